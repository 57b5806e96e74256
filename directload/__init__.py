"""directload: GPU-centric feature loading for mini-batch GNN training."""

from .errors import DirectloadError
from .files import CorruptFileError, from_file
from .memory import PinError
from .shared import SharedTableError, shared_table
from .unified import ClosedError, UnifiedTensor, empty, is_unified, ones, to_unified, zeros

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "DirectloadError",
    "UnifiedTensor",
    "to_unified",
    "empty",
    "zeros",
    "ones",
    "from_file",
    "shared_table",
    "SharedTableError",
    "is_unified",
    "ClosedError",
    "PinError",
    "CorruptFileError",
]

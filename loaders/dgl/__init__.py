"""DGL integration: ``DataLoader``, a drop-in for ``dgl.dataloading.DataLoader`` with features gathered by directload.

Needs DGL (``pip install directload[dgl]``).
"""

from directload.capabilities import require

require("dgl")

from ..pipeline import Epoch, resolve_overlap, resolve_sampling  # noqa: E402
from .dataloader import DataLoader, SeedTypeError, UVAUnavailableError, check_indices  # noqa: E402

__all__ = ["DataLoader", "Epoch", "check_indices", "resolve_sampling", "resolve_overlap", "UVAUnavailableError",
           "SeedTypeError"]

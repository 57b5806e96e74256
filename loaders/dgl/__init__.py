"""DGL integration: ``DataLoader``, a drop-in for ``dgl.dataloading.DataLoader`` with features gathered by directload,
and ``NeighborSampler``, directload's neighbour sampler as a DGL ``BlockSampler``.

Needs DGL (``pip install directload[dgl]``).
"""

from directload.capabilities import require

require("dgl")

from ..pipeline import Epoch, resolve_overlap, resolve_sampling  # noqa: E402
from .dataloader import (  # noqa: E402
    SAMPLERS,
    DataLoader,
    SeedTypeError,
    UVAUnavailableError,
    check_indices,
    resolve_sampler,
)
from .sampler import NeighborSampler  # noqa: E402

__all__ = ["DataLoader", "NeighborSampler", "Epoch", "check_indices", "resolve_sampling", "resolve_overlap",
           "resolve_sampler", "SAMPLERS", "UVAUnavailableError", "SeedTypeError"]

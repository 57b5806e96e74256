"""DGL integration: ``directload.loaders.DataLoader``, a drop-in for DGL's neighbour-sampling loader."""

from .dataloader import DataLoader, resolve_overlap, resolve_sampling
from .pipeline import Epoch

__all__ = ["DataLoader", "Epoch", "resolve_sampling", "resolve_overlap"]

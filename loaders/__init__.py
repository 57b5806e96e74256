"""Loaders: drop-ins for DGL's DataLoader (:mod:`directload.loaders.dgl`) and PyG's NeighborLoader and
FeatureStore (:mod:`directload.loaders.pyg`), over one framework-neutral pipeline.

``from directload.loaders import DataLoader`` is the DGL loader; it imports DGL when first asked for,
so this package imports with neither framework installed.
"""

from directload.capabilities import require

from .pipeline import Epoch, Pipeline, PipelineError, resolve_overlap, resolve_sampling

__all__ = ["DataLoader", "Epoch", "Pipeline", "PipelineError", "resolve_sampling", "resolve_overlap", "require"]


def __getattr__(name):
    # The DGL loader is imported on first use (PEP 562), so that this package loads without DGL.
    if name == "DataLoader":
        require("dgl")
        from .dgl import DataLoader

        return DataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

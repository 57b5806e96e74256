"""PyG integration: a ``FeatureStore`` over directload tables, a ``GraphStore``, and drop-in ``NeighborLoader`` and
``LinkNeighborLoader``.

Needs PyG (``pip install directload[pyg]``); without pyg-lib or torch-sparse, directload's sampler runs.
"""

from directload.capabilities import require

require("torch_geometric")

from .feature_store import FeatureStore  # noqa: E402
from .graph_store import GraphStore  # noqa: E402
from .link_loader import LinkNeighborLoader  # noqa: E402
from .loader import NeighborLoader, stores_from, unified_data  # noqa: E402
from .sampler import NeighborSampler  # noqa: E402

__all__ = ["FeatureStore", "GraphStore", "LinkNeighborLoader", "NeighborLoader", "NeighborSampler", "stores_from",
           "unified_data"]

"""The graph as unified tensors: every node's in-edges in CSC (indptr, indices, optional edge ids and weights).

:class:`CSCGraph` holds and checks the parts (``csc``); ``files`` saves and loads them (one ``.npy`` file a part,
then ``graph.json``, each checked before a byte of it is read); ``sharing`` shares one copy a node in
``/dev/shm``.
"""

from .csc import CSCGraph, from_edge_index
from .errors import GraphError, SharedGraphMismatch

__all__ = ["CSCGraph", "GraphError", "SharedGraphMismatch", "from_edge_index"]

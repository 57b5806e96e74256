"""A graph's errors: a CSC that is not one, and another graph shared under a key."""

from __future__ import annotations

from directload.errors import DirectloadError
from directload.shared import SharedTableError

__all__ = ["GraphError", "SharedGraphMismatch"]


class GraphError(DirectloadError, ValueError):
    """A CSC that is not one: a bad ``indptr``, an index outside the graph, or parts that disagree.

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> CSCGraph(torch.tensor([0, 2, 1]), torch.tensor([0, 1]))
    Traceback (most recent call last):
    ...
    directload.graph.GraphError: indptr decreases at position 1 (2 then 1); a CSC's indptr is sorted
    """

    __module__ = "directload.graph"  # where users import it from


class SharedGraphMismatch(SharedTableError):
    """Another graph is shared under the key: its digest (or shape) is not the one of the graph given.

    A sibling of the mismatch :func:`directload.shared_table` refuses, so ``except SharedTableError``
    catches both.

    Examples
    --------
    >>> import tempfile, torch
    >>> from directload.graph import CSCGraph
    >>> a = CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]))
    >>> b = CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
    >>> with tempfile.TemporaryDirectory() as where:
    ...     mine = CSCGraph.shared("demo-graph", a, affinity="host", directory=where)
    ...     try:
    ...         CSCGraph.shared("demo-graph", b, affinity="host", directory=where)
    ...     except SharedGraphMismatch as exc:
    ...         print(str(exc).split(":")[0])
    shared graph 'demo-graph' on this node is another graph than the one given
    """

    __module__ = "directload.graph"  # where users import it from

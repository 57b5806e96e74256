"""The graph as unified tensors: every node's in-edges in CSC (indptr, indices, optional edge ids and weights)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from directload.errors import DirectloadError
from directload.kernels.sampling import check_csc

from .atomic import write_atomically
from .files import from_file
from .shared import shared_table
from .unified import host_of, is_unified, to_unified

if TYPE_CHECKING:
    from .unified import UnifiedTensor

__all__ = ["CSCGraph", "GraphError", "from_edge_index"]

_INT32_MAX = 2**31 - 1
_PARTS = ("indptr", "indices", "eids", "weights")
_MANIFEST = "graph.json"


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


def _index_dtype(bound):
    return torch.int32 if bound <= _INT32_MAX else torch.int64


def _as_index(t, name):
    if not isinstance(t, (torch.Tensor, np.ndarray)):
        raise TypeError(f"{name} must be a tensor or array, got {type(t).__name__}")
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t)
    t = host_of(t)
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-d int32 or int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
    return t.contiguous()  # the kernels read the parts as flat arrays


class CSCGraph:
    """Every node's in-edges: ``indices[indptr[v]:indptr[v + 1]]`` are the sources of the edges into ``v``.

    The parts are host tensors (plain, memory-mapped or shared) or unified
    tensors (:meth:`to_unified`: pinned and mapped, read by GPU kernels in
    place), or CUDA tensors (:meth:`to`).  A sampler reads them where they
    are; nothing is copied per batch.

    Parameters
    ----------
    indptr : tensor of int32 or int64, ``num_nodes + 1`` entries
    indices : tensor of int32 or int64, ``num_edges`` entries
    eids : tensor of int64, optional
        Each CSC position's edge id in the user's numbering (None: the
        position itself).
    weights : tensor of float32 or float64, optional
        Each edge's sampling weight (non-negative; zero: never sampled).
    num_src_nodes : int, optional
        Sources are in ``[0, num_src_nodes)`` (default: ``num_nodes``; a
        bipartite relation of a heterogeneous graph has others).
    check : bool
        Check that the parts form a CSC (O(edges), once); a sampler trusts it after.

    Raises
    ------
    GraphError
        ``indptr`` does not start at 0, decreases, or does not end at
        ``len(indices)``; an index is outside ``[0, num_src_nodes)``; edge
        ids or weights of the wrong length or a negative weight.

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> g = CSCGraph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 1]]), num_nodes=3)
    >>> g.indptr.tolist(), g.indices.tolist(), g.eids.tolist()
    ([0, 0, 2, 3], [0, 2, 1], [0, 2, 1])
    >>> g.in_degrees().tolist()
    [0, 2, 1]
    """

    def __init__(self, indptr: torch.Tensor | np.ndarray, indices: torch.Tensor | np.ndarray, *,
                 eids: torch.Tensor | np.ndarray | None = None, weights: torch.Tensor | np.ndarray | None = None,
                 num_src_nodes: int | None = None, check: bool = True) -> None:
        indptr = _as_index(indptr, "indptr")
        indices = _as_index(indices, "indices")
        if indptr.numel() < 1:
            raise GraphError("indptr is empty; a graph of n nodes has n + 1 entries in indptr")
        num_nodes = indptr.numel() - 1
        if num_src_nodes is None:
            num_src_nodes = num_nodes
        if isinstance(num_src_nodes, bool) or not isinstance(num_src_nodes, int) or num_src_nodes < 0:
            raise TypeError(f"num_src_nodes must be a non-negative int, got {num_src_nodes!r}")
        if eids is not None:
            eids = _as_index(eids, "eids")
            if eids.numel() != indices.numel():  # type: ignore[union-attr]  # a tensor now (_as_index)
                raise GraphError(f"eids has {eids.numel()} entries for {indices.numel()} edges")  # type: ignore[union-attr]
        if weights is not None:
            if isinstance(weights, np.ndarray):
                weights = torch.from_numpy(weights)
            weights = host_of(weights)
            if not isinstance(weights, torch.Tensor) or weights.dtype not in (torch.float32, torch.float64) \
                    or weights.dim() != 1:
                raise TypeError("weights must be a 1-d float32 or float64 tensor")
            if weights.numel() != indices.numel():
                raise GraphError(f"weights has {weights.numel()} entries for {indices.numel()} edges")
            weights = weights.contiguous()
        self._parts = {"indptr": indptr, "indices": indices, "eids": eids, "weights": weights}
        self.num_nodes = num_nodes
        self.num_src_nodes = num_src_nodes
        self._meta: UnifiedTensor | None = None  # a shared graph's meta table (shared), held with the parts
        if check:
            self.check()

    @property
    def indptr(self) -> torch.Tensor:
        return self._parts["indptr"]

    @property
    def indices(self) -> torch.Tensor:
        return self._parts["indices"]

    @property
    def eids(self) -> torch.Tensor | None:
        return self._parts["eids"]

    @property
    def weights(self) -> torch.Tensor | None:
        return self._parts["weights"]

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        """Where the parts live: ``cpu`` for host, memory-mapped and unified tensors, else their CUDA device."""
        return self.indptr.device

    def __repr__(self):
        kind = "unified" if is_unified(self._parts["indptr"]) else str(self.device)
        return (f"CSCGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, indices={self.indices.dtype}, "
                f"eids={self.eids is not None}, weights={self.weights is not None}, memory={kind!r})")

    def in_degrees(self) -> torch.Tensor:
        """Each node's in-degree (int64, where the graph lives)."""
        p = host_of(self.indptr)
        return (p[1:] - p[:-1]).to(torch.int64)

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(indptr, indices, eids, weights)`` as numpy views of host memory (None where absent)."""
        if self.device.type != "cpu":
            raise ValueError(f"this graph lives on {self.device}; numpy views need host memory")
        return tuple(None if t is None else host_of(t).numpy()  # type: ignore[return-value]  # indptr, indices are
                     for t in (self._parts[k] for k in _PARTS))  # never None

    def check(self) -> None:
        """Raise :class:`GraphError` unless the parts form a CSC; O(edges), where the graph lives.

        Samplers trust a checked graph: its parts must not change after.
        """
        if self.device.type != "cpu":
            return self._check_on_device()
        indptr, indices, _, weights = self.numpy()
        code, pos = check_csc(indptr, indices.shape[0], indices, self.num_src_nodes)
        if code == 1:
            raise GraphError(f"indptr starts at {int(indptr[0])}; a CSC's indptr starts at 0")
        if code == 2:
            raise GraphError(f"indptr decreases at position {pos} ({int(indptr[pos])} then {int(indptr[pos + 1])});"
                             " a CSC's indptr is sorted")
        if code == 3:
            raise GraphError(f"indptr ends at {int(indptr[-1])} but there are {indices.shape[0]} indices")
        if code == 4:
            raise GraphError(f"index {int(indices[pos])} at position {pos} is outside the graph's "
                             f"{self.num_src_nodes} source nodes")
        if code == 5:
            raise GraphError(f"node {pos} has {int(indptr[pos + 1] - indptr[pos])} in-edges; the sampler's draws "
                             f"take in-degrees below 2**32")
        if weights is not None and weights.size and not (np.isfinite(weights) & (weights >= 0)).all():
            raise GraphError("weights must be finite and non-negative (NaN and inf are refused)")

    def _check_on_device(self):
        indptr, indices, weights = self.indptr, self.indices, self.weights
        deg = indptr[1:] - indptr[:-1]
        if int(indptr[0]) != 0 or bool((deg < 0).any()) or int(indptr[-1]) != indices.numel():
            raise GraphError("indptr does not start at 0, decreases, or does not end at len(indices)")
        if deg.numel() and int(deg.max()) >= 2**32:
            raise GraphError("an in-degree reaches 2**32; the sampler's draws take in-degrees below it")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_src_nodes):
            raise GraphError(f"an index is outside the graph's {self.num_src_nodes} source nodes")
        if weights is not None and weights.numel() and not bool((torch.isfinite(weights) & (weights >= 0)).all()):
            raise GraphError("weights must be finite and non-negative (NaN and inf are refused)")

    def _map(self, fn):
        parts = {k: None if v is None else fn(k, v) for k, v in self._parts.items()}
        return CSCGraph(parts["indptr"], parts["indices"], eids=parts["eids"], weights=parts["weights"],
                        num_src_nodes=self.num_src_nodes, check=False)._with(parts)

    def _with(self, parts):
        self._parts = parts  # keeps unified and CUDA tensors as they are (the constructor takes host views)
        return self

    def to_unified(self, affinity: str = "cuda", *, pin: str | bool = "auto") -> CSCGraph:
        """The graph in unified tensors sharing this graph's host memory (no copy; pinned and mapped with CUDA).

        Examples
        --------
        >>> import torch
        >>> from directload.graph import CSCGraph
        >>> g = CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0])).to_unified(affinity="host")
        >>> g
        CSCGraph(num_nodes=2, num_edges=2, indices=torch.int64, eids=False, weights=False, memory='unified')
        """
        return self._map(lambda _, t: t if is_unified(t) else to_unified(t, affinity, pin=pin))

    def to(self, device: torch.device | str) -> CSCGraph:
        """A copy of the parts on ``device`` (``"cuda"``: in GPU memory, for graphs that fit)."""
        return self._map(lambda _, t: host_of(t).to(device).contiguous())

    @classmethod
    def shared(cls, key: str, source: CSCGraph | Callable[[], CSCGraph] | None = None, *, ranks: int | None = None,
               affinity: str = "cuda", timeout: float = 600.0, directory: os.PathLike[str] | str | None = None
               ) -> CSCGraph:
        """One copy of a graph in shared memory for every process of the node that calls this with ``key``.

        Parameters
        ----------
        key : str
            As for :func:`directload.shared_table`: each part is the table
            ``f"{key}.{part}"``, beside a small ``f"{key}.meta"``.
        source : CSCGraph or callable, optional
            The graph, or a function that builds it: called only in a process
            that writes a part, so the others never build it.  None: attach to
            the graph another process shares (waiting for it while it writes).
        ranks, affinity, timeout, directory
            As for :func:`directload.shared_table`.

        Returns
        -------
        CSCGraph
            Its parts are read-only unified tensors over the node's one copy.
        """
        built: list[CSCGraph] = []

        def graph():
            if not built:
                g = source() if callable(source) else source
                if not isinstance(g, CSCGraph):
                    raise TypeError(f"source must be a CSCGraph or a function returning one, got {type(g).__name__}")
                built.append(g)
            return built[0]

        def meta_of():
            g = graph()
            return torch.tensor([g.num_src_nodes, g.eids is not None, g.weights is not None], dtype=torch.int64)

        def part(name):
            return lambda: host_of(graph()._parts[name])

        kw: dict[str, Any] = dict(ranks=ranks, affinity=affinity, timeout=timeout, directory=directory)
        meta = shared_table(f"{key}.meta", None if source is None else meta_of, **kw)
        num_src, has_eids, has_weights = meta.tolist()
        present = {"indptr": True, "indices": True, "eids": bool(has_eids), "weights": bool(has_weights)}
        parts = {name: shared_table(f"{key}.{name}", None if source is None else part(name), **kw)
                 for name in _PARTS if present[name]}
        g = cls(parts["indptr"], parts["indices"], eids=parts.get("eids"), weights=parts.get("weights"),
                num_src_nodes=num_src)  # checked here too: a reader trusts no other process's bytes
        g._meta = meta  # held while the graph lives: the last process to let a table go removes its name
        return g._with({k: parts.get(k) for k in _PARTS})

    def save(self, directory: os.PathLike[str] | str, *, source: str | None = None) -> None:
        """Write the parts as ``.npy`` files under ``directory``, then ``graph.json`` naming them.

        Each file is written whole or not at all, and ``graph.json`` last, so a
        killed write leaves either the graph that was there or none that
        :meth:`load` accepts.  ``source`` (a string: what the graph was built
        from) is kept for :meth:`load` to check.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        manifest = directory / _MANIFEST
        if manifest.exists():
            manifest.unlink()  # the parts change below: no reader may take a mix of two graphs
        parts = []
        for name in _PARTS:
            t = self._parts[name]
            if t is not None:
                # mypy cannot infer a lambda with a default argument; it takes the file as write_atomically asks
                write_atomically(directory / f"{name}.npy",
                                 lambda f, t=t: np.save(f, host_of(t).cpu().numpy()))  # type: ignore[misc]
                parts.append(name)
        meta = {"format": 1, "parts": parts, "num_nodes": self.num_nodes, "num_src_nodes": self.num_src_nodes,
                "num_edges": self.num_edges, "source": source}
        write_atomically(manifest, lambda f: f.write(json.dumps(meta).encode()))

    @classmethod
    def load(cls, directory: os.PathLike[str] | str, *, mmap: bool = True, affinity: str = "cuda", check: bool = True,
             source: str | None = None) -> CSCGraph:
        """A graph written by :meth:`save`; memory-mapped (graphs larger than host memory) unless ``mmap=False``.

        Memory-mapped parts are unified tensors over the files (:func:`directload.from_file`).

        Raises
        ------
        FileNotFoundError
            No complete graph in ``directory`` (no ``graph.json``).
        GraphError
            Parts that disagree with ``graph.json`` or do not form a CSC, or a
            graph saved from another ``source`` than the one given.
        """
        directory = Path(directory)
        try:
            meta = json.loads((directory / _MANIFEST).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no graph in {directory}: {_MANIFEST} is missing (CSCGraph.save writes it "
                                    "last)") from None
        except ValueError as exc:
            raise GraphError(f"{directory / _MANIFEST} is not a graph's manifest: {exc}") from None
        if source is not None and meta.get("source") != source:
            raise GraphError(f"the graph in {directory} was built from {meta.get('source')!r}, not {source!r}")
        parts = {}
        for name in meta.get("parts", ()):
            if name not in _PARTS:
                raise GraphError(f"{directory / _MANIFEST} names an unknown part {name!r}")
            path = directory / f"{name}.npy"
            parts[name] = (from_file(os.fspath(path), affinity=affinity, pin="auto") if mmap
                           else torch.from_numpy(np.load(path)))
        if "indptr" not in parts or "indices" not in parts:
            raise GraphError(f"{directory / _MANIFEST} lacks indptr or indices")
        g = cls(parts["indptr"], parts["indices"], eids=parts.get("eids"), weights=parts.get("weights"),
                num_src_nodes=meta.get("num_src_nodes"), check=check)
        if g.num_nodes != meta.get("num_nodes") or g.num_edges != meta.get("num_edges"):
            raise GraphError(f"the parts in {directory} have {g.num_nodes} nodes and {g.num_edges} edges, "
                             f"{_MANIFEST} says {meta.get('num_nodes')} and {meta.get('num_edges')}")
        return g._with({k: parts.get(k) for k in _PARTS}) if mmap else g

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int | None = None, *,
                        num_src_nodes: int | None = None, edge_weight: torch.Tensor | None = None) -> CSCGraph:
        """The CSC of a COO ``edge_index`` (``[2, E]``: row 0 sources, row 1 destinations).

        Edge ids are the columns' positions in ``edge_index`` (kept as ``eids``
        unless the edges are already sorted by destination).  Indices are int32
        where the graph allows it.
        """
        return from_edge_index(edge_index, num_nodes, num_src_nodes=num_src_nodes, edge_weight=edge_weight)


def from_edge_index(edge_index: torch.Tensor, num_nodes: int | None = None, *, num_src_nodes: int | None = None,
                    edge_weight: torch.Tensor | None = None) -> CSCGraph:
    """:meth:`CSCGraph.from_edge_index`."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise TypeError("edge_index must be a [2, num_edges] tensor")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"edge_index must be int32 or int64, got {edge_index.dtype}")
    src, dst = host_of(edge_index).cpu().to(torch.int64)
    if num_nodes is None:
        num_nodes = int(dst.max()) + 1 if dst.numel() else 0
    if num_src_nodes is None:
        num_src_nodes = num_nodes
    if dst.numel() and (int(dst.min()) < 0 or int(dst.max()) >= num_nodes):
        raise GraphError(f"a destination is outside the graph's {num_nodes} nodes")
    if src.numel() and (int(src.min()) < 0 or int(src.max()) >= num_src_nodes):
        raise GraphError(f"a source is outside the graph's {num_src_nodes} source nodes")
    counts = torch.bincount(dst, minlength=num_nodes)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    ordered = dst.numel() < 2 or bool((dst[1:] >= dst[:-1]).all())
    perm = None if ordered else torch.sort(dst, stable=True).indices
    indices = src if perm is None else src[perm]
    weights = None
    if edge_weight is not None:
        weights = host_of(edge_weight).cpu()
        if weights.dtype not in (torch.float32, torch.float64):
            weights = weights.to(torch.float32)
        weights = weights if perm is None else weights[perm]
    edges = indices.numel()
    return CSCGraph(indptr.to(_index_dtype(edges)), indices.to(_index_dtype(num_src_nodes)), eids=perm,
                    weights=weights, num_src_nodes=num_src_nodes)

"""``CSCGraph``: every node's in-edges in CSC (indptr, indices, optional edge ids and weights), checked once, where
they live (host, memory-mapped, unified or CUDA tensors)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from directload.capabilities import require
from directload.kernels.sampling import MAX_DEGREE, check_csc
from directload.unified import host_of, is_unified, to_unified

from . import files, sharing
from .errors import GraphError
from .parts import FLOAT, INDEX, PARTS, dtype_name

if TYPE_CHECKING:
    from directload.unified import UnifiedTensor

__all__ = ["CSCGraph", "from_edge_index"]

_INT32_MAX = 2**31 - 1
_CHUNK = 64 << 20  # bytes of a CUDA part copied to host at a time for its digest


def _index_dtype(bound):
    return torch.int32 if bound <= _INT32_MAX else torch.int64


def _count(name, value):
    """``value`` as an int when it is a whole number >= 0: TypeError for another type (a bool too),
    ValueError for a negative one."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a non-negative int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return int(value)


def _as_index(t, name) -> torch.Tensor:
    if not isinstance(t, (torch.Tensor, np.ndarray)):
        raise TypeError(f"{name} must be a tensor or array, got {type(t).__name__}")
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t)
    t = host_of(t)
    if t.dtype not in INDEX or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-d int32 or int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")
    return t.contiguous()  # the kernels read the parts as flat arrays


def _crc(crc32c, t):
    """The crc32c of a part's bytes: read in place in host memory (no copy), or copied to host a chunk at a
    time from a GPU."""
    t = host_of(t).detach()
    if t.device.type == "cpu":
        return crc32c.crc32c(memoryview(t.numpy()).cast("B"))
    flat = t.reshape(-1).view(torch.uint8)
    crc = 0
    for start in range(0, flat.numel(), _CHUNK):
        crc = crc32c.crc32c(memoryview(flat[start:start + _CHUNK].cpu().numpy()).cast("B"), crc)
    return crc


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
    eids : tensor of int32 or int64, optional
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
    TypeError, ValueError
        A part that is not a 1-d tensor of its dtypes; a ``num_src_nodes``
        that is not an int (TypeError) or is negative (ValueError).

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
        num_src_nodes = num_nodes if num_src_nodes is None else _count("num_src_nodes", num_src_nodes)
        if eids is not None:
            eids = _as_index(eids, "eids")
            if eids.numel() != indices.numel():
                raise GraphError(f"eids has {eids.numel()} entries for {indices.numel()} edges")
        if weights is not None:
            if isinstance(weights, np.ndarray):
                weights = torch.from_numpy(weights)
            weights = host_of(weights)
            if not isinstance(weights, torch.Tensor) or weights.dtype not in FLOAT or weights.dim() != 1:
                raise TypeError("weights must be a 1-d float32 or float64 tensor")
            if weights.numel() != indices.numel():
                raise GraphError(f"weights has {weights.numel()} entries for {indices.numel()} edges")
            weights = weights.contiguous()
        self._parts: dict[str, torch.Tensor | None] = {"indptr": indptr, "indices": indices, "eids": eids,
                                                      "weights": weights}
        self.num_nodes = num_nodes
        self.num_src_nodes = num_src_nodes
        self._meta: UnifiedTensor | None = None  # a shared graph's meta table (shared), held with the parts
        self._digest: str | None = None  # digest(): computed once
        if check:
            self.check()

    @property
    def indptr(self) -> torch.Tensor:
        return cast(torch.Tensor, self._parts["indptr"])  # never None (only eids and weights may be)

    @property
    def indices(self) -> torch.Tensor:
        return cast(torch.Tensor, self._parts["indices"])  # never None (only eids and weights may be)

    @property
    def eids(self) -> torch.Tensor | None:
        return self._parts["eids"]

    @property
    def weights(self) -> torch.Tensor | None:
        return self._parts["weights"]

    @property
    def parts(self) -> dict[str, torch.Tensor | None]:
        """``{"indptr": ..., "indices": ..., "eids": ..., "weights": ...}`` (None where absent), where they live."""
        return dict(self._parts)

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
                     for t in (self._parts[k] for k in PARTS))  # never None

    def digest(self) -> str:
        """The graph's content digest: 8 hex digits, the same for the same graph wherever its parts live.

        A crc32c over the node counts and each part's name, dtype, shape and
        bytes (which parts are present too), computed once, on first use:
        host, memory-mapped and unified parts are read in place, CUDA parts
        are copied to host a chunk at a time.  It tells graphs apart (a shared
        graph under a taken key, a saved graph whose files changed); it is a
        checksum, not a cryptographic hash.  The parts must not change after
        it is computed (as after :meth:`check`).

        Examples
        --------
        >>> import torch
        >>> from directload.graph import CSCGraph
        >>> g = CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]))
        >>> g.digest() == CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 0])).to_unified("host").digest()
        True
        >>> g.digest() == CSCGraph(torch.tensor([0, 1, 2]), torch.tensor([0, 1])).digest()
        False
        >>> len(g.digest())
        8
        """
        if self._digest is None:
            crc32c = require("crc32c")
            parts = [None if t is None else [name, dtype_name(t.dtype), list(t.shape), _crc(crc32c, t)]
                     for name, t in self._parts.items()]
            text = json.dumps([self.num_nodes, self.num_src_nodes, parts]).encode()
            self._digest = f"{crc32c.crc32c(text):08x}"
        return self._digest

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
            raise GraphError(f"node {pos} has {int(indptr[pos + 1] - indptr[pos])} in-edges; the sampler takes "
                             "in-degrees below 2**62 (kernels.sampling.MAX_DEGREE)")
        if weights is not None and weights.size and not (np.isfinite(weights) & (weights >= 0)).all():
            raise GraphError("weights must be finite and non-negative (NaN and inf are refused)")

    def _check_on_device(self):
        indptr, indices, weights = self.indptr, self.indices, self.weights
        deg = indptr[1:] - indptr[:-1]
        if int(indptr[0]) != 0 or bool((deg < 0).any()) or int(indptr[-1]) != indices.numel():
            raise GraphError("indptr does not start at 0, decreases, or does not end at len(indices)")
        if deg.numel() and int(deg.max()) >= MAX_DEGREE:
            raise GraphError("an in-degree reaches 2**62; the sampler takes in-degrees below it "
                             "(kernels.sampling.MAX_DEGREE)")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_src_nodes):
            raise GraphError(f"an index is outside the graph's {self.num_src_nodes} source nodes")
        if weights is not None and weights.numel() and not bool((torch.isfinite(weights) & (weights >= 0)).all()):
            raise GraphError("weights must be finite and non-negative (NaN and inf are refused)")

    def _map(self, fn):
        parts = {k: None if v is None else fn(k, v) for k, v in self._parts.items()}
        g = CSCGraph(parts["indptr"], parts["indices"], eids=parts["eids"], weights=parts["weights"],
                     num_src_nodes=self.num_src_nodes, check=False)._with(parts)
        g._digest = self._digest  # the same bytes elsewhere
        return g

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

        The process that writes the graph shares each part as the table
        ``f"{key}.{part}"`` and, last, its description ``f"{key}.meta"``
        (node and edge counts, each part's dtype, the :meth:`digest`), so a
        process that finds the description finds the whole graph.  Every
        process checks what it maps against the description (each part's
        dtype and length, the digest) and that it forms a CSC.

        Parameters
        ----------
        key : str
            The graph's name on this node, as for :func:`directload.shared_table`
            (1 to 192 letters, digits, ``_``, ``.`` or ``-``, starting with a
            letter or a digit: the parts' tables add up to 8 characters).
        source : CSCGraph or callable, optional
            The graph, or a function that builds it: called only in the
            process that writes it, so the others never build it.  A graph
            given is compared (by its :meth:`digest`) with the one already
            shared under ``key``.  None: wait for another process to share the
            graph (one that has not started yet too), then map it.
        ranks, affinity, directory
            As for :func:`directload.shared_table`.
        timeout : float
            Seconds this call waits in all, for the description and every part
            together (one deadline, not one per part): for a writer to start or
            to finish, or for a lock another process holds.

        Returns
        -------
        CSCGraph
            Its parts are read-only unified tensors over the node's one copy.

        Raises
        ------
        TypeError, ValueError
            A key that is not a ``str`` (TypeError) or not one
            ``shared_table`` takes, a bad ``timeout``, ``ranks`` or
            ``source``; before anything is made.
        SharedGraphMismatch
            Another graph is shared under ``key`` (a ``SharedTableError``).
        SharedTableTimeout
            No whole graph after ``timeout`` seconds: its writer is stopped,
            slow, or died before publishing it (the message names its pid), or
            no writer started.
        SharedTableError
            As for :func:`directload.shared_table`.

        Examples
        --------
        >>> import tempfile, torch
        >>> from directload.graph import CSCGraph
        >>> g = CSCGraph(torch.tensor([0, 1, 3]), torch.tensor([1, 0, 1]))
        >>> with tempfile.TemporaryDirectory() as where:  # /dev/shm by default
        ...     mine = CSCGraph.shared("demo-csc", g, affinity="host", directory=where)
        ...     theirs = CSCGraph.shared("demo-csc", affinity="host", directory=where)  # another process's call
        >>> theirs.indices.tolist(), theirs.digest() == g.digest()
        ([1, 0, 1], True)
        """
        if source is not None and not isinstance(source, CSCGraph) and not callable(source):
            raise TypeError(f"source must be a CSCGraph or a function returning one, got {type(source).__name__}")

        def build():
            g = source() if callable(source) else source
            if not isinstance(g, CSCGraph):
                raise TypeError(f"source must be a CSCGraph or a function returning one, got {type(g).__name__}")
            return g

        parts, layout, meta = sharing.share(key, None if source is None else build,
                                            source if isinstance(source, CSCGraph) else None, ranks=ranks,
                                            affinity=affinity, timeout=timeout, directory=directory)
        g = cls(parts["indptr"], parts["indices"], eids=parts.get("eids"), weights=parts.get("weights"),
                num_src_nodes=layout.num_src_nodes)  # checked here too: a process trusts no other process's bytes
        if g.digest() != layout.digest:
            raise layout.mismatch(key, "the one its parts hold", sharing.Layout.of(g))
        g._meta = meta  # held while the graph lives: the last process to let a table go removes its name
        return g._with({k: parts.get(k) for k in PARTS})

    def save(self, directory: os.PathLike[str] | str, *, source: str | None = None) -> None:
        """Write the parts as ``.npy`` files under ``directory``, then ``graph.json`` naming them.

        Each file is written whole or not at all, and ``graph.json`` last, so a
        killed write leaves either the graph that was there or none that
        :meth:`load` accepts.  ``graph.json`` holds the counts, the parts'
        names, the :meth:`digest` and ``source`` (a string: what the graph was
        built from), which :meth:`load` checks.
        """
        files.save(self, directory, source)

    @classmethod
    def load(cls, directory: os.PathLike[str] | str, *, mmap: bool = True, affinity: str = "cuda", check: bool = True,
             source: str | None = None) -> CSCGraph:
        """A graph written by :meth:`save`; memory-mapped (graphs larger than host memory) unless ``mmap=False``.

        Memory-mapped parts are unified tensors over the files (:func:`directload.from_file`).
        ``graph.json`` is checked as a whole first (a JSON object of format 1
        or 2 with exactly its fields, each of its type), then each part's
        ``.npy`` header against it (a 1-d array of the part's dtypes, of the
        length the counts give), before a byte of a part is read, in both
        modes.  With ``check``, the parts must form a CSC and match the
        digest ``graph.json`` keeps (a crc32c pass over the parts, about as
        fast as the CSC check); without it, both are trusted.

        Raises
        ------
        FileNotFoundError
            No complete graph in ``directory`` (no ``graph.json``).
        GraphError
            Anything else: a ``graph.json`` or a part that is not what it
            should be, parts that do not form a CSC or whose digest differs,
            or a graph saved from another ``source`` than the one given.  The
            message names the file and the field.

        Examples
        --------
        >>> import tempfile, torch
        >>> from directload.graph import CSCGraph
        >>> g = CSCGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), 2)
        >>> where = tempfile.mkdtemp()
        >>> g.save(where, source="two nodes")
        >>> CSCGraph.load(where, affinity="host", source="two nodes").digest() == g.digest()
        True
        >>> with open(f"{where}/graph.json", "w") as f:
        ...     _ = f.write("[]")
        >>> CSCGraph.load(where)
        Traceback (most recent call last):
        ...
        directload.graph.GraphError: .../graph.json: a JSON array, not an object: not a graph's manifest
        """
        manifest, parts = files.load_parts(directory, mmap=mmap, affinity=affinity, source=source)
        g = cls(parts["indptr"], parts["indices"], eids=parts.get("eids"), weights=parts.get("weights"),
                num_src_nodes=manifest.num_src_nodes, check=check)
        if manifest.digest is not None:
            if check and g.digest() != manifest.digest:
                raise GraphError(f"{manifest.path}: field 'digest' is {manifest.digest}, the parts' digest is "
                                 f"{g.digest()}: a part changed after the graph was saved")
            g._digest = manifest.digest
        return g._with({k: parts.get(k) for k in PARTS}) if mmap else g

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int | None = None, *,
                        num_src_nodes: int | None = None, edge_weight: torch.Tensor | None = None) -> CSCGraph:
        """The CSC of a COO ``edge_index`` (``[2, E]``: row 0 sources, row 1 destinations).

        Edge ids are the columns' positions in ``edge_index`` (kept as ``eids``
        unless the edges are already sorted by destination).  Indices are int32
        where the graph allows it.  ``edge_weight`` (one real number per edge)
        is kept as float32 unless it is float64.

        Raises
        ------
        TypeError, ValueError
            ``edge_index`` is not a ``[2, E]`` integer tensor; ``num_nodes``
            or ``num_src_nodes`` is not an int (TypeError) or is negative
            (ValueError); ``edge_weight`` is not a 1-d tensor of real numbers.
        GraphError
            ``edge_weight`` has another length than the edges, or an edge
            names a node outside the graph.

        Examples
        --------
        >>> import torch
        >>> from directload.graph import CSCGraph
        >>> g = CSCGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), 2, edge_weight=torch.tensor([0.5, 2.0]))
        >>> g.weights.tolist()
        [2.0, 0.5]
        >>> CSCGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), 2, edge_weight=torch.ones(3))
        Traceback (most recent call last):
        ...
        directload.graph.GraphError: edge_weight has 3 entries for 2 edges
        """
        return from_edge_index(edge_index, num_nodes, num_src_nodes=num_src_nodes, edge_weight=edge_weight)


def from_edge_index(edge_index: torch.Tensor, num_nodes: int | None = None, *, num_src_nodes: int | None = None,
                    edge_weight: torch.Tensor | None = None) -> CSCGraph:
    """:meth:`CSCGraph.from_edge_index`."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise TypeError("edge_index must be a [2, num_edges] tensor")
    if edge_index.dtype not in INDEX:
        raise TypeError(f"edge_index must be int32 or int64, got {edge_index.dtype}")
    if num_nodes is not None:
        num_nodes = _count("num_nodes", num_nodes)
    if num_src_nodes is not None:
        num_src_nodes = _count("num_src_nodes", num_src_nodes)
    weights = _edge_weights(edge_weight, edge_index.shape[1])  # before the edges are reordered
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
    if weights is not None and perm is not None:
        weights = weights[perm]
    edges = indices.numel()
    return CSCGraph(indptr.to(_index_dtype(edges)), indices.to(_index_dtype(num_src_nodes)), eids=perm,
                    weights=weights, num_src_nodes=num_src_nodes)


def _edge_weights(edge_weight, edges):
    """``edge_weight`` checked (a 1-d tensor or array of real numbers, one per edge) as a host float tensor."""
    if edge_weight is None:
        return None
    if isinstance(edge_weight, np.ndarray):
        try:
            edge_weight = torch.from_numpy(edge_weight)
        except TypeError as exc:
            raise TypeError(f"edge_weight has dtype {edge_weight.dtype}: weights are real numbers") from exc
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a 1-d tensor, one weight per edge, got {type(edge_weight).__name__}")
    if edge_weight.dim() != 1:
        raise TypeError(f"edge_weight must be 1-d, one weight per edge, got shape {tuple(edge_weight.shape)}")
    if edge_weight.dtype == torch.bool or edge_weight.is_complex():
        raise TypeError(f"edge_weight must be real numbers, got {edge_weight.dtype}")
    if edge_weight.numel() != edges:
        raise GraphError(f"edge_weight has {edge_weight.numel()} entries for {edges} edges")
    w = host_of(edge_weight).detach().cpu()
    return w if w.dtype in FLOAT else w.to(torch.float32)

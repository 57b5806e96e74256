"""directload's neighbour sampler: uniform (or weighted) picks without (or with) replacement, the same batch on any
thread count and either device, over a :class:`~directload.graph.CSCGraph` where it lives."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from directload.capabilities import usable_device
from directload.kernels import sampling as cpu
from directload.kernels.sampling_gpu import run_batch
from directload.kernels.sampling_gpu_hetero import run_hetero_batch

from .batch_device import BatchDevice, batch_device
from .graph import CSCGraph
from .unified import host_of, is_unified

__all__ = ["NeighborSampler", "HeteroNeighborSampler", "SampledBatch", "HeteroSampledBatch", "check_fanouts",
           "check_device", "LAYOUTS", "MAX_FANOUT", "generator_state", "generator_from"]

#: ``"pyg"``: each hop samples the nodes new at the hop before; ``"dgl"``: every node reached so far.
LAYOUTS = ("pyg", "dgl")
_KEY_BOUND = 2**63 - 1
#: The largest fanout (draws per node with replacement; without, -1 takes every neighbour).
MAX_FANOUT = 2**31 - 1


@dataclass
class SampledBatch:
    """One sampled batch of a homogeneous graph.

    Attributes
    ----------
    nodes : torch.Tensor
        int64 global ids: the seeds first, then each hop's new nodes in the order first seen.
    hops : list of (row, col, eid)
        Hop ``h``'s edges (hop 0 samples the seeds): ``row`` the batch-local id
        of the picked neighbour (the message's source), ``col`` the local id of
        the node it was picked for, ``eid`` the edge's id; int64, on the
        sampler's device.
    num_sampled_nodes : list of int
        Nodes new at each hop, the seeds first (``len(hops) + 1`` entries).
    num_sampled_edges : list of int
        Edges of each hop.
    key : int
        The batch's random key: sampling the same seeds with it gives this batch again.

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> from directload.sampler import NeighborSampler
    >>> g = CSCGraph.from_edge_index(torch.tensor([[1, 2], [0, 1]]), num_nodes=3)
    >>> b = NeighborSampler(g, [1, 1]).sample(torch.tensor([0]), key=0)
    >>> b.nodes.tolist(), b.num_sampled_nodes, b.num_sampled_edges  # 1 -> 0, then 2 -> 1
    ([0, 1, 2], [1, 1, 1], [1, 1])
    >>> [(row.tolist(), col.tolist()) for row, col, _ in b.hops]
    [([1], [0]), ([2], [1])]
    """

    nodes: torch.Tensor
    hops: list
    num_sampled_nodes: list
    num_sampled_edges: list
    key: int


@dataclass
class HeteroSampledBatch:
    """One sampled batch of a heterogeneous graph: :class:`SampledBatch`'s fields per node or edge type.

    ``hops[h][edge_type] = (row, col, eid)``, ``row`` local to the edge type's
    source type and ``col`` to its destination type.

    Examples
    --------
    See :class:`HeteroNeighborSampler`.

    >>> from directload.sampler import HeteroSampledBatch
    >>> sorted(HeteroSampledBatch.__dataclass_fields__)
    ['hops', 'key', 'nodes', 'num_sampled_edges', 'num_sampled_nodes']
    """

    nodes: dict
    hops: list
    num_sampled_nodes: dict
    num_sampled_edges: dict
    key: int


def check_fanouts(fanouts: Iterable[int], name: str = "fanouts") -> list[int]:
    """``fanouts`` as a list of ints (-1: all neighbours), or a ``ValueError``/``TypeError`` naming ``name``.

    Examples
    --------
    >>> from directload.sampler import check_fanouts
    >>> check_fanouts((10, -1))
    [10, -1]
    >>> check_fanouts([5, -2])
    Traceback (most recent call last):
    ...
    ValueError: fanouts[1] is -2; a fanout is a count of neighbours, or -1 for all of them
    """
    if isinstance(fanouts, (str, bytes)) or not hasattr(fanouts, "__iter__"):
        raise TypeError(f"{name} must be a list of ints, got {type(fanouts).__name__}")
    out = []
    for i, k in enumerate(fanouts):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int, got {type(k).__name__}")
        if k < -1:
            raise ValueError(f"{name}[{i}] is {k}; a fanout is a count of neighbours, or -1 for all of them")
        if k > MAX_FANOUT:
            raise ValueError(f"{name}[{i}] is {k}, over {MAX_FANOUT}; use -1 for all neighbours")
        out.append(int(k))
    if not out:
        raise ValueError(f"{name} is empty; give one fanout per layer")
    return out


def check_device(device: torch.device | str | None, name: str = "device") -> torch.device:
    """Where a sampler makes its batches: ``device`` (None: the CPU) as a usable ``torch.device``, or an error
    naming ``name``, raised before any work.

    Raises
    ------
    TypeError
        Not a str or ``torch.device``.
    ValueError
        Not a device name, or a device other than ``cpu``/``cuda`` (``meta``, ``mps``, ...).
    NoDeviceError
        ``cuda`` on a machine without a usable CUDA device, or ``cuda:N`` past the last one.

    Examples
    --------
    >>> from directload.sampler import check_device
    >>> check_device(None), check_device("cpu")
    (device(type='cpu'), device(type='cpu'))
    >>> check_device("bogus")
    Traceback (most recent call last):
    ...
    ValueError: device='bogus' is not a device (use 'cpu', 'cuda' or 'cuda:N')
    """
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be a str or torch.device, got {type(device).__name__}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}={device!r} is not a device (use 'cpu', 'cuda' or 'cuda:N')") from exc
    try:
        return usable_device(device)  # NoDeviceError for a GPU this machine does not have
    except ValueError as exc:
        raise ValueError(f"{name}={str(device)!r}: a sampler runs on 'cpu' or 'cuda', not {torch.device(device).type}"
                         ) from exc


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_ids_tensor(seeds, what):
    """``TypeError`` unless ``seeds`` is a 1-d int32 or int64 tensor (wherever it lives)."""
    if seeds.dtype not in (torch.int32, torch.int64) or seeds.dim() != 1:
        raise TypeError(f"{what}s must be a 1-d int32 or int64 tensor, got {seeds.dtype} of shape "
                        f"{tuple(seeds.shape)}")


def _seeds_array(seeds, num_nodes, what="seed"):
    if isinstance(seeds, np.ndarray):
        seeds = torch.from_numpy(seeds)
    if not isinstance(seeds, torch.Tensor):
        raise TypeError(f"{what}s must be a tensor of node ids, got {type(seeds).__name__}")
    _check_ids_tensor(seeds, what)
    s = host_of(seeds).cpu().to(torch.int64).numpy()
    if s.size:
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{what} {bad} is outside the graph's {num_nodes} nodes")
    return s


def _device_seeds(seeds, path, num_nodes, launcher, what="seed"):
    """``seeds`` checked and on ``path``'s device: host ids checked on the host and uploaded without a wait; ids
    already on the device checked with one counted host read (their least and greatest)."""
    if isinstance(seeds, torch.Tensor) and seeds.device.type != "cpu" and seeds.device == path.device:
        _check_ids_tensor(seeds, what)
        if seeds.numel():
            lo, hi = launcher.read(torch.stack([seeds.min(), seeds.max()]))
            if lo < 0 or hi >= num_nodes:
                raise IndexError(f"{what} {lo if lo < 0 else hi} is outside the graph's {num_nodes} nodes")
        return seeds.to(torch.int64).contiguous()
    return path.upload(torch.from_numpy(_seeds_array(seeds, num_nodes, what)))


def generator_state(generator: torch.Generator | None) -> tuple[str, torch.Tensor] | None:
    """``generator`` (a ``torch.Generator`` or None) as something that pickles: its device and state.

    Examples
    --------
    >>> import pickle, torch
    >>> g = torch.Generator().manual_seed(3)
    >>> copy = generator_from(pickle.loads(pickle.dumps(generator_state(g))))
    >>> torch.randint(9, (3,), generator=copy).tolist() == torch.randint(9, (3,), generator=g).tolist()
    True
    """
    return None if generator is None else (str(generator.device), generator.get_state())


def generator_from(state: tuple[str, torch.Tensor] | None) -> torch.Generator | None:
    """The ``torch.Generator`` :func:`generator_state` saved (None for None)."""
    if state is None:
        return None
    device, saved = state
    generator = torch.Generator(device=device)
    generator.set_state(saved)
    return generator


def _salted(key, salt):
    """A key mixed with ``salt`` (a non-negative int), in ``[0, 2**63)``."""
    return int(cpu.mix(np.uint64(key) ^ np.uint64(cpu.mix(np.uint64(salt))))) & _KEY_BOUND


class _Keys:
    """Each batch's key: from ``torch``'s default generator (so ``torch.manual_seed`` fixes the batches; torch
    seeds each DataLoader worker's apart) or a ``torch.Generator`` of the sampler's own, whose copy in a worker
    process draws keys mixed with the worker's seed (so neither two workers nor two epochs share streams)."""

    def __init__(self, generator):
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def __getstate__(self):  # a torch.Generator does not pickle: its device and state do
        return {"generator": generator_state(self.generator)}

    def __setstate__(self, state):
        self.generator = generator_from(state["generator"])

    def next(self, key):
        if key is None:
            key = int(torch.randint(_KEY_BOUND, (1,), generator=self.generator))
            worker = torch.utils.data.get_worker_info()
            if self.generator is not None and worker is not None:
                # The worker's seed is drawn anew for every epoch's workers (and differs between them), where
                # the copy of the generator each new worker gets is the same.
                key = _salted(key, worker.seed)
            return key
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not 0 <= key <= _KEY_BOUND:
            raise ValueError(f"key must be an int in [0, 2**63 - 1], got {key!r}")
        return int(key)


class _Marks(threading.local):
    """One all-zero mark array per thread and node type (reset after every batch, never reallocated)."""

    def __reduce__(self):  # a copy in another process starts with marks of its own
        return _Marks, ()

    def get(self, n, name=None):
        cache = self.__dict__.setdefault("arrays", {})
        if (name, n) not in cache:
            cache[name, n] = np.zeros(n, np.int64)
        return cache[name, n]


def _device_path(graph, device):
    """The :class:`~directload.batch_device.BatchDevice` that samples ``graph`` for ``device`` (None: the CPU
    twin runs): a CUDA device over a graph in its memory or unified, or a device given as a BatchDevice, which
    must be able to read the graph where it lives."""
    if isinstance(device, BatchDevice):
        arrays = [a for a in (graph.indptr, graph.indices, graph.eids, graph.weights) if a is not None]
        if not all(device.readable(a) for a in arrays):
            raise ValueError(f"{device!r} cannot read this graph where it lives ({graph.device}); pin it "
                             "(graph.to_unified()) or move it to the device")
        return device
    if device.type == "cuda" and (graph.device.type == "cuda" or is_unified(graph.indptr)):
        return batch_device(device)
    return None


class _DeviceMarks(threading.local):
    """One all-zero mark tensor per thread on a sampler's device (reset after every batch by the kernels)."""

    def __reduce__(self):
        return _DeviceMarks, ()

    def get(self, device, n, name=None):
        cache = self.__dict__.setdefault("tensors", {})
        if (name, n) not in cache:
            cache[name, n] = device.zeros(n, torch.int64)
        return cache[name, n]


def _resolve_device(device):
    """``(torch device, BatchDevice or None as given)``: a BatchDevice's own device, else :func:`check_device`."""
    if isinstance(device, BatchDevice):
        return device.device, device
    return check_device(device), None


class NeighborSampler:
    """Sample a batch's multi-hop neighbourhood from a :class:`~directload.graph.CSCGraph`.

    At each hop, every node to sample gets ``min(fanout, degree)`` distinct
    in-edges picked uniformly at random (``replace=False``; ``fanout`` draws
    with replacement with ``replace=True``; all with ``fanout=-1``), or
    proportionally to the graph's edge weights with ``weighted=True``.
    Neighbours are relabelled to batch-local ids in the order first seen.

    Same key, same batch: each node's picks are a pure function of the
    batch's key, the hop and the node, so a batch does not change with the
    thread count or between CPU and GPU.  The key comes from torch's default
    generator unless ``generator`` is given, so ``torch.manual_seed`` fixes
    the batches.  These are not the framework's own batches: they follow the
    same distribution (uniform without replacement, as DGL and pyg-lib; not
    torch-sparse's, which under-samples each list's last neighbour).

    Parameters
    ----------
    graph : CSCGraph
        Host, memory-mapped, unified or CUDA.
    fanouts : list of int
        Neighbours per node at each hop, the seeds' hop first; -1: all.
    replace : bool
        Pick with replacement.
    weighted : bool
        Pick proportionally to ``graph.weights`` (edges of weight 0 never).
    layout : {"pyg", "dgl"}
        Which nodes each hop samples (see :data:`LAYOUTS`).
    device : str, torch.device or BatchDevice, optional
        Where batches are made and returned: ``"cuda"`` runs the GPU kernels
        over a unified or CUDA graph (the batch never leaves the GPU; one host
        read per batch, plus one per hop of fanout -1); otherwise the CPU twin
        runs on Numba's threads (its batch copied to ``device``).  A
        :class:`~directload.batch_device.BatchDevice` runs the device path on
        it (the host emulation's, in tests).
    generator : torch.Generator, optional

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> from directload.sampler import NeighborSampler
    >>> g = CSCGraph.from_edge_index(torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]), num_nodes=4)
    >>> s = NeighborSampler(g, [2])
    >>> b = s.sample(torch.tensor([0]), key=7)
    >>> b.num_sampled_nodes, b.num_sampled_edges
    ([1, 2], [2])
    >>> b.hops[0][1].tolist()  # both edges go into the seed, local id 0
    [0, 0]
    >>> torch.equal(s.sample(torch.tensor([0]), key=7).nodes, b.nodes)
    True
    """

    def __init__(self, graph: CSCGraph, fanouts: Iterable[int], *, replace: bool = False, weighted: bool = False,
                 layout: str = "pyg", device: torch.device | str | BatchDevice | None = None,
                 generator: torch.Generator | None = None) -> None:
        if not isinstance(graph, CSCGraph):
            raise TypeError(f"graph must be a directload.graph.CSCGraph, got {type(graph).__name__}")
        if graph.num_src_nodes != graph.num_nodes:
            raise ValueError("a homogeneous sampler needs as many source as destination nodes; "
                             "use HeteroNeighborSampler for a bipartite relation")
        self.device, given = _resolve_device(device)
        self.fanouts = check_fanouts(fanouts)
        _check_layout(layout)
        if weighted and graph.weights is None:
            raise ValueError("weighted=True needs a graph with weights")
        self.graph, self.replace, self.weighted, self.layout = graph, bool(replace), bool(weighted), layout
        if graph.device.type != "cpu" and self.device.type != "cuda":
            raise ValueError(f"the graph lives on {graph.device}: sample it with device='cuda' (or pass "
                             "graph.to('cpu'))")
        self._keys = _Keys(generator)
        self._marks = _Marks()
        self._path = _device_path(graph, given or self.device)
        self._device_marks = _DeviceMarks()

    def __repr__(self):
        return (f"NeighborSampler(fanouts={self.fanouts}, replace={self.replace}, weighted={self.weighted}, "
                f"layout={self.layout!r}, device={str(self.device)!r}, backend={self.backend!r})")

    @property
    def backend(self) -> str:
        """``"cuda"`` (the GPU kernels), ``"emulated"`` (them on the host emulation) or ``"cpu"`` (the Numba
        twin)."""
        if self._path is None:
            return "cpu"
        return "cuda" if self._path.device.type == "cuda" else self._path.name

    @property
    def batch_device(self) -> BatchDevice | None:
        """The device path that makes the batches (None: the CPU twin)."""
        return self._path

    def sample(self, seeds: torch.Tensor | np.ndarray, *, key: int | None = None) -> SampledBatch:
        """Sample one batch around ``seeds`` (node ids; a repeated one keeps its place).

        Returns a :class:`SampledBatch` on the sampler's device.  ``key``
        (an int in ``[0, 2**63)``) replays a batch; by default one is drawn.

        Raises
        ------
        IndexError
            A seed outside the graph.
        ValueError
            A bad key.
        """
        path = self._path
        if path is not None:
            launcher = path.launcher()
            on_device = _device_seeds(seeds, path, self.graph.num_nodes, launcher)
            key = self._keys.next(key)
            g = self.graph
            marks = self._device_marks.get(path, g.num_nodes)
            nodes, hops, nn, ne = run_batch(launcher, g.indptr, g.indices, g.eids,
                                            g.weights if self.weighted else None, on_device, self.fanouts,
                                            self.replace, key, self.layout, marks)
            return SampledBatch(nodes, hops, nn, ne, key)
        s = _seeds_array(seeds, self.graph.num_nodes)
        key = self._keys.next(key)
        indptr, indices, eids, weights = self.graph.numpy()
        host_nodes, host_hops, nn, ne = cpu.sample_batch(indptr, indices, eids, weights if self.weighted else None,
                                                         s, self.fanouts, self.replace, key, self.layout,
                                                         self._marks.get(self.graph.num_nodes))
        dev = self.device
        out_hops = [tuple(torch.from_numpy(a).to(dev) for a in hop) for hop in host_hops]
        return SampledBatch(torch.from_numpy(host_nodes).to(dev), out_hops, nn, ne, key)


class HeteroNeighborSampler:
    """:class:`NeighborSampler` over a heterogeneous graph: one CSC and one fanout list per edge type.

    At each hop, for every edge type ``(src, rel, dst)`` in the order given,
    the ``dst`` nodes to sample (new at the hop before with ``layout="pyg"``,
    all so far with ``"dgl"``) get their picks from that relation, and new
    ``src`` nodes join the batch for the next hop.  With ``device="cuda"``
    over relations that are all unified or on the GPU, the GPU kernels make
    the batch there (the same batch as the CPU twin's for the same key; one
    host read per batch, plus one per relation and hop of fanout -1);
    otherwise the CPU twin runs and its batch is copied to ``device``.

    Parameters
    ----------
    graphs : dict
        ``{(src, rel, dst): CSCGraph}`` with ``num_nodes`` the ``dst`` type's
        count and ``num_src_nodes`` the ``src`` type's.
    num_nodes : dict
        ``{node_type: count}``.
    fanouts : dict
        ``{edge_type: [fanout per hop]}``, all of one length.
    replace, weighted, layout, device, generator
        As for :class:`NeighborSampler`.

    Examples
    --------
    >>> import torch
    >>> from directload.graph import CSCGraph
    >>> from directload.sampler import HeteroNeighborSampler
    >>> writes = CSCGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 1, num_src_nodes=2)
    >>> s = HeteroNeighborSampler({("author", "writes", "paper"): writes}, {"author": 2, "paper": 1},
    ...                           {("author", "writes", "paper"): [-1]})
    >>> b = s.sample({"paper": torch.tensor([0])}, key=1)
    >>> b.nodes["author"].tolist(), b.num_sampled_nodes
    ([0, 1], {'author': [0, 2], 'paper': [1, 0]})
    """

    def __init__(self, graphs: dict[tuple[str, str, str], CSCGraph], num_nodes: Mapping[str, int],
                 fanouts: dict[tuple[str, str, str], Iterable[int]], *, replace: bool = False,
                 weighted: bool = False, layout: str = "pyg", device: torch.device | str | BatchDevice | None = None,
                 generator: torch.Generator | None = None) -> None:
        self.device, given = _resolve_device(device)
        _check_layout(layout)
        if not isinstance(graphs, dict) or not graphs:
            raise TypeError("graphs must be a non-empty dict {(src, rel, dst): CSCGraph}")
        if not isinstance(fanouts, dict):
            raise TypeError("fanouts must be a dict {edge_type: [fanout per hop]}")
        self.num_nodes = dict(num_nodes)
        self.fanouts, hops = {}, set()
        for et, g in graphs.items():
            if not (isinstance(et, tuple) and len(et) == 3):
                raise TypeError(f"edge type {et!r} is not a (src, rel, dst) tuple")
            if not isinstance(g, CSCGraph):
                raise TypeError(f"graphs[{et!r}] must be a CSCGraph, got {type(g).__name__}")
            src, _, dst = et
            for t in (src, dst):
                if t not in self.num_nodes:
                    raise ValueError(f"edge type {et!r} names node type {t!r}, which num_nodes lacks")
            if g.num_nodes != self.num_nodes[dst] or g.num_src_nodes != self.num_nodes[src]:
                raise ValueError(f"graphs[{et!r}] has {g.num_src_nodes} x {g.num_nodes} nodes, num_nodes says "
                                 f"{self.num_nodes[src]} x {self.num_nodes[dst]}")
            if weighted and g.weights is None:
                raise ValueError(f"weighted=True needs weights on every relation; {et!r} has none")
            if et not in fanouts:
                raise ValueError(f"fanouts has no entry for edge type {et!r}")
            self.fanouts[et] = check_fanouts(fanouts[et], f"fanouts[{et!r}]")
            hops.add(len(self.fanouts[et]))
        unknown = set(fanouts) - set(graphs)
        if unknown:
            raise ValueError(f"fanouts names edge types the graph lacks: {sorted(map(str, unknown))}")
        if len(hops) != 1:
            raise ValueError(f"every edge type needs the same number of fanouts, got lengths {sorted(hops)}")
        self.num_hops = hops.pop()
        self.graphs, self.replace, self.weighted, self.layout = dict(graphs), bool(replace), bool(weighted), layout
        self._keys = _Keys(generator)
        self._marks = _Marks()
        self._arrays = None
        paths = {_device_path(g, given or self.device) for g in self.graphs.values()}
        self._path = paths.pop() if len(paths) == 1 else None  # every relation where the device reads it, or none
        self._device_marks = _DeviceMarks()

    @property
    def batch_device(self) -> BatchDevice | None:
        """The device path that makes the batches (None: the CPU twin, its batch copied to ``device``)."""
        return self._path

    def _sample_on(self, path, seeds, key):
        launcher = path.launcher()
        on_device = {t: _device_seeds(ids, path, self.num_nodes[t], launcher) for t, ids in seeds.items()}
        key = self._keys.next(key)
        graphs = {et: (g.indptr, g.indices, g.eids, g.weights if self.weighted else None)
                  for et, g in self.graphs.items()}
        keys = {et: _salted(key, index + 1) for index, et in enumerate(self.graphs)}
        marks = {t: self._device_marks.get(path, n, t) for t, n in self.num_nodes.items()}
        nodes, hops, nn, ne = run_hetero_batch(launcher, graphs, self.num_nodes, on_device, self.fanouts,
                                               self.replace, keys, self.layout, marks)
        return HeteroSampledBatch(nodes, hops, nn, ne, key)

    def _numpy(self):
        if self._arrays is None:
            self._arrays = {et: tuple(None if a is None else np.ascontiguousarray(a)
                                      for a in (g.numpy() if g.device.type == "cpu" else g.to("cpu").numpy()))
                            for et, g in self.graphs.items()}
        return self._arrays

    def sample(self, seeds: dict[str, torch.Tensor | np.ndarray], *, key: int | None = None
               ) -> HeteroSampledBatch:
        """Sample one batch around ``seeds``, ``{node_type: ids}``; returns a :class:`HeteroSampledBatch`."""
        if not isinstance(seeds, dict) or not seeds:
            raise TypeError("seeds must be a non-empty dict {node_type: ids}")
        for t in seeds:
            if t not in self.num_nodes:
                raise ValueError(f"seed type {t!r} is not a node type of the graph")
        if self._path is not None:
            return self._sample_on(self._path, seeds, key)
        arrays = self._numpy()
        key = self._keys.next(key)
        buf = {t: np.empty(0, np.int64) for t in self.num_nodes}
        count = {t: 0 for t in self.num_nodes}
        marks = {t: self._marks.get(n, t) for t, n in self.num_nodes.items()}
        try:
            for t, ids in seeds.items():
                s = _seeds_array(ids, self.num_nodes[t])
                buf[t] = np.empty(s.size, np.int64)
                count[t] = cpu.place_seeds(buf[t], marks[t], s)
            nn = {t: [count[t]] for t in self.num_nodes}
            ne: dict[tuple[str, str, str], list[int]] = {et: [] for et in self.graphs}
            hops, start = [], {t: 0 for t in self.num_nodes}
            for hop in range(self.num_hops):
                end = dict(count)
                out = {}
                for index, et in enumerate(self.graphs):
                    src, _, dst = et
                    lo = start[dst] if self.layout == "pyg" else 0
                    frontier = buf[dst][lo:end[dst]]
                    indptr, indices, eids, weights = arrays[et]
                    nbr, eid, offsets = cpu.sample_hop(indptr, indices, eids, weights if self.weighted else None,
                                                       frontier, self.fanouts[et][hop], self.replace,
                                                       _salted(key, index + 1), hop)
                    if buf[src].size < count[src] + nbr.size:
                        buf[src] = np.concatenate([buf[src][:count[src]],
                                                   np.empty(max(nbr.size, count[src]), np.int64)])
                    row = np.empty(nbr.size, np.int64)
                    count[src] = cpu.relabel(buf[src], count[src], marks[src], nbr, row)
                    col = np.repeat(np.arange(lo, end[dst], dtype=np.int64), np.diff(offsets))
                    out[et] = tuple(torch.from_numpy(a).to(self.device) for a in (row, col, eid))
                    ne[et].append(int(nbr.size))
                for t in self.num_nodes:
                    nn[t].append(count[t] - end[t])
                hops.append(out)
                start = end
            nodes = {t: torch.from_numpy(buf[t][:count[t]].copy()).to(self.device) for t in self.num_nodes}
            return HeteroSampledBatch(nodes, hops, nn, ne, key)
        finally:
            for t in self.num_nodes:
                cpu.reset_marks(marks[t], buf[t], count[t])

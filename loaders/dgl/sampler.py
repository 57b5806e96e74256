"""``NeighborSampler``: directload's neighbour sampler as a DGL ``BlockSampler``, for DGL's DataLoader and ours."""

from __future__ import annotations

import copy
import os
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Self

import dgl
import torch
from dgl.dataloading import BlockSampler

from directload.batch_device import BatchDevice, batch_device
from directload.errors import SamplerWarning
from directload.graph import CSCGraph
from directload.sampler import HeteroNeighborSampler, check_device, check_fanouts, generator_from, generator_state
from directload.sampler import NeighborSampler as _Sampler

__all__ = ["NeighborSampler"]

_EDGE_DIRS = ("in", "out")
#: Every sampler of this process: a child forked while one built a plan (its lock held by a thread the child
#: does not have) gets fresh locks.
_LIVE: weakref.WeakSet[NeighborSampler] = weakref.WeakSet()


def _fresh_locks():
    for sampler in list(_LIVE):
        sampler._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


def _check_layers(fanouts):
    """DGL's fanouts: a non-empty list whose layers are ints or dicts ``{etype: int}``; ints checked here, dict
    values once the graph names the edge types (:meth:`NeighborSampler._plan`)."""
    if isinstance(fanouts, (str, bytes, Mapping)) or not hasattr(fanouts, "__iter__"):
        raise TypeError(f"fanouts must be a list of ints or of dicts {{etype: int}}, got {type(fanouts).__name__}")
    layers = list(fanouts)
    if not any(isinstance(layer, Mapping) for layer in layers):
        return check_fanouts(layers)
    for i, layer in enumerate(layers):
        if isinstance(layer, Mapping) and not layer:
            raise ValueError(f"fanouts[{i}] is an empty dict; give a fanout for every edge type")
    return layers


def _per_etype(layers, g):
    """``{canonical etype: [fanout per layer]}``; every dict layer names each edge type of ``g`` once."""
    etypes = g.canonical_etypes
    out = {et: [] for et in etypes}
    for i, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            for et in etypes:
                out[et].append(layer)
            continue
        given = {}
        for k, v in layer.items():
            try:
                et = g.to_canonical_etype(k)
            except dgl.DGLError as exc:
                raise ValueError(f"fanouts[{i}] names {k!r}, which is not an edge type of the graph") from exc
            if et in given:
                raise ValueError(f"fanouts[{i}] names edge type {et!r} twice")
            given[et] = v
        missing = [et for et in etypes if et not in given]
        if missing:
            raise ValueError(f"fanouts[{i}] has no fanout for edge types {missing}; a dict layer names every one")
        for et in etypes:
            out[et].append(given[et])
    return {et: check_fanouts(f, f"fanouts[{et!r}]") for et, f in out.items()}


def _weights(g, et, prob, eids):
    """The CSC-ordered weights of ``et`` from edge feature ``prob`` (a bool mask: 0 or 1); all 1 where the edge
    type lacks it (DGL samples those uniformly); ``(weights, the feature or None)``."""
    data = g.edges[et].data
    if prob not in data:
        return torch.ones(eids.numel(), dtype=torch.float32, device=eids.device), None
    t = data[prob]
    if t.numel() != g.num_edges(et):
        raise ValueError(f"edge feature {prob!r} of {et!r} has shape {tuple(t.shape)}; prob and mask name one "
                         "scalar per edge")
    w = t.reshape(-1)
    w = w if w.dtype in (torch.float32, torch.float64) else w.to(torch.float32)
    return w.to(eids.device)[eids.to(torch.int64)], t


class _Plan:
    """directload's sampler over one DGL graph: its CSCs, and weights, read once, with what they were read from
    (the graph's index, the weight tensors and their versions, the sampler's settings)."""

    def __init__(self, g, settings, path, csc=None):
        fanouts, prob, replace, generator = settings
        self.path = path
        self.settings = (copy.deepcopy(fanouts), prob, replace, generator)  # a copy: fanouts[0] = 3 is seen
        self.index = _index(g)
        layers = _check_layers(fanouts)
        self.ntypes, self.etypes = list(g.ntypes), list(g.canonical_etypes)
        per_etype = {et: f[::-1] for et, f in _per_etype(layers, g).items()}  # DGL's fanouts[0]: the input layer
        if prob is not None and not any(prob in g.edges[et].data for et in self.etypes):
            raise KeyError(f"prob {prob!r} is not an edge feature of the graph")
        graphs, self.sources = {}, []
        for et in self.etypes:
            if csc is not None:
                graphs[et] = _readable(_given_csc(csc, g, prob), path)
                continue
            indptr, indices, eids = g.adj_tensors("csc", et)  # _structure_unsupported: CSC is allowed
            weights = None
            if prob is not None:
                weights, source = _weights(g, et, prob, eids)
                self.sources.append(source)  # held, so the signature's ids stay theirs
            if weights is not None:
                weights = weights.to(indptr.device)
            graphs[et] = _readable(CSCGraph(indptr, indices, eids=eids, weights=weights,
                                            num_src_nodes=g.num_nodes(et[0])), path)
        self.homogeneous = len(self.ntypes) == 1 and len(self.etypes) == 1
        kw = dict(replace=replace, weighted=prob is not None, layout="dgl", generator=generator, device=path)
        if self.homogeneous:
            self.sampler = _Sampler(graphs[self.etypes[0]], per_etype[self.etypes[0]], **kw)
        else:
            self.sampler = HeteroNeighborSampler(graphs, {nt: g.num_nodes(nt) for nt in self.ntypes}, per_etype,
                                                 **kw)
        self.weights_read = _weights_read(g, prob)

    def current(self, g, settings, path):
        """Whether this plan still samples ``g`` as the sampler's ``settings`` ask, on ``path``: the graph's
        structure is the one read (its index, by identity: O(1)), and so are ``prob``'s tensors and their
        versions."""
        return (self.index is not None and _index(g) is self.index and self.settings == settings
                and self.path is path and self.weights_read == _weights_read(g, settings[1]))

    def sample(self, seeds):
        """``(nodes, hops, num_sampled_nodes)`` by node and edge type, from ``{ntype: ids}``."""
        if not self.homogeneous:
            b = self.sampler.sample(seeds)
            return b.nodes, b.hops, b.num_sampled_nodes
        (nt,), (et,) = self.ntypes, self.etypes
        b = self.sampler.sample(seeds.get(nt, torch.empty(0, dtype=torch.int64)))
        return {nt: b.nodes}, [{et: hop} for hop in b.hops], {nt: b.num_sampled_nodes}


def _given_csc(csc, g, prob):
    """The CSC given for ``g`` (``csc=``), checked against it: one relation, its node and edge counts."""
    if len(g.canonical_etypes) != 1 or len(g.ntypes) != 1:
        raise ValueError("csc= is for a graph of one node and one edge type")
    if prob is not None:
        raise ValueError("csc= carries no weights of the graph's: leave out prob (or mask), or csc=")
    if csc.num_nodes != g.num_nodes() or csc.num_edges != g.num_edges():
        raise ValueError(f"csc has {csc.num_nodes} nodes and {csc.num_edges} edges; the graph has {g.num_nodes()} "
                         f"and {g.num_edges()}")
    return csc


def _readable(graph, path):
    """``graph`` where ``path``'s kernels read it: as it is (on the device, or pinned, as DGL pins a graph for
    ``use_uva``), else its host arrays pinned and mapped in place."""
    if path is None:
        return graph
    arrays = [a for a in (graph.indptr, graph.indices, graph.eids, graph.weights) if a is not None]
    return graph if all(path.readable(a) for a in arrays) else graph.to_unified()


def _index(g):
    """DGL's index of ``g``'s structure, or None.  DGL never changes an index in place (its own mutators raise
    "not mutable"): ``add_nodes``, ``add_edges``, ``remove_nodes`` and ``remove_edges`` each give the graph a
    new one (``self._graph = ...`` in dgl/heterograph.py, DGL 2.1), so a plan that holds the index it read
    (its id then cannot be reused) knows by identity whether the graph changed since."""
    return getattr(g, "_graph", None)


def _weights_read(g, prob):
    """Which weight tensor of each edge type (and its version: in-place writes bump it) a plan reads; the plan
    holds the tensors (:attr:`_Plan.sources`), so their ids stay theirs."""
    if prob is None:
        return ()
    return tuple((id(t), t._version) if t is not None else None
                 for t in (g.edges[et].data.get(prob) for et in g.canonical_etypes))


def _structure_unsupported(g):
    """Why directload cannot sample ``g``'s structure (None: it can): a block, or formats without CSC.  Asked
    only when a plan is built (``g.formats()`` costs ~20 us, a batch's checks well under one)."""
    if g.is_block:
        return "blocks as the graph"
    formats = g.formats()
    if "csc" not in formats["created"] + formats["not created"]:
        return f"graphs whose formats {formats['created']} exclude CSC"
    return None


def _csc(row, col, n_dst, idtype):
    """A hop's edges as the block's CSC: they come grouped by destination, in order (``col`` sorted), so the
    pointer is where each destination's edges start (a search, which waits for nothing on a GPU, where a
    count would read its length back); DGL then neither infers node counts nor converts COO for its in-edge
    message passing.  Block edge ``i`` is the hop's edge ``i`` (its ``dgl.EID`` set by the caller), and the
    CSC says so with its edge ids written out: DGL's CPU kernels through libxsmm (GAT's edge softmax and
    attention) refuse a CSC whose edge ids are left implicit."""
    device = col.device
    indptr = torch.searchsorted(col, torch.arange(n_dst + 1, dtype=col.dtype, device=device)).to(idtype)
    return "csc", (indptr, row.to(idtype), torch.arange(len(row), dtype=idtype, device=device))


def _blocks(g, nodes, hops, num_nodes, device):
    """DGL blocks, the input layer's first, of a batch sampled with ``layout="dgl"``: hop ``h``'s destination
    nodes are every node reached before it, its source nodes those plus the hop's new ones (dst-first)."""
    idtype, blocks = g.idtype, []
    for h, hop in enumerate(hops):
        n_dst = {nt: sum(num_nodes[nt][:h + 1]) for nt in g.ntypes}
        n_src = {nt: sum(num_nodes[nt][:h + 2]) for nt in g.ntypes}
        block = dgl.create_block({et: _csc(row, col, n_dst[et[2]], idtype) for et, (row, col, _) in hop.items()},
                                 num_src_nodes=n_src, num_dst_nodes=n_dst, idtype=idtype)
        for nt in g.ntypes:
            block.srcnodes[nt].data[dgl.NID] = nodes[nt][:n_src[nt]].to(idtype)
            block.dstnodes[nt].data[dgl.NID] = nodes[nt][:n_dst[nt]].to(idtype)
        for et, (_, _, eid) in hop.items():
            block.edges[et].data[dgl.EID] = eid.to(idtype)
        blocks.insert(0, block if block.device == device else block.to(device))
    return blocks


def _device_of(seed_nodes):
    t = next(iter(seed_nodes.values()), None) if isinstance(seed_nodes, Mapping) else seed_nodes
    return t.device if isinstance(t, torch.Tensor) else torch.device("cpu")


class NeighborSampler(BlockSampler):
    """DGL's :class:`~dgl.dataloading.NeighborSampler`, sampled by directload: the same distribution and blocks
    of the same form, not the same batches.

    Every destination node gets ``min(fanout, in-degree)`` distinct in-edges
    picked uniformly at random (``fanout`` draws with ``replace=True``, all
    with -1), or in proportion to the edge feature ``prob`` (a ``mask``
    feature: uniformly among its true edges); see
    :class:`directload.sampler.NeighborSampler`.  ``sample_blocks`` returns
    ``(input_nodes, output_nodes, blocks)`` as DGL's does: blocks from
    :func:`dgl.create_block`, destination nodes first among the source nodes,
    ``srcdata[dgl.NID]``, ``dstdata[dgl.NID]`` and ``edata[dgl.EID]`` in the
    graph's id type, a dict per node or edge type on a heterogeneous graph
    (an edge type of fanout 0 gives an empty relation).  Blocks are made on
    the CPU and returned on ``output_device``, else the seeds' device.

    The graph's CSC (``g.adj_tensors("csc")``), and the weights, are read once
    per graph and kept while the graph lives.  They are read again after any
    change to the graph's structure (``add_nodes``, ``add_edges``,
    ``remove_nodes``, ``remove_edges``, on any relation: each gives the graph
    a new DGL graph index, compared by identity at every batch), when
    ``prob``'s tensor is replaced or written in place, and when ``fanouts``,
    ``prob``, ``replace`` or ``generator`` is set anew.  Each batch's random
    key comes from torch's default generator (``torch.manual_seed`` fixes the
    batches) unless ``generator`` is given, and the picks do not depend on
    Numba's thread count.

    What directload does not implement (``edge_dir="out"``, ``exclude_eids``
    from an edge-wise loader's ``exclude=``, a graph
    that is not a ``DGLGraph``, a block, formats without CSC) is sampled by
    DGL's own ``NeighborSampler.sample_blocks`` over this sampler's settings
    (``fused`` and all), said once per sampler and reason in a one-line
    ``UserWarning``.  A subclass that overrides ``sample_blocks`` runs as
    written.

    Parameters
    ----------
    fanouts, edge_dir, prob, mask, replace, prefetch_node_feats, prefetch_labels, prefetch_edge_feats, \
output_device, fused
        As for DGL's ``NeighborSampler``: ``fanouts[0]`` is the input layer's;
        a layer is an int or a dict ``{etype: int}`` naming every edge type.
        ``fused`` only matters to DGL's sampler, where it runs instead.
    generator : torch.Generator, optional
        Where each batch's key is drawn.
    device : str, torch.device or BatchDevice, optional
        Where batches are sampled (directload's option).  None: on the GPU
        for seeds or a graph there, else the CPU twin; ``"cuda"`` or a
        :class:`~directload.batch_device.BatchDevice` (the host emulation's,
        in tests): always there.
    csc : CSCGraph, optional
        The graph's CSC when it is built already (a dataset's kept CSC,
        mapped from its files: one copy in memory for every process of the
        machine, as ``directload train --nproc N`` shares it), read instead
        of DGL's.  One node and edge type; its counts must be the graph's and
        its edge ids DGL's.

    Raises
    ------
    TypeError, ValueError
        Fanouts that are not a list of ints or dicts, a fanout below -1,
        ``edge_dir`` neither ``"in"`` nor ``"out"``, or both ``prob`` and
        ``mask`` (at construction); dict layers that do not name each edge
        type once (at the first batch of a graph).
    IndexError
        A seed outside the graph (before any sampling).

    Examples
    --------
    >>> import dgl, torch
    >>> from directload.loaders.dgl import NeighborSampler
    >>> g = dgl.graph((torch.tensor([1, 2, 3, 0]), torch.tensor([0, 0, 0, 1])))
    >>> sampler = NeighborSampler([2], generator=torch.Generator().manual_seed(0))
    >>> input_nodes, output_nodes, (block,) = sampler.sample_blocks(g, torch.tensor([0]))
    >>> block.num_dst_nodes(), block.num_src_nodes(), block.num_edges()
    (1, 3, 2)
    >>> input_nodes[0].item(), block.dstdata[dgl.NID].tolist()
    (0, [0])
    >>> src, dst = block.edges()
    >>> g.has_edges_between(input_nodes[src], output_nodes[dst]).all().item()
    True
    """

    def __init__(self, fanouts: Sequence[int | Mapping[str | tuple[str, str, str], int]], edge_dir: str = "in",
                 prob: str | None = None, mask: str | None = None, replace: bool = False,
                 prefetch_node_feats: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
                 prefetch_labels: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
                 prefetch_edge_feats: Sequence[str] | Mapping[Any, Sequence[str]] | None = None,
                 output_device: torch.device | str | None = None, fused: bool = True, *,
                 generator: torch.Generator | None = None, device: torch.device | str | BatchDevice | None = None,
                 csc: CSCGraph | None = None) -> None:
        layers = _check_layers(fanouts)
        if csc is not None and not isinstance(csc, CSCGraph):
            raise TypeError(f"csc must be a directload.graph.CSCGraph, got {type(csc).__name__}")
        self.csc = csc
        self.sample_on = device if device is None or isinstance(device, BatchDevice) else check_device(device)
        if edge_dir not in _EDGE_DIRS:
            raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        super().__init__(prefetch_node_feats=prefetch_node_feats, prefetch_labels=prefetch_labels,
                         prefetch_edge_feats=prefetch_edge_feats, output_device=output_device)
        # Every attribute DGL's NeighborSampler has, as its constructor sets them (it checks prob and mask; a
        # mask is its prob of 0/1): DGL's sample_blocks runs over this sampler for what directload does not
        # implement (_dgl_sample_blocks), reading the settings as they are at that batch.
        self.__dict__.update(vars(dgl.dataloading.NeighborSampler(
            fanouts if isinstance(fanouts, Sequence) else layers, edge_dir=edge_dir, prob=prob, mask=mask,
            replace=replace, prefetch_node_feats=prefetch_node_feats, prefetch_labels=prefetch_labels,
            prefetch_edge_feats=prefetch_edge_feats, output_device=output_device, fused=fused)))
        self.generator = generator
        self._plans: weakref.WeakKeyDictionary[Any, _Plan] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        _LIVE.add(self)

    @classmethod
    def from_dgl(cls, sampler: dgl.dataloading.NeighborSampler, *, generator: torch.Generator | None = None) -> Self:
        """This sampler with the settings of DGL's ``NeighborSampler`` ``sampler`` (fanouts, edge direction,
        prob or mask, replacement, prefetched fields, output device, fused): its settings only, not a
        subclass's methods or attributes of its own (:func:`~directload.loaders.dgl.resolve_sampler` keeps such
        a sampler).

        Examples
        --------
        >>> import dgl
        >>> from directload.loaders.dgl import NeighborSampler
        >>> theirs = dgl.dataloading.NeighborSampler([5, 10], prefetch_node_feats=["feat"])
        >>> ours = NeighborSampler.from_dgl(theirs)
        >>> ours.fanouts, ours.prefetch_node_feats
        ([5, 10], ['feat'])
        """
        if not isinstance(sampler, dgl.dataloading.NeighborSampler):
            raise TypeError(f"sampler must be a dgl.dataloading.NeighborSampler, got {type(sampler).__name__}")
        return cls(sampler.fanouts, edge_dir=sampler.edge_dir, prob=sampler.prob, replace=sampler.replace,
                   prefetch_node_feats=sampler.prefetch_node_feats, prefetch_labels=sampler.prefetch_labels,
                   prefetch_edge_feats=sampler.prefetch_edge_feats, output_device=sampler.output_device,
                   fused=sampler.fused, generator=generator)

    def __repr__(self):
        return (f"NeighborSampler(fanouts={self.fanouts}, edge_dir={self.edge_dir!r}, prob={self.prob!r}, "
                f"replace={self.replace})")

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_plans"], state["_lock"]  # a worker process reads the graph again
        state["g"], state["mapping"] = None, {}  # DGL's fused sampler's cache of the last graph, not shipped
        state["generator"] = generator_state(state["generator"])  # a torch.Generator does not pickle
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.generator = generator_from(state["generator"])
        self._plans = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        _LIVE.add(self)

    def unsupported(self, g: object,
                    exclude_eids: torch.Tensor | Mapping[Any, torch.Tensor] | None = None) -> str | None:
        """Why DGL's own sampler runs for this graph and batch (None: directload's runs).

        Examples
        --------
        >>> import dgl
        >>> from directload.loaders.dgl import NeighborSampler
        >>> g = dgl.rand_graph(10, 30)
        >>> NeighborSampler([2]).unsupported(g), NeighborSampler([2], edge_dir="out").unsupported(g)
        (None, "edge_dir='out'")
        """
        return self._batch_unsupported(g, exclude_eids) or _structure_unsupported(g)

    def _batch_unsupported(self, g, exclude_eids):
        """:meth:`unsupported`'s checks that every batch makes (each well under a microsecond)."""
        if self.edge_dir != "in":
            return f"edge_dir={self.edge_dir!r}"
        if exclude_eids is not None:
            return "exclude_eids (an edge-wise loader's exclude=)"
        if not isinstance(g, dgl.DGLGraph):
            return f"graphs of type {type(g).__name__}"
        return None

    def sample_blocks(self, g: dgl.DGLGraph, seed_nodes: torch.Tensor | Mapping[str, torch.Tensor],
                      exclude_eids: torch.Tensor | Mapping[Any, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor | Mapping[str, torch.Tensor], torch.Tensor | Mapping[str, torch.Tensor],
                                 list[dgl.DGLGraph]]:
        """``(input_nodes, output_nodes, blocks)`` around ``seed_nodes`` (distinct ids; ``{ntype: ids}`` on a
        graph of several node types), as DGL's ``NeighborSampler.sample_blocks``.

        Returns
        -------
        input_nodes : tensor or dict
            ``blocks[0].srcdata[dgl.NID]``.
        output_nodes : tensor or dict
            ``seed_nodes`` as given.
        blocks : list of DGLBlock
            On ``output_device``, else the seeds' device.

        Examples
        --------
        >>> import dgl, torch
        >>> from directload.loaders.dgl import NeighborSampler
        >>> g = dgl.rand_graph(50, 400)
        >>> _, _, blocks = NeighborSampler([3, 3]).sample_blocks(g, torch.tensor([0, 1]))
        >>> [b.num_dst_nodes() for b in blocks][-1], bool((blocks[-1].in_degrees() <= 3).all())
        (2, True)
        """
        plan = self._batch_unsupported(g, exclude_eids) or self._plan(g, self._path(g, seed_nodes))
        if isinstance(plan, str):
            self._warn(plan)
            return self._dgl_sample_blocks(g, seed_nodes, exclude_eids)
        if isinstance(seed_nodes, Mapping):
            seeds = dict(seed_nodes)
        elif len(plan.ntypes) == 1:
            seeds = {plan.ntypes[0]: seed_nodes}
        else:
            raise TypeError("this graph has several node types: pass the seeds as a dict {ntype: ids}")
        unknown = [t for t in seeds if t not in plan.ntypes]
        if unknown:
            raise ValueError(f"seed types {unknown} are not node types of the graph {plan.ntypes}")
        device = torch.device(self.output_device) if self.output_device is not None else _device_of(seed_nodes)
        nodes, hops, num_nodes = plan.sample(seeds)
        blocks = _blocks(g, nodes, hops, num_nodes, device)
        return blocks[0].srcdata[dgl.NID], seed_nodes, blocks

    @property
    def asks_for_gpu(self) -> bool:
        """Whether ``device=`` asks for a GPU, whatever the graph and the seeds."""
        where = self.sample_on.device if isinstance(self.sample_on, BatchDevice) else self.sample_on
        return where is not None and where.type == "cuda"

    def _path(self, g, seed_nodes):
        """The device path of a batch (None: the CPU twin): ``device=`` as given, else a GPU that holds the graph
        or the seeds."""
        if self.sample_on is not None:
            return batch_device(self.sample_on)
        where = g.device if g.device.type == "cuda" else _device_of(seed_nodes)
        return batch_device(where) if where.type == "cuda" else None

    def _plan(self, g, path):
        """The plan for ``g`` on ``path`` as it is now (built again when the graph, its weights, the settings or
        the path changed), or why its structure is not directload's to sample."""
        settings = (self.fanouts, self.prob, bool(self.replace), self.generator)
        with self._lock:
            plan = self._plans.get(g)
            if plan is not None and plan.current(g, settings, path):
                return plan
            reason = _structure_unsupported(g)
            if reason is not None:
                return reason
            plan = _Plan(g, settings, path, self.csc)
            self._plans[g] = plan
            return plan

    def _dgl_sample_blocks(self, g, seed_nodes, exclude_eids):
        """DGL's ``NeighborSampler.sample_blocks`` itself, over this sampler's attributes (DGL's, from
        ``__init__``) as they are now."""
        return dgl.dataloading.NeighborSampler.sample_blocks(self, g, seed_nodes, exclude_eids=exclude_eids)

    def _warn(self, reason):
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"directload's sampler does not implement {reason}: DGL's own sampler runs instead",
                          SamplerWarning, stacklevel=3)

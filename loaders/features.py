"""Node feature sources of the loader: which tables feed which block fields, and the batched gather."""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from directload.kernels import gather, gather_async

__all__ = ["FeatureSpec", "resolve_features", "fetch_batch"]


@dataclass
class FeatureSpec:
    """Where the loader gets each prefetched node field.

    Attributes
    ----------
    inputs : dict
        ``name -> {ntype: table}`` for fields of ``blocks[0].srcdata``.
    labels : dict
        ``name -> {ntype: table}`` for fields of ``blocks[-1].dstdata``.
    hetero : bool
        Whether the graph has several node types (fields become per-type dicts).
    prefetchers : list
        Tables or stores with a ``prefetch(ids)`` hook (fed upcoming batches).
    """

    inputs: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    hetero: bool = False
    prefetchers: list = field(default_factory=list)


def _names_by_type(names, ntypes, graph):
    """Normalise DGL's ``list[str] | dict[ntype, list[str]]`` to ``{name: [ntype, ...]}``."""
    out = {}
    if isinstance(names, Mapping):
        for ntype, ns in names.items():
            for n in ns:
                out.setdefault(n, []).append(ntype)
        return out
    for n in names:
        out[n] = [t for t in ntypes if n in graph.nodes[t].data] if len(ntypes) > 1 else list(ntypes)
    return out


def resolve_features(graph, node_feats, labels, features=None):
    """Build the :class:`FeatureSpec` for a sampler's prefetch lists.

    Each field comes from ``features[name]`` when given (a table for a
    homogeneous graph, ``{ntype: table}`` for a heterogeneous one, where types
    left out fall back to the graph), else from ``graph.nodes[ntype].data[name]``.
    A table is a tensor (a unified tensor for zero-copy GPU gathers) or a
    store with ``gather(ids, device)``.

    Raises
    ------
    KeyError
        A requested field exists neither in ``features`` nor in the graph.
    """
    features = dict(features or {})
    ntypes = list(graph.ntypes)
    spec = FeatureSpec(hetero=len(ntypes) > 1)
    for target, names in ((spec.inputs, node_feats), (spec.labels, labels)):
        for name, types in _names_by_type(names, ntypes, graph).items():
            given = features.get(name)
            tables = {}
            for t in types:
                table = given.get(t) if isinstance(given, Mapping) else given
                if table is None and name in graph.nodes[t].data:
                    table = graph.nodes[t].data[name]
                if table is None:
                    raise KeyError(f"node field {name!r} of type {t!r} is neither in features= nor in the graph")
                tables[t] = table
                if hasattr(table, "prefetch") and table not in spec.prefetchers:
                    spec.prefetchers.append(table)
            target[name] = tables
    return spec


def _ids(nodes, ntype, hetero):
    return nodes[ntype] if hetero else nodes


def _start(table, ids, device):
    """Start gathering ``table[ids]`` onto ``device``; returns a zero-argument finisher."""
    if not isinstance(table, torch.Tensor):
        out = table.gather(ids, device)  # a store
        return lambda: out
    if getattr(table, "is_unified", False):
        # Its plain host view: same bytes, pinned where the unified tensor is, and no
        # __torch_function__ dispatch on every metadata query of the gather's checks.
        table = table.host
    if device.type == "cuda" and (table.is_cuda or table.is_pinned()):
        fut = gather_async(table, ids.to(device, non_blocking=True))
        return fut.wait
    # A CPU gather would run in wait() on this thread anyway; gather() checks the
    # index in the kernel's own pass instead of a separate one first.
    rows = gather(table, ids.cpu())
    if device.type == "cuda":
        return lambda: rows.to(device, non_blocking=True)
    return lambda: rows


def fetch_batch(spec, batch, device, stats):
    """Gather every field of ``batch`` and put it where DGL's loader would.

    ``batch`` is ``(input_nodes, output_nodes, blocks)``; fields land in
    ``blocks[0].srcdata`` and ``blocks[-1].dstdata`` (per node type on a
    heterogeneous graph).  ``stats["gather_s"]`` grows by the time spent.
    """
    t0 = time.perf_counter()
    input_nodes, output_nodes, blocks = batch
    pending = []
    for fields, nodes, block, side in ((spec.inputs, input_nodes, blocks[0], "src"),
                                       (spec.labels, output_nodes, blocks[-1], "dst")):
        for name, tables in fields.items():
            for ntype, table in tables.items():
                pending.append((block, side, name, ntype, _start(table, _ids(nodes, ntype, spec.hetero), device)))
    for block, side, name, ntype, finish in pending:
        value = finish()
        data = block.srcnodes[ntype].data if side == "src" else block.dstnodes[ntype].data
        data[name] = value
    stats["gather_s"] += time.perf_counter() - t0

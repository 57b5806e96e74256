"""DistDGL partitions read as DGL writes them, checked against directload's record.

:func:`read_partitions` checks directload's record (``directload-partitions.json``, beside DGL's partition
config) against DGL's config and raises :class:`PartitionMismatchError` for a set that is not one
partitioning; a folder without a record is read as DGL wrote it (``dgl.distributed.partition_graph``), the
bounds from its config's ``node_map``.  :func:`store_path` finds a part's disk store and checks it against the
record.  (Writing them is :mod:`.partitions_write`'s.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from directload.codecs import CODECS
from directload.errors import DirectloadError
from directload.stores import generations
from directload.stores.partitioned import check_bounds

__all__ = ["read_partitions", "store_path", "node_bounds", "store_token", "PartitionMismatchError", "META", "FORMAT",
           "VERSION", "CODEC_VERSION"]

#: directload's record, beside DGL's partition config.
META = "directload-partitions.json"
#: The record's ``format``; version 2 records are tied to their config (older ones are refused).
FORMAT = "directload-partitions"
#: The record's version.
VERSION = 2
#: The record's version for partitions of code rows (it names their codec).
CODEC_VERSION = 3


class PartitionMismatchError(DirectloadError, ValueError):
    """directload's record and DGL's partition config (or a part's store) come from different partitionings.

    Examples
    --------
    >>> issubclass(PartitionMismatchError, ValueError)
    True
    """


def store_token(path: os.PathLike[str] | str) -> str | None:
    """The token of the generation the disk store at ``path`` links to (None for anything else).

    Examples
    --------
    >>> import tempfile
    >>> store_token(tempfile.mkdtemp() + "/feat.npy") is None
    True
    """
    target, _ = generations.current(path)
    if target is None:
        return None
    try:
        return generations.read_sidecar_json(generations.sidecar_path(target)).get("token")
    except (OSError, ValueError):
        return None


def node_bounds(config: dict[str, Any], ntype: str | None = None) -> list[int]:
    """The partition bounds of node type ``ntype`` in a DGL partition config (a dict): ``[0, end_0, ...,
    num_nodes]``, where partition ``p`` owns that type's ids ``bounds[p]:bounds[p + 1]``, as DGL's
    ``RangePartitionBook`` numbers them.  ``ntype`` may be left out when the graph has one node type.

    DGL's ``node_map`` gives each part's range of homogeneous ids per type; a type's own ids are numbered
    part by part, so its bounds are the running sum of those ranges' lengths.

    Examples
    --------
    >>> node_bounds({"node_map": {"_N": [[0, 107], [107, 200]]}})
    [0, 107, 200]
    >>> node_bounds({"node_map": {"a": [[0, 18], [30, 42]], "b": [[18, 30], [42, 50]]}}, "b")
    [0, 12, 20]
    """
    node_map = config.get("node_map") if isinstance(config, dict) else None
    if not isinstance(node_map, dict):
        raise ValueError("the partition config has no node_map of ranges per node type (DGL >= 0.8 writes one; "
                         "partition again with this DGL)")
    if ntype is None:
        if len(node_map) != 1:
            raise ValueError(f"the graph has node types {sorted(node_map)}: name one (ntype=...)")
        ntype = next(iter(node_map))
    if ntype not in node_map:
        raise KeyError(f"{ntype!r} is not a node type of the partitions (they have {sorted(node_map)})")
    try:
        lengths = [int(end) - int(start) for start, end in node_map[ntype]]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the partition config's node_map[{ntype!r}] is not a list of [start, end] ranges") from exc
    return check_bounds([0, *np.cumsum(lengths, dtype=np.int64).tolist()]).tolist()


def _node_types(cfg):
    node_map = cfg.get("node_map")
    if not isinstance(node_map, dict):
        node_bounds(cfg)  # its one-line error
    return list(node_map)


def _dgl_config(config):
    try:
        raw = Path(config).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{config} is missing: no DistDGL partition config there (partition with "
                                "`directload dataset partition` or dgl.distributed.partition_graph)") from None
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{config} is not a DGL partition config ({exc})") from exc
    if not isinstance(cfg, dict) or "num_parts" not in cfg:
        raise ValueError(f"{config} is not a DGL partition config (no num_parts)")
    return cfg, hashlib.sha256(raw).hexdigest()


def read_partitions(config: os.PathLike[str] | str) -> dict[str, Any]:
    """What the partitions at ``config`` (DGL's partition config) hold, checked: a dict with ``parts``,
    ``features`` (``"memory"`` or ``"disk"``), ``bounds`` (partition ``p`` owns reshuffled ids
    ``bounds[p]:bounds[p + 1]``; None with several node types), ``node_bounds`` (the same per node type),
    ``graph``, ``num_feats`` and ``num_classes`` (None where only DGL wrote the partitions), ``codec`` (the
    codec whose code rows the partitions hold, or None for plain rows), ``recorded``
    (whether directload's record was there) and ``config``, the config's path with ``out``'s link resolved:
    pass that on so every later read uses this generation.

    Partitions that only ``dgl.distributed.partition_graph`` wrote (no record) hold their features in DGL's
    parts, in memory.  With a record, it must belong to this config (its SHA-256 and bounds):
    :class:`PartitionMismatchError` otherwise, before any work.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> import dgl, torch
    >>> g = dgl.rand_graph(50, 200)
    >>> g.ndata["feat"] = torch.randn(50, 4)
    >>> out = tempfile.mkdtemp()
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     dgl.distributed.partition_graph(g, "g", 2, out, part_method="random")
    >>> meta = read_partitions(out + "/g.json"); meta["parts"], meta["features"], meta["recorded"], meta["bounds"][-1]
    (2, 'memory', False, 50)
    """
    config = Path(config).resolve()  # through out's link once: one generation from here on
    cfg, digest = _dgl_config(config)
    bounds = {t: node_bounds(cfg, t) for t in _node_types(cfg)}
    single = next(iter(bounds.values())) if len(bounds) == 1 else None
    record = config.parent / META
    if not record.is_file():
        return {"graph": cfg.get("graph_name"), "parts": int(cfg["num_parts"]), "features": "memory",
                "bounds": single, "node_bounds": bounds, "num_feats": None, "num_classes": None, "recorded": False,
                "codec": None, "config": config}
    try:
        meta = json.loads(record.read_text())
    except ValueError as exc:
        raise PartitionMismatchError(f"{record} is not a directload record ({exc}); partition again") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or \
            meta.get("version") not in (VERSION, CODEC_VERSION):
        raise PartitionMismatchError(f"{record} does not say which DGL config it belongs to (written before "
                                     "directload published partitions as one set); partition again with "
                                     "`directload dataset partition`")
    if meta.get("config") != config.name or meta.get("config_sha256") != digest:
        raise PartitionMismatchError(f"{config.parent}: directload's record and DGL's config {config.name} come from "
                                     "different partitionings (a torn or mixed folder); partition again with "
                                     "`directload dataset partition`")
    if meta.get("parts") != int(cfg["num_parts"]) or meta.get("bounds") != single:
        raise PartitionMismatchError(f"{config.parent}: directload's record names {meta.get('parts')} parts with "
                                     f"bounds {meta.get('bounds')}, DGL's config {cfg['num_parts']} with {single}; "
                                     "partition again")
    codec = meta.get("codec")
    if (meta["version"] == CODEC_VERSION) != (codec is not None) or (codec is not None and codec not in CODECS):
        raise PartitionMismatchError(f"{record}: version {meta['version']} with codec {codec!r} is not a record "
                                     "directload writes; partition again")
    return {**meta, "codec": codec, "node_bounds": bounds, "recorded": True, "config": config}


def store_path(config: os.PathLike[str] | str, part: int) -> Path:
    """The disk store of partition ``part`` of the partitions at ``config``, checked against the record:
    :class:`PartitionMismatchError` when the store there is not the one the record names.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> import dgl
    >>> out = tempfile.mkdtemp()
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     dgl.distributed.partition_graph(dgl.rand_graph(50, 200), "g", 2, out, part_method="random")
    >>> store_path(out + "/g.json", 0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ...: the features are in DGL's partitions (features='memory'), not in directload disk stores
    """
    meta = read_partitions(config)
    if meta["features"] != "disk":
        raise ValueError(f"{meta['config']}: the features are in DGL's partitions (features={meta['features']!r}), "
                         "not in directload disk stores")
    path = meta["config"].parent / f"part{int(part)}" / "feat.npy"
    want = meta["stores"].get(str(int(part)))
    if want is not None and store_token(path) != want:
        raise PartitionMismatchError(f"{path} is not the store directload's record names for partition {part}; "
                                     "partition again")
    return path

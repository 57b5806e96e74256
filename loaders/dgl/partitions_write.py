"""DistDGL partitions written and published whole (:mod:`directload.publish`'s protocol, for a folder).

A partition folder ``out`` (``partitions-2-disk``, say) holds DGL's partition config and parts, directload's
record of them (``directload-partitions.json``), a disk store per part (``part{i}/feat.npy``, out-of-core
features) and the original ids of DGL's reshuffled ones (``orig_nids.npy``).  :func:`partition` publishes
them as one set, as :mod:`directload.stores.generations` publishes a disk store: ``out`` is a symbolic link to
its current generation, the sibling directory ``<out>.g<N>``, and a write

1. locks the folder that holds ``out`` (a second writer is refused, not queued), removes what killed writes
   into ``out`` left, and picks ``N`` above every generation present;
2. builds the whole set in a fresh partial directory (``.<out>.<random>.build.partial``): DGL's partitions,
   the disk stores, the original ids and, last, the record, which names the SHA-256 of DGL's config and the
   token of each store; then syncs it;
3. renames it to ``<out>.g<N>`` and **publishes** it in one atomic step: a new link renamed over ``out``
   (``rename(2)``), or, where ``out`` is still a plain folder that directload wrote before generations (or an
   empty one), exchanged with it (``renameat2(RENAME_EXCHANGE)``);
4. removes the old generation.

DGL's config is read through the link (``out/<graph>.json``) and names its parts relative to itself, so a
reader that resolves ``out`` once reads one complete generation, the old or the new.  What a killed write
leaves (the partial directory, an unpublished or superseded generation, a link partial) is removed by the
next write into ``out``, and only what it can tell is its own: a partial or generation name *and* inside it
directload's build marker, its record or its old layout.  Anything else at ``out`` is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.capabilities import require
from directload.codecs import CODECS, CodecError, encode
from directload.publish import Publication
from directload.stores import write_disk_store
from directload.unified import host_of

from .partitions_read import CODEC_VERSION, FORMAT, META, VERSION, node_bounds, store_token

dgl = require("dgl")

if TYPE_CHECKING:
    from directload.datasets import Dataset

__all__ = ["partition"]

_DGL_PART_FILES = {"graph.dgl", "node_feat.dgl", "edge_feat.dgl"}
_STORE_FILE = re.compile(r"\.?feat\.npy(\.g[0-9]{1,18})?(\.dlstore\.json|\.dlmap\.npy)?(\.[A-Za-z0-9_]{8}(\.[a-z]+)?"
                         r"\.partial)?")


def partition(dataset: Dataset, parts: int, out: os.PathLike[str] | str, *, features: str = "memory",
              method: str = "metis", codec: str | None = None, progress: bool = True) -> Path:
    """Write ``dataset`` as ``parts`` DistDGL partitions, published at ``out`` as one set; returns the path of
    DGL's partition config (``out/<name>.json``).

    DGL partitions the graph (``dgl.distributed.partition_graph``, METIS by default, one hop of halo) with
    the labels and the train/valid/test masks.  With ``features="memory"`` the features go into DGL's
    partitions as usual (the servers hold them in RAM).  With ``features="disk"`` they do not: each
    partition's rows, in DGL's reshuffled order, are written as a directload disk store
    (``part{i}/feat.npy``), which the servers and trainers of that machine read, so no machine needs its
    partition's features in memory.  ``directload-partitions.json`` beside the config records which.

    With a ``codec`` (:mod:`directload.codecs`) the rows are stored as its code rows, in DGL's partitions
    (``uint8`` rows of ``feat``) or in the disk stores, and the record names it: every machine then holds,
    reads and sends codes, and :func:`~directload.loaders.dgl.distributed.dist_features` decodes them on the
    trainer, last.  DGL's own fetch (``g.ndata["feat"][ids]``) of such partitions gives code rows.

    The whole folder is one generation (see the module's docstring): a run killed at any instant leaves the
    old set or the new one at ``out``, never a mix, and the next run removes what it left.

    Parameters
    ----------
    dataset : directload.datasets.Dataset
    parts : int
        Partitions (machines), at least 1.
    out : str or os.PathLike
        Where the partitions are published: a link to their current generation.  A set directload wrote
        there before is replaced; anything else at ``out`` (a folder of other files, a file) is refused with
        ``FileExistsError`` and left as it is.
    features : {"memory", "disk"}
    method : {"metis", "random"}
    codec : str, optional
        Store the rows as this codec's code rows (``"float16"``, ``"bfloat16"``, ``"int8"``).

    Raises
    ------
    FileExistsError
        ``out`` is not directload's.
    BlockingIOError
        Another directload process is writing partitions beside ``out``
        (:class:`~directload.publish.PublishBusyError`).

    Examples
    --------
    >>> import os, tempfile
    >>> from directload.datasets import load, synthesize
    >>> tmp = tempfile.mkdtemp()
    >>> ds = load(tmp, "synth-tiny") if synthesize(tmp, "synth-tiny", progress=False) else None
    >>> cfg = partition(ds, 2, tmp + "/parts", features="disk", progress=False)
    >>> from directload.loaders.dgl.partitions import read_partitions
    >>> meta = read_partitions(cfg); meta["parts"], meta["features"], meta["bounds"][-1]
    (2, 'disk', 3000)
    >>> os.readlink(tmp + "/parts")
    'parts.g1'
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive integer, got {parts!r}")
    if features not in ("memory", "disk"):
        raise ValueError(f"features must be 'memory' or 'disk', not {features!r}")
    if method not in ("metis", "random"):
        raise ValueError(f"method must be 'metis' or 'random', not {method!r}")
    if codec is not None and codec not in CODECS:
        raise CodecError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    if parts > dataset.num_nodes:
        raise ValueError(f"{parts} partitions of {dataset.num_nodes} nodes: at most one partition per node")
    with _PartitionWrite(out, contention="raise") as w:
        config = _build(dataset, parts, w.build("build"), features, method, codec, progress, w)
        w.commit()
    return Path(out) / config.name


def _build(dataset, parts, where, features, method, codec, progress, w):
    """Every file of one generation in ``where``, the record last; the config's path there."""
    g = dgl.graph((dataset.edge_index[0], dataset.edge_index[1]), num_nodes=dataset.num_nodes)
    g.ndata["label"] = dataset.labels
    for name, ids in dataset.split.items():
        mask = torch.zeros(dataset.num_nodes, dtype=torch.bool)
        mask[ids] = True
        g.ndata[f"{name}_mask"] = mask
    feat = host_of(dataset.feat)
    if features == "memory":
        g.ndata["feat"] = feat if codec is None else encode(feat, codec, progress=progress).codes
    with contextlib.redirect_stdout(sys.stdout if progress else io.StringIO()):  # DGL reports on stdout
        orig_nids, _ = dgl.distributed.partition_graph(g, dataset.name, parts, str(where), part_method=method,
                                                       return_mapping=True, num_hops=1)
    w.step("dgl")
    orig_nids = orig_nids.numpy()
    config = where / f"{dataset.name}.json"
    bounds = node_bounds(json.loads(config.read_text()))
    stores = {}
    if features == "disk":
        for p in range(parts):
            rows = feat[torch.from_numpy(orig_nids[bounds[p]:bounds[p + 1]])]
            path = write_disk_store(rows.numpy(), where / f"part{p}" / "feat.npy", codec=codec, progress=progress)
            stores[str(p)] = store_token(path)
    np.save(where / "orig_nids.npy", orig_nids)
    w.step("orig_nids")
    # a record of codes is version 3, which an older directload refuses instead of taking codes for features
    meta = {"format": FORMAT, "version": VERSION if codec is None else CODEC_VERSION, "codec": codec,
            "generation": w.generation, "token": secrets.token_hex(16),
            "graph": dataset.name, "parts": parts, "features": features, "bounds": bounds,
            "num_feats": int(feat.shape[1]), "num_classes": int(dataset.num_classes), "config": config.name,
            "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(), "stores": stores,
            "orig_nids": "orig_nids.npy"}
    (where / META).write_text(json.dumps(meta, indent=1))
    w.step("record")
    return config


class _PartitionWrite(Publication):
    """One publication of a partition folder (see the module's docstring): one directory, ``"build"``."""

    roles = {"build": ""}
    directory_roles = frozenset({"build"})
    build_mark = ".directload-partition-build"  # inside a build directory until it is complete
    label = "partition:"

    def owns(self, path: Path, role: str) -> bool:
        """A folder holding a record of ours, or a partition folder from before generations."""
        return _record_is_ours(path / META) or _old_layout(path)

    def adopts(self, path: Path) -> bool:
        """An empty folder, or one directload wrote partitions into in place before generations."""
        if path.is_symlink() or not path.is_dir():
            return False
        return not any(path.iterdir()) or _old_layout(path)

    def foreign_message(self) -> str:
        if self.path.is_symlink():
            return f"{self.path} is a link directload did not make; not replacing it"
        return (f"{self.path} holds files directload did not write; not replacing it (move them away or partition "
                "into another folder)")


def _record_is_ours(path):
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def _old_layout(path):
    """Whether ``path`` is a partition folder written in place by directload before generations: its record,
    and nothing but DGL's config and parts, the disk stores and the original ids."""
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
        graph, names = meta["graph"], os.listdir(path)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for name in names:
        entry = path / name
        if name in (META, f"{graph}.json", "orig_nids.npy") and entry.is_file() and not entry.is_symlink():
            continue
        if not (re.fullmatch(r"part[0-9]+", name) and entry.is_dir() and not entry.is_symlink()):
            return False
        if any(inner not in _DGL_PART_FILES and not _STORE_FILE.fullmatch(inner) for inner in os.listdir(entry)):
            return False
    return True

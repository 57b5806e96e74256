"""DistDGL partitions published whole, and read as DGL writes them.

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

:func:`read_partitions` checks directload's record against DGL's config and raises
:class:`PartitionMismatchError` for a set that is not one partitioning; a folder without a record is read as
DGL wrote it (``dgl.distributed.partition_graph``), the bounds from its config's ``node_map``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from directload.atomic import fsync_dir, new_partial, partial_pattern, umask
from directload.capabilities import require
from directload.errors import DirectloadError
from directload.stores import generations, write_disk_store
from directload.stores.partitioned import check_bounds
from directload.unified import host_of

dgl = require("dgl")

if TYPE_CHECKING:
    from directload.datasets import Dataset

__all__ = ["partition", "read_partitions", "store_path", "node_bounds", "PartitionMismatchError", "META", "FORMAT"]

#: directload's record, beside DGL's partition config.
META = "directload-partitions.json"
#: The record's ``format``; version 2 records are tied to their config (older ones are refused).
FORMAT = "directload-partitions"
VERSION = 2
_BUILD_MARK = ".directload-partition-build"  # inside a build directory until it is complete
_DGL_PART_FILES = {"graph.dgl", "node_feat.dgl", "edge_feat.dgl"}
_STORE_FILE = re.compile(r"\.?feat\.npy(\.g[0-9]{1,18})?(\.dlstore\.json|\.dlmap\.npy)?(\.[A-Za-z0-9_]{8}(\.[a-z]+)?"
                         r"\.partial)?")


class PartitionMismatchError(DirectloadError, ValueError):
    """directload's record and DGL's partition config (or a part's store) come from different partitionings.

    Examples
    --------
    >>> issubclass(PartitionMismatchError, ValueError)
    True
    """


# --------------------------------------------------------------------------- writing
def partition(dataset: Dataset, parts: int, out: os.PathLike[str] | str, *, features: str = "memory",
              method: str = "metis", progress: bool = True) -> Path:
    """Write ``dataset`` as ``parts`` DistDGL partitions, published at ``out`` as one set; returns the path of
    DGL's partition config (``out/<name>.json``).

    DGL partitions the graph (``dgl.distributed.partition_graph``, METIS by default, one hop of halo) with
    the labels and the train/valid/test masks.  With ``features="memory"`` the features go into DGL's
    partitions as usual (the servers hold them in RAM).  With ``features="disk"`` they do not: each
    partition's rows, in DGL's reshuffled order, are written as a directload disk store
    (``part{i}/feat.npy``), which the servers and trainers of that machine read, so no machine needs its
    partition's features in memory.  ``directload-partitions.json`` beside the config records which.

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

    Raises
    ------
    FileExistsError
        ``out`` is not directload's.
    BlockingIOError
        Another directload process is writing partitions beside ``out``.

    Examples
    --------
    >>> from directload.datasets import load, synthesize
    >>> tmp = tempfile.mkdtemp()
    >>> ds = load(tmp, "synth-tiny") if synthesize(tmp, "synth-tiny", progress=False) else None
    >>> cfg = partition(ds, 2, tmp + "/parts", features="disk", progress=False)
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
    if parts > dataset.num_nodes:
        raise ValueError(f"{parts} partitions of {dataset.num_nodes} nodes: at most one partition per node")
    with _GenerationWrite(out) as w:
        config = _build(dataset, parts, w.build, features, method, progress, w.generation)
        w.commit()
    return Path(out) / config.name


def _build(dataset, parts, where, features, method, progress, generation):
    """Every file of one generation in ``where``, the record last; the config's path there."""
    g = dgl.graph((dataset.edge_index[0], dataset.edge_index[1]), num_nodes=dataset.num_nodes)
    g.ndata["label"] = dataset.labels
    for name, ids in dataset.split.items():
        mask = torch.zeros(dataset.num_nodes, dtype=torch.bool)
        mask[ids] = True
        g.ndata[f"{name}_mask"] = mask
    feat = host_of(dataset.feat)
    if features == "memory":
        g.ndata["feat"] = feat
    with contextlib.redirect_stdout(sys.stdout if progress else io.StringIO()):  # DGL reports on stdout
        orig_nids, _ = dgl.distributed.partition_graph(g, dataset.name, parts, str(where), part_method=method,
                                                       return_mapping=True, num_hops=1)
    generations.crash_point("partition:dgl")
    orig_nids = orig_nids.numpy()
    config = where / f"{dataset.name}.json"
    bounds = node_bounds(json.loads(config.read_text()))
    stores = {}
    if features == "disk":
        for p in range(parts):
            rows = feat[torch.from_numpy(orig_nids[bounds[p]:bounds[p + 1]])]
            path = write_disk_store(rows.numpy(), where / f"part{p}" / "feat.npy", progress=progress)
            stores[str(p)] = _store_token(path)
    np.save(where / "orig_nids.npy", orig_nids)
    generations.crash_point("partition:orig_nids")
    meta = {"format": FORMAT, "version": VERSION, "generation": generation, "token": secrets.token_hex(16),
            "graph": dataset.name, "parts": parts, "features": features, "bounds": bounds,
            "num_feats": int(feat.shape[1]), "num_classes": int(dataset.num_classes), "config": config.name,
            "config_sha256": _sha256(config), "stores": stores, "orig_nids": "orig_nids.npy"}
    (where / META).write_text(json.dumps(meta, indent=1))
    generations.crash_point("partition:record")
    return config


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _store_token(path):
    """The token of the generation the disk store at ``path`` links to (None for anything else)."""
    target, _ = generations.current(path)
    if target is None:
        return None
    try:
        return generations.read_sidecar_json(generations.sidecar_path(target)).get("token")
    except (OSError, ValueError):
        return None


class _GenerationWrite:
    """One publication of a partition folder (see the module's docstring); a context manager whose ``build``
    is the directory to fill before :meth:`commit`.  Leaving without ``commit`` removes the build."""

    def __init__(self, out):
        self.out = Path(out)
        self.parent, self.name = self.out.parent, self.out.name
        self._lock_fd = self.build = self._link = None
        self._committed = False

    def __enter__(self):
        self.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BlockingIOError(errno.EWOULDBLOCK, f"another directload process is writing in {self.parent}; "
                                      "run again once it has finished") from None
            self._kind = self._inspect()
            self._sweep()
            self.generation = 1 + max(self._generations_present(), default=0)
            self.build = Path(tempfile.mkdtemp(dir=self.parent, prefix=f".{self.name}.", suffix=".build.partial"))
            os.chmod(self.build, 0o777 & ~umask())  # a temporary directory would be private
            (self.build / _BUILD_MARK).touch()
            generations.crash_point("partition:build")
        except BaseException:
            self._unlock()
            raise
        return self

    def _inspect(self):
        """What is at ``out``: ``"none"``, ``"link"`` (ours), ``"plain"`` (ours, before generations) or
        ``"empty"`` (an empty folder); ``FileExistsError`` for anything else."""
        out = self.out
        if not os.path.lexists(out):
            return "none"
        if os.path.islink(out):
            if generations.current(out)[0] is not None:
                return "link"
            raise FileExistsError(f"{out} is a link directload did not make; not replacing it")
        if out.is_dir():
            if not any(out.iterdir()):
                return "empty"
            if _old_layout(out):
                return "plain"
        raise FileExistsError(f"{out} holds files directload did not write; not replacing it (move them away or "
                              "partition into another folder)")

    def _generation_re(self):
        return re.compile(re.escape(self.name) + r"\.g([0-9]{1,18})")

    def _generations_present(self):
        pattern = self._generation_re()
        found = [int(m.group(1)) for m in map(pattern.fullmatch, os.listdir(self.parent)) if m]
        _, now = generations.current(self.out)
        return found + ([now] if now is not None else [])

    def _sweep(self):
        """Remove what killed writes into ``out`` left: partials (by name, and a directory only when it is
        ours inside) and generations the link does not name (ours inside)."""
        partial, pattern = partial_pattern(self.name), self._generation_re()
        target, _ = generations.current(self.out)
        keep = None if target is None else target.name
        for entry in list(os.scandir(self.parent)):
            if partial.fullmatch(entry.name):
                if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                elif _is_ours(entry.path):
                    _remove_tree(entry.path)
            elif pattern.fullmatch(entry.name) and entry.name != keep and not entry.is_symlink() \
                    and entry.is_dir(follow_symlinks=False) and _is_ours(entry.path):
                _remove_tree(entry.path)

    def commit(self):
        """Sync the build, rename it to its generation, publish it at ``out`` in one atomic step, then remove
        the old generation."""
        _fsync_tree(self.build)
        os.unlink(self.build / _BUILD_MARK)  # the record marks it ours from here
        final = self.parent / f"{self.name}.g{self.generation}"
        os.rename(self.build, final)
        self.build = None
        fsync_dir(self.parent)
        generations.crash_point("partition:renamed")
        fd, self._link = new_partial(self.parent, self.name, "link")
        os.close(fd)
        os.unlink(self._link)  # the name only: symlink() cannot replace a file
        os.symlink(final.name, self._link)
        generations.crash_point("partition:linked")
        if self._kind in ("none", "link"):
            os.replace(self._link, self.out)  # the one atomic step
        else:
            _exchange(self._link, self.out)  # the same, over a folder: the old one is now at the link's name
        self._committed = True
        generations.crash_point("partition:published")
        fsync_dir(self.parent)
        if self._kind == "plain" and _old_layout(self._link):
            _remove_tree(self._link)
        elif self._kind == "empty":
            with contextlib.suppress(OSError):
                os.rmdir(self._link)
        self._sweep()
        generations.crash_point("partition:swept")

    def _unlock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __exit__(self, *exc):
        try:
            if self.build is not None:
                _remove_tree(self.build)
            if self._link is not None and not self._committed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._link)
        finally:
            self._unlock()


def _is_ours(path):
    """Whether the directory at ``path`` is one directload made: empty (a build that never began), marked
    as a build, holding a record of ours, or a partition folder from before generations."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return not names or _BUILD_MARK in names or _record_is_ours(Path(path) / META) or _old_layout(path)


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


def _remove_tree(path):
    shutil.rmtree(path, ignore_errors=True)
    generations.crash_point("partition:removed")


def _fsync_tree(root):
    for where, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(where, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(where)


_RENAME_EXCHANGE = 2


def _exchange(a, b):
    """Swap the names ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if not hasattr(libc, "renameat2") or libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b),
                                                        _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno() if hasattr(libc, "renameat2") else errno.ENOSYS
        raise OSError(code, f"cannot swap {b} for its new generation in one step ({os.strerror(code)}): move the "
                      f"old partitions at {b} away and partition again")


# --------------------------------------------------------------------------- reading
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
    ``graph``, ``num_feats`` and ``num_classes`` (None where only DGL wrote the partitions), ``recorded``
    (whether directload's record was there) and ``config``, the config's path with ``out``'s link resolved:
    pass that on so every later read uses this generation.

    Partitions that only ``dgl.distributed.partition_graph`` wrote (no record) hold their features in DGL's
    parts, in memory.  With a record, it must belong to this config (its SHA-256 and bounds):
    :class:`PartitionMismatchError` otherwise, before any work.

    Examples
    --------
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
                "config": config}
    try:
        meta = json.loads(record.read_text())
    except ValueError as exc:
        raise PartitionMismatchError(f"{record} is not a directload record ({exc}); partition again") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
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
    return {**meta, "node_bounds": bounds, "recorded": True, "config": config}


def store_path(config: os.PathLike[str] | str, part: int) -> Path:
    """The disk store of partition ``part`` of the partitions at ``config``, checked against the record:
    :class:`PartitionMismatchError` when the store there is not the one the record names.

    Examples
    --------
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
    if want is not None and _store_token(path) != want:
        raise PartitionMismatchError(f"{path} is not the store directload's record names for partition {part}; "
                                     "partition again")
    return path

"""Loading node-property datasets in OGB's layout with OGB's own readers, for DGL and PyG alike.

The graph, labels and splits are read by OGB's raw-file readers
(``ogb.io.read_graph_raw``), so no framework is needed to load a dataset;
:attr:`Dataset.graph` builds a DGL graph and :meth:`Dataset.to_pyg` a PyG
``Data`` on request.  OGB's own dataset classes are not used: they keep a
pickled cache that ``torch.load`` refuses by default from torch 2.6 on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from directload.atomic import write_atomically
from directload.capabilities import require
from directload.errors import DirectloadError, DirectloadWarning
from directload.files import CorruptFileError, from_file, npy_layout
from directload.unified import to_unified

from .synthetic import META_FILE, check_name, dataset_files

if TYPE_CHECKING:
    import dgl
    import torch_geometric.data

    from directload.graph import CSCGraph
    from directload.unified import UnifiedTensor

__all__ = ["Dataset", "load", "convert", "dataset_dir", "ogb_meta_dict", "FEATURE_FILE", "IncompleteDatasetError",
           "SplitIndexError", "KeptGraphWarning"]

#: A memory-mappable copy of the node features, beside OGB's files.
FEATURE_FILE = "node-feat.npy"
#: Our cache of the graph and labels OGB's readers produce (plain arrays, no pickle).
GRAPH_CACHE = "directload-graph.npz"


class IncompleteDatasetError(DirectloadError, FileNotFoundError):
    """A dataset directory lacks files it needs (an interrupted or partial generation, or a copy).

    Examples
    --------
    >>> import tempfile
    >>> from directload.datasets import load, synthesize
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = synthesize(tmp.name, "synth-tiny", progress=False)
    >>> (path / "raw" / "node-label.npz").unlink()  # a copy that lost a file
    >>> try:
    ...     load(tmp.name, "synth-tiny")
    ... except IncompleteDatasetError as exc:
    ...     print(str(exc).split(";")[0].split(" is ")[1])
    incomplete (missing raw/node-label.npz)
    >>> tmp.cleanup()
    """


class SplitIndexError(CorruptFileError, IndexError):
    """A split names node ids outside the graph.

    It is both a :class:`~directload.files.CorruptFileError` (the files disagree) and an ``IndexError``
    (the ids are out of range), so either ``except`` catches it.

    Examples
    --------
    >>> issubclass(SplitIndexError, IndexError), issubclass(SplitIndexError, ValueError)
    (True, True)
    """


@dataclass
class Dataset:
    """A loaded node-classification dataset, framework-free.

    Attributes
    ----------
    name : str
    path : pathlib.Path
    edge_index : torch.Tensor
        ``[2, num_edges]`` int64, source then destination, as OGB stores it.
    num_nodes : int
    feat : directload.UnifiedTensor
        The node features, ``[num_nodes, num_feats]``.
    labels : torch.Tensor
        int64 ``[num_nodes]``; -1 for unlabelled nodes.
    split : dict
        ``{"train", "valid", "test"}`` -> int64 node ids.
    num_classes : int

    Examples
    --------
    >>> import tempfile
    >>> from directload.datasets import load, synthesize
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = synthesize(tmp.name, "synth-tiny", progress=False)
    >>> ds = load(tmp.name, "synth-tiny")
    >>> tuple(ds.feat.shape), ds.labels.dtype, sorted(ds.split)
    ((3000, 32), torch.int64, ['test', 'train', 'valid'])
    >>> ds.edge_index.shape[0] == 2 and ds.num_edges == ds.edge_index.shape[1]
    True
    >>> ds.feat.close(); tmp.cleanup()
    """

    name: str
    path: Path
    edge_index: torch.Tensor
    num_nodes: int
    feat: UnifiedTensor
    labels: torch.Tensor
    split: dict[str, torch.Tensor]
    num_classes: int
    _graph: dgl.DGLGraph | None = field(default=None, repr=False)
    _csc: CSCGraph | None = field(default=None, repr=False)
    #: The feature stores opened over this dataset's files, by name (``"disk"``, ``"packed"``, ``"run"``): a
    #: training harness keeps them here to open each once, and closes them.
    stores: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def graph(self) -> dgl.DGLGraph:
        """A DGL graph of the dataset (built once), with ``ndata["feat"]`` (the unified tensor)
        and ``ndata["label"]``.  Needs DGL."""
        if self._graph is None:
            dgl = require("dgl")
            g = dgl.graph((self.edge_index[0], self.edge_index[1]), num_nodes=self.num_nodes)
            g.ndata["label"] = self.labels
            g.ndata["feat"] = self.feat
            self._graph = g
        return self._graph

    def csc(self, *, affinity: str = "cuda") -> CSCGraph:
        """The graph as a :class:`directload.graph.CSCGraph` (every node's in-edges), for directload's sampler.

        Built once from ``edge_index`` and kept in the dataset's directory
        (``csc/``, memory-mapped on later loads, checked against a CRC of
        ``edge_index`` so a regenerated dataset is rebuilt), or only in memory
        where the directory is read-only.  A kept graph that
        :meth:`CSCGraph.load <directload.graph.CSCGraph.load>` refuses for any
        reason (damaged, another dataset's, another version's) is rebuilt and
        saved again, with one warning per dataset directory naming why.
        """
        if self._csc is None:
            from directload.graph import CSCGraph

            crc32c = require("crc32c")
            edges = np.ascontiguousarray(self.edge_index.numpy()).data.cast("B")  # no copy
            source = f"{self.num_nodes} nodes, edge_index crc32c {crc32c.crc32c(edges):08x}"
            where = self.path / "csc"
            try:
                g = CSCGraph.load(where, affinity=affinity, source=source)
            except FileNotFoundError:  # none kept yet
                g = self._build_csc(where, source)
            except Exception as exc:  # a cache: whatever is wrong with it, the edges rebuild it (the warning says what)
                _warn_once(where, f"{where}: the kept graph is refused ({type(exc).__name__}: {exc}); rebuilding "
                                  "it from edge_index")
                g = self._build_csc(where, source)
            self._csc = g
        return self._csc

    def _build_csc(self, where, source):
        from directload.graph import CSCGraph

        g = CSCGraph.from_edge_index(self.edge_index, self.num_nodes)
        with contextlib.suppress(OSError):  # a read-only directory: kept in memory only
            g.save(where, source=source)  # each file atomically, graph.json last
        return g

    def to_pyg(self) -> torch_geometric.data.Data:
        """A ``torch_geometric.data.Data`` with ``x`` (the unified tensor), ``y`` and ``edge_index``.
        Needs PyG."""
        pyg_data = require("torch_geometric.data")
        return pyg_data.Data(x=self.feat, y=self.labels, edge_index=self.edge_index, num_nodes=self.num_nodes)


class KeptGraphWarning(DirectloadWarning, RuntimeWarning):
    """The graph a dataset kept from an earlier read is refused (torn, or of other files): it is built again.

    Examples
    --------
    >>> issubclass(KeptGraphWarning, RuntimeWarning)
    True
    """


_WARNED: set[Path] = set()  # the csc/ directories whose kept graph was refused, so warned about once


def _warn_once(where, message):
    where = where.resolve()
    if where not in _WARNED:
        _WARNED.add(where)
        warnings.warn(message, KeptGraphWarning, stacklevel=3)


def ogb_meta_dict(path: os.PathLike[str] | str, num_classes: int) -> dict[str, str | int]:
    """OGB's meta information for a local dataset directory made by :func:`directload.datasets.synthesize`."""
    return {
        "dir_path": str(path), "version": 1, "download_name": Path(path).name, "url": "",
        "num tasks": 1, "task type": "multiclass classification", "eval metric": "acc",
        "num classes": num_classes, "split": "random", "add_inverse_edge": "False",
        "has_node_attr": "True", "has_edge_attr": "False", "additional node files": "None",
        "additional edge files": "None", "is hetero": "False", "binary": "True",
    }


def _meta_info(path, name):
    """OGB's meta information: ours for a generated dataset, OGB's master table for its own."""
    meta_file = path / META_FILE
    if meta_file.exists():
        return ogb_meta_dict(path, json.loads(meta_file.read_text())["config"]["num_classes"])
    return _ogb_master()[name]


def _ogb_master():
    """OGB's node-property dataset table (name -> meta information)."""
    os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb would ask the network for its latest version
    ogb_nodeproppred = require("ogb.nodeproppred")
    import pandas

    table = Path(ogb_nodeproppred.__file__).parent / "master.csv"
    return pandas.read_csv(table, index_col=0, keep_default_na=False)


def _read_graph(path, info, quiet, *, need_feat):
    """``(edge_index, num_nodes, node_feat or None, labels)`` through OGB's readers.

    The graph and labels are cached as plain arrays in ``processed/``; the
    features are not (they may be most of the dataset), so ``need_feat``
    reads everything again.
    """
    cache = path / "processed" / GRAPH_CACHE
    if not need_feat and cache.exists() and cache.stat().st_mtime >= (path / "raw").stat().st_mtime:
        with np.load(cache) as z:
            return z["edge_index"], int(z["num_nodes"]), None, z["labels"]
    os.environ.setdefault("OUTDATED_IGNORE", "1")
    read_graph_raw = require("ogb.io.read_graph_raw")
    read_binary_graph_raw, read_csv_graph_raw = read_graph_raw.read_binary_graph_raw, read_graph_raw.read_csv_graph_raw
    import pandas  # OGB's own dependency

    if info["is hetero"] == "True":
        raise ValueError(f"{path}: heterogeneous OGB datasets are not supported by directload.datasets.load")
    raw = path / "raw"
    inverse = info["add_inverse_edge"] == "True"
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
        if info["binary"] == "True":
            graph = read_binary_graph_raw(str(raw), add_inverse_edge=inverse)[0]
            labels = np.load(raw / "node-label.npz")["node_label"]
        else:
            extra = {f"additional {k} files": [] if info[f"additional {k} files"] == "None" else
                     info[f"additional {k} files"].split(",") for k in ("node", "edge")}
            graph = read_csv_graph_raw(str(raw), add_inverse_edge=inverse,
                                       additional_node_files=extra["additional node files"],
                                       additional_edge_files=extra["additional edge files"])[0]
            labels = pandas.read_csv(raw / "node-label.csv.gz", compression="gzip", header=None).values
    labels = np.nan_to_num(np.asarray(labels, dtype=np.float64).reshape(-1), nan=-1).astype(np.int64)
    arrays = {"edge_index": np.ascontiguousarray(graph["edge_index"], dtype=np.int64),
              "num_nodes": np.int64(graph["num_nodes"]), "labels": labels}
    _save_atomically(cache, arrays)
    return arrays["edge_index"], int(arrays["num_nodes"]), graph.get("node_feat"), labels


def _save_atomically(path, arrays):
    write_atomically(path, lambda f: np.savez(f, **arrays))


def _read_split(path, info):
    require("ogb")
    import pandas  # OGB's own dependency

    folder = path / "split" / info["split"]
    return {part: torch.from_numpy(pandas.read_csv(folder / f"{part}.csv.gz", compression="gzip", header=None)
                                   .values.T[0].astype(np.int64)) for part in ("train", "valid", "test")}


def dataset_dir(root: os.PathLike[str] | str, name: str) -> Path:
    """The directory of dataset ``name`` under ``root`` (OGB's ``<name>_dgl`` copy when only that exists)."""
    base = Path(root) / name.replace("-", "_")
    dgl_dir = Path(root) / (base.name + "_dgl")  # OGB's own name for a DGL-processed copy
    return dgl_dir if dgl_dir.exists() and not base.exists() else base


def load(root: os.PathLike[str] | str, name: str, *, affinity: str = "cuda", pin: str | bool = "auto",
         quiet: bool = True) -> Dataset:
    """Load an OGB node-property dataset from ``root`` (never downloads).

    Works for a dataset made by :func:`directload.datasets.synthesize` and for
    a real one (``ogbn-products``, ``ogbn-papers100M``, ...) already in
    ``root`` in OGB's layout.  Graph, labels and splits are read by OGB's
    readers, with no framework; the features become a unified tensor: mapped
    from ``raw/node-feat.npy`` where it exists (zero-copy, page-cache
    backed), else OGB's in-memory features registered in place.

    Raises
    ------
    ValueError
        ``name`` is not one plain path component.
    FileNotFoundError
        The dataset is not in ``root`` (OGB would try to download it).
    IncompleteDatasetError
        The directory is a partial generation or lacks files (a
        ``FileNotFoundError``).
    SplitIndexError
        A split names nodes outside the graph (an ``IndexError`` and a
        :class:`directload.CorruptFileError`).

    Examples
    --------
    >>> import tempfile
    >>> from directload.datasets import synthesize, load
    >>> root = tempfile.mkdtemp()
    >>> _ = synthesize(root, "synth-tiny", progress=False)
    >>> ds = load(root, "synth-tiny")
    >>> ds.num_nodes, ds.num_classes, ds.feat.is_unified
    (3000, 5, True)
    """
    check_name(name)
    path = dataset_dir(root, name)
    if not (path / "raw").exists() and not (path / "processed").exists():
        raise FileNotFoundError(f"no dataset {name!r} under {root}: generate one with `directload dataset synth` "
                                f"or place OGB's {name} files there (this never downloads)")
    _check_complete(path, name)
    info = _meta_info(path, name)
    feat_file = path / "raw" / FEATURE_FILE
    edge_index, n, node_feat, labels = _read_graph(path, info, quiet, need_feat=not feat_file.exists())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        split = _read_split(path, info)
    if labels.shape[0] != n:
        raise CorruptFileError(f"{path}: {labels.shape[0]} labels for {n} nodes")
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= n):
        raise CorruptFileError(f"{path}: edges name nodes outside the graph's {n} nodes")
    for part, ids in split.items():
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise SplitIndexError(f"{path}: split {part!r} names node {bad}, outside the graph's {n} nodes "
                                  f"(valid 0..{n - 1}); the split files do not belong to this graph")
    if feat_file.exists():
        feat = from_file(feat_file, affinity=affinity, pin=pin)
    elif node_feat is not None:
        feat = to_unified(np.ascontiguousarray(node_feat), affinity, pin=pin)
    else:
        raise FileNotFoundError(f"{path}: no node features (neither raw/{FEATURE_FILE} nor OGB's node_feat)")
    if feat.shape[0] != n:
        raise CorruptFileError(f"{feat_file}: {feat.shape[0]} feature rows for {n} nodes")
    return Dataset(name, path, torch.from_numpy(edge_index), n, feat, torch.from_numpy(labels), split,
                   int(info["num classes"]))


def _check_complete(path, name):
    """Raise :class:`IncompleteDatasetError` for a generated dataset with files missing, or a directory
    that is neither a generated dataset nor one of OGB's (what an interrupted generation leaves)."""
    meta_file = path / META_FILE
    if meta_file.exists():
        try:
            inline = bool(json.loads(meta_file.read_text()).get("inline_features", False))
        except (ValueError, AttributeError) as exc:
            raise IncompleteDatasetError(f"{path}: {META_FILE} is unreadable ({exc}); regenerate it with "
                                         f"`directload dataset synth --name {name} --overwrite`") from exc
        missing = [f for f in dataset_files(inline) if not (path / f).is_file()]
        if missing:
            raise IncompleteDatasetError(f"dataset {name!r} in {path} is incomplete (missing {', '.join(missing)}); "
                                         f"regenerate it with `directload dataset synth --name {name} --overwrite`")
    elif name not in _ogb_master().columns:
        raise IncompleteDatasetError(
            f"{path} is neither a complete generated dataset (no {META_FILE}: an interrupted generation?) nor one "
            f"of OGB's datasets; regenerate it with `directload dataset synth --name {name} --overwrite`, or "
            "remove it")


def convert(root: os.PathLike[str] | str, name: str, *, quiet: bool = True) -> Path:
    """Write a memory-mappable ``raw/node-feat.npy`` for an OGB dataset in ``root``.

    Later :func:`load` calls map it instead of reading OGB's features into
    memory.  Returns the file's path.
    """
    check_name(name)
    path = dataset_dir(root, name)
    if not path.exists():
        raise FileNotFoundError(f"no dataset {name!r} under {root}")
    _check_complete(path, name)
    out = path / "raw" / FEATURE_FILE
    _, _, feat, _ = _read_graph(path, _meta_info(path, name), quiet, need_feat=True)
    if feat is None:
        if out.exists():
            npy_layout(out)  # a readable .npy: the features already live there
            return out
        raise ValueError(f"{name} has no node features to convert")
    out.parent.mkdir(parents=True, exist_ok=True)
    feat = np.ascontiguousarray(feat)
    if out.exists():
        have = npy_layout(out)
        if have[:2] == (feat.dtype, feat.shape):
            return out  # converted before
        raise FileExistsError(f"{out} exists with another layout ({have[0]}, {have[1]}); not overwriting it")
    write_atomically(out, lambda f: np.save(f, feat))  # complete or absent, never half written
    return out

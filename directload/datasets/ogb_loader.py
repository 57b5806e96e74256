"""Loading node-property datasets through OGB's own loader, with features as unified tensors."""

import contextlib
import io
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from directload.files import CorruptFileError, npy_layout

from .synthetic import META_FILE, check_name, dataset_files

__all__ = ["Dataset", "load", "convert", "ogb_meta_dict", "FEATURE_FILE", "IncompleteDatasetError",
           "SplitIndexError"]


class IncompleteDatasetError(FileNotFoundError):
    """A dataset directory lacks files it needs (an interrupted or partial generation, or a copy)."""


class SplitIndexError(CorruptFileError, IndexError):
    """A split names node ids outside the graph."""

#: A memory-mappable copy of the node features, beside OGB's files.
FEATURE_FILE = "node-feat.npy"


@dataclass
class Dataset:
    """A loaded node-classification dataset.

    Attributes
    ----------
    name : str
    path : pathlib.Path
    graph : dgl.DGLGraph
        With ``ndata["feat"]`` (a :class:`directload.UnifiedTensor`) and
        ``ndata["label"]`` (int64).
    feat : directload.UnifiedTensor
        The node features, ``[num_nodes, num_feats]``.
    labels : torch.Tensor
    split : dict
        ``{"train", "valid", "test"}`` -> int64 node ids.
    num_classes : int
    """

    name: str
    path: Path
    graph: object
    feat: object
    labels: torch.Tensor
    split: dict
    num_classes: int


def ogb_meta_dict(path, num_classes):
    """The ``meta_dict`` OGB's ``DglNodePropPredDataset`` needs for a local dataset directory."""
    return {
        "dir_path": str(path), "version": 1, "download_name": Path(path).name, "url": "",
        "num tasks": 1, "task type": "multiclass classification", "eval metric": "acc",
        "num classes": num_classes, "split": "random", "add_inverse_edge": "False",
        "has_node_attr": "True", "has_edge_attr": "False", "additional node files": "None",
        "additional edge files": "None", "is hetero": "False", "binary": "True",
    }


def _ogb_dataset(root, name, path, quiet):
    os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb would ask the network for its latest version
    os.environ.setdefault("DGLBACKEND", "pytorch")
    from ogb.nodeproppred import DglNodePropPredDataset

    meta_file = path / META_FILE
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
        if meta_file.exists():
            meta = json.loads(meta_file.read_text())
            return DglNodePropPredDataset(name, root=str(root), meta_dict=ogb_meta_dict(path,
                                                                                   meta["config"]["num_classes"]))
        return DglNodePropPredDataset(name, root=str(root))


def _dataset_dir(root, name):
    base = Path(root) / name.replace("-", "_")
    dgl_dir = Path(root) / (base.name + "_dgl")  # OGB's own name for a DGL-processed copy
    return dgl_dir if dgl_dir.exists() and not base.exists() else base


def load(root, name, *, affinity="cuda", pin="auto", quiet=True):
    """Load an OGB node-property dataset from ``root`` (never downloads).

    Works for a dataset made by :func:`directload.datasets.synthesize` and for
    a real one (``ogbn-products``, ``ogbn-papers100M``, ...) already in
    ``root`` in OGB's layout.  Graph, labels and splits come from OGB's
    ``DglNodePropPredDataset``; the features become a unified tensor: mapped
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
    >>> ds.graph.num_nodes(), ds.num_classes, ds.feat.is_unified
    (3000, 5, True)
    """
    import directload

    check_name(name)
    path = _dataset_dir(root, name)
    if not (path / "raw").exists() and not (path / "processed").exists():
        raise FileNotFoundError(f"no dataset {name!r} under {root}: generate one with `directload dataset synth` "
                                f"or place OGB's {name} files there (this never downloads)")
    _check_complete(path, name)
    ds = _ogb_dataset(root, name, path, quiet)
    graph, labels = ds[0]
    labels = labels.reshape(-1).long()
    with warnings.catch_warnings():
        # OGB's split reader hands pandas' read-only arrays to torch.from_numpy; the ids are copied by .to(long).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        split = {k: v.long() for k, v in ds.get_idx_split().items()}
    n = graph.num_nodes()
    if labels.shape[0] != n:
        raise CorruptFileError(f"{path}: {labels.shape[0]} labels for {n} nodes")
    for part, ids in split.items():
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise SplitIndexError(f"{path}: split {part!r} names node {bad}, outside the graph's {n} nodes "
                                  f"(valid 0..{n - 1}); the split files do not belong to this graph")
    feat_file = path / "raw" / FEATURE_FILE
    if feat_file.exists():
        feat = directload.from_file(feat_file, affinity=affinity, pin=pin)
    elif "feat" in graph.ndata:
        feat = directload.to_unified(graph.ndata.pop("feat").contiguous(), affinity, pin=pin)
    else:
        raise FileNotFoundError(f"{path}: no node features (neither raw/{FEATURE_FILE} nor OGB's node_feat)")
    if feat.shape[0] != graph.num_nodes():
        raise directload.CorruptFileError(f"{feat_file}: {feat.shape[0]} feature rows for {graph.num_nodes()} nodes")
    graph.ndata["label"] = labels
    graph.ndata["feat"] = feat
    return Dataset(name, path, graph, feat, labels, split, int(ds.num_classes))


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
    elif name not in _ogb_names():
        raise IncompleteDatasetError(
            f"{path} is neither a complete generated dataset (no {META_FILE}: an interrupted generation?) nor one "
            f"of OGB's datasets; regenerate it with `directload dataset synth --name {name} --overwrite`, or "
            "remove it")


def _ogb_names():
    """OGB's node-property dataset names (its own master table)."""
    import ogb.nodeproppred
    import pandas

    table = Path(ogb.nodeproppred.__file__).parent / "master.csv"
    return set(pandas.read_csv(table, index_col=0, keep_default_na=False).columns)


def convert(root, name, *, quiet=True):
    """Write a memory-mappable ``raw/node-feat.npy`` for an OGB dataset in ``root``.

    Later :func:`load` calls map it instead of reading OGB's features into
    memory.  Returns the file's path.
    """
    check_name(name)
    path = _dataset_dir(root, name)
    if not path.exists():
        raise FileNotFoundError(f"no dataset {name!r} under {root}")
    ds = _ogb_dataset(root, name, path, quiet)
    graph, _ = ds[0]
    if "feat" not in graph.ndata:
        raise ValueError(f"{name} has no node features to convert")
    out = path / "raw" / FEATURE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    feat = graph.ndata["feat"].numpy()
    if out.exists():
        have = npy_layout(out)
        if have[:2] == (feat.dtype, feat.shape):
            return out  # converted before
        raise FileExistsError(f"{out} exists with another layout ({have[0]}, {have[1]}); not overwriting it")
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{FEATURE_FILE}.", suffix=".npy", delete=False) as f:
        tmp = Path(f.name)
    try:
        np.save(tmp, feat)
        os.replace(tmp, out)  # complete or absent, never half written
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out

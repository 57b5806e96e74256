"""A real dataset from one ``.npz`` file, written in OGB's raw layout so every command reads it as any other.

The file's arrays are the layout of the heterophilous-graph benchmark (Platonov et al., ICLR 2023, whose
``data/*.npz`` files are public): ``node_features`` ``[N, F]``, ``node_labels`` ``[N]``, ``edges`` ``[E, 2]``
(each undirected edge once) and ``train_masks``, ``val_masks``, ``test_masks`` ``[S, N]`` (``S`` splits).
``tolokers.npz`` from there is a real graph with dense features (11,758 workers, 519,000 edges, 10 real
features per node).  Nothing is downloaded: fetch the file yourself.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np

from directload.npy import CorruptFileError

from .ogb_loader import FEATURE_FILE
from .synthetic import publish_dataset, write_ids_csv_gz, write_meta, write_npy_stream

__all__ = ["import_npz", "NPZ_ARRAYS"]

#: The arrays :func:`import_npz` reads.
NPZ_ARRAYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")


def import_npz(root: os.PathLike[str] | str, name: str, source: os.PathLike[str] | str, *, split: int = 0,
               overwrite: bool = False) -> Path:
    """Write the graph in ``source`` (an ``.npz`` of :data:`NPZ_ARRAYS`) as dataset ``name`` under ``root``,
    with its split ``split``; returns the dataset's directory.

    Edges are stored in both directions, as OGB stores an undirected graph.  The dataset is published whole
    (:func:`~directload.datasets.synthetic.publish_dataset`): importing the same file and split again keeps
    it, and another file or split under the same name needs ``overwrite``.

    Raises
    ------
    CorruptFileError
        The file lacks one of the arrays, or they disagree (shapes, ids outside the graph, a node in two
        parts of the split, labels that are not small non-negative integers), or a feature is not finite;
        before anything is written.
    IndexError
        ``split`` is not one of the file's splits.

    Examples
    --------
    >>> import tempfile
    >>> tmp = Path(tempfile.mkdtemp())
    >>> masks = np.eye(3, 6, dtype=bool)[None]  # one split: node 0 trains, 1 validates, 2 tests
    >>> np.savez(tmp / "g.npz", node_features=np.ones((6, 2), np.float32), node_labels=np.arange(6) % 2,
    ...          edges=np.array([[0, 1], [1, 2]]), train_masks=masks[:, 0], val_masks=masks[:, 1],
    ...          test_masks=masks[:, 2])
    >>> from directload.datasets import load
    >>> ds = load(tmp, import_npz(tmp, "g", tmp / "g.npz").name)
    >>> ds.num_nodes, tuple(ds.feat.shape), ds.num_classes, ds.edge_index.shape[1], ds.split["train"].tolist()
    (6, (6, 2), 2, 4, [0])
    """
    source = Path(source)
    arrays = _read(source)
    feat, labels, edges = arrays["node_features"], arrays["node_labels"], arrays["edges"]
    masks = {part: arrays[f"{key}_masks"] for part, key in (("train", "train"), ("valid", "val"), ("test", "test"))}
    splits = masks["train"].shape[0]
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split < splits:
        raise IndexError(f"{source} has splits 0..{splits - 1}, not {split!r}")
    ids = {part: np.flatnonzero(m[split]) for part, m in masks.items()}
    config = {"imported": source.name, "sha256": _sha256(source), "split": split, "num_nodes": int(feat.shape[0]),
              "num_feats": int(feat.shape[1]), "num_classes": int(labels.max()) + 1,
              "feat_dtype": str(feat.dtype)}

    def write(out: Path) -> None:
        (out / "raw").mkdir()
        (out / "split" / "random").mkdir(parents=True)
        src, dst = edges[:, 0], edges[:, 1]
        with zipfile.ZipFile(out / "raw" / "data.npz", "w", compression=zipfile.ZIP_STORED) as zf:
            write_npy_stream(zf, "edge_index", (2, 2 * len(src)), np.int64, [src, dst, dst, src])
            write_npy_stream(zf, "num_nodes_list", (1,), np.int64, [np.array([feat.shape[0]])])
            write_npy_stream(zf, "num_edges_list", (1,), np.int64, [np.array([2 * len(src)])])
        np.save(out / "raw" / FEATURE_FILE, feat)
        np.savez(out / "raw" / "node-label.npz", node_label=labels.reshape(-1, 1))
        for part, at in ids.items():
            write_ids_csv_gz(out / "split" / "random" / f"{part}.csv.gz", at)
        (out / "RELEASE_v1.txt").write_text(f"{name}: imported by directload from {source.name}\n")
        write_meta(out, name, config, 2 * len(src), inline_features=False)

    return publish_dataset(root, name, config, False, write, overwrite=overwrite)


def _read(source: Path) -> dict[str, np.ndarray]:
    """The file's arrays, checked against one another: a one-line ``CorruptFileError`` naming what is wrong."""
    try:
        with np.load(source, allow_pickle=False) as z:
            missing = [k for k in NPZ_ARRAYS if k not in z.files]
            if missing:
                raise CorruptFileError(f"{source} lacks {', '.join(missing)} (an .npz of {', '.join(NPZ_ARRAYS)})")
            arrays = {k: z[k] for k in NPZ_ARRAYS}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CorruptFileError(f"{source} is not a readable .npz ({exc})") from exc
    feat, labels, edges = arrays["node_features"], arrays["node_labels"], arrays["edges"]
    if feat.ndim != 2 or feat.shape[0] < 1 or feat.shape[1] < 1 or feat.dtype.kind != "f":
        raise CorruptFileError(f"{source}: node_features must be [nodes, features] floats, not {feat.dtype} "
                               f"{feat.shape}")
    n = feat.shape[0]
    if not np.isfinite(feat).all():
        raise CorruptFileError(f"{source}: node_features holds NaN or infinite values")
    arrays["node_features"] = np.ascontiguousarray(feat, dtype=np.float32)
    if labels.shape != (n,) or labels.dtype.kind not in "iu" or labels.min() < 0 or labels.max() >= 1 << 16:
        raise CorruptFileError(f"{source}: node_labels must be {n} class numbers in [0, 65536)")
    arrays["node_labels"] = labels.astype(np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2 or edges.dtype.kind not in "iu" or \
            (len(edges) and (edges.min() < 0 or edges.max() >= n)):
        raise CorruptFileError(f"{source}: edges must be [edges, 2] node ids in [0, {n})")
    arrays["edges"] = edges.astype(np.int64)
    shapes = {arrays[k].shape for k in NPZ_ARRAYS[3:]}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[1] != n or \
            any(arrays[k].dtype != np.bool_ for k in NPZ_ARRAYS[3:]):
        raise CorruptFileError(f"{source}: the masks must be boolean [splits, {n}], all of one shape")
    overlap = arrays["train_masks"].astype(np.int8) + arrays["val_masks"] + arrays["test_masks"]
    if (overlap > 1).any():
        raise CorruptFileError(f"{source}: a node is in two parts of one split")
    return arrays


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

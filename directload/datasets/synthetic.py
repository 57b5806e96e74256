"""A synthetic node-classification dataset written in OGB's raw on-disk layout, in chunks."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import math
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

__all__ = ["SynthConfig", "synthesize", "publish_dataset", "write_meta", "write_npy_stream", "write_ids_csv_gz",
           "check_name", "dataset_files", "dataset_exists", "META_FILE", "PRESETS"]

#: Our description of a generated dataset, beside OGB's files.
META_FILE = "directload-meta.json"
#: Marks a directory that a generation is still writing (or that a killed one left behind).
PARTIAL_FILE = ".directload-partial"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is one plain path component.

    Dataset names become directory names under a root, so ``..``, ``.``, an
    empty name, separators and absolute paths are refused before any file is
    touched.  Allowed: letters, digits, ``-``, ``_`` and ``.``, starting with a
    letter or digit (OGB's names, such as ``ogbn-papers100M``, qualify).

    Examples
    --------
    >>> check_name("synth-small")
    >>> check_name("../victim")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: dataset name must be one plain path component ... got '../victim'
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError("dataset name must be one plain path component (letters, digits, '-', '_', '.'; "
                         f"starting with a letter or digit), got {name!r}")


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of :func:`synthesize`.

    Attributes
    ----------
    num_nodes, avg_degree, num_feats, num_classes : int
        Graph size; ``avg_degree`` counts both directions of each edge.
    homophily : float
        Probability that an edge stays inside its source's class community.
    signal : float
        Scale of the class centroid in each feature vector (noise has unit
        variance): low enough that features alone classify poorly, so a GNN
        that averages same-class neighbours must do better than an MLP.
    power : float
        Pareto exponent of the out-degree; popularity inside a community is
        skewed too, which gives power-law in-degrees (hubs).
    split : tuple of float
        Train and validation fractions; the rest is test.
    feat_dtype : str
        ``"float32"`` or ``"float16"``.
    seed : int
    chunk_nodes : int
        Nodes generated per chunk (bounds memory).

    Examples
    --------
    >>> cfg = SynthConfig(num_nodes=500, avg_degree=4, num_feats=8, num_classes=3)
    >>> cfg.homophily, cfg.feat_dtype
    (0.7, 'float32')
    >>> SynthConfig(num_classes=1)
    Traceback (most recent call last):
    ...
    ValueError: num_classes must be an integer >= 2, got 1
    """

    num_nodes: int = 100_000
    avg_degree: int = 20
    num_feats: int = 100
    num_classes: int = 10
    homophily: float = 0.7
    signal: float = 0.15
    power: float = 2.2
    split: tuple[float, float] = (0.2, 0.1)
    feat_dtype: str = "float32"
    seed: int = 0
    chunk_nodes: int = 1 << 20

    def __post_init__(self):
        for name, low in (("num_nodes", 1), ("avg_degree", 1), ("num_feats", 1), ("num_classes", 2),
                          ("seed", 0), ("chunk_nodes", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        _check_real("homophily", self.homophily, lambda v: 0 <= v <= 1, "in [0, 1]")
        _check_real("signal", self.signal, lambda v: v >= 0, ">= 0")
        _check_real("power", self.power, lambda v: v > 1, "> 1 (a Pareto exponent with a finite mean)")
        split = tuple(self.split)
        if len(split) != 2 or any(not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 <= f < 1
                                  for f in split) or sum(split) >= 1:
            raise ValueError(f"split must be (train, valid) fractions in [0, 1) that leave a test part, got {split!r}")
        if self.feat_dtype not in ("float32", "float16"):
            raise ValueError(f"feat_dtype must be 'float32' or 'float16', got {self.feat_dtype!r}")


def _check_real(name, value, ok, what):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be a finite number {what}, got {value!r}")


#: Named sizes: tiny for tests, small for the README's first run, larger for benchmarks.
PRESETS = {
    "synth-tiny": SynthConfig(num_nodes=3_000, avg_degree=10, num_feats=32, num_classes=5, chunk_nodes=1_000),
    "synth-small": SynthConfig(),
    # A planted partition: 8 communities that keep 90% of the edges inside, near-even degrees (a Pareto exponent
    # of 20 puts nearly every node at the mean), and features that alone classify poorly.
    "synth-planted": SynthConfig(num_nodes=50_000, avg_degree=16, num_feats=100, num_classes=8, homophily=0.9,
                                 signal=0.1, power=20.0),
    "synth-medium": SynthConfig(num_nodes=2_000_000, avg_degree=20, num_feats=128),
    "synth-large": SynthConfig(num_nodes=20_000_000, avg_degree=6, num_feats=128, feat_dtype="float16"),
    # Out of core: a 4 GiB feature file (4 KiB rows); few training nodes, so a cold epoch over np.memmap
    # (hundreds of random rows a second) takes minutes, not hours.
    "synth-ooc": SynthConfig(num_nodes=1_000_000, avg_degree=10, num_feats=1024, split=(0.002, 0.002)),
}


def _dir(root, name):
    return Path(root) / name.replace("-", "_")


def write_meta(out: Path, name: str, config: dict, num_edges: int, inline_features: bool) -> None:
    """Write ``META_FILE``, the last file of a dataset: what :func:`publish_dataset` compares."""
    meta = {"name": name, "config": config, "num_edges": int(num_edges), "inline_features": inline_features}
    (out / META_FILE).write_text(json.dumps(meta, indent=2))


def write_npy_stream(zf: zipfile.ZipFile, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike,
                     chunks: Iterable[np.ndarray]) -> None:
    """Write one ``.npy`` member of an ``.npz`` from chunks, never holding the array."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                "shape": shape})
        for c in chunks:
            f.write(np.ascontiguousarray(c, dtype=dtype).tobytes())


def write_ids_csv_gz(path: Path, ids: np.ndarray, chunk: int = 1 << 20) -> None:
    """Write ids one per line, gzipped: OGB's split files."""
    with gzip.open(path, "wt", compresslevel=1) as f:
        for s in range(0, len(ids), chunk):
            f.write("\n".join(map(str, ids[s:s + chunk].tolist())))
            f.write("\n")


def synthesize(root: os.PathLike[str] | str, name: str = "synth-small", config: SynthConfig | None = None, *,
               inline_features: bool = False, overwrite: bool = False, progress: bool = True) -> Path:
    """Generate a dataset in OGB's raw layout and return its directory.

    Layout (read back by ``ogb.nodeproppred.DglNodePropPredDataset`` with a
    ``meta_dict``; see :func:`directload.datasets.load`):

    - ``RELEASE_v1.txt`` so OGB never asks to update it;
    - ``raw/data.npz`` (``edge_index``, ``num_nodes_list``, ``num_edges_list``)
      and ``raw/node-label.npz``, OGB's binary format;
    - ``split/random/{train,valid,test}.csv.gz``;
    - ``raw/node-feat.npy``: features, memory-mappable (``inline_features``
      puts them inside ``data.npz`` as ``node_feat`` instead, like OGB's own
      datasets; fine for small sizes);
    - ``directload-meta.json``: the configuration and OGB's meta fields.

    The dataset is written into a fresh hidden directory beside its final
    place and renamed into place only when complete, so an interrupted run
    leaves nothing that loads as a dataset.  Generations in one ``root`` take
    turns (a lock on ``root``): a second generation of the same dataset waits
    for the first and then finds it done.  Nothing that this function did not
    create is ever deleted.

    Parameters
    ----------
    root : str or Path
    name : str
        Dataset name, one plain path component (see :func:`check_name`); a key
        of :data:`PRESETS` picks its configuration.
    config : SynthConfig, optional
        Overrides the preset.
    inline_features : bool
    overwrite : bool
        Regenerate even if the directory holds a complete dataset.  Only a
        directory made by this function is ever replaced.
    progress : bool
        Show tqdm progress bars.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        ``name`` is not one plain path component.
    FileExistsError
        The directory exists but was not made by this function, or holds a
        dataset with another configuration (or an incomplete one) and
        ``overwrite`` is false.

    Examples
    --------
    >>> import tempfile
    >>> path = synthesize(tempfile.mkdtemp(), "synth-tiny", progress=False)
    >>> sorted(p.name for p in (path / "raw").iterdir())
    ['data.npz', 'node-feat.npy', 'node-label.npz']
    """
    check_name(name)
    cfg = config or PRESETS.get(name) or SynthConfig()
    return publish_dataset(root, name, asdict(cfg), inline_features,
                           lambda tmp: _generate(tmp, name, cfg, inline_features, progress), overwrite=overwrite)


def publish_dataset(root: os.PathLike[str] | str, name: str, config: dict, inline_features: bool,
                    write: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Write dataset ``name`` under ``root`` with ``write(tmp)`` and rename it into place, whole: the one way
    a dataset directory is made (:func:`synthesize`, :func:`directload.datasets.import_npz`).

    ``write`` fills the private directory ``tmp`` with every file of :func:`dataset_files`, ``META_FILE``
    last, whose ``"config"`` is ``config``.  A complete dataset of the same ``config`` at the destination is
    kept (``write`` is not called); one of another ``config``, or an incomplete one, is replaced only with
    ``overwrite``; a directory directload did not make is refused with ``FileExistsError``.  Writers in one
    ``root`` take turns (a lock on ``root``); what a killed writer left is removed by the next.
    """
    check_name(name)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = _dir(root, name)
    with _root_lock(root):
        state = _state(out, config, inline_features)
        if state == "same" and not overwrite:
            return out
        if state == "foreign":
            raise FileExistsError(f"{out} exists and was not made by directload (no {META_FILE}); refusing to touch "
                                  "it: choose another --name or --root")
        if state in ("different", "incomplete") and not overwrite:
            what = "another configuration" if state == "different" else "an incomplete dataset"
            raise FileExistsError(f"{out} holds {what}; pass overwrite=True (--overwrite) to regenerate it, or "
                                  "choose another --name")
        _remove_stale_partials(root, out.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=root))
        try:
            (tmp / PARTIAL_FILE).write_text(f"{name}: being written by directload (pid {os.getpid()})\n")
            write(tmp)
            (tmp / PARTIAL_FILE).unlink()
            if out.exists():  # ours (it has our meta file), replaced on request
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=root))
                os.rename(out, old / "dataset")
                os.rename(tmp, out)
                shutil.rmtree(old)
            else:
                os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


@contextlib.contextmanager
def _root_lock(root):
    """Hold an exclusive lock on the ``root`` directory (released on exit, or when the process dies)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def dataset_exists(root: os.PathLike[str] | str, name: str) -> bool:
    """Whether ``root`` has a directory for dataset ``name`` (complete or not; :func:`load` tells)."""
    check_name(name)
    return os.path.lexists(_dir(root, name))


def dataset_files(inline_features: bool) -> list[str]:
    """The files a complete generated dataset has, relative to its directory."""
    files = ["RELEASE_v1.txt", "raw/data.npz", "raw/node-label.npz", META_FILE,
             *(f"split/random/{part}.csv.gz" for part in ("train", "valid", "test"))]
    return files if inline_features else [*files, "raw/node-feat.npy"]


def _state(out, config, inline_features):
    """What is at ``out``: "missing", "same" (complete, configuration ``config``), "different",
    "incomplete" (ours, files missing) or "foreign" (not made by directload)."""
    if not out.exists() and not out.is_symlink():
        return "missing"
    meta_path = out / META_FILE
    if not out.is_dir() or out.is_symlink() or not meta_path.is_file():
        return "foreign"
    try:
        meta = json.loads(meta_path.read_text())
        stored = meta["config"]
    except (ValueError, KeyError, TypeError):
        return "incomplete"
    if any(not (out / f).is_file() for f in dataset_files(meta.get("inline_features", False))):
        return "incomplete"
    same = stored == json.loads(json.dumps(config)) and meta.get("inline_features", False) == inline_features
    return "same" if same else "different"


def _remove_stale_partials(root, dirname):
    """Remove what killed generations of this dataset left behind (only directories holding our marker).

    Called under the root lock, so no generation is writing them.
    """
    for p in root.glob(f".{dirname}.partial-*"):
        if p.is_dir() and not p.is_symlink() and (p / PARTIAL_FILE).is_file():
            shutil.rmtree(p, ignore_errors=True)


def _generate(out, name, cfg, inline_features, progress):
    """Write the whole dataset into the (empty, private) directory ``out``."""
    (out / "raw").mkdir()
    (out / "split" / "random").mkdir(parents=True)
    rng = np.random.default_rng(cfg.seed)
    n, c = cfg.num_nodes, cfg.num_classes
    labels = rng.integers(0, c, n)
    members = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[members], np.arange(c + 1))
    sizes = np.diff(starts)
    # Out-degree: Pareto with the mean avg_degree / 2 (each edge is stored both ways).
    xm = (cfg.avg_degree / 2) * (cfg.power - 1) / cfg.power
    chunks = list(range(0, n, cfg.chunk_nodes))
    src_parts, dst_parts = [], []
    bar = tqdm(total=2 * len(chunks) + 2, desc=f"synthesize {name}", unit="step", disable=not progress)
    for i, s in enumerate(chunks):
        crng = np.random.default_rng([cfg.seed, 1, i])
        nodes = np.arange(s, min(n, s + cfg.chunk_nodes))
        deg = np.minimum((crng.pareto(cfg.power, len(nodes)) + 1) * xm, 1000).astype(np.int64)
        deg = np.maximum(deg, 1)
        src = np.repeat(nodes, deg)
        same = crng.random(len(src)) < cfg.homophily
        cls = np.where(same, labels[src], crng.integers(0, c, len(src)))
        # Skewed popularity inside the community: rank = floor(size * u^3) favours low ranks.
        rank = (sizes[cls] * crng.random(len(src)) ** 3).astype(np.int64)
        dst = members[starts[cls] + rank]
        keep = src != dst
        src_parts.append(src[keep])
        dst_parts.append(dst[keep])
        bar.update()
    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    del src_parts, dst_parts
    num_edges = 2 * len(src)
    feat_dtype = np.dtype(cfg.feat_dtype)
    centroids = np.random.default_rng([cfg.seed, 2]).standard_normal((c, cfg.num_feats)).astype(np.float32)

    def feature_chunks():
        for i, s in enumerate(chunks):
            frng = np.random.default_rng([cfg.seed, 3, i])
            y = labels[s:s + cfg.chunk_nodes]
            x = cfg.signal * centroids[y] + frng.standard_normal((len(y), cfg.num_feats), dtype=np.float32)
            bar.update()
            yield x.astype(feat_dtype)

    with zipfile.ZipFile(out / "raw" / "data.npz", "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        write_npy_stream(zf, "edge_index", (2, num_edges), np.int64, [src, dst, dst, src])
        write_npy_stream(zf, "num_nodes_list", (1,), np.int64, [np.array([n])])
        write_npy_stream(zf, "num_edges_list", (1,), np.int64, [np.array([num_edges])])
        if inline_features:
            write_npy_stream(zf, "node_feat", (n, cfg.num_feats), feat_dtype, feature_chunks())
    if not inline_features:
        feat = np.lib.format.open_memmap(out / "raw" / "node-feat.npy", mode="w+", dtype=feat_dtype,
                                         shape=(n, cfg.num_feats))
        for s, x in zip(chunks, feature_chunks()):
            feat[s:s + len(x)] = x
        feat.flush()
        del feat
    del src, dst
    np.savez(out / "raw" / "node-label.npz", node_label=labels.reshape(-1, 1).astype(np.int64))
    perm = np.random.default_rng([cfg.seed, 4]).permutation(n)
    n_train, n_valid = int(cfg.split[0] * n), int(cfg.split[1] * n)
    for part, ids in (("train", perm[:n_train]), ("valid", perm[n_train:n_train + n_valid]),
                      ("test", perm[n_train + n_valid:])):
        write_ids_csv_gz(out / "split" / "random" / f"{part}.csv.gz", np.sort(ids))
    bar.update()
    (out / "RELEASE_v1.txt").write_text(f"{name}: generated by directload\n")
    write_meta(out, name, asdict(cfg), num_edges, inline_features)
    bar.update()
    bar.close()

"""A synthetic node-classification dataset written in OGB's raw on-disk layout, in chunks."""

import gzip
import json
import os
import shutil
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

__all__ = ["SynthConfig", "synthesize", "META_FILE", "PRESETS"]

#: Our description of a generated dataset, beside OGB's files.
META_FILE = "directload-meta.json"


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
    """

    num_nodes: int = 100_000
    avg_degree: int = 20
    num_feats: int = 100
    num_classes: int = 10
    homophily: float = 0.7
    signal: float = 0.15
    power: float = 2.2
    split: tuple = (0.2, 0.1)
    feat_dtype: str = "float32"
    seed: int = 0
    chunk_nodes: int = 1 << 20


#: Named sizes: tiny for tests, small for the README's first run, larger for benchmarks.
PRESETS = {
    "synth-tiny": SynthConfig(num_nodes=3_000, avg_degree=10, num_feats=32, num_classes=5, chunk_nodes=1_000),
    "synth-small": SynthConfig(),
    "synth-medium": SynthConfig(num_nodes=2_000_000, avg_degree=20, num_feats=128),
    "synth-large": SynthConfig(num_nodes=20_000_000, avg_degree=6, num_feats=128, feat_dtype="float16"),
}


def _dir(root, name):
    return Path(root) / name.replace("-", "_")


def _write_npy_stream(zf, name, shape, dtype, chunks):
    """Write one ``.npy`` member of an ``.npz`` from chunks, never holding the array."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                "shape": shape})
        for c in chunks:
            f.write(np.ascontiguousarray(c, dtype=dtype).tobytes())


def _write_ids_csv_gz(path, ids, chunk=1 << 20):
    with gzip.open(path, "wt", compresslevel=1) as f:
        for s in range(0, len(ids), chunk):
            f.write("\n".join(map(str, ids[s:s + chunk].tolist())))
            f.write("\n")


def synthesize(root, name="synth-small", config=None, *, inline_features=False, overwrite=False, progress=True):
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

    Parameters
    ----------
    root : str or Path
    name : str
        Dataset name; a key of :data:`PRESETS` picks its configuration.
    config : SynthConfig, optional
        Overrides the preset.
    inline_features : bool
    overwrite : bool
        Regenerate even if the directory holds a complete dataset.
    progress : bool
        Show tqdm progress bars.

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> path = synthesize(tempfile.mkdtemp(), "synth-tiny", progress=False)
    >>> sorted(p.name for p in (path / "raw").iterdir())
    ['data.npz', 'node-feat.npy', 'node-label.npz']
    """
    cfg = config or PRESETS.get(name) or SynthConfig()
    out = _dir(root, name)
    meta_path = out / META_FILE
    if meta_path.exists() and not overwrite:
        meta = json.loads(meta_path.read_text())
        if meta["config"] == json.loads(json.dumps(asdict(cfg))):
            return out
    if out.exists():
        shutil.rmtree(out)
    (out / "raw").mkdir(parents=True)
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
        _write_npy_stream(zf, "edge_index", (2, num_edges), np.int64, [src, dst, dst, src])
        _write_npy_stream(zf, "num_nodes_list", (1,), np.int64, [np.array([n])])
        _write_npy_stream(zf, "num_edges_list", (1,), np.int64, [np.array([num_edges])])
        if inline_features:
            _write_npy_stream(zf, "node_feat", (n, cfg.num_feats), feat_dtype, feature_chunks())
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
        _write_ids_csv_gz(out / "split" / "random" / f"{part}.csv.gz", np.sort(ids))
    bar.update()
    (out / "RELEASE_v1.txt").write_text(f"{name}: generated by directload\n")
    meta = {"name": name, "config": asdict(cfg), "num_edges": num_edges, "inline_features": inline_features}
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, meta_path)  # written last: its presence marks a complete dataset
    bar.update()
    bar.close()
    return out

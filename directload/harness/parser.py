"""The ``directload`` command line's parser: its commands and options, their types and help."""

from __future__ import annotations

import argparse
from typing import Any

from directload.codecs import CODECS

from .commands import bench, convert, import_npz, info, pack, partition, synth, tune, verify
from .commands import train as train_command
from .flags import int_at_least, non_negative_int, positive_int
from .options import OPTIONS, RunOptions, value_at
from .train import SIDES

__all__ = ["build_parser", "add_train_arguments", "HelpFormatter"]

DESCRIPTION = ("directload: zero-copy GPU feature loading for mini-batch GNN training, with drop-ins for DGL's "
               "DataLoader and PyG's NeighborLoader, datasets in OGB's layout, and side-by-side training against "
               "the frameworks' own loaders.  Everything also runs on a machine without a GPU.")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default; ``(default: None)`` left out where None only means "not given"."""

    def _get_help_string(self, action):
        if action.default is None or action.default is argparse.SUPPRESS or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _memory_limit(text):
    """An argparse type: a memory cap (1.5G)."""
    from directload.harness.memcap import parse_limit

    try:
        return parse_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_framework():
    """Whichever framework is installed, DGL first."""
    import importlib.util

    return "dgl" if importlib.util.find_spec("dgl") is not None else "pyg"


def _option(p: argparse.ArgumentParser, path: str, **changes: Any) -> None:
    """Add the flag of option ``path`` (:data:`~directload.harness.options.OPTIONS`) with its option's default
    (``changes``: argparse's keywords known only now)."""
    OPTIONS[path].add_to(p, value_at(RunOptions(), path), **changes)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``directload train`` and benchmarks/loader_e2e.py: the run's options
    (:data:`~directload.harness.options.OPTIONS`, each with its help and parse) and the command's own."""
    _option(p, "framework", choices=list(SIDES), default=_default_framework())
    p.add_argument("--dataset", default="synth-small",
                   help="a synthetic preset (synth-tiny, synth-small, synth-planted, synth-medium, synth-large, "
                        "synth-ooc; generated when missing), or an OGB node-property dataset or one made by `dataset "
                        "import` already under --root")
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    _option(p, "epochs")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N; auto picks cuda when a GPU is usable")
    for path in ("layers", "fanouts", "hidden", "lr", "batch_size", "num_workers"):
        _option(p, path)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default=None,
                   help="directory for the JSON and PNG (default: benchmarks/results in a source checkout, "
                        "else directload-results)")
    for path in ("features", "store.gpu_bytes", "store.host_bytes", "store.staging_bytes", "sampler", "lookahead",
                 "store.policy", "store.packed", "store.codec", "eval_batch_size", "eval_nodes", "nproc"):
        _option(p, path)
    p.add_argument("--memory-limit", type=_memory_limit, default=None,
                   help="cap the training's host memory (its pages and the page cache it fills) with a memory "
                        "cgroup, e.g. 1.5G; needs root.  The feature files' cached pages are dropped first; the "
                        "training runs in a child process inside the cgroup, which is removed when it ends, "
                        "however it ends")
    for path in ("store.budget.host_bytes", "store.budget.io_depth", "store.budget.name",
                 "store.budget.shared_hot_bytes"):
        _option(p, path)
    _no_progress(p)


def _dataset(p: argparse.ArgumentParser, root_help: str, name_default: str | None, name_help: str) -> None:
    """A dataset command's ``--root`` and ``--name``."""
    p.add_argument("--root", default="data", help=root_help)
    p.add_argument("--name", default=name_default, help=name_help)


def _no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``directload``."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    parser = argparse.ArgumentParser(prog="directload", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,tune,dataset,store,bench,train}")

    def command(parent, name, help_text):
        return parent.add_parser(name, help=help_text, description=help_text, parents=[debug],
                                 formatter_class=HelpFormatter)

    p = command(sub, "info", "what this machine offers: CUDA, CuPy, NVRTC, the Numba CUDA simulator, io_uring, "
                              "CPU threads, and the GPU gather's tuner (on or off, its cache file, its choices)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=info.run)

    p = command(sub, "tune", "the GPU gather's tuned choices: for each GPU, driver, torch and kind of gather, the "
                             "kernel chosen and each candidate's time (the first GPU gather of a kind times them; "
                             "DIRECTLOAD_TUNE=0 turns timing off)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--clear", action="store_true",
                   help="remove the tuner's cache file (only that file), so every kind is timed again")
    p.set_defaults(func=tune.run)

    ds = command(sub, "dataset", "generate a synthetic dataset, import a real one, or convert an OGB one")
    ds_sub = ds.add_subparsers(dest="action", required=True, metavar="{synth,import,convert,pack,partition}")
    p = command(ds_sub, "synth", "generate a synthetic node-classification dataset in OGB's on-disk layout")
    _dataset(p, "directory to write the dataset into", "synth-small",
             "dataset name, one plain path component; the presets synth-tiny, synth-small, synth-planted (a "
             "planted partition), synth-medium, synth-large and synth-ooc pick their sizes")
    p.add_argument("--nodes", type=positive_int, help="number of nodes (default: the preset's)")
    p.add_argument("--degree", type=positive_int, help="average degree, both directions (default: the preset's)")
    p.add_argument("--feats", type=positive_int, help="features per node (default: the preset's)")
    p.add_argument("--classes", type=int_at_least(2), help="number of classes, at least 2 (default: the preset's)")
    p.add_argument("--seed", type=non_negative_int, help="random seed (default: the preset's)")
    p.add_argument("--dtype", choices=["float32", "float16"], help="feature type (default: the preset's)")
    p.add_argument("--inline-features", action="store_true",
                   help="store the features inside OGB's data.npz instead of a memory-mappable node-feat.npy")
    p.add_argument("--overwrite", action="store_true",
                   help="regenerate a dataset this command made before (never touches other directories)")
    _no_progress(p)
    p.set_defaults(func=synth.run)
    p = command(ds_sub, "import", "write a real graph from one .npz file (node_features, node_labels, edges and "
                                  "train/val/test masks, the heterophilous-graph benchmark's layout: its "
                                  "tolokers.npz has dense features) as a dataset in OGB's layout")
    p.add_argument("npz", help="the .npz file (fetch it yourself: nothing is downloaded)")
    _dataset(p, "directory to write the dataset into", None,
             "dataset name, one plain path component (default: the file's name, '_' as '-')")
    p.add_argument("--split", type=non_negative_int, default=0, help="which of the file's splits to keep")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset this command or synth made before under that name")
    p.set_defaults(func=import_npz.run)
    p = command(ds_sub, "convert", "add a memory-mappable raw/node-feat.npy to an OGB dataset on disk, or write "
                                   "a dataset's (or a .npy file's) features as a disk store (--to disk)")
    _dataset(p, "directory that holds the dataset", None, "the dataset, for example ogbn-products")
    p.add_argument("--to", choices=["npy", "disk"], default="npy",
                   help="npy: raw/node-feat.npy for memory mapping; disk: a disk store (4 KiB-aligned rows and a "
                        "checksummed sidecar) for directload.stores.DiskStore, in <dataset>/disk/node-feat.npy")
    p.add_argument("--input", help="with --to disk: a .npy file to convert instead of a dataset's features")
    p.add_argument("--out", help="with --to disk: where to write the store (default: see --to; for --input, "
                                 "FILE.disk.npy next to it)")
    p.add_argument("--overwrite", action="store_true", help="replace a disk store directload wrote before")
    p.add_argument("--codec", choices=list(CODECS), default=None,
                   help="with --to disk: store the rows compressed as this codec's code rows (float16, bfloat16, or "
                        "int8 with a per-row scale and offset), in <dataset>/disk/node-feat.<codec>.npy (for --input, "
                        "FILE.<codec>.disk.npy); train --codec reads it")
    _no_progress(p)
    p.set_defaults(func=convert.run)

    p = command(ds_sub, "pack", "write a dataset's packed disk store: its rows renumbered hottest first, by how "
                                "often pre-sampled epochs of the training sampler read them (train --packed "
                                "reads it)")
    _dataset(p, "directory that holds the dataset", "synth-small",
             "the dataset (its disk store is written first if missing)")
    p.add_argument("--framework", choices=list(SIDES), default=_default_framework(),
                   help="whose sampler pre-samples the epochs (default: whichever is installed, DGL first)")
    p.add_argument("--fanouts", type=int, nargs="+", default=None,
                   help="neighbours sampled per layer, as train's --fanouts (default 15 10 5)")
    p.add_argument("--batch-size", type=positive_int, default=1024, help="seed nodes per mini-batch, as train's")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs pre-sampled for the profile")
    p.add_argument("--codec", choices=list(CODECS), default=None,
                   help="pack the dataset's store of this codec's code rows (written first if missing) into "
                        "<dataset>/disk/node-feat.<codec>.packed.npy, which train --packed --codec reads")
    _no_progress(p)
    p.set_defaults(func=pack.run)

    p = command(ds_sub, "partition", "write a dataset's DistDGL partitions (dgl.distributed.partition_graph) for "
                                     "train --dist, with a directload disk store per partition for out-of-core "
                                     "features")
    _dataset(p, "directory that holds the dataset", "synth-small",
             "the dataset (a synthetic preset is generated when missing)")
    p.add_argument("--parts", type=positive_int, required=True, help="partitions: one per machine")
    p.add_argument("--features", choices=["memory", "disk"], default="memory",
                   help="memory: in DGL's partitions, held by its servers; disk: a directload disk store per "
                        "partition, read by that machine's servers and trainers, never all in memory")
    p.add_argument("--method", choices=["metis", "random"], default="metis", help="DGL's partitioning method")
    p.add_argument("--codec", choices=list(CODECS), default=None,
                   help="store the rows as this codec's code rows (in DGL's partitions or the disk stores), in "
                        "partitions-N-<features>-<codec>: machines hold, read and send codes, and the trainer "
                        "decodes them (train --dist --codec reads them)")
    _no_progress(p)
    p.set_defaults(func=partition.run)

    st = command(sub, "store", "check a disk store")
    st_sub = st.add_subparsers(dest="action", required=True, metavar="{verify}")
    p = command(st_sub, "verify", "check every chunk of a disk store against its sidecar's checksums (exit 1 if "
                                  "any differs)")
    p.add_argument("path", help="the store's .npy file")
    _no_progress(p)
    p.set_defaults(func=verify.run)

    p = command(sub, "bench", "run a benchmark script from benchmarks/ (each prints a table, writes JSON and PNG)")
    p.add_argument("which", choices=sorted(bench.BENCH_SCRIPTS),
                   help="gather: gather bandwidth; alignment: the alignment sweep; unified: unified-tensor "
                        "gathers; disk: random row reads from disk, DiskStore against fio and np.memmap; "
                        "loader: training epochs, DGL's loader against ours (GraphSAGE by default); "
                        "pyg: PyG's example idioms, PyG's loader against ours; gpu: the GPU suite; versus: "
                        "one of these against the same benchmark of an earlier commit; codecs: gathers and tiers of "
                        "compressed rows against float32; accuracy: test accuracy with each codec against float32")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script (see its --help)")
    p.set_defaults(func=bench.run)

    p = command(sub, "train", "train GraphSAGE or GAT with the framework's loader and directload's, side by side")
    p.add_argument("--model", choices=["sage", "gat", "both"], default="sage",
                   help="GraphSAGE (mean) or GAT (4 heads).  On 2 CPU cores a synth-small training epoch takes "
                        "about 3.5 s with GraphSAGE and about 16 s with GAT, whose attention dominates (measured; "
                        "evaluation comes on top)")
    p.add_argument("--loader", choices=["dgl", "pyg", "directload", "both"], default="both",
                   help="the framework's own loader, directload's, or both interleaved and compared")
    p.add_argument("--seeds", type=positive_int, default=1, help="runs per (model, loader), seeds 0..N-1")
    p.add_argument("--dist", type=positive_int, default=0, metavar="N",
                   help="train with DistDGL on N machines emulated on this host (root: each machine in its own "
                        "network namespace with its own /dev/shm), one server and one trainer each, on the "
                        "partitions of `directload dataset partition --parts N`; --features memory reads the "
                        "servers' rows (--loader dgl: DGL's own fetch), disk or tiered each machine's disk store "
                        "(tiered: through a --host-cache)")
    _option(p, "store.partition")
    add_train_arguments(p)
    p.set_defaults(func=train_command.run)
    return parser

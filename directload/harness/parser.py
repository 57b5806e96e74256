"""The ``directload`` command line's parser: its commands and options, their types and help."""

from __future__ import annotations

import argparse

from directload.stores.policies import POLICY_NAMES
from directload.units import check_int

from .commands import bench, convert, info, pack, partition, synth, tune, verify
from .commands import train as train_command
from .options import SAMPLERS
from .train import SIDES
from .train_inputs import FEATURE_MODES

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


def _int_at_least(low):
    """An argparse type: a whole number ``>= low``."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        try:
            return check_int("value", value, low=low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}") from None

    parse.__name__ = f"integer >= {low}"
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_float(text):
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _lookahead(text):
    """An argparse type: a whole number >= 1, or auto."""
    if text == "auto":
        return text
    return _positive_int(text)


def _size(text):
    """An argparse type: a byte size (1G, 512M, 0)."""
    from directload.units import parse_size

    try:
        return parse_size(text, allow_zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``directload train`` and benchmarks/loader_e2e.py."""
    p.add_argument("--framework", choices=list(SIDES), default=_default_framework(),
                   help="DGL (blocks, DGL's DataLoader) or PyG (NeighborLoader, PyG's convolutions); the default "
                        "is whichever is installed, DGL first")
    p.add_argument("--dataset", default="synth-small",
                   help="a synthetic preset (synth-tiny, synth-small, synth-medium, synth-large, synth-ooc; generated "
                        "when missing) or an OGB node-property dataset already under --root")
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--epochs", type=_positive_int, default=3,
                   help="epochs per run; the report leaves the first out when there are more")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N; auto picks cuda when a GPU is usable")
    p.add_argument("--layers", type=_positive_int, default=None,
                   help="GNN layers (default 3, or one per --fanouts entry)")
    p.add_argument("--fanouts", type=int, nargs="+", default=None,
                   help="neighbours sampled per layer, one per layer (default 15 10 5, as DGL's examples)")
    p.add_argument("--hidden", type=_positive_int, default=128, help="hidden units per layer (GAT: over 4 heads)")
    p.add_argument("--lr", type=_positive_float, default=3e-3, help="Adam learning rate")
    p.add_argument("--batch-size", type=_positive_int, default=1024, help="seed nodes per mini-batch")
    p.add_argument("--num-workers", type=_non_negative_int, default=0, help="DGL sampling worker processes")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default=None,
                   help="directory for the JSON and PNG (default: benchmarks/results in a source checkout, "
                        "else directload-results)")
    p.add_argument("--features", choices=FEATURE_MODES, default="memory",
                   help="memory: the memory-mapped feature table; disk: directload's loader reads the dataset's "
                        "disk store (io_uring, O_DIRECT; written on first use) while the framework's loader reads "
                        "the memory-mapped .npy; tiered: directload reads through a GPU cache and a host cache "
                        "(--gpu-cache, --host-cache) in front of that disk store")
    p.add_argument("--gpu-cache", type=_size, default=0,
                   help="bytes of the GPU cache with --features tiered, e.g. 512M (a host buffer where CUDA does "
                        "not run)")
    p.add_argument("--host-cache", type=_size, default=0,
                   help="bytes of the host cache with --features tiered, e.g. 1G")
    p.add_argument("--staging", type=_size, default=None,
                   help="bytes of the host tier's read-ahead slots with --features tiered (default: a quarter of "
                        "--host-cache, at least 64M)")
    p.add_argument("--sampler", choices=SAMPLERS, default="directload",
                   help="directload's loader samples with directload's sampler (the framework's distribution, "
                        "uniform without replacement, not its batches; the same on any thread count) or the "
                        "framework's own (its batches, bit for bit); the framework's loader always uses its own")
    p.add_argument("--lookahead", type=_lookahead, default=4,
                   help="batches directload's loader samples (and announces to the stores) ahead, or auto: "
                        "each epoch's from the last one's stage times")
    p.add_argument("--policy", default="lookahead", choices=POLICY_NAMES,
                   help="the caches' policy with --features tiered")
    p.add_argument("--packed", action="store_true",
                   help="with --features disk or tiered: read the dataset's packed disk store (hot rows first, "
                        "written by `directload dataset pack`), and with tiered fill the caches with its hot rows "
                        "before the first epoch, in long sequential reads")
    p.add_argument("--eval-batch-size", type=_positive_int, default=4096,
                   help="seed nodes per evaluation mini-batch (a small host wants fewer: each batch's input rows "
                        "are gathered at once)")
    p.add_argument("--eval-nodes", type=_non_negative_int, default=0,
                   help="evaluate on this many nodes of each split, the same for every run (0: all)")
    p.add_argument("--nproc", type=_positive_int, default=1,
                   help="DDP ranks on this node, one process each, started through torchrun's launcher (gloo on "
                        "the CPU, NCCL with one GPU per rank); each rank trains on its share of the seeds, split as "
                        "the framework does, and rank 0 writes the report with every rank's epochs.  At most what "
                        "the node can run, refused before any work: 4 ranks per usable CPU core (on GPUs one per "
                        "GPU), 512 MiB of available memory per rank, and 256.  Under torchrun leave it out: "
                        "torchrun's --nproc-per-node starts the ranks")
    p.add_argument("--memory-limit", type=_memory_limit, default=None,
                   help="cap the training's host memory (its pages and the page cache it fills) with a memory "
                        "cgroup, e.g. 1.5G; needs root.  The feature files' cached pages are dropped first; the "
                        "training runs in a child process inside the cgroup, which is removed when it ends, "
                        "however it ends")
    p.add_argument("--node-budget", type=_size, default=0,
                   help="with --features tiered: host memory (host caches and their read-ahead slots) that every "
                        "directload job on this node running with the same --budget-name shares, e.g. 4G; each "
                        "job's cache grows and shrinks to its fair share (up to --host-cache, default the table) "
                        "as jobs come and go")
    p.add_argument("--node-io-depth", type=_non_negative_int, default=0,
                   help="with --node-budget: disk reads in flight shared by those jobs (0: each job its own)")
    p.add_argument("--budget-name", default="directload",
                   help="the node budget's name: jobs giving the same name share one budget")
    p.add_argument("--shared-hot", type=_size, default=0,
                   help="with --packed and --features tiered: bytes of the packed store's hottest rows kept once per "
                        "node in shared memory for every job of the same --budget-name (taken out of --node-budget "
                        "first); each job's own cache then holds only the rest")
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

    ds = command(sub, "dataset", "generate a synthetic dataset or convert an OGB one")
    ds_sub = ds.add_subparsers(dest="action", required=True, metavar="{synth,convert,pack,partition}")
    p = command(ds_sub, "synth", "generate a synthetic node-classification dataset in OGB's on-disk layout")
    _dataset(p, "directory to write the dataset into", "synth-small",
             "dataset name, one plain path component; the presets synth-tiny, synth-small, synth-medium, synth-large "
             "and synth-ooc pick their sizes")
    p.add_argument("--nodes", type=_positive_int, help="number of nodes (default: the preset's)")
    p.add_argument("--degree", type=_positive_int, help="average degree, both directions (default: the preset's)")
    p.add_argument("--feats", type=_positive_int, help="features per node (default: the preset's)")
    p.add_argument("--classes", type=_int_at_least(2), help="number of classes, at least 2 (default: the preset's)")
    p.add_argument("--seed", type=_non_negative_int, help="random seed (default: the preset's)")
    p.add_argument("--dtype", choices=["float32", "float16"], help="feature type (default: the preset's)")
    p.add_argument("--inline-features", action="store_true",
                   help="store the features inside OGB's data.npz instead of a memory-mappable node-feat.npy")
    p.add_argument("--overwrite", action="store_true",
                   help="regenerate a dataset this command made before (never touches other directories)")
    _no_progress(p)
    p.set_defaults(func=synth.run)
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
    p.add_argument("--batch-size", type=_positive_int, default=1024, help="seed nodes per mini-batch, as train's")
    p.add_argument("--epochs", type=_positive_int, default=3, help="epochs pre-sampled for the profile")
    _no_progress(p)
    p.set_defaults(func=pack.run)

    p = command(ds_sub, "partition", "write a dataset's DistDGL partitions (dgl.distributed.partition_graph) for "
                                     "train --dist, with a directload disk store per partition for out-of-core "
                                     "features")
    _dataset(p, "directory that holds the dataset", "synth-small",
             "the dataset (a synthetic preset is generated when missing)")
    p.add_argument("--parts", type=_positive_int, required=True, help="partitions: one per machine")
    p.add_argument("--features", choices=["memory", "disk"], default="memory",
                   help="memory: in DGL's partitions, held by its servers; disk: a directload disk store per "
                        "partition, read by that machine's servers and trainers, never all in memory")
    p.add_argument("--method", choices=["metis", "random"], default="metis", help="DGL's partitioning method")
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
                        "one of these against the same benchmark of an earlier commit")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script (see its --help)")
    p.set_defaults(func=bench.run)

    p = command(sub, "train", "train GraphSAGE or GAT with the framework's loader and directload's, side by side")
    p.add_argument("--model", choices=["sage", "gat", "both"], default="sage",
                   help="GraphSAGE (mean) or GAT (4 heads).  On 2 CPU cores a synth-small training epoch takes "
                        "about 3.5 s with GraphSAGE and about 16 s with GAT, whose attention dominates (measured; "
                        "evaluation comes on top)")
    p.add_argument("--loader", choices=["dgl", "pyg", "directload", "both"], default="both",
                   help="the framework's own loader, directload's, or both interleaved and compared")
    p.add_argument("--seeds", type=_positive_int, default=1, help="runs per (model, loader), seeds 0..N-1")
    p.add_argument("--dist", type=_positive_int, default=0, metavar="N",
                   help="train with DistDGL on N machines emulated on this host (root: each machine in its own "
                        "network namespace with its own /dev/shm), one server and one trainer each, on the "
                        "partitions of `directload dataset partition --parts N`; --features memory reads the "
                        "servers' rows (--loader dgl: DGL's own fetch), disk or tiered each machine's disk store "
                        "(tiered: through a --host-cache)")
    p.add_argument("--partition-features", action="store_true",
                   help="with --nproc N (or under torchrun): each rank holds 1/N of the feature rows (in memory, on "
                        "disk, or tiered) and fetches the others from their owners by all-to-all over "
                        "torch.distributed, as ranks on different machines would")
    add_train_arguments(p)
    p.set_defaults(func=train_command.run)
    return parser

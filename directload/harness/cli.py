"""The ``directload`` command line: info, datasets, benchmarks and training."""

import argparse
import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from directload.harness.train import SAMPLERS, SIDES
from directload.harness.train_inputs import FEATURE_MODES
from directload.stores.cache import POLICY_NAMES
from directload.units import check_int

__all__ = ["main", "build_parser", "add_train_arguments", "run_training", "report_name", "HelpFormatter",
           "BENCH_SCRIPTS"]

DESCRIPTION = ("directload: zero-copy GPU feature loading for mini-batch GNN training, with drop-ins for DGL's "
               "DataLoader and PyG's NeighborLoader, datasets in OGB's layout, and side-by-side training against "
               "the frameworks' own loaders.  Everything also runs on a machine without a GPU.")

#: ``directload bench NAME``: the script of benchmarks/ that NAME runs.
BENCH_SCRIPTS = {"gather": "gather_bandwidth.py", "alignment": "alignment_sweep.py", "unified": "unified_gather.py",
                 "loader": "loader_e2e.py", "gpu": "gpu_suite.py", "disk": "disk_read.py",
                 "cache": "cache_policies.py", "ooc": "out_of_core.py", "pack": "hot_packing.py",
                 "pyg": "pyg_idioms.py", "versus": "versus.py", "share": "node_share.py",
                 "dist": "distdgl.py", "sample": "sample_bench.py"}
_SOURCE_TREE = Path(__file__).resolve().parents[2]  # the checkout: directload/harness/cli.py


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
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _default_framework():
    import importlib.util

    return "dgl" if importlib.util.find_spec("dgl") is not None else "pyg"


def _default_out():
    bench = Path("benchmarks") / "results"
    return str(bench) if bench.parent.is_dir() else "directload-results"


def _info(args):
    from directload.capabilities import capabilities
    from directload.kernels import cpu
    from directload.kernels.tuner import tuner_state

    caps = capabilities().as_dict()
    # The CPU gathers' thread team is the kernels' own choice (directload.kernels.cpu says why).
    caps.update(cpu_threads=cpu.get_num_threads(), cpu_team=cpu.team(), openmp_wait_policy=cpu.wait_policy())
    caps.update(tuner_state())  # the GPU gather's tuner: on or off, its cache file, the choices it holds
    if args.json:
        print(json.dumps(caps, indent=2))
    else:
        width = max(map(len, caps))
        for k, v in caps.items():
            print(f"{k:<{width}}  {v}")
    return 0


def _span(low, factor, unit=False):
    """A bucket ``[low, low * factor)`` in words: ``1024-2047`` ids, or ``256 MiB-1 GiB``."""
    def size(n):
        for name, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if n >= 1 << shift and n % (1 << shift) == 0:
                return f"{n >> shift} {name}"
        return f"{n} B"

    if low == 0:
        return "0"
    return f"{size(low)}-{size(low * factor)}" if unit else f"{low}-{low * factor - 1}"


def _tune_lines(rows):
    """``directload tune``'s table: one block per machine and software, one line per kind of gather."""
    lines, env = [], None
    for row in rows:
        here = (row["gpu"], row["driver"], row["torch"], row["cuda"], row["sources"])
        if here != env:
            env = here
            lines += ["", "{}, driver {}, torch {}, CUDA {}, kernel sources {}".format(*here),
                      f"  {'row B':>7} {'elem B':>6} {'align':>5} {'ids':>13} {'table':>17}  {'chosen':<18} "
                      f"{'ms':>8} {'vs index_select':>15}"]
        times = row["times_ms"]
        best = times.get(row["chosen"])
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        lines.append(f"  {row['row_bytes']:>7} {row['elem_bytes']:>6} {row['align']:>5} {_span(row['ids'], 2):>13} "
                     f"{_span(row['table'], 4, unit=True):>17}  {row['chosen']:<18} "
                     f"{'-' if best is None else f'{best:.3f}':>8} {speedup:>15}")
        ranked = sorted(times.items(), key=lambda kv: kv[1])
        lines.append("      timed (ms): " + (", ".join(f"{name} {ms:.3f}" for name, ms in ranked) or "none"))
        lines += [f"      failed: {name} ({why})" for name, why in row["failed"].items()]
        if row["untimed"]:
            lines.append("      not timed (the budget ran out): " + ", ".join(row["untimed"]))
        if row["note"]:
            lines.append(f"      note: {row['note']}")
    return lines


def _tune(args):
    from directload.kernels.tuner import ENV_VAR, Tuner, tuning_enabled

    tuner = Tuner()
    path = tuner.store.path
    if args.clear:
        print(f"removed {path}" if tuner.clear() else f"no tuner cache at {path}")
        return 0
    rows = tuner.table()
    if args.json:
        print(json.dumps({"enabled": tuning_enabled(), "cache": str(path), "choices": rows}, indent=2))
        return 0
    state = "on" if tuning_enabled() else f"off ({ENV_VAR}=0: every GPU gather takes the default kernel)"
    print(f"tuner: {state}; cache {path}: {len(rows)} choice{'' if len(rows) == 1 else 's'}")
    if not rows:
        print("nothing tuned yet: the first GPU gather of each kind times its candidates and keeps the fastest")
    for line in _tune_lines(rows):
        print(line)
    return 0


def _synth(args):
    from directload.datasets import PRESETS, SynthConfig, check_name, synthesize

    check_name(args.name)
    base = PRESETS.get(args.name, SynthConfig())
    overrides = {k: v for k, v in {"num_nodes": args.nodes, "avg_degree": args.degree, "num_feats": args.feats,
                                   "num_classes": args.classes, "seed": args.seed,
                                   "feat_dtype": args.dtype}.items() if v is not None}
    path = synthesize(args.root, args.name, SynthConfig(**{**asdict(base), **overrides}),
                      inline_features=args.inline_features, overwrite=args.overwrite, progress=not args.no_progress)
    print(f"dataset {args.name} in {path}")
    return 0


def _pack(args):
    import time

    from directload.capabilities import require
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize
    from directload.harness.train import TrainConfig, pack, resolve_depth

    check_name(args.name)
    layers, fanouts = resolve_depth(None, args.fanouts)
    require({"dgl": "dgl", "pyg": "torch_geometric"}[args.framework])
    if args.name in PRESETS and not dataset_exists(args.root, args.name):
        synthesize(args.root, args.name, progress=not args.no_progress)
    args.dataset, args.features = args.name, "disk"
    _feature_files(args, "disk")  # the disk store it renumbers, written first if missing
    dataset = load(args.root, args.name)
    cfg = TrainConfig(framework=args.framework, loader="directload", layers=layers, fanouts=fanouts,
                      batch_size=args.batch_size)
    t0 = time.perf_counter()
    path, counts = pack(dataset, cfg, args.epochs, progress=not args.no_progress)
    seen = int((counts > 0).sum())
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s: {seen} of {dataset.num_nodes} rows read in "
          f"{args.epochs} pre-sampled epochs, now the file's first {seen} rows")
    return 0


def partition_dir(root, name, parts, features):
    """Where ``directload dataset partition`` writes (and ``train --dist`` reads) a dataset's partitions. Pure.

    Examples
    --------
    >>> str(partition_dir("data", "synth-tiny", 2, "disk"))
    'data/synth-tiny/partitions-2-disk'
    """
    from directload.datasets import dataset_dir

    return dataset_dir(root, name) / f"partitions-{parts}-{features}"


def _partition(args):
    from directload.capabilities import require
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize

    check_name(args.name)
    require("dgl")
    from directload.loaders.dgl.distributed import partition

    if args.name in PRESETS and not dataset_exists(args.root, args.name):
        synthesize(args.root, args.name, progress=not args.no_progress)
    dataset = load(args.root, args.name)
    out = partition_dir(args.root, args.name, args.parts, args.features)
    config = partition(dataset, args.parts, out, features=args.features, method=args.method,
                       progress=not args.no_progress)
    print(f"wrote {args.parts} DistDGL partitions of {args.name} ({args.features} features) to {config}")
    return 0


def _train_dist(args, models, loaders):
    """``train --dist N``: N DistDGL machines on this host, one server and one trainer each."""
    from directload.capabilities import require
    from directload.datasets import PRESETS, dataset_exists, synthesize

    if args.framework != "dgl":
        raise ValueError("--dist trains with DistDGL: it needs --framework dgl (PyG has no distributed engine that "
                         "runs on PyG 2.8; use --nproc for DDP on one node)")
    if models != ["sage"]:
        raise ValueError("--dist trains GraphSAGE (DGL's distributed example): leave --model at sage")
    for flag, given in (("--nproc", args.nproc != 1), ("--packed", args.packed), ("--node-budget", args.node_budget),
                        ("--memory-limit", args.memory_limit is not None), ("--gpu-cache", args.gpu_cache)):
        if given:
            raise ValueError(f"--dist does not take {flag}")
    from directload.harness.dist import check_host
    from directload.harness.train import resolve_depth

    layers, fanouts = resolve_depth(args.layers, args.fanouts)
    kind = "memory" if args.features == "memory" else "disk"
    if "dgl" in loaders and kind != "memory":
        raise ValueError("DGL's own fetch reads the features its servers hold: --loader dgl (or both) needs "
                         "--features memory")
    config = partition_dir(args.root, args.dataset, args.dist, kind) / f"{args.dataset}.json"
    if not config.exists():
        raise FileNotFoundError(f"{config} does not exist: partition first with `directload dataset partition "
                                f"--name {args.dataset} --parts {args.dist} --features {kind}`")
    require("dgl")
    from directload.harness.train_dist import run
    from directload.loaders.dgl.distributed import read_partitions

    config = read_partitions(config)["config"]  # before any work: one partitioning, this generation from here
    check_host()  # root, unshare and ip
    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset, progress=not args.no_progress)
    report = {"dataset": args.dataset, "machines": args.dist, "features": args.features, "runs": []}
    for seed in range(args.seeds):
        for loader in loaders:
            print(f"{loader:>10} seed {seed}: {args.dist} DistDGL machines on this host, one server and one trainer "
                  f"each, {args.epochs} epochs ...", flush=True)
            trainers = run(config, root=args.root, dataset=args.dataset, epochs=args.epochs, fanouts=fanouts,
                           batch_size=args.batch_size, hidden=args.hidden, lr=args.lr, seed=seed,
                           host_bytes=args.host_cache if args.features == "tiered" else 0,
                           fetch="dgl" if loader == "dgl" else "directload")
            report["runs"].append({"loader": loader, "seed": seed, "test_acc": trainers[0]["test_acc"],
                                   "trainers": trainers})
            last = [t["epochs"][-1] for t in trainers]
            fetch = " / ".join(f"{e['fetch_ms_median']:.1f}" for e in last)
            print(f"{loader:>10} seed {seed}: test {trainers[0]['test_acc'] * 100:.2f} %, last epoch "
                  f"{max(e['seconds'] for e in last):.2f} s, fetch {fetch} ms per batch (median, per machine)")
    out = Path(args.out or _default_out())
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{report_name('train-dist', args.dataset, models, loaders)}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


def _convert(args):
    from directload.datasets import convert

    if args.to == "npy" or args.input is None:
        if args.name is None:
            raise ValueError("name the dataset (--name), or give --input FILE.npy with --to disk")
        npy = convert(args.root, args.name)
        if args.to == "npy":
            print(f"wrote {npy}")
            return 0
        source, out = npy, npy.parent.parent / "disk" / "node-feat.npy"
    else:
        source = Path(args.input)
        out = source.with_name(source.stem + ".disk.npy")
    from directload.stores import write_disk_store

    out = write_disk_store(source, Path(args.out) if args.out else out, overwrite=args.overwrite,
                           progress=not args.no_progress)
    print(f"wrote the disk store {out} (open it with directload.stores.DiskStore)")
    return 0


def _verify(args):
    from directload.stores import verify

    report = verify(args.path, progress=not args.no_progress)
    bad = report["bad_chunks"]
    for index, first, last in bad:
        print(f"chunk {index} (bytes {first}-{last}): checksum mismatch")
    print(f"{report['path']}: {report['chunks']} chunks, {report['bytes']} bytes, "
          f"{'all match' if not bad else f'{len(bad)} bad'}")
    return 1 if bad else 0


def _bench(args):
    path = _SOURCE_TREE / "benchmarks" / BENCH_SCRIPTS[args.which]
    if not path.exists():
        raise FileNotFoundError(f"benchmarks/{BENCH_SCRIPTS[args.which]} is not in this installation: run it from a "
                                "source checkout")
    return subprocess.call([sys.executable, str(path), *args.rest], env=os.environ.copy())


def _lookahead(text):
    if text == "auto":
        return text
    return _positive_int(text)


def _size(text):
    from directload.units import parse_size

    try:
        return parse_size(text, allow_zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _memory_limit(text):
    from directload.harness.memcap import parse_limit

    try:
        return parse_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_train_arguments(p):
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def report_name(prefix, dataset, models, loaders):
    """The file stem of a training report, unique per dataset, models and loaders.  Pure.

    Examples
    --------
    >>> report_name("train", "synth-small", ["gat"], ["dgl", "directload"])
    'train_synth-small_gat_dgl-vs-directload'
    """
    return f"{prefix}_{dataset}_{'+'.join(models)}_{'-vs-'.join(loaders)}"


def run_training(args, models, loaders, seeds, name, conditions=None):
    """Load (generating if needed) the dataset, train side by side, print and write the report.

    With ``args.memory_limit`` the training runs in a child inside a memory cgroup: ``args.rerun`` (the
    argv that ran this) is started again there, and this process waits for it.  ``conditions`` (see
    :func:`~directload.harness.experiments.compare`) runs each seed under each, interleaved."""
    import torch

    from directload.capabilities import capabilities, require, usable_device
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize
    from directload.harness import ddp, memcap
    from directload.harness.experiments import compare, print_summary, write_report
    from directload.harness.train import TrainConfig, resolve_depth
    from directload.kernels.cpu import wait_policy as cpu_wait_policy

    # Bad arguments get their own error before any work, a missing framework after them.
    device = usable_device(args.device)
    nproc = getattr(args, "nproc", 1)
    capped = memcap.capped_group()
    if ddp.torchrun_world()[1] > 1:
        if nproc > 1:
            rank, size = ddp.torchrun_world()
            raise ValueError(f"this process is rank {rank} of {size} that torchrun started: leave --nproc out "
                             "(torchrun's --nproc-per-node starts the ranks)")
        if getattr(args, "memory_limit", None) is not None and capped is None:
            raise ValueError("--memory-limit under torchrun would cap each rank alone: run torchrun itself in a "
                             "memory cgroup, or start the ranks with --nproc")
    if nproc > 1:
        ddp.check_nproc(nproc, device)  # before any work: no more ranks than this node can run
    layers, fanouts = resolve_depth(args.layers, args.fanouts)
    check_name(args.dataset)
    limit = getattr(args, "memory_limit", None)
    require({"dgl": "dgl", "pyg": "torch_geometric"}[args.framework])
    if limit is not None and capped is None:
        memcap.check_limit(limit)  # before any work: a cap the run cannot start in
    if args.threads:
        torch.set_num_threads(args.threads)
    _note_busy_machine()
    rank, size = ddp.join_torchrun(device)  # under torchrun: every collective from here has a timeout
    features = getattr(args, "features", "memory")
    if rank == 0:  # under torchrun one rank writes what is missing, the others wait for it
        if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
            synthesize(args.root, args.dataset, progress=not args.no_progress)  # one made with other options is kept
        _feature_files(args, features)
    ddp.barrier()
    files = _feature_files(args, features)
    if limit is not None and capped is None:  # the guardian: this command again, as a child in the cgroup
        for f in files:
            memcap.drop_page_cache(f)
        print(f"host memory capped at {limit / 2**30:.2f} GiB in a memory cgroup; the feature files' cached "
              "pages were dropped", flush=True)
        return memcap.run_capped(limit, args.rerun)
    if nproc > 1:  # the ranks: this command again, nproc times, under torchrun's launcher (in the cgroup if any)
        load(args.root, args.dataset)  # the dataset's caches are written here, once, before any rank reads them
        memcap.guard_children()  # they die with this process
        ddp.launch(nproc, [*args.rerun, "--nproc", "1"])
        return 0
    if limit is not None:
        from directload.kernels.host_pool import default_pool

        pool = default_pool()  # recycled output blocks count against the cap: keep few
        pool.max_cached_bytes = min(pool.max_cached_bytes, limit // 8)
    dataset = load(args.root, args.dataset)
    base = TrainConfig(epochs=args.epochs, device=str(device), num_workers=args.num_workers, hidden=args.hidden,
                       lr=args.lr, batch_size=args.batch_size, layers=layers, fanouts=fanouts,
                       framework=args.framework, loader="directload", features=features,
                       eval_nodes=getattr(args, "eval_nodes", 0),
                       eval_batch_size=getattr(args, "eval_batch_size", 4096),
                       gpu_cache=getattr(args, "gpu_cache", 0), host_cache=getattr(args, "host_cache", 0),
                       staging=getattr(args, "staging", None), policy=getattr(args, "policy", "lookahead"),
                       lookahead=getattr(args, "lookahead", 4), packed=getattr(args, "packed", False),
                       nproc=size, node_budget=getattr(args, "node_budget", 0),
                       node_io_depth=getattr(args, "node_io_depth", 0),
                       budget_name=getattr(args, "budget_name", "directload"),
                       shared_hot=getattr(args, "shared_hot", 0),
                       partitioned=getattr(args, "partition_features", False),
                       sampler=getattr(args, "sampler", "directload"))
    rows = compare(dataset, base, models=models, loaders=loaders, seeds=seeds, progress=not args.no_progress,
                   conditions=conditions)
    if rank != 0:
        ddp.finish()  # rank 0 reports for the job: wait for it, then end with it (never returns)
    meta = {"dataset": args.dataset, "framework": args.framework, "device": str(device), "nodes": dataset.num_nodes,
            "edges": dataset.num_edges, "feats": int(dataset.feat.shape[1]), "epochs": args.epochs,
            "torch_threads": torch.get_num_threads(), "capabilities": capabilities().as_dict(),
            "features": features, "memory_limit": limit, "nproc": size,
            "sampler": {row["loader"]: row["sampler"] for row in rows},
            "feature_file_bytes": sum(os.path.getsize(f) for f in files), "openmp_wait_policy": cpu_wait_policy(),
            **({"conditions": [c for c, _ in conditions]} if conditions else {})}
    path, summary = write_report(rows, args.out or _default_out(), name, meta)
    print_summary(summary, meta)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    if size > 1:
        ddp.finish()  # the report is written: every rank ends now, together (never returns)
    return 0


def _note_busy_machine():
    """One line on stderr when the machine is busier than its cores and torch's OpenMP threads spin for
    libgomp's default 3 ms while they wait: the spinning, not either loader, is what slows a busy machine's
    epochs (see :func:`directload.kernels.cpu.wait_policy`)."""
    from directload.kernels import cpu

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if cpu.wait_policy() == f"spin {cpu.LIBGOMP_SPINS}" and load > cores:
        print(f"note: this machine is busy (load {load:.1f} on {cores} cores) and torch's OpenMP threads spin for "
              "about 3 ms while they wait, which slows training 2-6x beside other busy processes; start with "
              "GOMP_SPINCOUNT=10000 (scripts/dev.sh does)", file=sys.stderr, flush=True)


def _feature_files(args, features):
    """The dataset's feature files (the .npy, and the disk store with ``--features disk``, written here on
    first use, and the packed store with ``--packed``), or none when its features live inside OGB's archive."""
    from directload.datasets import FEATURE_FILE, convert, dataset_dir
    from directload.harness.train import DISK_FILE, PACKED_FILE

    base = dataset_dir(args.root, args.dataset)
    npy = base / "raw" / FEATURE_FILE
    if features == "memory":
        return [npy] if npy.exists() else []
    packed = [base / PACKED_FILE] if getattr(args, "packed", False) else []
    if packed and not packed[0].exists():  # checked first: nothing is written for a run that cannot start
        raise FileNotFoundError(f"{packed[0]} does not exist: write it with `directload dataset pack "
                                f"--name {args.dataset}`")
    if not npy.exists():
        npy = convert(args.root, args.dataset)  # features inside OGB's archive: write the .npy first
    store = base / DISK_FILE
    if not store.exists():
        from directload.stores import write_disk_store

        write_disk_store(npy, store, progress=not args.no_progress)
    return [npy, store, *packed]


def _train(args):
    models = ["sage", "gat"] if args.model == "both" else [args.model]
    if args.loader in ("dgl", "pyg") and args.loader != args.framework:
        raise ValueError(f"--loader {args.loader} is {args.loader}'s own loader, but --framework is {args.framework}")
    loaders = [args.framework, "directload"] if args.loader == "both" else [args.loader]
    if args.dist:
        return _train_dist(args, models, loaders)
    if args.partition_features and (args.loader != "directload" or args.packed or args.node_budget):
        raise ValueError("--partition-features splits the rows among the ranks of directload's loader: it needs "
                         "--loader directload, and neither --packed nor --node-budget")
    if args.partition_features and args.nproc < 2 and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise ValueError("--partition-features splits the rows among the ranks of a DDP job: give --nproc N (N >= 2) "
                         "or start the ranks with torchrun")
    if args.packed and (args.features == "memory" or args.loader not in ("directload", "both")):
        raise ValueError("--packed reads the packed disk store with directload's loader: it needs --features disk "
                         "or tiered and --loader directload (or both)")
    if (args.node_budget or args.node_io_depth) and (args.features != "tiered" or args.loader not in ("directload",
                                                                                                        "both")):
        raise ValueError("--node-budget shares the host caches and disk queues of directload's tiered stores: it "
                         "needs --features tiered and --loader directload (or both)")
    if args.node_io_depth and not args.node_budget:
        raise ValueError("--node-io-depth is shared within a node budget: give --node-budget too")
    if args.shared_hot and not (args.packed and args.features == "tiered"):
        raise ValueError("--shared-hot keeps the packed store's hottest rows once per node: it needs --packed and "
                         "--features tiered")
    if args.shared_hot and args.node_budget and args.shared_hot >= args.node_budget:
        raise ValueError("--shared-hot is taken out of --node-budget: it must be smaller")
    if args.node_budget:
        from directload.budget import NodeBudget

        NodeBudget(args.budget_name, host_bytes=args.node_budget)  # the name's check, before any work
    dataset = args.dataset + ("" if args.features == "memory" else f"-{args.features}") + \
        ("-packed" if args.packed else "")
    return run_training(args, models, loaders, range(args.seeds), report_name("train", dataset, models, loaders))


def build_parser():
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
    p.set_defaults(func=_info)

    p = command(sub, "tune", "the GPU gather's tuned choices: for each GPU, driver, torch and kind of gather, the "
                             "kernel chosen and each candidate's time (the first GPU gather of a kind times them; "
                             "DIRECTLOAD_TUNE=0 turns timing off)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--clear", action="store_true",
                   help="remove the tuner's cache file (only that file), so every kind is timed again")
    p.set_defaults(func=_tune)

    ds = command(sub, "dataset", "generate a synthetic dataset or convert an OGB one")
    ds_sub = ds.add_subparsers(dest="action", required=True, metavar="{synth,convert,pack,partition}")
    p = command(ds_sub, "synth", "generate a synthetic node-classification dataset in OGB's on-disk layout")
    p.add_argument("--root", default="data", help="directory to write the dataset into")
    p.add_argument("--name", default="synth-small",
                   help="dataset name, one plain path component; the presets synth-tiny, synth-small, synth-medium, "
                        "synth-large and synth-ooc pick their sizes")
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
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_synth)
    p = command(ds_sub, "convert", "add a memory-mappable raw/node-feat.npy to an OGB dataset on disk, or write "
                                   "a dataset's (or a .npy file's) features as a disk store (--to disk)")
    p.add_argument("--root", default="data", help="directory that holds the dataset")
    p.add_argument("--name", help="the dataset, for example ogbn-products")
    p.add_argument("--to", choices=["npy", "disk"], default="npy",
                   help="npy: raw/node-feat.npy for memory mapping; disk: a disk store (4 KiB-aligned rows and a "
                        "checksummed sidecar) for directload.stores.DiskStore, in <dataset>/disk/node-feat.npy")
    p.add_argument("--input", help="with --to disk: a .npy file to convert instead of a dataset's features")
    p.add_argument("--out", help="with --to disk: where to write the store (default: see --to; for --input, "
                                 "FILE.disk.npy next to it)")
    p.add_argument("--overwrite", action="store_true", help="replace a disk store directload wrote before")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_convert)

    p = command(ds_sub, "pack", "write a dataset's packed disk store: its rows renumbered hottest first, by how "
                                "often pre-sampled epochs of the training sampler read them (train --packed "
                                "reads it)")
    p.add_argument("--root", default="data", help="directory that holds the dataset")
    p.add_argument("--name", default="synth-small", help="the dataset (its disk store is written first if missing)")
    p.add_argument("--framework", choices=list(SIDES), default=_default_framework(),
                   help="whose sampler pre-samples the epochs (default: whichever is installed, DGL first)")
    p.add_argument("--fanouts", type=int, nargs="+", default=None,
                   help="neighbours sampled per layer, as train's --fanouts (default 15 10 5)")
    p.add_argument("--batch-size", type=_positive_int, default=1024, help="seed nodes per mini-batch, as train's")
    p.add_argument("--epochs", type=_positive_int, default=3, help="epochs pre-sampled for the profile")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_pack)

    p = command(ds_sub, "partition", "write a dataset's DistDGL partitions (dgl.distributed.partition_graph) for "
                                     "train --dist, with a directload disk store per partition for out-of-core "
                                     "features")
    p.add_argument("--root", default="data", help="directory that holds the dataset")
    p.add_argument("--name", default="synth-small", help="the dataset (a synthetic preset is generated when missing)")
    p.add_argument("--parts", type=_positive_int, required=True, help="partitions: one per machine")
    p.add_argument("--features", choices=["memory", "disk"], default="memory",
                   help="memory: in DGL's partitions, held by its servers; disk: a directload disk store per "
                        "partition, read by that machine's servers and trainers, never all in memory")
    p.add_argument("--method", choices=["metis", "random"], default="metis", help="DGL's partitioning method")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_partition)

    st = command(sub, "store", "check a disk store")
    st_sub = st.add_subparsers(dest="action", required=True, metavar="{verify}")
    p = command(st_sub, "verify", "check every chunk of a disk store against its sidecar's checksums (exit 1 if "
                                  "any differs)")
    p.add_argument("path", help="the store's .npy file")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_verify)

    p = command(sub, "bench", "run a benchmark script from benchmarks/ (each prints a table, writes JSON and PNG)")
    p.add_argument("which", choices=sorted(BENCH_SCRIPTS),
                   help="gather: gather bandwidth; alignment: the alignment sweep; unified: unified-tensor "
                        "gathers; disk: random row reads from disk, DiskStore against fio and np.memmap; "
                        "loader: training epochs, DGL's loader against ours (GraphSAGE by default); "
                        "pyg: PyG's example idioms, PyG's loader against ours; gpu: the GPU suite; versus: "
                        "one of these against the same benchmark of an earlier commit")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script (see its --help)")
    p.set_defaults(func=_bench)

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
    p.set_defaults(func=_train)
    return parser


def _one_line(exc):
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = f"KeyError: {exc.args[0]}"
    return text or type(exc).__name__


def main(argv=None):
    """Entry point of ``directload`` and ``python -m directload``.

    Errors are printed as one line (``directload: error: ...``, exit status
    1); ``--debug`` prints the traceback instead.
    """
    from directload.harness.memcap import enter_capped_child

    enter_capped_child()  # a capped child dies with its guardian
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.rerun = [sys.executable, "-m", "directload", *argv]  # a capped run: this command again, in its cgroup
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe (| head) shows up here, not at exit
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a program cut off by head
    except KeyboardInterrupt:
        print("directload: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every library error: one line, or the traceback with --debug
        if getattr(args, "debug", False):
            traceback.print_exc()
        else:
            print(f"directload: error: {_one_line(exc)}", file=sys.stderr)
        return 1

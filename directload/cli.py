"""The ``directload`` command line: info, datasets, benchmarks and training."""

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

__all__ = ["main"]

_BENCH = {"gather": "gather_bandwidth.py", "alignment": "alignment_sweep.py", "unified": "unified_gather.py",
          "loader": "loader_e2e.py", "gpu": "gpu_suite.py"}
_SOURCE_TREE = Path(__file__).resolve().parent.parent


def _default_out():
    bench = Path("benchmarks") / "results"
    return str(bench) if bench.parent.is_dir() else "directload-results"


def _info(args):
    from directload.capabilities import capabilities

    caps = capabilities().as_dict()
    if args.json:
        print(json.dumps(caps, indent=2))
    else:
        width = max(map(len, caps))
        for k, v in caps.items():
            print(f"{k:<{width}}  {v}")
    return 0


def _synth(args):
    from directload.datasets import PRESETS, SynthConfig, synthesize

    base = PRESETS.get(args.name, SynthConfig())
    overrides = {k: v for k, v in {"num_nodes": args.nodes, "avg_degree": args.degree, "num_feats": args.feats,
                                   "num_classes": args.classes, "seed": args.seed,
                                   "feat_dtype": args.dtype}.items() if v is not None}
    path = synthesize(args.root, args.name, SynthConfig(**{**asdict(base), **overrides}),
                      inline_features=args.inline_features, overwrite=args.overwrite)
    print(f"dataset {args.name} in {path}")
    return 0


def _convert(args):
    from directload.datasets import convert

    print(f"wrote {convert(args.root, args.name)}")
    return 0


def _bench(args):
    path = _SOURCE_TREE / "benchmarks" / _BENCH[args.which]
    if not path.exists():
        print(f"benchmarks/{_BENCH[args.which]} is not in this installation: run it from a source checkout",
              file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(path), *args.rest], env=os.environ.copy())


def add_train_arguments(p):
    """Options shared by ``directload train`` and benchmarks/loader_e2e.py."""
    p.add_argument("--dataset", default="synth-small", help="synthetic preset (generated if missing) or OGB name")
    p.add_argument("--root", default="data", help="directory holding datasets")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--fanouts", type=int, nargs="+", default=None)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--out", default=None, help="directory for the JSON and PNG (default: benchmarks/results)")
    p.add_argument("--no-progress", action="store_true")


def run_training(args, models, loaders, seeds, name):
    """Load (generating if needed) the dataset, train side by side, print and write the report."""
    import torch

    from directload.capabilities import capabilities
    from directload.datasets import PRESETS, load, synthesize
    from directload.datasets.synthetic import META_FILE
    from directload.experiments import compare, write_report
    from directload.train import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dataset in PRESETS and not (Path(args.root) / args.dataset.replace("-", "_") / META_FILE).exists():
        synthesize(args.root, args.dataset, progress=not args.no_progress)  # keeps one made with other options
    device = args.device or ("cuda" if capabilities().cuda else "cpu")
    dataset = load(args.root, args.dataset)
    overrides = {k: v for k, v in {"hidden": args.hidden, "batch_size": args.batch_size,
                                   "fanouts": tuple(args.fanouts) if args.fanouts else None}.items() if v is not None}
    base = TrainConfig(epochs=args.epochs, device=device, num_workers=args.num_workers, **overrides)
    rows = compare(dataset, base, models=models, loaders=loaders, seeds=seeds, progress=not args.no_progress)
    meta = {"dataset": args.dataset, "device": device, "nodes": dataset.graph.num_nodes(),
            "edges": dataset.graph.num_edges(), "feats": int(dataset.feat.shape[1]),
            "torch_threads": torch.get_num_threads(), "capabilities": capabilities().as_dict()}
    path, summary = write_report(rows, args.out or _default_out(), name, meta)
    _print_summary(summary, meta)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _print_summary(summary, meta):
    cols = ["model", "loader", "seeds", "epoch_s", "sample_s", "gather_s", "train_s", "wait_s", "valid_acc",
            "test_acc", "epoch_vs_dgl", "test_acc_minus_dgl"]
    print(f"\n{meta['dataset']}: {meta['nodes']} nodes, {meta['edges']} edges, {meta['feats']} features; "
          f"{meta['device']}, {meta['torch_threads']} torch threads; seconds per epoch (median, first epoch left out)")
    cells = [[f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols] for r in summary]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _train(args):
    models = ["sage", "gat"] if args.model == "both" else [args.model]
    loaders = ["dgl", "directload"] if args.loader == "both" else [args.loader]
    return run_training(args, models, loaders, range(args.seeds), f"train_{args.dataset}")


def main(argv=None):
    """Entry point of ``directload`` and ``python -m directload``."""
    parser = argparse.ArgumentParser(prog="directload", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="what this machine can do (CUDA, CuPy, NVRTC, simulator, io_uring)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)

    ds = sub.add_parser("dataset", help="generate or convert datasets").add_subparsers(dest="action", required=True)
    p = ds.add_parser("synth", help="generate a synthetic dataset in OGB's on-disk layout")
    p.add_argument("--root", default="data")
    p.add_argument("--name", default="synth-small", help="synth-tiny, synth-small, synth-medium, synth-large or any")
    p.add_argument("--nodes", type=int)
    p.add_argument("--degree", type=int)
    p.add_argument("--feats", type=int)
    p.add_argument("--classes", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--dtype", choices=["float32", "float16"])
    p.add_argument("--inline-features", action="store_true", help="features inside OGB's data.npz")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_synth)
    p = ds.add_parser("convert", help="add a memory-mappable feature file to an OGB dataset on disk")
    p.add_argument("--root", default="data")
    p.add_argument("--name", required=True, help="for example ogbn-products")
    p.set_defaults(func=_convert)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    p.add_argument("which", choices=sorted(_BENCH))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_bench)

    p = sub.add_parser("train", help="train GraphSAGE/GAT with DGL's loader and/or directload's")
    p.add_argument("--model", choices=["sage", "gat", "both"], default="sage")
    p.add_argument("--loader", choices=["dgl", "directload", "both"], default="both")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    add_train_arguments(p)
    p.set_defaults(func=_train)

    args = parser.parse_args(argv)
    return args.func(args)

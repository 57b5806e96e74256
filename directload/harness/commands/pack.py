"""``directload dataset pack``: a dataset's packed disk store, its rows renumbered hottest first."""

from __future__ import annotations

import argparse

from directload.harness.options import resolve_depth

from .runs import feature_files

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Pre-sample ``args.epochs`` epochs, count each row's reads, and write the rows hottest first."""
    import time

    from directload.capabilities import require
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize
    from directload.harness.train import TrainConfig, pack

    check_name(args.name)
    layers, fanouts = resolve_depth(None, args.fanouts)
    require({"dgl": "dgl", "pyg": "torch_geometric"}[args.framework])
    if args.name in PRESETS and not dataset_exists(args.root, args.name):
        synthesize(args.root, args.name, progress=not args.no_progress)
    # the disk store it renumbers, written first if missing
    feature_files(args.root, args.name, "disk", codec=args.codec, progress=not args.no_progress)
    dataset = load(args.root, args.name)
    cfg = TrainConfig(framework=args.framework, loader="directload", layers=layers, fanouts=fanouts,
                      batch_size=args.batch_size)
    t0 = time.perf_counter()
    path, counts = pack(dataset, cfg, args.epochs, codec=args.codec, progress=not args.no_progress)
    seen = int((counts > 0).sum())
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s: {seen} of {dataset.num_nodes} rows read in "
          f"{args.epochs} pre-sampled epochs, now the file's first {seen} rows")
    return 0

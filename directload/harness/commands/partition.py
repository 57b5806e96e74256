"""``directload dataset partition``: a dataset's DistDGL partitions, for ``train --dist``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["run", "partition_dir"]


def partition_dir(root: os.PathLike[str] | str, name: str, parts: int, features: str,
                  codec: str | None = None) -> Path:
    """Where ``directload dataset partition`` writes (and ``train --dist`` reads) a dataset's partitions, of
    plain rows or of ``codec``'s code rows. Pure.

    Examples
    --------
    >>> str(partition_dir("data", "synth-tiny", 2, "disk")), partition_dir("data", "synth-tiny", 2, "disk", "int8").name
    ('data/synth_tiny/partitions-2-disk', 'partitions-2-disk-int8')
    """
    from directload.datasets import dataset_dir

    return dataset_dir(root, name) / f"partitions-{parts}-{features}{'-' + codec if codec else ''}"


def run(args: argparse.Namespace) -> int:
    """Write ``args.parts`` DistDGL partitions of ``args.name`` under :func:`partition_dir`."""
    from directload.capabilities import require
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize

    check_name(args.name)
    require("dgl")
    from directload.loaders.dgl.distributed import partition

    if args.name in PRESETS and not dataset_exists(args.root, args.name):
        synthesize(args.root, args.name, progress=not args.no_progress)
    dataset = load(args.root, args.name)
    out = partition_dir(args.root, args.name, args.parts, args.features, args.codec)
    config = partition(dataset, args.parts, out, features=args.features, method=args.method, codec=args.codec,
                       progress=not args.no_progress)
    rows = f"{args.codec} code rows" if args.codec else "features"
    where = "in memory" if args.features == "memory" else "on disk"
    print(f"wrote {args.parts} DistDGL partitions of {args.name} ({rows} {where}) to {config}")
    return 0

"""``directload dataset convert``: an OGB dataset's memory-mappable features, or a disk store."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Write ``raw/node-feat.npy`` (``--to npy``) or a disk store (``--to disk``)."""
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

"""``directload dataset convert``: an OGB dataset's memory-mappable features, or a disk store."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Write ``raw/node-feat.npy`` (``--to npy``) or a disk store (``--to disk``, of code rows with ``--codec``)."""
    if args.codec is not None and args.to != "disk":
        raise ValueError("--codec writes a disk store of code rows: give --to disk")
    from directload.datasets import convert

    if args.to == "npy" or args.input is None:
        if args.name is None:
            raise ValueError("name the dataset (--name), or give --input FILE.npy with --to disk")
        npy = convert(args.root, args.name)
        if args.to == "npy":
            print(f"wrote {npy}")
            return 0
        from directload.harness.train_inputs import disk_file

        source, out = npy, npy.parent.parent / disk_file(args.codec)
    else:
        source = Path(args.input)
        out = source.with_name(source.stem + (f".{args.codec}" if args.codec else "") + ".disk.npy")
    from directload.stores import write_disk_store

    out = write_disk_store(source, Path(args.out) if args.out else out, overwrite=args.overwrite,
                           progress=not args.no_progress, codec=args.codec)
    print(f"wrote the disk store {out} (open it with directload.stores.DiskStore)")
    return 0

"""``directload dataset import``: a real graph from one ``.npz`` file, in OGB's layout."""

from __future__ import annotations

import argparse

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Import ``args.npz`` as dataset ``args.name`` (default: the file's name) under ``args.root``."""
    from pathlib import Path

    from directload.datasets import check_name, import_npz

    name = args.name or Path(args.npz).stem.replace("_", "-")
    check_name(name)
    if not Path(args.npz).is_file():
        raise FileNotFoundError(f"no file {args.npz}")
    path = import_npz(args.root, name, args.npz, split=args.split, overwrite=args.overwrite)
    print(f"dataset {name} (split {args.split} of {Path(args.npz).name}) in {path}")
    return 0

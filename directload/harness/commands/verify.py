"""``directload store verify``: every chunk of a disk store against its sidecar's checksums."""

from __future__ import annotations

import argparse

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Check every chunk of ``args.path``; exit status 1 when any differs."""
    from directload.stores import verify

    report = verify(args.path, progress=not args.no_progress)
    bad = report["bad_chunks"]
    for index, first, last in bad:
        print(f"chunk {index} (bytes {first}-{last}): checksum mismatch")
    print(f"{report['path']}: {report['chunks']} chunks, {report['bytes']} bytes, "
          f"{'all match' if not bad else f'{len(bad)} bad'}")
    return 1 if bad else 0

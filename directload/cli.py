"""The ``directload`` command line."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]


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


def _bench(args):
    script = {"gather": "gather_bandwidth.py", "alignment": "alignment_sweep.py", "unified": "unified_gather.py",
              "gpu": "gpu_suite.py"}[args.which]
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    path = root / script
    if not path.exists():
        print(f"benchmarks/{script} is not in this installation: run it from a source checkout", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(path), *args.rest], env=os.environ.copy())


def main(argv=None):
    """Entry point of ``directload`` and ``python -m directload``."""
    parser = argparse.ArgumentParser(prog="directload", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="what this machine can do (CUDA, CuPy, NVRTC, simulator, io_uring)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)
    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    p.add_argument("which", choices=["gather", "alignment", "unified", "gpu"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return args.func(args)

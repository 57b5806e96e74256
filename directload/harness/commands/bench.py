"""``directload bench NAME``: run a benchmark script of benchmarks/ in a source checkout."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["run", "BENCH_SCRIPTS"]

#: ``directload bench NAME``: the script of benchmarks/ that NAME runs.
BENCH_SCRIPTS = {"gather": "gather_bandwidth.py", "alignment": "alignment_sweep.py", "unified": "unified_gather.py",
                 "loader": "loader_e2e.py", "gpu": "gpu_suite.py", "disk": "disk_read.py",
                 "cache": "cache_policies.py", "ooc": "out_of_core.py", "pack": "hot_packing.py",
                 "pyg": "pyg_idioms.py", "versus": "versus.py", "share": "node_share.py",
                 "accuracy": "codec_accuracy.py", "dist": "distdgl.py", "sample": "sample_bench.py",
                 "epoch": "gpu_epoch.py", "codecs": "codecs.py"}
_SOURCE_TREE = Path(__file__).resolve().parents[3]  # the checkout: directload/harness/commands/bench.py


def run(args: argparse.Namespace) -> int:
    """Run benchmarks/ script ``args.which`` with ``args.rest``; its exit status."""
    path = _SOURCE_TREE / "benchmarks" / BENCH_SCRIPTS[args.which]
    if not path.exists():
        raise FileNotFoundError(f"benchmarks/{BENCH_SCRIPTS[args.which]} is not in this installation: run it from a "
                                "source checkout")
    return subprocess.call([sys.executable, str(path), *args.rest], env=os.environ.copy())

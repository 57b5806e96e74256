"""The GPU suite: gpu-marked tests plus the benchmarks, on a CUDA machine, into one report.

Run ``python benchmarks/gpu_suite.py`` (or ``directload bench gpu``).  Without a
CUDA device it says so and exits 0, having measured nothing.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, system_facts  # noqa: E402

from directload.capabilities import capabilities  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# (name, script, arguments): every benchmark that has a GPU mode.
BENCHMARKS = [
    ("gather_bandwidth", "gather_bandwidth.py", ["--device", "cuda", "--name", "gpu_gather_bandwidth"]),
    ("alignment_sweep", "alignment_sweep.py", ["--name", "gpu_alignment_sweep"]),
    ("unified_gather", "unified_gather.py", ["--name", "gpu_unified_gather"]),
    ("loader_e2e", "loader_e2e.py", ["--device", "cuda", "--seeds", "1", "--epochs", "2",
                                     "--out", "benchmarks/results/gpu", "--no-progress"]),
]


def _run(cmd, log):
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
    return proc, time.time() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller benchmark sweeps")
    args = p.parse_args(argv)
    caps = capabilities()
    if not caps.cuda:
        print("no CUDA device on this machine: the GPU suite measures nothing here (CPU lanes: scripts/dev.sh test)")
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / "gpu_report.md"
    head = (f"# directload GPU report\n\nMeasured on {caps.device_name}.\n\n```json\n"
            f"{json.dumps(system_facts(), indent=2)}\n```\n\n")

    def write(sections):  # after every step, so a run cut short still leaves what it measured
        report.write_text(head + "\n".join(sections))

    with open(RESULTS / "gpu_suite.log", "w") as log:
        tests, secs = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests/gpu", "-p", "no:cacheprovider"],
                           log)
        sections = [f"## gpu-marked tests ({secs:.0f} s, exit {tests.returncode})\n\n```\n"
                    + "\n".join(tests.stdout.strip().splitlines()[-15:]) + "\n```\n"]
        write(sections)
        ok = tests.returncode == 0
        for name, script, extra in BENCHMARKS:
            quick = ["--quick"] if args.quick and name == "gather_bandwidth" else []
            proc, secs = _run([sys.executable, f"benchmarks/{script}", *extra, *quick], log)
            ok &= proc.returncode == 0
            table = "\n".join(line for line in proc.stdout.splitlines() if "it/s" not in line and "%|" not in line)
            sections.append(f"## {name} ({secs:.0f} s, exit {proc.returncode})\n\n```\n{table.strip()}\n```\n")
            write(sections)
    print(f"wrote {report} (full output in {RESULTS / 'gpu_suite.log'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

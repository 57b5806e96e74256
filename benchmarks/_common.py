"""Shared helpers for the benchmark scripts: timing, system facts, and JSON/PNG/table output."""

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from directload.harness.plotting import pyplot, save_figure  # re-exported for the scripts

RESULTS = Path(__file__).resolve().parent / "results"

# GPU timing (host, GPU and pipelined time apart) lives in _gpu.py.
__all__ = ["RESULTS", "prepare_cpu_kernels", "median_time", "interleaved_medians", "system_facts", "write_json",
           "print_table", "table_text", "pyplot", "save_figure", "grouped_bars", "cpu_hog"]


def prepare_cpu_kernels():
    """Load every CPU gather kernel now: gathers measured here must run the kernels, not the index_select a
    process uses until the load pays (``directload.kernels.cpu.LOAD_AFTER_S``)."""
    from directload.kernels import cpu

    for aligned in (True, False):
        cpu.prepare(aligned=aligned, background=False)


def median_time(fn, reps, warmup=1):
    """Median wall time of ``fn()`` in seconds over ``reps`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(fns, reps, min_seconds=0.3, max_rounds=500, timer=None):
    """Median time of each ``fns[name]()``, timed in interleaved rounds.

    One round times every function once, in order, so slow drifts of a noisy
    machine (turbo, other tenants) hit all of them alike.  Rounds repeat until
    there are ``reps`` of them and ``min_seconds`` have passed (small inputs get
    more rounds), at most ``max_rounds``.  ``timer(fn)`` measures one call
    (wall clock by default).
    """
    timer = timer or _wall
    for fn in fns.values():
        fn()  # warm-up: compile, fault pages in
    samples = {name: [] for name in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < reps or (time.perf_counter() - start < min_seconds and rounds < max_rounds):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
        rounds += 1
    return {name: statistics.median(v) for name, v in samples.items()}


def _wall(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def system_facts():
    """What the numbers were measured on."""
    import numba
    import torch

    from directload.capabilities import capabilities
    from directload.kernels import cpu

    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "cpu_gather_team": cpu.team(),
        "torch": torch.__version__,
        "capabilities": capabilities().as_dict(),
    }


def write_json(name, payload):
    """Write ``benchmarks/results/<name>.json`` (``name`` may name a subfolder); returns the path."""
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    return path


def print_table(rows, columns):
    """Print a list of dicts as an aligned text table, in ``columns`` order."""
    print(table_text(rows, columns))


def table_text(rows, columns):
    """A list of dicts as an aligned text table, in ``columns`` order (floats to 2 decimals).

    >>> print(table_text([{"a": 1.5, "bb": "x"}], ["a", "bb"]))
       a  bb
    1.50   x
    """
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def grouped_bars(path, labels, series, ylabel, title, rotation=45, log=False):
    """A bar group per label, one bar per ``series`` entry (name -> values); ``log`` for a log value axis."""
    import numpy as np

    plt = pyplot()
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.9), 4.5))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + i * width, values, width, label=name)
    ax.set_xticks(x + 0.4 - width / 2, labels, rotation=rotation, ha="right")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def pack_disk_store(args):
    """Write the packed disk store (``directload dataset pack``) of ``args.dataset`` under ``args.root`` with
    the runs' sampler settings (``fanouts``, ``batch_size``, ``pack_epochs``); its seconds."""
    cmd = [sys.executable, "-m", "directload", "dataset", "pack", "--name", args.dataset, "--root", args.root,
           "--framework", "dgl", "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size),
           "--epochs", str(args.pack_epochs), "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"directload dataset pack failed (exit {proc.returncode}): {proc.stderr[-600:]}")
    return time.perf_counter() - t0


_SPIN = "while True:\n    pass\n"


def _die_with_parent():
    """In a child before exec: SIGKILL when the parent dies (``PR_SET_PDEATHSIG``)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@contextlib.contextmanager
def cpu_hog(n):
    """``n`` processes, each keeping one core busy with a spinning loop, for as long as the block runs: a
    controlled CPU contention, as other jobs on a shared node make.  They run at this process's priority,
    die with it (``PR_SET_PDEATHSIG``) and are killed and reaped when the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], preexec_fn=_die_with_parent) for _ in range(int(n))]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def parse_with_quick(parser, argv, quick):
    """``parser.parse_args(argv)``, then with ``--quick`` the values of ``quick`` for every option left at its
    default."""
    args = parser.parse_args(argv)
    if args.quick:
        for k, v in quick.items():
            if getattr(args, k) == parser.get_default(k):
                setattr(args, k, v)
    return args

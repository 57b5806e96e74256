"""The GPU suite: every GPU benchmark and the hot-path tests on a CUDA machine, most decisive first, into
one report written as it goes.

Run ``python benchmarks/gpu_suite.py`` (or ``directload bench gpu``; ``scripts/gpu_lease.sh`` on a lent
machine).  Sections, in order, each with a time budget (``--plan`` prints them, and the total with a fresh
machine's setup, and exits):

1. ``e2e``: the mission's headline: GraphSAGE epochs with PyG's loader, PyG's loader over directload's
   features, directload's loader sampling on the CPU and directload's loader with the whole batch on the GPU,
   side by side, stage by stage, host syncs counted (``benchmarks/gpu_epoch.py``);
2. ``sort``: sorted vs unsorted ids (the ``+sort`` variants, and ids the caller sorted);
3. ``tablesize``: one gather over tables of 256 MiB to 16 GiB;
4. ``kernels``: every candidate (rowvec widths, naive, aligned, ``index_select``) vs torch's
   ``index_select`` and the ideal copy; ``unified[idx]`` against the goals; the alignment sweep;
5. ``tuner``: the tuner's choice vs an exhaustive sweep (within 5%?);
6. ``sample``: directload's GPU sampler over a unified graph against PyG's sampler (and DGL's UVA sampler
   where DGL runs), sampling alone (``benchmarks/sample_bench.py --device cuda``);
7. ``codecs``: each codec's decoding gather against float32 rows and against ``index_select`` + decode
   (``benchmarks/codecs.py --device cuda``);
8. ``hotpath``: ``pytest tests/gpu tests/kernels tests/unified`` with ``DIRECTLOAD_SYNC_DEBUG=1`` (the
   ``sync_debug`` fixture runs the gathers under ``torch.cuda.set_sync_debug_mode("error")``).

Each section is appended to ``benchmarks/results/gpu_report.md`` when it ends, so a run killed midway
leaves a report of what it finished.  A section's scripts get its budget (``--budget-s``: they start no
new point after it) and are stopped at it plus a grace.  Without a CUDA device it says so and exits 0,
having measured nothing (``--plan`` works anywhere).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS  # noqa: E402
from _report import Report  # noqa: E402

from directload.harness.parser import HelpFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: Seconds a step may run past its budget to print and write what it measured, before it is stopped.
GRACE_S = 30
#: A section starts only with at least this share of its budget left.
FLOOR = 0.5


@dataclass(frozen=True)
class Step:
    """One command of a section: ``argv`` after the Python interpreter, its share of the section's time,
    extra environment, and whether it takes ``--budget-s``."""

    argv: tuple
    share: float = 1.0
    env: dict = field(default_factory=dict)
    budgeted: bool = True


@dataclass(frozen=True)
class Section:
    """A titled part of the report: its steps, and its budget in seconds, full and ``--quick``."""

    key: str
    title: str
    budget_s: int
    quick_s: int
    steps: tuple
    quick_steps: tuple = ()

    def steps_for(self, quick):
        return self.quick_steps if quick and self.quick_steps else self.steps


def _bench(script, *args, share=1.0):
    return Step(("benchmarks/" + script, *args), share)


SECTIONS = (
    Section("e2e", "1. The GPU epoch end to end: GraphSAGE with four loaders side by side, stage by stage", 240, 140,
            (_bench("gpu_epoch.py", "--device", "cuda", "--name", "gpu/epoch_e2e"),),
            (_bench("gpu_epoch.py", "--device", "cuda", "--quick", "--name", "gpu/epoch_e2e"),)),
    Section("sort", "2. Sorted vs unsorted ids", 100, 30,
            (_bench("gather_bandwidth.py", "--device", "cuda", "--variants", "index_select", "rowvec", "aligned",
                    "--row-bytes", "256", "1024", "4096", "--counts", "16384", "131072", "--gather-mib",
                    "--no-tuner", "--name", "gpu/sort"),),
            (_bench("gather_bandwidth.py", "--device", "cuda", "--variants", "index_select", "rowvec", "aligned",
                    "--row-bytes", "256", "1024", "--counts", "131072", "--gather-mib", "--no-tuner", "--quick",
                    "--name", "gpu/sort"),)),
    Section("tablesize", "3. Table-size sweep (256 MiB to 16 GiB)", 150, 50,
            (_bench("table_size_sweep.py", "--name", "gpu/table_size"),),
            (_bench("table_size_sweep.py", "--quick", "--name", "gpu/table_size"),)),
    Section("kernels", "4. New kernels vs aligned vs index_select", 170, 60,
            # Caller-sorted ids are section 2's and 3's; here every candidate, +sort variants included.
            (_bench("gather_bandwidth.py", "--device", "cuda", "--id-order", "random", "--name",
                    "gpu/gather_bandwidth", share=0.5),
             _bench("unified_gather.py", "--name", "gpu/unified_gather", share=0.3),
             _bench("alignment_sweep.py", "--name", "gpu/alignment_sweep", share=0.2)),
            (_bench("gather_bandwidth.py", "--device", "cuda", "--id-order", "random", "--quick", "--name",
                    "gpu/gather_bandwidth", share=0.5),
             _bench("unified_gather.py", "--row-bytes", "400", "2052", "--counts", "1024", "131072", "--reps", "5",
                    "--name", "gpu/unified_gather", share=0.3),
             _bench("alignment_sweep.py", "--reps", "5", "--count", "16384", "--name", "gpu/alignment_sweep",
                    share=0.2))),
    Section("tuner", "5. The tuner vs an exhaustive sweep", 120, 35,
            (_bench("tuner_check.py", "--name", "gpu/tuner_check"),),
            (_bench("tuner_check.py", "--quick", "--name", "gpu/tuner_check"),)),
    Section("sample", "6. directload's GPU sampler vs PyG's (and DGL's UVA sampler where DGL runs)", 90, 30,
            (Step(("benchmarks/sample_bench.py", "--device", "cuda", "--rounds", "3"), budgeted=False),),
            (Step(("benchmarks/sample_bench.py", "--device", "cuda", "--quick"), budgeted=False),)),
    Section("codecs", "7. Compressed rows: each codec's decoding gather vs float32 and vs index_select + decode", 60,
            30, (Step(("benchmarks/codecs.py", "--device", "cuda", "--no-progress"), budgeted=False),),
            (Step(("benchmarks/codecs.py", "--device", "cuda", "--quick", "--no-progress"), budgeted=False),)),
    # The GPU tests first: a run stopped at its budget has them.
    Section("hotpath", "8. Hot-path checks: the GPU, kernel and unified tests under sync debug mode", 180, 90,
            (Step(("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu", "tests/kernels", "tests/unified"),
                  env={"DIRECTLOAD_SYNC_DEBUG": "1"}, budgeted=False),)),
)
#: Seconds a fresh lent machine spends outside the sections (scripts/gpu_lease.sh: the machine's facts, the
#: installs from carried wheels, the report collected), which the quick plan's total counts.
SETUP_S = 75


def allot(section, left, quick, floor=FLOOR):
    """Seconds to give ``section`` with ``left`` seconds of the run remaining (None: no limit), or None when
    less than ``floor`` of its budget is left.  Pure.

    >>> s = SECTIONS[1]
    >>> allot(s, None, False), allot(s, 1000, False), allot(s, 60, False), allot(s, 40, False)
    (100, 100, 60, None)
    """
    want = section.quick_s if quick else section.budget_s
    if left is None:
        return want
    if left < floor * want:
        return None
    return min(want, int(left))


def plan(sections, *, quick=False, only=None, total_s=None):
    """``(rows, skipped)``: the sections that would run, in order, with the seconds each is given if every
    section uses its whole budget, and a line for each left out.  Pure.

    >>> rows, skipped = plan(SECTIONS, only={"sort", "tuner"}, total_s=200)
    >>> [(r["section"], r["budget s"]) for r in rows], skipped
    ([('sort', 100), ('tuner', 100)], [])
    >>> plan(SECTIONS, only={"sort", "tablesize"}, total_s=120)[1][0]
    '3. Table-size sweep (256 MiB to 16 GiB): skipped, 20 s left of the run and it needs at least 75 s'
    """
    rows, skipped, left = [], [], total_s
    for s in sections:
        if only and s.key not in only:
            continue
        seconds = allot(s, left, quick)
        if seconds is None:
            want = s.quick_s if quick else s.budget_s
            skipped.append(f"{s.title}: skipped, {left:.0f} s left of the run and it needs at least "
                           f"{FLOOR * want:.0f} s")
            continue
        rows.append({"section": s.key, "title": s.title, "budget s": seconds,
                     "steps": "; ".join(" ".join(step.argv) for step in s.steps_for(quick))})
        left = None if left is None else left - seconds
    return rows, skipped


def step_budgets(section, seconds, quick):
    """``[(step, seconds)]``: the section's seconds shared among its steps by their shares.  Pure.

    >>> [round(b) for _, b in step_budgets(SECTIONS[3], 200, False)]
    [100, 60, 40]
    """
    steps = section.steps_for(quick)
    total = sum(s.share for s in steps)
    return [(s, seconds * s.share / total) for s in steps]


def clean_output(text, tail=None):
    """A step's output for the report: progress bars left out (the last state of a ``\\r``-redrawn line
    only, and no tqdm bar), and only the last ``tail`` lines where given.  Pure.

    >>> clean_output("a\\n 50%|##   | 1/2\\rdone 100%|####| 2/2 [00:01<00:00, 2.0it/s]\\nb\\n")
    'a\\nb'
    """
    lines = []
    for line in text.splitlines():
        line = line.rsplit("\r", 1)[-1]
        if "it/s]" in line or "s/it]" in line or ("%|" in line and "|" in line.split("%|", 1)[1]):
            continue
        lines.append(line)
    text = "\n".join(lines).strip("\n")
    return "\n".join(text.splitlines()[-tail:]) if tail else text


def run_step(step, seconds, log_path):
    """Run one step in its own session, its output to ``log_path``; stop it (the whole process group) at
    ``seconds`` plus :data:`GRACE_S`.  ``(exit status or None if stopped, seconds taken)``."""
    argv = [sys.executable, *step.argv]
    if step.budgeted:
        argv += ["--budget-s", f"{max(1.0, seconds - GRACE_S):.0f}"]
    env = {**os.environ, **step.env}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=seconds + GRACE_S)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
    return code, time.monotonic() - t0


def _stop(proc):
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def section_text(section, seconds, results):
    """The report's Markdown for one finished section: its title, budget and time, and per step the
    command, how it ended and its output.  ``results``: ``[(step, exit or None, seconds, output)]``.  Pure."""
    took = sum(r[2] for r in results)
    parts = [f"## {section.title}\n\nbudget {seconds:.0f} s, took {took:.0f} s."]
    for step, code, secs, output in results:
        ended = "stopped at its budget" if code is None else f"exit {code}"
        parts.append(f"`{' '.join(step.argv)}` ({secs:.0f} s, {ended})\n\n```\n{output}\n```")
    return "\n\n".join(parts) + "\n"


def _head():
    from _common import system_facts

    from directload.capabilities import capabilities

    return (f"# directload GPU report\n\nMeasured on {capabilities().device_name} by `directload bench gpu` "
            f"(benchmarks/gpu_suite.py); each section was written when it ended.\n\n```json\n"
            f"{json.dumps(system_facts(), indent=2)}\n```\n")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="each section's smaller sweep and budget")
    p.add_argument("--sections", nargs="+", choices=[s.key for s in SECTIONS],
                   help="only these sections (in the suite's order); default: all")
    p.add_argument("--budget-s", type=float, help="seconds the whole run may take; a section that no longer "
                                                  "has half its budget left is skipped, with a line")
    p.add_argument("--keep-report", action="store_true",
                   help="add to the sections already in the report (a run split over several calls) instead of "
                        "starting a new one")
    p.add_argument("--plan", action="store_true", help="print the sections and their budgets, then exit")
    p.add_argument("--report", default=str(RESULTS / "gpu_report.md"))
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    only = set(args.sections or ())
    if args.plan:
        rows, skipped = plan(SECTIONS, quick=args.quick, only=only, total_s=args.budget_s)
        for r in rows:
            print(f"{r['budget s']:>5} s  {r['section']:<10}{r['title']}\n{'':19}{r['steps']}")
        sections = sum(r["budget s"] for r in rows)
        print(f"in all {sections} s at most, {sections + SETUP_S} s ({(sections + SETUP_S) / 60:.1f} min) with "
              f"about {SETUP_S} s of a fresh machine's setup (scripts/gpu_lease.sh)"
              + "".join(f"\n{line}" for line in skipped))
        return 0
    from directload.capabilities import capabilities

    if not capabilities().cuda:
        print("no CUDA device on this machine: the GPU suite measures nothing here (CPU lanes: scripts/dev.sh test)")
        return 0
    return run(args, only)


def run(args, only):
    t0 = time.monotonic()
    logs = RESULTS / "gpu" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    report = Report(args.report, _head(), keep=args.keep_report)
    report.write()
    ok = True
    for section in SECTIONS:
        if only and section.key not in only:
            continue
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - t0)
        seconds = allot(section, left, args.quick)
        if seconds is None:
            report.put(section.key, f"## {section.title}\n\nskipped: {left:.0f} s of the run's budget were left.\n")
            continue
        print(f"[{time.monotonic() - t0:.0f} s] {section.title} (budget {seconds} s)", flush=True)
        results, started = [], time.monotonic()
        steps = step_budgets(section, seconds, args.quick)
        for k, (step, share) in enumerate(steps):
            # What earlier steps left unused goes to the later ones, by their shares.
            rest = sum(b for _, b in steps[k:])
            share = max(share, (seconds - (time.monotonic() - started)) * share / rest)
            log = logs / f"{section.key}-{k}.log"
            code, secs = run_step(step, share, log)
            ok &= code == 0
            output = clean_output(log.read_text(), tail=40 if not step.budgeted else None)
            results.append((step, code, secs, output))
            report.put(section.key, section_text(section, seconds, results))  # after every step too
    print(f"wrote {report.path} (each step's whole output in {logs})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

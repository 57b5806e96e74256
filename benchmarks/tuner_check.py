"""The tuner against an exhaustive sweep: is its choice within 5% of the fastest candidate? (GPU only)

At each point (row size, id count) every candidate of ``kernels.variants`` is timed by this benchmark, with
more rounds than the tuner's 300 ms allow, beside ``gather(...)`` left to the tuner (``variant=None``) and
torch's own ``index_select`` over the mapped view.  The verdict compares the tuner's path with the
fastest candidate round by round (GPU time and pipelined), and with torch's path (the goal: never slower).
The tuner starts from an empty cache of its own (``DIRECTLOAD_CACHE`` set to a new folder, unless
``--keep-cache``), so each point's first call shows what tuning costs.  Prints tables, writes JSON.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_with_quick, system_facts, table_text, write_json  # noqa: E402
from _report import fmt_ratio, fmt_time, gpu_tables  # noqa: E402

from directload.capabilities import capabilities  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402

QUICK = dict(row_bytes=[256, 1024, 2052], counts=[1024, 131072], reps=5, pipeline=10, table_gib=2.0)
#: The tuner's choice counts as right when it takes at most this much more time than the fastest.
TOLERANCE = 1.05


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"a smaller sweep: {QUICK}")
    p.add_argument("--row-bytes", type=int, nargs="+", default=[256, 400, 1024, 2052, 4096])
    p.add_argument("--counts", type=int, nargs="+", default=[1024, 16384, 131072])
    p.add_argument("--table-gib", type=float, default=4.0, help="the one table every point reads")
    p.add_argument("--allocator", choices=["directload", "torch"], default="directload")
    p.add_argument("--id-order", nargs="+", choices=["random", "sorted"], default=["random"])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--pipeline", type=int, default=20)
    p.add_argument("--keep-cache", action="store_true", help="use the tuner's existing cache, not a new one")
    p.add_argument("--budget-s", type=float, help="start no new point after this many seconds")
    p.add_argument("--name", default="tuner_check")
    return p


def verdicts(rows, index=("row_bytes", "count", "ids")):
    """``(table_rows, summary_lines)`` from the result rows of :func:`_gpu.run_point`: per point, the
    tuner's pick and the fastest candidate, their times and ratios, and whether the pick is within
    :data:`TOLERANCE`.  Pure.

    >>> stat = lambda m: {"median": m, "p25": m, "p75": m, "n": 5}
    >>> rows = [{"row_bytes": 256, "count": 8, "ids": "random", "method": "tuner", "pick": "rowvec16x16",
    ...          "best": "rowvec16x16+sort", "gpu_us": stat(10.4), "vs_best": stat(1.04),
    ...          "vs_best_pipe": stat(1.0), "vs_torch": stat(0.5), "first_call_us": 2e5},
    ...         {"row_bytes": 256, "count": 8, "ids": "random", "method": "rowvec16x16+sort", "gpu_us": stat(10.0)}]
    >>> table, summary = verdicts(rows)
    >>> table[0]["within 5%"], table[0]["tuner/fastest"]
    ('yes', '1.04 (1.04-1.04)')
    >>> summary[0]
    "the tuner within 5% of the fastest candidate (GPU time) at 1 of 1 points; at most the time of torch's ..."
    """
    by = {(tuple(r.get(k) for k in index), r["method"]): r for r in rows}
    table, within, never_slower, n = [], 0, 0, 0
    for (key, method), r in by.items():
        if method != "tuner":
            continue
        line = dict(zip(index, key))
        if "failed" in r:
            table.append({**line, "tuner pick": r["failed"]})
            continue
        n += 1
        best = by.get((key, r.get("best")), {})
        ok = r["vs_best"]["median"] <= TOLERANCE
        within += ok
        never_slower += "vs_torch" in r and r["vs_torch"]["median"] <= 1.0
        table.append({**line, "tuner pick": r.get("pick", "n/a"), "fastest": r.get("best"),
                      "tuner us": fmt_time(r["gpu_us"]), "fastest us": fmt_time(best["gpu_us"]) if best else "",
                      "tuner/fastest": fmt_ratio(r["vs_best"]),
                      "pipelined": fmt_ratio(r["vs_best_pipe"]) if "vs_best_pipe" in r else "",
                      "within 5%": "yes" if ok else "no",
                      "tuner/torch": fmt_ratio(r["vs_torch"]) if "vs_torch" in r else "",
                      "first call ms": f"{r['first_call_us'] / 1e3:.1f}" if "first_call_us" in r else ""})
    summary = [f"the tuner within {100 * (TOLERANCE - 1):.0f}% of the fastest candidate (GPU time) at {within} of "
               f"{n} points; at most the time of torch's index_select at {never_slower} of {n}"] if n else \
        ["the tuner was not measured: " + "; ".join(sorted({r["failed"] for r in rows
                                                            if r["method"] == "tuner" and "failed" in r}))]
    return table, summary


def main(argv=None):
    args = parse_with_quick(build_parser(), argv, QUICK)
    if not capabilities().cuda:
        print("no CUDA device on this machine: the tuner times GPU kernels, so there is nothing to check here")
        return 0
    if not args.keep_cache:  # before the tuner exists: it reads its cache's place once
        os.environ["DIRECTLOAD_CACHE"] = tempfile.mkdtemp(prefix="directload-tuner-check-")
    return run(args)


def run(args):
    from _gpu import GIB, CudaClock, allocate_table, gpu_facts, run_point

    t0 = time.monotonic()
    table = allocate_table(int(args.table_gib * GIB), args.allocator)
    clock = CudaClock()
    rng = np.random.default_rng(1)
    points = [(rb, c, o) for rb in args.row_bytes for c in args.counts for o in args.id_order]
    payload = {"benchmark": "tuner_check", "args": vars(args), "system": system_facts(), "gpu": gpu_facts(),
               "table": table.describe(), "results": []}
    notes = []
    for k, (rb, count, order) in enumerate(tqdm(points, desc="tuner check", unit="point")):
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            notes.append(f"budget: stopped after {k} of {len(points)} points (--budget-s {args.budget_s:g})")
            break
        payload["results"] += run_point(table, rb, count, order, rng, clock, reps=args.reps, pipeline=args.pipeline)
        write_json(args.name, payload)
    table.close()
    rows, summary = verdicts(payload["results"])
    payload["verdicts"], payload["summary"] = rows, summary
    print(f"\n{payload['gpu']['gpu']}; one table for every point: {payload['table']}; "
          f"medians of >= {args.reps} interleaved rounds")
    print("\n".join(summary))
    if rows:
        print(table_text(rows, list(dict.fromkeys(k for r in rows for k in r))))
    print("\nevery candidate, for the record:\n" + gpu_tables(payload["results"], index=("row_bytes", "count")))
    if notes:
        print("\n".join(notes))
    print(f"wrote {write_json(args.name, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Unified-tensor gathers: the cost of the unified path, and (on a GPU) zero-copy against the baselines.

On the CPU fallback: ``x[idx]`` on a unified tensor against ``gather`` and ``torch.index_select`` on the
plain tensor, measured side by side (overhead of the placement layer).

On a GPU: ``unified[idx]`` (CUDA ids) against torch's own zero-copy path, ``torch.index_select`` over
``x.cuda_view()`` (PyTorch-Direct's "PyD Naive"), ``kernels.gather`` on the table's host view (the tuner's
choice), a CPU gather followed by ``.to("cuda")`` and the ideal (a pinned copy of the same bytes); every
method makes its own output, as a caller's code does.  One table size for every row size and one
allocator (``directload.empty``), random and caller-sorted ids; host time, GPU time, one blocking call
and a pipelined mean apart (benchmarks/_gpu.py), and the issue's two goals checked point by point:
``unified[idx]`` takes at most 1.0x ``index_select``'s time, and its host overhead (one blocking call
less its GPU time) is at most 50 us.  Prints tables, writes JSON and PNG.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    grouped_bars,
    interleaved_medians,
    prepare_cpu_kernels,
    print_table,
    system_facts,
    table_text,
    write_json,
)
from _report import fmt_ratio, gpu_tables  # noqa: E402

import directload  # noqa: E402
from directload.capabilities import capabilities  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.kernels import gather  # noqa: E402

#: The goals of the GPU path (issue 31): at most this time over torch's index_select, at most this host overhead.
GOAL_RATIO = 1.0
GOAL_OVERHEAD_US = 50.0


def cpu_point(rows, row_bytes, count, reps, rng):
    plain = torch.from_numpy(rng.standard_normal((rows, row_bytes // 4)).astype(np.float32))
    unified = directload.to_unified(plain, "host")
    idx = torch.from_numpy(rng.integers(0, rows, count))
    fns = {
        "unified_getitem": lambda: unified[idx],
        "plain_gather": lambda: gather(plain, idx),
        "plain_index_select": lambda: torch.index_select(plain, 0, idx),
    }
    want = plain[idx]
    for name, fn in fns.items():
        if not torch.equal(fn(), want):
            raise RuntimeError(f"{name} gathered wrong rows")
    times = interleaved_medians(fns, reps)
    res = {f"{k}_gbps": count * row_bytes / t / 1e9 for k, t in times.items()}
    res.update({f"unified_getitem_over_{k}": times["unified_getitem"] / t for k, t in times.items()
                if k != "unified_getitem"})
    unified.close()
    return res


def gpu_methods(unified, host, view):
    """``{name: fn(ids)}``: the unified path and its baselines, each making its own output."""
    return {
        "ideal_copy": lambda i: host.view(-1)[:i[0].numel() * host.shape[1]].to("cuda", non_blocking=True),
        "torch_index_select": lambda i: torch.index_select(view, 0, i[1]),
        "unified_getitem": lambda i: unified[i[1]],
        "kernels_gather": lambda i: gather(host, i[1]),
        "cpu_gather_to_cuda": lambda i: host[i[0]].to("cuda"),
    }


def gpu_point(table_bytes, row_bytes, count, order, rng, clock, args):
    """Result rows of every method at one point, on a unified table of ``table_bytes``."""
    from _gpu import GIB, fill, id_sets, measure, point_rows, rotating, verify

    rows = table_bytes // row_bytes
    unified = directload.empty((rows, row_bytes // 4), dtype=torch.float32)
    view = unified.cuda_view()
    fill(view)
    host = unified.host
    sets = id_sets(rows, count, order, rng)
    out = torch.empty((count, row_bytes // 4), device="cuda")
    working, failed, first = verify(gpu_methods(unified, host, view), out, host, sets[0], clock)
    fns = {name: rotating(fn, sets, k) for k, (name, fn) in enumerate(working.items())}
    keys = {"row_bytes": row_bytes, "count": count, "ids": order, "table_gib": table_bytes / GIB,
            "allocator": "directload"}
    result = point_rows(measure(fns, clock, reps=args.reps, pipeline=args.pipeline), count * row_bytes, **keys)
    for r in result:
        r["first_call_us"] = first[r["method"]] * 1e6
    # Closed now; its block goes back to directload's pool once the methods above are gone, and the next
    # point's table (the same size) reuses it.
    unified.close()
    return result + [{**keys, "method": n, "failed": why} for n, why in failed.items()]


def goals(rows, index=("row_bytes", "count", "ids")):
    """``(table_rows, summary_lines)``: per point, ``unified[idx]``'s time over torch's ``index_select``
    (GPU and pipelined) and its host overhead (one blocking call less its GPU time), against the goals.
    Pure.

    >>> st = lambda m: {"median": m, "p25": m, "p75": m, "n": 3}
    >>> rows = [{"row_bytes": 400, "count": 1024, "ids": "random", "method": "unified_getitem", "vs_torch": st(0.9),
    ...          "vs_torch_pipe": st(1.1), "wall_us": st(80.0), "gpu_us": st(20.0)}]
    >>> table, summary = goals(rows)
    >>> table[0]["overhead us"], summary[0]
    ('60.0', 'unified[idx] at most 1.0x index_select: 1 of 1 points by GPU time, 0 of 1 pipelined')
    >>> summary[1]
    'unified[idx] host overhead at most 50 us: 0 of 1 points'
    """
    table, by_gpu, by_pipe, cheap, n = [], 0, 0, 0, 0
    for r in rows:
        if r.get("method") != "unified_getitem" or "failed" in r or "vs_torch" not in r:
            continue
        n += 1
        overhead = r["wall_us"]["median"] - r["gpu_us"]["median"]
        by_gpu += r["vs_torch"]["median"] <= GOAL_RATIO
        by_pipe += r["vs_torch_pipe"]["median"] <= GOAL_RATIO
        cheap += overhead <= GOAL_OVERHEAD_US
        table.append({**{k: r.get(k) for k in index}, "vs index_select (GPU)": fmt_ratio(r["vs_torch"]),
                      "vs index_select (pipelined)": fmt_ratio(r["vs_torch_pipe"]), "overhead us": f"{overhead:.1f}"})
    summary = [f"unified[idx] at most {GOAL_RATIO:.1f}x index_select: {by_gpu} of {n} points by GPU time, "
               f"{by_pipe} of {n} pipelined",
               f"unified[idx] host overhead at most {GOAL_OVERHEAD_US:g} us: {cheap} of {n} points"]
    return table, summary


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--rows", type=int, default=1 << 19, help="CPU: table rows")
    p.add_argument("--table-mib", type=int, default=2048, help="GPU: the table's size at every row size")
    p.add_argument("--row-bytes", type=int, nargs="+", default=[400, 2052, 2408])
    p.add_argument("--counts", type=int, nargs="+", default=[1024, 16384, 131072])
    p.add_argument("--id-order", nargs="+", choices=["random", "sorted"], default=["random", "sorted"],
                   help="GPU: ids as drawn, and sorted by the caller")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--pipeline", type=int, default=20, help="GPU: calls back to back per pipelined sample")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget-s", type=float, help="GPU: start no new point after this many seconds")
    p.add_argument("--name", default="unified_gather")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    prepare_cpu_kernels()
    torch.set_num_threads(args.threads)
    if capabilities().cuda:
        return gpu_main(args)
    rng = np.random.default_rng(0)
    results = []
    for rb in tqdm(args.row_bytes, desc="unified gather", unit="row size"):
        for count in args.counts:
            results.append({"row_bytes": rb, "count": count, **cpu_point(args.rows, rb, count, args.reps, rng)})
    print(f"\nGB/s and time ratios (median of >= {args.reps} interleaved rounds), CPU fallback, {args.threads} threads")
    print_table(results, list(results[0]))
    path = write_json(args.name, {"benchmark": "unified_gather", "device": "cpu", "args": vars(args),
                                  "system": system_facts(), "results": results})
    _plot(results, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def gpu_main(args):
    from _gpu import ALLOCATORS, MIB, CudaClock, gpu_facts

    t0 = time.monotonic()
    clock = CudaClock()
    rng = np.random.default_rng(0)
    payload = {"benchmark": "unified_gather", "device": "cuda", "args": vars(args), "system": system_facts(),
               "gpu": gpu_facts(), "results": []}
    points = [(rb, c, o) for rb in args.row_bytes for c in args.counts for o in args.id_order]
    notes = []
    for k, (rb, count, order) in enumerate(tqdm(points, desc="unified gather", unit="point")):
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            notes.append(f"budget: stopped after {k} of {len(points)} points (--budget-s {args.budget_s:g})")
            break
        payload["results"] += gpu_point(args.table_mib * MIB, rb, count, order, rng, clock, args)
        path = write_json(args.name, payload)
    table, summary = goals(payload["results"])
    payload["goals"] = summary
    print(f"\n{payload['gpu']['gpu']}; a {args.table_mib} MiB table at every row size, {ALLOCATORS['directload']}; "
          f"medians of >= {args.reps} interleaved rounds")
    print("\n".join(summary))
    if table:
        print(table_text(table, list(table[0])))
    print("\n" + gpu_tables(payload["results"], index=("row_bytes", "count")))
    if notes:
        print("\n".join(notes))
    path = write_json(args.name, payload)
    rows = [r for r in payload["results"] if r.get("ids") == "random" and "gbps" in r]
    _plot([{"count": c, "row_bytes": rb, **{f"{r['method']}_gbps": r["gbps"] for r in rows
                                            if (r["count"], r["row_bytes"]) == (c, rb)}}
           for rb, c in dict.fromkeys((r["row_bytes"], r["count"]) for r in rows)], path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results, path):
    keys = list(dict.fromkeys(k for r in results for k in r if k.endswith("_gbps")))
    labels = [f"{r['count']} x {r['row_bytes']}B" for r in results]
    # Log axis: bandwidths span two orders of magnitude between the small and the large gathers.
    grouped_bars(path, labels, {k[:-5]: [r.get(k, 0.0) for r in results] for k in keys}, "GB/s (log scale)",
                 "Unified-tensor gather", rotation=30, log=True)


if __name__ == "__main__":
    raise SystemExit(main())

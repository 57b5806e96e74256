"""Gather bandwidth microbenchmark (PyTorch-Direct paper, Figure 4.6): random rows of a large table.

On the CPU: directload's ``cpu`` backend (aligned and naive; ``--team`` picks the thread team that runs
it, see kernels/cpu.py) against ``torch.index_select`` and ``numpy.take``, in GB/s and as % of a memcpy of
the same bytes measured in the same run.

On a GPU: every candidate of ``kernels.variants`` (``index_select`` over the mapped view, ``rowvec`` at each
width, ``naive``, ``aligned``; each unsorted and sorted, forced with ``gather(..., variant=name)``), the
tuner's choice, torch's own ``index_select`` over the mapped view and the ideal (a pinned copy of the same
bytes), side by side on one table (one size, one allocator), over random and caller-sorted ids.  Host
time, GPU time and a pipelined mean are reported apart (benchmarks/_gpu.py).  Prints tables, writes JSON
and PNG to results/.
"""

import argparse
import itertools
import sys
import time
from pathlib import Path

import numba
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
    write_json,
)

from directload.capabilities import capabilities  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.kernels import cpu as cpu_backend  # noqa: E402
from directload.kernels import gather  # noqa: E402

KIB = 1024
MIB = 1 << 20
INDEX_SETS = 8


def _table(rows, row_bytes, pin):
    t = torch.empty((rows, row_bytes // 4), dtype=torch.float32, pin_memory=pin)
    # Touch every page with distinct values so no read is served by the zero page.
    chunk = max(1, (256 << 20) // row_bytes)
    for s in range(0, rows, chunk):
        t[s:s + chunk].view(torch.int32).copy_(
            torch.arange(s * (row_bytes // 4), min(rows, s + chunk) * (row_bytes // 4), dtype=torch.int32).view(
                -1, row_bytes // 4))
    return t


def _index_sets(rows, count, rng, device="cpu"):
    """Distinct random index sets, so no method reads rows the previous one just cached."""
    return [torch.from_numpy(rng.integers(0, rows, count)).to(device) for _ in range(INDEX_SETS)]


def _rotating(fn, sets, start):
    """``fn(idx)`` bound to a rotation through ``sets`` starting at ``start``."""
    it = itertools.cycle(sets[start:] + sets[:start])
    return lambda: fn(next(it))


def cpu_point(table, count, reps, rng):
    sets = _index_sets(table.shape[0], count, rng)
    out = torch.empty((count, table.shape[1]), dtype=table.dtype)
    src_np, out_np = table.numpy(), out.numpy()
    nbytes = count * table.shape[1] * 4
    contiguous = table[:count]
    methods = {
        "memcpy": lambda i: out.copy_(contiguous),
        "directload_cpu": lambda i: gather(table, i, out=out),
        "directload_cpu_naive": lambda i: gather(table, i, out=out, aligned=False),
        "torch_index_select": lambda i: torch.index_select(table, 0, i, out=out),
        "numpy_take": lambda i: np.take(src_np, i.numpy(), axis=0, out=out_np),
    }
    _verify(methods, out, table[sets[0]], sets[0])
    fns = {name: _rotating(fn, sets, k) for k, (name, fn) in enumerate(methods.items())}
    return {name: nbytes / t / 1e9 for name, t in interleaved_medians(fns, reps).items()}


def _verify(methods, out, ref, idx):
    for name, fn in methods.items():
        if name == "memcpy":
            continue
        out.zero_()
        fn(idx)
        if out.is_cuda:
            torch.cuda.synchronize()
        if not torch.equal(out, ref):
            raise RuntimeError(f"{name} gathered wrong rows")


QUICK = dict(rows=1 << 20, counts=[8 * KIB, 32 * KIB, 128 * KIB], row_bytes=[256, KIB, 4 * KIB], reps=5)
# On a GPU --quick also shrinks the sweep to these, where the command line gave no others.
GPU_QUICK = dict(counts=[1024, 131072], row_bytes=[256, 1024, 4096], gather_mib=[512], reps=5, pipeline=10,
                 table_gib=2.0)
GPU_DEFAULTS = dict(counts=[1024, 16384, 131072], row_bytes=[256, 400, 1024, 2052, 4096, 16384])


def _ratios(res):
    return {"cpu_vs_index_select": res["directload_cpu"] / res["torch_index_select"],
            "cpu_pct_memcpy": 100 * res["directload_cpu"] / res["memcpy"]}


def counts_for(row_bytes, counts, gather_mib):
    """The id counts of one row size: ``counts``, plus each ``gather_mib`` MiB gather's count.  Pure.

    >>> counts_for(256, [1024, 131072], [512])
    [1024, 131072, 2097152]
    """
    return sorted({*counts, *(int(m * MIB) // row_bytes for m in gather_mib)})


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sweep (seconds, not minutes)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--counts", type=int, nargs="+", help="ids per gather (default: 8K-256K on the CPU, "
                   f"{GPU_DEFAULTS['counts']} on a GPU)")
    p.add_argument("--row-bytes", type=int, nargs="+", help="bytes per row, multiples of 4 (default: 256 B-16 KiB "
                   f"on the CPU, {GPU_DEFAULTS['row_bytes']} on a GPU)")
    p.add_argument("--reps", type=int, default=7, help="least timed rounds per point")
    p.add_argument("--name", default="gather_bandwidth", help="results/<name>.json and .png")
    cpu = p.add_argument_group("CPU")
    cpu.add_argument("--rows", type=int, default=4 << 20, help="table rows (capped by --max-table-gib)")
    cpu.add_argument("--max-table-gib", type=float, default=4.0)
    cpu.add_argument("--threads", type=int, default=2, help="CPU threads for every CPU method")
    cpu.add_argument("--team", choices=["auto", "torch", "numba"], default="auto",
                     help="thread team of the cpu backend: torch's OpenMP team (the default where it exists) "
                          "or Numba's; one team per run, since two teams' spinning threads slow each other")
    gpu = p.add_argument_group("GPU")
    gpu.add_argument("--table-gib", type=float, default=4.0, help="the one table every point reads")
    gpu.add_argument("--allocator", choices=["directload", "torch"], default="directload",
                     help="the one allocator of the table (directload.empty or torch's pin_memory)")
    gpu.add_argument("--gather-mib", type=float, nargs="*", default=[512],
                     help="also gather this many MiB at each row size (the goals' 512 MiB point)")
    gpu.add_argument("--id-order", nargs="+", choices=["random", "sorted"], default=["random", "sorted"],
                     help="ids as drawn, and sorted by the caller")
    gpu.add_argument("--variants", nargs="+", choices=["index_select", "rowvec", "naive", "aligned"],
                     help="only these kernels' variants (each unsorted and +sort); default: every candidate")
    gpu.add_argument("--no-tuner", action="store_true", help="leave out the tuner's choice")
    gpu.add_argument("--pipeline", type=int, default=20, help="calls back to back per pipelined sample")
    gpu.add_argument("--budget-s", type=float, help="start no new point after this many seconds")
    return p


def _preset(args, parser, preset):
    """Set each of ``preset``'s options that the command line left at its default.  Pure but for ``args``."""
    for k, v in preset.items():
        if getattr(args, k) == parser.get_default(k):
            setattr(args, k, v)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    on_gpu = args.device == "cuda" or (args.device == "auto" and capabilities().cuda)
    if on_gpu:
        _preset(args, parser, {**GPU_DEFAULTS, **(GPU_QUICK if args.quick else {})})
        return gpu_main(args)
    _preset(args, parser, QUICK if args.quick else {})
    return cpu_main(args)


def cpu_main(args):
    prepare_cpu_kernels()
    args.counts = args.counts or [8 * KIB, 32 * KIB, 128 * KIB, 256 * KIB]
    args.row_bytes = args.row_bytes or [256, KIB, 4 * KIB, 16 * KIB]
    torch.set_num_threads(args.threads)
    cpu_backend.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    if args.team != "auto":
        cpu_backend.set_team(args.team)
    args.team = cpu_backend.team()
    rng = np.random.default_rng(0)
    results = []
    with tqdm(total=len(args.row_bytes) * len(args.counts), desc="gather bandwidth", unit="point") as bar:
        for rb in args.row_bytes:
            rows = int(min(args.rows, args.max_table_gib * (1 << 30) // rb))
            table = _table(rows, rb, pin=False)
            for count in [c for c in args.counts if c <= rows]:
                res = cpu_point(table, count, args.reps, rng)
                results.append({"row_bytes": rb, "count": count, "table_rows": rows, **res, **_ratios(res)})
                bar.update()
            del table
    methods = list(res)
    print(f"\nGB/s (median of >= {args.reps} interleaved rounds), CPU, {args.threads} threads, {args.team} team")
    print_table(results, ["row_bytes", "count", *methods, *_ratios(res)])
    payload = {"benchmark": "gather_bandwidth", "device": "cpu", "args": vars(args), "system": system_facts(),
               "results": results}
    path = write_json(args.name, payload)
    labels = [f"{r['count'] // KIB}K x {r['row_bytes']}B" for r in results]
    grouped_bars(path.with_suffix(".png"), labels, {m: [r[m] for r in results] for m in methods}, "GB/s",
                 "Gather bandwidth (CPU)")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def gpu_main(args):
    from _gpu import GIB, CudaClock, allocate_table, gpu_facts, run_point
    from _report import gpu_tables

    t0 = time.monotonic()
    table = allocate_table(int(args.table_gib * GIB), args.allocator)
    clock = CudaClock()
    rng = np.random.default_rng(0)
    points = [(rb, c) for rb in args.row_bytes for c in counts_for(rb, args.counts, args.gather_mib)]
    payload = {"benchmark": "gather_bandwidth", "device": "cuda", "args": vars(args), "system": system_facts(),
               "gpu": gpu_facts(), "table": table.describe(), "results": []}
    notes = []
    for k, (rb, count) in enumerate(tqdm(points, desc="gather bandwidth", unit="point")):
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            notes.append(f"budget: stopped after {k} of {len(points)} points (--budget-s {args.budget_s:g})")
            break
        if count > table.nbytes // rb:
            notes.append(f"skipped {count} ids x {rb} B: more rows than the table holds")
            continue
        for order in args.id_order:
            payload["results"] += run_point(table, rb, count, order, rng, clock, kernels=args.variants,
                                            tuner=not args.no_tuner, reps=args.reps, pipeline=args.pipeline)
        path = write_json(args.name, payload)  # after every point: a run cut short keeps what it measured
    table.close()
    print(f"\n{payload['gpu']['gpu']}; one table for every point: {payload['table']}; "
          f"medians of >= {args.reps} interleaved rounds")
    print(gpu_tables(payload["results"]))
    if notes:
        print("\n".join(notes))
    path = write_json(args.name, payload)
    _plot(payload["results"], path.with_suffix(".png"), payload["table"])
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(rows, path, table):
    """GB/s by GPU time of every method at every point, random ids."""
    rows = [r for r in rows if r.get("ids") == "random" and "gbps" in r]
    labels = list(dict.fromkeys(f"{r['count']} x {r['row_bytes']}B" for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    at = {(f"{r['count']} x {r['row_bytes']}B", r["method"]): r["gbps"] for r in rows}
    grouped_bars(path, labels, {m: [at.get((label, m), 0.0) for label in labels] for m in methods},
                 "GB/s by GPU time (log scale)", f"GPU gather, random ids ({table})", rotation=30, log=True)


if __name__ == "__main__":
    raise SystemExit(main())

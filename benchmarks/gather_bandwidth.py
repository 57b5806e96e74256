"""Gather bandwidth microbenchmark (PyTorch-Direct paper, Figure 4.6): random rows of a large table.

On the CPU: directload's ``cpu`` backend (aligned and naive; ``--team`` picks
the thread team that runs it, see kernels/cpu.py) against
``torch.index_select`` and ``numpy.take``, in GB/s and as % of a memcpy of the
same bytes measured in the same run.  On a GPU: aligned against naive kernels
of both backends reading a pinned table zero-copy, against the paper's baseline
(CPU gather, then ``.to("cuda")``) and the ideal (bytes over measured pinned
``cudaMemcpy`` bandwidth).  Prints a table, writes JSON and PNG to results/.
"""

import argparse
import itertools
import sys
from pathlib import Path

import numba
import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    cuda_event_timer,
    cuda_median_time,
    grouped_bars,
    interleaved_medians,
    prepare_cpu_kernels,
    print_table,
    system_facts,
    write_json,
)

from directload.capabilities import capabilities  # noqa: E402
from directload.kernels import cpu as cpu_backend  # noqa: E402
from directload.kernels import gather  # noqa: E402

KIB = 1024
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


def gpu_point(table, count, reps, rng, h2d_gbps):
    dev = torch.device("cuda")
    sets = [(i, i.to(dev)) for i in _index_sets(table.shape[0], count, rng)]
    out = torch.empty((count, table.shape[1]), dtype=table.dtype, device=dev)
    staging = torch.empty((count, table.shape[1]), dtype=table.dtype, pin_memory=True)
    nbytes = count * table.shape[1] * 4

    def baseline(i):  # the paper's baseline: CPU gather, then a DMA copy
        torch.index_select(table, 0, i[0], out=staging)
        out.copy_(staging, non_blocking=True)

    methods = {"cpu_gather_to_cuda": baseline}
    caps = capabilities()
    for backend in [b for b, ok in (("cupy", caps.cupy), ("numba_cuda", caps.numba_cuda)) if ok]:
        for aligned in (True, False):
            methods[f"{backend}_{'aligned' if aligned else 'naive'}"] = (
                lambda i, b=backend, a=aligned: gather(table, i[1], out=out, backend=b, aligned=a))
    _verify(methods, out, table[sets[0][0]].to(dev), sets[0])
    fns = {name: _rotating(fn, sets, k) for k, (name, fn) in enumerate(methods.items())}
    times = interleaved_medians(fns, reps, timer=cuda_event_timer)
    return {"ideal": h2d_gbps, **{name: nbytes / t / 1e9 for name, t in times.items()}}


def h2d_bandwidth(reps):
    """Pinned host -> device cudaMemcpy bandwidth, GB/s (the ideal of Figure 4.6)."""
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    return src.numel() / cuda_median_time(lambda: dst.copy_(src, non_blocking=True), reps) / 1e9


QUICK = dict(rows=1 << 20, counts=[8 * KIB, 32 * KIB, 128 * KIB], row_bytes=[256, KIB, 4 * KIB], reps=5)
RATIOS = ("cpu_vs_index_select", "cpu_pct_memcpy")


def _ratios(res, on_gpu):
    if on_gpu:
        return {f"{k}_vs_ideal": res["ideal"] / v for k, v in res.items() if k != "ideal"}
    return {"cpu_vs_index_select": res["directload_cpu"] / res["torch_index_select"],
            "cpu_pct_memcpy": 100 * res["directload_cpu"] / res["memcpy"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sweep (seconds, not minutes)")
    p.add_argument("--rows", type=int, default=4 << 20, help="table rows (capped by --max-table-gib)")
    p.add_argument("--max-table-gib", type=float, default=4.0)
    p.add_argument("--counts", type=int, nargs="+", default=[8 * KIB, 32 * KIB, 128 * KIB, 256 * KIB])
    p.add_argument("--row-bytes", type=int, nargs="+", default=[256, KIB, 4 * KIB, 16 * KIB])
    p.add_argument("--reps", type=int, default=7, help="least timed rounds per point")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for every CPU method")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--team", choices=["auto", "torch", "numba"], default="auto",
                   help="thread team of the cpu backend: torch's OpenMP team (the default where it exists) "
                        "or Numba's; one team per run, since two teams' spinning threads slow each other")
    p.add_argument("--name", default="gather_bandwidth")
    args = p.parse_args(argv)
    prepare_cpu_kernels()
    if args.quick:
        vars(args).update(QUICK)
    torch.set_num_threads(args.threads)
    cpu_backend.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    if args.team != "auto":
        cpu_backend.set_team(args.team)
    args.team = cpu_backend.team()
    on_gpu = args.device == "cuda" or (args.device == "auto" and capabilities().cuda)
    rng = np.random.default_rng(0)
    h2d = h2d_bandwidth(args.reps) if on_gpu else None
    results = []
    with tqdm(total=len(args.row_bytes) * len(args.counts), desc="gather bandwidth", unit="point") as bar:
        for rb in args.row_bytes:
            rows = int(min(args.rows, args.max_table_gib * (1 << 30) // rb))
            table = _table(rows, rb, pin=on_gpu)
            for count in [c for c in args.counts if c <= rows]:
                if on_gpu:
                    res = gpu_point(table, count, args.reps, rng, h2d)
                else:
                    res = cpu_point(table, count, args.reps, rng)
                results.append({"row_bytes": rb, "count": count, "table_rows": rows, **res, **_ratios(res, on_gpu)})
                bar.update()
            del table
    methods = [k for k in res]
    where = f"GPU {capabilities().device_name}" if on_gpu else f"CPU, {args.threads} threads, {args.team} team"
    print(f"\nGB/s (median of >= {args.reps} interleaved rounds), {where}")
    print_table(results, ["row_bytes", "count", *methods, *_ratios(res, on_gpu)])
    payload = {"benchmark": "gather_bandwidth", "device": "cuda" if on_gpu else "cpu", "args": vars(args),
               "system": system_facts(), "h2d_gbps": h2d, "results": results}
    path = write_json(args.name, payload)
    _plot(results, methods, RESULTS / f"{args.name}.png", on_gpu)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(rows, methods, path, on_gpu):
    labels = [f"{r['count'] // KIB}K x {r['row_bytes']}B" for r in rows]
    title = "Gather bandwidth" + (" (GPU, zero-copy from pinned host)" if on_gpu else " (CPU)")
    grouped_bars(path, labels, {m: [r[m] for r in rows] for m in methods}, "GB/s", title)


if __name__ == "__main__":
    raise SystemExit(main())

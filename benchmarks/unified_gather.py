"""Unified-tensor gathers: the cost of the unified path, and (on a GPU) zero-copy against the baselines.

On the CPU fallback: ``x[idx]`` on a unified tensor against ``gather`` and
``torch.index_select`` on the plain tensor, measured side by side (overhead of
the placement layer).  On a GPU: the aligned kernel through ``x[idx]`` against
``x.cuda_view()`` + torch ``index_select`` (PyTorch-Direct's "PyD Naive") and a
CPU gather followed by ``.to("cuda")``.  Prints a table, writes JSON and PNG.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    cuda_event_timer,
    grouped_bars,
    interleaved_medians,
    prepare_cpu_kernels,
    print_table,
    system_facts,
    write_json,
)

import directload  # noqa: E402
from directload.capabilities import capabilities  # noqa: E402
from directload.kernels import gather  # noqa: E402


def point(rows, row_bytes, count, reps, rng, on_gpu):
    plain = torch.from_numpy(rng.standard_normal((rows, row_bytes // 4)).astype(np.float32))
    unified = directload.to_unified(plain, "cuda" if on_gpu else "host", copy=on_gpu)
    idx = torch.from_numpy(rng.integers(0, rows, count))
    if on_gpu:
        idx_gpu, view = idx.cuda(), unified.cuda_view()
        fns = {
            "unified_aligned": lambda: unified[idx_gpu],
            "cuda_view_index_select": lambda: torch.index_select(view, 0, idx_gpu),
            "cpu_gather_to_cuda": lambda: plain[idx].to("cuda", non_blocking=False),
        }
        timer = cuda_event_timer
    else:
        fns = {
            "unified_getitem": lambda: unified[idx],
            "plain_gather": lambda: gather(plain, idx),
            "plain_index_select": lambda: torch.index_select(plain, 0, idx),
        }
        timer = None
    want = plain[idx]
    for name, fn in fns.items():
        if not torch.equal(fn().cpu(), want):
            raise RuntimeError(f"{name} gathered wrong rows")
    times = interleaved_medians(fns, reps, timer=timer)
    nbytes = count * row_bytes
    res = {f"{k}_gbps": nbytes / t / 1e9 for k, t in times.items()}
    first = next(iter(times))
    res.update({f"{first}_over_{k}": times[first] / t for k, t in times.items() if k != first})
    unified.close()
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 19)
    p.add_argument("--row-bytes", type=int, nargs="+", default=[400, 2052, 2408])
    p.add_argument("--counts", type=int, nargs="+", default=[1024, 16384, 131072])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="unified_gather")
    args = p.parse_args(argv)
    prepare_cpu_kernels()
    torch.set_num_threads(args.threads)
    on_gpu = capabilities().cuda
    rng = np.random.default_rng(0)
    results = []
    for rb in tqdm(args.row_bytes, desc="unified gather", unit="row size"):
        for count in args.counts:
            results.append({"row_bytes": rb, "count": count,
                            **point(args.rows, rb, count, args.reps, rng, on_gpu)})
    print(f"\nGB/s and time ratios (median of >= {args.reps} interleaved rounds), "
          + (f"GPU {capabilities().device_name}" if on_gpu else f"CPU fallback, {args.threads} threads"))
    print_table(results, list(results[0]))
    path = write_json(args.name, {"benchmark": "unified_gather", "device": "cuda" if on_gpu else "cpu",
                                  "args": vars(args), "system": system_facts(), "results": results})
    _plot(results, RESULTS / f"{args.name}.png")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results, path):
    keys = [k for k in results[0] if k.endswith("_gbps")]
    labels = [f"{r['count']} x {r['row_bytes']}B" for r in results]
    # Log axis: bandwidths span two orders of magnitude between the small and the large gathers.
    grouped_bars(path, labels, {k[:-5]: [r[k] for r in results] for k in keys}, "GB/s (log scale)",
                 "Unified-tensor gather", rotation=30, log=True)


if __name__ == "__main__":
    raise SystemExit(main())

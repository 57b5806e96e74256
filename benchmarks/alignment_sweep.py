"""Alignment sweep (PyTorch-Direct paper, Figure 4.7): rows of 2048-2076 bytes in 4-byte steps.

Always reports the memory-traffic model (``kernels.pcie_model``): the SM-to-L2 requests per row of the
naive kernel, PyTorch-Direct's own shift and our aligned kernel against the minimum (lines the rows span),
which the L2 merges before the link; and what the link and the address translation see, the same for
every kernel: 32-byte sector bytes and 4 KiB pages per row, unsorted and sorted.  Where a GPU exists it
also times every candidate of ``kernels.variants`` and the tuner's choice against torch's
``index_select`` over the mapped view (the paper's "PyD Naive") and the ideal copy, on one table (one size
for every row size, one allocator); ``--cpu-baseline`` adds the paper's "Py" (a CPU gather, then
``.to("cuda")``).
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
    prepare_cpu_kernels,
    print_table,
    pyplot,
    save_figure,
    system_facts,
    write_json,
)
from _gpu import WINDOW  # noqa: E402
from _report import fmt_time, gpu_tables, wide_table  # noqa: E402

from directload.capabilities import capabilities  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.kernels.pcie_model import count_requests, footprint  # noqa: E402


def model_point(row_bytes, idx):
    """The model's counts per gathered row: SM-to-L2 requests by kernel, sector bytes and 4 KiB pages."""
    res = {}
    for kernel in ("naive", "paper", "aligned"):
        r = count_requests(idx, row_bytes, 4, kernel=kernel)
        res[f"l2req_{kernel}"] = r.total / len(idx)
        res["l2req_min"] = float(r.min_lines.mean())
    res["naive_over_aligned"] = res["l2req_naive"] / res["l2req_aligned"]
    res["sector_bytes"] = footprint(idx, row_bytes).sector_bytes / len(idx)
    for sort in (False, True):
        res[f"pages_4k{'_sorted' if sort else ''}"] = footprint(idx, row_bytes, sort=sort,
                                                                window=WINDOW).pages_4k / len(idx)
    return res


def cpu_baseline(table, row_bytes, count, rng, reps):
    """The paper's "Py": a CPU gather of the host table, then a copy to the GPU; microseconds (wall, one call)."""
    from _gpu import summarize

    host, _ = table.rows(row_bytes)
    idx = torch.from_numpy(rng.integers(0, host.shape[0], count))
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host[idx].to("cuda")
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return summarize(times).median


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--count", type=int, default=32768, help="rows gathered per point")
    p.add_argument("--rows", type=int, default=1 << 20, help="rows the model draws ids from (without a GPU)")
    p.add_argument("--table-mib", type=int, default=2048, help="GPU: the one table every row size reads")
    p.add_argument("--allocator", choices=["directload", "torch"], default="directload")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--pipeline", type=int, default=20)
    p.add_argument("--cpu-baseline", action="store_true", help="GPU: also the paper's CPU gather then copy")
    p.add_argument("--budget-s", type=float, help="GPU: time no new row size after this many seconds")
    p.add_argument("--name", default="alignment_sweep")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    prepare_cpu_kernels()
    rng = np.random.default_rng(0)
    on_gpu = capabilities().cuda
    results, gpu_rows, notes, payload = [], [], [], {}
    if on_gpu:
        from _gpu import MIB, CudaClock, allocate_table, gpu_facts, run_point

        table = allocate_table(args.table_mib * MIB, args.allocator)
        clock = CudaClock()
        payload.update(gpu=gpu_facts(), table=table.describe())
    t0, timing = time.monotonic(), on_gpu
    for rb in tqdm(range(2048, 2077, 4), desc="alignment sweep", unit="size"):
        rows = table.nbytes // rb if on_gpu else args.rows
        row = {"row_bytes": rb, **model_point(rb, rng.integers(0, rows, args.count))}
        results.append(row)
        if timing and args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            notes.append(f"budget: no GPU times from {rb} B on (--budget-s {args.budget_s:g})")
            timing = False
        if not timing:
            continue
        gpu_rows += run_point(table, rb, args.count, "random", rng, clock, reps=args.reps, pipeline=args.pipeline)
        if args.cpu_baseline:
            row["us_py_cpu_gather_to"] = cpu_baseline(table, rb, args.count, rng, 3)
    print(f"\nThe memory-traffic model per gathered row ({args.count} random rows; warp 32): SM-to-L2 requests "
          f"(128-byte lines per warp-wide load, merged by the L2 before the link), sector bytes and 4 KiB pages "
          f"({WINDOW} rows in flight)")
    print_table(results, list(dict.fromkeys(k for r in results for k in r)))
    if gpu_rows:
        print(f"\n{payload['gpu']['gpu']}; one table for every row size: {payload['table']}")
        print(wide_table(gpu_rows, ("row_bytes",), "gpu_us", fmt_time, "GPU us per gather (±: half the IQR)"))
        print("\n" + gpu_tables(gpu_rows, index=("row_bytes",)))
    elif not on_gpu:
        print("no GPU here, so no timings")
    if notes:
        print("\n".join(notes))
    if on_gpu:
        table.close()
    payload.update(benchmark="alignment_sweep", args=vars(args), system=system_facts(), results=results,
                   gpu_results=gpu_rows)
    path = write_json(args.name, payload)
    _plot(results, path.with_suffix(".png"), bool(gpu_rows), gpu_rows)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results, path, on_gpu, gpu_rows=()):
    plt = pyplot()
    x = [r["row_bytes"] for r in results]
    fig, axes = plt.subplots(1, 2 if on_gpu else 1, figsize=(12 if on_gpu else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    # directload's aligned kernel meets the minimum at every size, so the two lines coincide: the
    # minimum is drawn as a thick pale band underneath and ours as a dashed line with markers on top.
    styles = (("l2req_naive", "naive (PyTorch index kernel)", dict(marker="o")),
              ("l2req_paper", "PyTorch-Direct shift", dict(marker="s")),
              ("l2req_min", "minimum (lines spanned)", dict(linewidth=7, alpha=0.35, color="tab:green")),
              ("l2req_aligned", "directload aligned (on the minimum)", dict(marker="x", linestyle="--",
                                                                            markersize=7, color="black")))
    for key, label, style in styles:
        ax.plot(x, [r[key] for r in results], label=label, **style)
    ax.set_xlabel("row bytes")
    ax.set_ylabel("SM-to-L2 requests per row (128-byte lines)")
    ax.set_title("Memory-traffic model: requests, not link bytes")
    ax.legend(fontsize=8)
    if on_gpu:
        ax = axes[0][1]
        lines = {}
        for r in gpu_rows:
            if "gpu_us" in r:
                lines.setdefault(r["method"], []).append((r["row_bytes"], r["gpu_us"]["median"]))
        for method, pts in lines.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.set_xlabel("row bytes")
        ax.set_ylabel("GPU microseconds")
        ax.set_title("Measured gather time")
        ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())

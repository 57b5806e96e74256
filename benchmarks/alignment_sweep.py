"""Alignment sweep (PyTorch-Direct paper, Figure 4.7): rows of 2048-2076 bytes in 4-byte steps.

Always reports the PCIe transaction model's requests for the naive kernel,
PyTorch-Direct's own shift and our aligned kernel, against the minimum (lines
the rows span).  Where a GPU exists it also times the kernels reading a pinned
table zero-copy, PyTorch's ``index_select`` over the same mapped memory (the
paper's "PyD Naive") and a CPU gather followed by ``.to("cuda")`` ("Py").
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
    interleaved_medians,
    prepare_cpu_kernels,
    print_table,
    pyplot,
    save_figure,
    system_facts,
    write_json,
)

from directload.capabilities import capabilities  # noqa: E402
from directload.kernels import gather  # noqa: E402
from directload.kernels.interop import cuda_array  # noqa: E402
from directload.kernels.pcie_model import count_requests  # noqa: E402


def model_point(row_bytes, idx):
    res = {}
    for kernel in ("naive", "paper", "aligned"):
        r = count_requests(idx, row_bytes, 4, kernel=kernel)
        res[f"req_{kernel}"] = r.total / len(idx)
        res["req_min"] = float(r.min_lines.mean())
    res["naive_over_aligned"] = res["req_naive"] / res["req_aligned"]
    return res


def gpu_point(row_bytes, rows, count, reps, rng):
    table = torch.empty((rows, row_bytes // 4), dtype=torch.float32, pin_memory=True)
    table.view(torch.int32).copy_(torch.arange(table.numel(), dtype=torch.int32).view_as(table))
    mapped = torch.as_tensor(cuda_array(table), device="cuda").view(torch.float32)  # zero-copy view
    idx_cpu = torch.from_numpy(rng.integers(0, rows, count))
    idx = idx_cpu.cuda()
    out = torch.empty((count, table.shape[1]), device="cuda")
    fns = {
        "py_cpu_gather_to": lambda: out.copy_(table[idx_cpu].pin_memory(), non_blocking=True),
        "pyd_naive_index_select": lambda: torch.index_select(mapped, 0, idx, out=out),
    }
    caps = capabilities()
    for backend in [b for b, ok in (("cupy", caps.cupy), ("numba_cuda", caps.numba_cuda)) if ok]:
        for aligned in (True, False):
            fns[f"{backend}_{'aligned' if aligned else 'naive'}"] = (
                lambda b=backend, a=aligned: gather(table, idx, out=out, backend=b, aligned=a))
    ref = table[idx_cpu].cuda()
    for name, fn in fns.items():
        out.zero_()
        fn()
        torch.cuda.synchronize()
        if not torch.equal(out, ref):
            raise RuntimeError(f"{name} gathered wrong rows")
    times = interleaved_medians(fns, reps, timer=cuda_event_timer)
    return {f"us_{k}": v * 1e6 for k, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=32768, help="rows gathered per point")
    p.add_argument("--rows", type=int, default=1 << 20, help="table rows")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--name", default="alignment_sweep")
    args = p.parse_args(argv)
    prepare_cpu_kernels()
    rng = np.random.default_rng(0)
    on_gpu = capabilities().cuda
    results = []
    for rb in tqdm(range(2048, 2077, 4), desc="alignment sweep", unit="size"):
        idx = rng.integers(0, args.rows, args.count)
        row = {"row_bytes": rb, **model_point(rb, idx)}
        if on_gpu:
            row.update(gpu_point(rb, args.rows, args.count, args.reps, rng))
        results.append(row)
    cols = list(results[0])
    print(f"\nPCIe requests per gathered row (model, warp 32, 128-byte lines, {args.count} random rows)"
          + ("; GPU times in microseconds" if on_gpu else "; no GPU here, so no timings"))
    print_table(results, cols)
    path = write_json(args.name, {"benchmark": "alignment_sweep", "args": vars(args), "system": system_facts(),
                                  "results": results})
    _plot(results, RESULTS / f"{args.name}.png", on_gpu)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results, path, on_gpu):
    plt = pyplot()
    x = [r["row_bytes"] for r in results]
    fig, axes = plt.subplots(1, 2 if on_gpu else 1, figsize=(12 if on_gpu else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    # directload's aligned kernel meets the minimum at every size, so the two lines coincide: the
    # minimum is drawn as a thick pale band underneath and ours as a dashed line with markers on top.
    styles = (("req_naive", "naive (PyTorch index kernel)", dict(marker="o")),
              ("req_paper", "PyTorch-Direct shift", dict(marker="s")),
              ("req_min", "minimum (lines spanned)", dict(linewidth=7, alpha=0.35, color="tab:green")),
              ("req_aligned", "directload aligned (on the minimum)", dict(marker="x", linestyle="--", markersize=7,
                                                                          color="black")))
    for key, label, style in styles:
        ax.plot(x, [r[key] for r in results], label=label, **style)
    ax.set_xlabel("row bytes")
    ax.set_ylabel("128-byte requests per row")
    ax.set_title("PCIe transaction model")
    ax.legend(fontsize=8)
    if on_gpu:
        ax = axes[0][1]
        for key in [k for k in results[0] if k.startswith("us_")]:
            ax.plot(x, [r[key] for r in results], marker="o", label=key[3:])
        ax.set_xlabel("row bytes")
        ax.set_ylabel("microseconds")
        ax.set_title("Measured gather time")
        ax.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())

"""Table-size sweep: one row size and one id count, over tables of 256 MiB to 16 GiB (GPU only).

The same gather, random and caller-sorted ids, from pinned host tables of growing size, one allocator:
whether zero-copy slows as the table grows (address translation and host locality rather than link bytes;
NVIDIA/nvbandwidth#42 saw SM reads fall from 25 to 16.5 GB/s between 1 and 20 GiB on an A100), and what
sorting the ids recovers, beside the memory-traffic model's prediction (``kernels.pcie_model``).  Sizes
that would leave less than ``--headroom-gib`` of the host's available memory are skipped, each with a line
that says so.  Prints tables, writes JSON and PNG to results/.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_with_quick, pyplot, save_figure, system_facts, write_json  # noqa: E402

from directload.capabilities import capabilities  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402

SIZES_GIB = [0.25, 0.5, 1, 2, 4, 8, 16]
QUICK = dict(sizes_gib=[0.25, 2, 16], row_bytes=[1024], reps=5, pipeline=10)


def decisive_order(sizes):
    """The smallest and the largest size first, then the rest in order: a run cut short still has both
    ends of the sweep.  Pure.

    >>> decisive_order([0.25, 0.5, 1, 16])
    [0.25, 16, 0.5, 1]
    """
    sizes = sorted(sizes)
    return sizes[:1] + sizes[-1:] + sizes[1:-1] if len(sizes) > 1 else sizes


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"a smaller sweep: {QUICK}")
    p.add_argument("--sizes-gib", type=float, nargs="+", default=SIZES_GIB, help="table sizes, GiB")
    p.add_argument("--row-bytes", type=int, nargs="+", default=[256, 1024], help="row sizes (one sweep each)")
    p.add_argument("--count", type=int, default=131072, help="ids per gather, the same at every size")
    p.add_argument("--allocator", choices=["directload", "torch"], default="directload")
    p.add_argument("--id-order", nargs="+", choices=["random", "sorted"], default=["random", "sorted"])
    p.add_argument("--variants", nargs="+", choices=["index_select", "rowvec", "naive", "aligned"],
                   default=["index_select", "rowvec", "aligned"], help="kernels whose variants run")
    p.add_argument("--headroom-gib", type=float, default=4.0, help="host memory left free at the largest size")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--pipeline", type=int, default=20)
    p.add_argument("--budget-s", type=float, help="start no new table after this many seconds")
    p.add_argument("--name", default="table_size_sweep")
    return p


def main(argv=None):
    args = parse_with_quick(build_parser(), argv, QUICK)
    if not capabilities().cuda:
        print("no CUDA device on this machine: the table-size sweep measures zero-copy gathers, so nothing here")
        return 0
    return run(args)


def run(args):
    from _gpu import ALLOCATORS, GIB, CudaClock, allocate_table, fit_table_sizes, free_host_bytes, gpu_facts, run_point
    from _report import gpu_tables

    t0 = time.monotonic()
    clock = CudaClock()
    rng = np.random.default_rng(0)
    sizes, notes = fit_table_sizes([int(g * GIB) for g in args.sizes_gib], free_host_bytes(),
                                   int(args.headroom_gib * GIB))
    payload = {"benchmark": "table_size_sweep", "args": vars(args), "system": system_facts(), "gpu": gpu_facts(),
               "results": []}
    for k, size in enumerate(tqdm(decisive_order(sizes), desc="table sizes", unit="table")):
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            notes.append(f"budget: stopped after {k} of {len(sizes)} tables (--budget-s {args.budget_s:g})")
            break
        fit, late = fit_table_sizes([size], free_host_bytes(), int(args.headroom_gib * GIB))
        if not fit:  # checked again now the smaller tables are freed: something else may hold memory
            notes += late
            continue
        table = allocate_table(size, args.allocator)
        for rb in args.row_bytes:
            for order in args.id_order:
                payload["results"] += run_point(table, rb, args.count, order, rng, clock, kernels=args.variants,
                                                tuner=False, reps=args.reps, pipeline=args.pipeline)
        table.close()
        write_json(args.name, payload)  # after every table: a run cut short keeps what it measured
    payload["results"].sort(key=lambda r: (r["row_bytes"], r["table_gib"]))
    print(f"\n{payload['gpu']['gpu']}; {args.count} ids a gather; every table from {ALLOCATORS[args.allocator]}; "
          f"medians of >= {args.reps} interleaved rounds")
    print(gpu_tables(payload["results"], index=("row_bytes", "table_gib")))
    if notes:
        print("\n".join(notes))
    path = write_json(args.name, payload)
    plot(payload["results"], path.with_suffix(".png"), args.count)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def plot(rows, path, count):
    """GB/s by GPU time against the table's size, one line per method and id order, a panel per row size."""
    plt = pyplot()
    sizes = sorted({r["row_bytes"] for r in rows})
    fig, axes = plt.subplots(1, max(1, len(sizes)), figsize=(6 * max(1, len(sizes)), 4.5), squeeze=False)
    for ax, rb in zip(axes[0], sizes):
        lines = {}
        for r in rows:
            if r["row_bytes"] == rb and "gbps" in r:
                lines.setdefault(f"{r['method']} ({r['ids']} ids)", []).append((r["table_gib"], r["gbps"]))
        for label, pts in lines.items():
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label,
                    linestyle="--" if "sorted ids" in label else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("table GiB")
        ax.set_ylabel("GB/s by GPU time")
        ax.set_title(f"{count} ids x {rb} B")
        ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())

"""Partitioned features over torch.distributed against the whole table in one process: ms per read.

A read through ``PartitionedStore`` + ``RowExchange`` (two gloo ranks on loopback, each holding half the
table) is timed against a read of the whole table in one process.

Two rank processes hold a synthetic table (``--rows`` x ``--dim`` float32) split by ``partition_bounds``,
their half in memory (``TensorStore``) or on disk (``DiskStore``).  Every rank reads its own batches of ids
drawn from a skewed (Zipf ``--skew``) distribution, ``--remote`` of them from the other rank's half; for
each batch it times, interleaved, (a) the partitioned read (one all-to-all round: counts, ids, rows) and
(b) the same ids from the whole table in this process's memory (``TensorStore``), and for disk halves also
(c) from the whole table on disk (``DiskStore``).  Rank 0's times are reported: median and p10/p90 ms
per read, and the bytes the exchange moved per batch (sent and received: rows, ids, counts).
Writes ``results/exchange.json`` and ``results/exchange.png``.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    prepare_cpu_kernels,
    print_table,
    pyplot,
    save_figure,
    system_facts,
    write_json,
)

from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.stores import PartitionSpec, StoreSpec, open_store, write_disk_store  # noqa: E402
from directload.stores.partitioned import partition_bounds  # noqa: E402

WORLD = 2


def skewed_batches(rng, bounds, rank, sizes, count, remote, skew):
    """``count`` batches per size for ``rank``: Zipf-distributed rows of its own half, ``remote`` of them from
    the other half (hot rows scattered by a fixed permutation per half, the same on every rank)."""
    halves = []
    for part in range(WORLD):
        lo, hi = int(bounds[part]), int(bounds[part + 1])
        weights = 1.0 / np.arange(1, hi - lo + 1) ** skew
        order = np.random.default_rng(part).permutation(hi - lo) + lo
        halves.append((order, weights / weights.sum()))
    out = {}
    for size in sizes:
        out[size] = []
        for _ in range(count):
            far = rng.random(size) < remote
            ids = np.empty(size, np.int64)
            for part, mask in ((rank, ~far), (1 - rank, far)):
                order, p = halves[part]
                ids[mask] = order[rng.choice(order.size, int(mask.sum()), p=p)]
            out[size].append(torch.from_numpy(ids))
    return out


def _timed(store, ids):
    t0 = time.perf_counter()
    store.read(ids)
    return time.perf_counter() - t0


def rank_main(args):
    """One rank: time every mode on its batches; rank 0 writes what it measured to ``args.out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    prepare_cpu_kernels()
    rank = args.rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=args.timeout))
    table = torch.randn(args.rows, args.dim, generator=torch.Generator().manual_seed(0))
    bounds = partition_bounds(args.rows, WORLD)
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = skewed_batches(np.random.default_rng([args.seed, rank]), bounds, rank, sizes, args.batches + 2,
                             args.remote, args.skew)
    work = Path(args.workdir)
    whole_disk = work / "whole" / "rows.npy"
    if rank == 0:
        (work / "whole").mkdir()
        write_disk_store(table, whole_disk, progress=False)
    dist.barrier()
    rows = []
    steps = len(sizes) * 2 * (args.batches + 2)
    with tqdm(total=steps, desc=f"rank {rank}", disable=rank != 0) as bar:
        for kind in ("memory", "disk"):
            # this rank's rows (of the table in memory, or of the file on disk), the others by all-to-all
            opened = {"partitioned": open_store(StoreSpec(table if kind == "memory" else whole_disk, tiers=False,
                                                          partition=PartitionSpec(timeout=args.timeout))),
                      "whole (memory)": open_store(StoreSpec(table, tiers=False))}
            if kind == "disk":
                opened["whole (disk)"] = open_store(StoreSpec(whole_disk, tiers=False))
            modes = {mode: handle.store for mode, handle in opened.items()}  # the stacks themselves, timed
            exchange = modes["partitioned"].remote
            for size in sizes:
                times = {mode: [] for mode in modes}
                for i, ids in enumerate(batches[size]):
                    if i == 2:  # two warm-up reads
                        exchange.reset_stats()
                        times = {mode: [] for mode in modes}
                    for mode, store in modes.items():
                        times[mode].append(_timed(store, ids))
                    bar.update()
                s = exchange.stats()["exchange"]
                for mode, t in times.items():
                    ms = np.asarray(t) * 1e3
                    moved = (s["bytes_sent"] + s["bytes_received"]) / args.batches if mode == "partitioned" else 0
                    rows.append({"local": kind, "batch": size, "mode": mode, "median ms": float(np.median(ms)),
                                 "p10 ms": float(np.percentile(ms, 10)), "p90 ms": float(np.percentile(ms, 90)),
                                 "MB moved/batch": moved / 1e6,
                                 "remote rows/batch": s["rows_asked"] / args.batches if mode == "partitioned" else 0,
                                 "dups saved/batch": s["duplicates_saved"] / args.batches if mode == "partitioned"
                                 else 0})
            for handle in opened.values():
                handle.close()
    dist.barrier()
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plot(rows, path, args):
    plt = pyplot()
    kinds = ("memory", "disk")
    fig, axes = plt.subplots(1, len(kinds), figsize=(12, 4.5))
    for ax, kind in zip(axes, kinds):
        sel = [r for r in rows if r["local"] == kind]
        sizes = sorted({r["batch"] for r in sel})
        modes = list(dict.fromkeys(r["mode"] for r in sel))
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            got = [next(r for r in sel if r["batch"] == s and r["mode"] == mode) for s in sizes]
            med = np.array([r["median ms"] for r in got])
            spread = np.array([med - [r["p10 ms"] for r in got], [r["p90 ms"] for r in got] - med])
            ax.bar(np.arange(len(sizes)) + (i - (len(modes) - 1) / 2) * width, med, width, yerr=spread, capsize=3,
                   label=mode)
        ax.set_xticks(np.arange(len(sizes)), [f"{s:,} ids" for s in sizes])
        ax.set_ylabel("ms per read (median, p10-p90)")
        ax.set_title(f"each rank's half {'in memory' if kind == 'memory' else 'on disk'}")
        ax.legend(fontsize=8)
    fig.suptitle(f"{args.rows:,} x {args.dim} float32 over {WORLD} gloo ranks on loopback, {args.remote:.0%} remote, "
                 f"Zipf {args.skew}")
    save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="rows of the synthetic table")
    p.add_argument("--dim", type=int, default=128, help="float32 columns per row")
    p.add_argument("--sizes", default="2000,8000,20000", help="ids per batch, comma-separated")
    p.add_argument("--batches", type=int, default=30, help="timed batches per size (after 2 warm-up ones)")
    p.add_argument("--remote", type=float, default=0.5, help="fraction of each batch owned by the other rank")
    p.add_argument("--skew", type=float, default=1.1, help="Zipf exponent of the id distribution")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a step of the exchange may take")
    p.add_argument("--workdir", default="data", help="where the disk stores go (a temporary directory in it)")
    p.add_argument("--name", default="exchange", help="results/<name>.json and .png")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        return rank_main(args)

    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix=".exchange-") as tmp:
        out = Path(tmp) / "rank0.json"
        argv = [a for a in (argv if argv is not None else sys.argv[1:])]
        common = [*argv, "--port", str(_free_port()), "--out", str(out), "--workdir", tmp]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, __file__, *common, "--rank", str(r)], env=env) for r in range(WORLD)]
        try:
            codes = [proc.wait(timeout=3600) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        rows = json.loads(out.read_text())
    print_table(rows, ["local", "batch", "mode", "median ms", "p10 ms", "p90 ms", "MB moved/batch",
                       "remote rows/batch", "dups saved/batch"])
    write_json(args.name, {"system": system_facts(), "args": vars(args), "rows": rows})
    plot(rows, RESULTS / f"{args.name}.png", args)


if __name__ == "__main__":
    main()

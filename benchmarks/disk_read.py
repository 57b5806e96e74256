"""Random row reads from disk: DiskStore against the disk's limit (fio), a cold np.memmap and pread.

For each row size (128 B, 512 B, 2 KiB and 16 KiB by default) the same file
is read as a table of rows of that size, at random rows, with the page cache
out of the way: O_DIRECT for DiskStore and fio, ``posix_fadvise(DONTNEED)``
before each cold round for the baselines.  Rounds of every reader are
interleaved, and the table reports medians with their spread (min-max).

* **fio** (``--ioengine=io_uring --direct=1``) reads blocks of the size one
  row's read needs, at the same queue depth, for the same time: the disk's
  limit.  Where fio is not installed, a bare io_uring loop over the same
  blocks stands in (marked).
* **DiskStore** reads batches of random row ids for as long as fio runs; its
  IOPS count the reads it issued, over the time they took, and its CPU per read is the submitting
  thread's (as fio's is its job's); "whole" adds the planning, the copy-out
  and everything else the process did during the read.
* **np.memmap** (cold) and **pread** (one ``os.pread`` per row) are what a
  user without directload writes.

Writes ``results/disk_read.json`` and ``results/disk_read.png``.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, print_table, pyplot, save_figure, system_facts, write_json  # noqa: E402

from directload.stores import DiskOptions, StoreSpec, disk_uring, open_store  # noqa: E402

HEADER = 4096


def make_file(path, gib):
    """A file of ``gib`` GiB of random bytes after a 4 KiB header (kept between runs)."""
    size = HEADER + int(gib * (1 << 30))
    if path.exists() and path.stat().st_size == size:
        return size
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    chunk = 64 << 20
    with open(path, "wb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"writing {path.name}") as bar:
        f.write(b"\0" * HEADER)
        left = size - HEADER
        while left:
            n = min(chunk, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
            bar.update(n)
        f.flush()
        os.fsync(f.fileno())
    return size


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fio_point(path, bs, qd, seconds, size):
    """fio's IOPS and CPU microseconds per read, or None when fio is missing."""
    if shutil.which("fio") is None:
        return None
    cmd = ["fio", "--name=rand", f"--filename={path}", "--rw=randread", f"--bs={bs}", "--direct=1",
           "--ioengine=io_uring", f"--iodepth={qd}", "--numjobs=1", f"--runtime={seconds}", "--time_based",
           f"--offset={HEADER}", f"--size={size - HEADER}", "--norandommap", "--group_reporting",
           "--output-format=json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    job = out["jobs"][0]
    iops = job["read"]["iops"]
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * seconds  # percent of one CPU over the run
    return {"iops": iops, "cpu_us_per_read": cpu / max(job["read"]["total_ios"], 1) * 1e6, "tool": "fio 'io_uring'"}


def bare_uring_point(path, bs, qd, seconds, size, rng):
    """The same random block reads through directload's io_uring loop alone (no planning, no copy-out)."""
    n = 20000
    blocks = (size - HEADER) // bs
    engine = disk_uring.UringEngine(qd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = np.empty(n * bs + 4096, np.uint8)
    base = (buf.ctypes.data + 4095) // 4096 * 4096
    dsts = (base + np.arange(n, dtype=np.uint64) * bs).astype(np.uint64)
    lengths = np.full(n, bs, np.uint32)
    done, t_end, busy, cpu = 0, time.perf_counter() + seconds, 0.0, 0.0
    try:
        while time.perf_counter() < t_end:
            offsets = (HEADER + rng.integers(0, blocks, n) * bs).astype(np.uint64)
            t0, c0 = time.perf_counter(), time.thread_time()
            engine.read(fd, offsets, lengths, dsts, lengths.astype(np.int64), 512)
            busy += time.perf_counter() - t0
            cpu += time.thread_time() - c0
            done += n
    finally:
        engine.close()
        os.close(fd)
    return {"iops": done / busy, "cpu_us_per_read": cpu / done * 1e6, "tool": "bare io_uring loop (no fio)"}


def diskstore_round(store, rng, batch, seconds):
    """Batches of ``batch`` random ids for ``seconds`` (as long as fio runs)."""
    store.reset_stats()
    rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        store.read(torch.from_numpy(rng.integers(0, store.num_rows, batch)))
        rows += batch
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = store.stats()
    return {"iops": s["iops"], "rows_per_s": rows / wall, "cpu_us_per_read": s["cpu_us_per_read"],
            "whole_cpu_us_per_read": cpu / s["reads"] * 1e6, "amplification": s["read_amplification"],
            "reads": s["reads"]}


def memmap_round(path, row, rows, rng, batch):
    drop_cache(path)
    mm = np.memmap(path, np.uint8, "r", offset=HEADER, shape=(rows, row))
    ids = rng.integers(0, rows, batch)
    t0 = time.perf_counter()
    mm[ids].sum()
    return {"rows_per_s": batch / (time.perf_counter() - t0)}


def pread_round(path, row, rows, rng, batch):
    drop_cache(path)
    fd = os.open(path, os.O_RDONLY)
    ids = rng.integers(0, rows, batch)
    t0 = time.perf_counter()
    for i in ids.tolist():
        os.pread(fd, row, HEADER + i * row)
    dt = time.perf_counter() - t0
    os.close(fd)
    return {"rows_per_s": batch / dt}


def _spread(values):
    return float(np.median(values)), float(np.min(values)), float(np.max(values))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="data/bench-disk", help="where the test file lives (on the disk to measure)")
    p.add_argument("--gib", type=float, default=4.0, help="file size in GiB (larger than the page cache budget)")
    p.add_argument("--sizes", default="128,512,2048,16384", help="row sizes in bytes")
    p.add_argument("--qd", type=int, default=64, help="queue depth (DiskStore and fio)")
    p.add_argument("--batch", type=int, default=20000, help="row ids per DiskStore read")
    p.add_argument("--cold-batch", type=int, default=2000, help="row ids per cold memmap/pread round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per reader")
    p.add_argument("--fio-seconds", type=int, default=5)
    p.add_argument("--engine", default="auto", choices=["auto", "io_uring", "pread"])
    p.add_argument("--name", default="disk_read", help="results/<name>.json and .png")
    args = p.parse_args(argv)

    path = Path(args.dir) / "rows.bin"
    size = make_file(path, args.gib)
    rng = np.random.default_rng(1)
    results = []
    for row in [int(s) for s in args.sizes.split(",")]:
        rows = (size - HEADER) // row
        bs = max(512, -(-row // 512) * 512)
        handle = open_store(StoreSpec(path, tiers=False, disk=DiskOptions(
            dtype=torch.uint8, shape=(rows, row), offset=HEADER, queue_depth=args.qd, engine=args.engine)))
        store = handle.store  # the disk store itself, timed
        store.read(torch.arange(4))  # compile outside the timing
        rec = {"diskstore": [], "memmap": [], "pread": [], "limit": []}
        for _ in tqdm(range(args.rounds), desc=f"{row} B rows"):
            rec["diskstore"].append(diskstore_round(store, rng, args.batch, args.fio_seconds))
            rec["memmap"].append(memmap_round(path, row, rows, rng, args.cold_batch))
            rec["pread"].append(pread_round(path, row, rows, rng, args.cold_batch))
            point = fio_point(path, bs, args.qd, args.fio_seconds, size)
            rec["limit"].append(point or bare_uring_point(path, bs, args.qd, args.fio_seconds, size, rng))
        handle.close()
        ds_iops = _spread([r["iops"] for r in rec["diskstore"]])
        lim_iops = _spread([r["iops"] for r in rec["limit"]])
        ratio = _spread([d["iops"] / lim["iops"] for d, lim in zip(rec["diskstore"], rec["limit"])])
        cpu_ratio = _spread([d["cpu_us_per_read"] / lim["cpu_us_per_read"]
                             for d, lim in zip(rec["diskstore"], rec["limit"])])
        mm = _spread([r["rows_per_s"] for r in rec["memmap"]])
        pr = _spread([r["rows_per_s"] for r in rec["pread"]])
        ds_rows = _spread([r["rows_per_s"] for r in rec["diskstore"]])
        results.append({
            "row_bytes": row, "read_bytes": bs, "queue_depth": args.qd, "limit_tool": rec["limit"][0]["tool"],
            "limit_iops": lim_iops, "diskstore_iops": ds_iops, "iops_ratio": ratio,
            "limit_cpu_us_per_read": _spread([r["cpu_us_per_read"] for r in rec["limit"]]),
            "diskstore_cpu_us_per_read": _spread([r["cpu_us_per_read"] for r in rec["diskstore"]]),
            "diskstore_whole_cpu_us_per_read": _spread([r["whole_cpu_us_per_read"] for r in rec["diskstore"]]),
            "cpu_ratio": cpu_ratio, "diskstore_rows_per_s": ds_rows, "memmap_rows_per_s": mm,
            "pread_rows_per_s": pr, "speedup_vs_memmap": _spread(
                [d["rows_per_s"] / m["rows_per_s"] for d, m in zip(rec["diskstore"], rec["memmap"])]),
            "useful_gb_per_s": ds_rows[0] * row / 1e9,
            "amplification": _spread([r["amplification"] for r in rec["diskstore"]]),
            "rounds": rec})

    def cell(v, fmt="{:.0f}"):
        return f"{fmt.format(v[0])} ({fmt.format(v[1])}-{fmt.format(v[2])})"

    print(f"\nrandom row reads, QD {args.qd}, {args.gib:g} GiB file; medians of {args.rounds} interleaved rounds "
          "(min-max)")
    print_table([{
        "row B": r["row_bytes"], "read B": r["read_bytes"], "limit IOPS": cell(r["limit_iops"]),
        "DiskStore IOPS": cell(r["diskstore_iops"]), "ratio": cell(r["iops_ratio"], "{:.2f}"),
        "CPU us/read limit": f"{r['limit_cpu_us_per_read'][0]:.2f}",
        "CPU us/read DS": f"{r['diskstore_cpu_us_per_read'][0]:.2f}",
        "CPU ratio": cell(r["cpu_ratio"], "{:.2f}"),
        "CPU us/read DS whole": f"{r['diskstore_whole_cpu_us_per_read'][0]:.2f}",
        "DS rows/s": cell(r["diskstore_rows_per_s"]), "memmap rows/s": cell(r["memmap_rows_per_s"]),
        "pread rows/s": cell(r["pread_rows_per_s"]), "x memmap": cell(r["speedup_vs_memmap"], "{:.1f}"),
        "useful GB/s": f"{r['useful_gb_per_s']:.3f}", "amplif.": f"{r['amplification'][0]:.2f}"}
        for r in results], ["row B", "read B", "limit IOPS", "DiskStore IOPS", "ratio", "CPU us/read limit",
                            "CPU us/read DS", "CPU ratio", "CPU us/read DS whole", "DS rows/s", "memmap rows/s",
                            "pread rows/s", "x memmap", "useful GB/s", "amplif."])
    print(f"limit measured with: {results[0]['limit_tool']}")
    payload = {"system": system_facts(), "args": vars(args), "results": results}
    print(f"wrote {write_json(args.name, payload)}")

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['row_bytes']} B" for r in results]
    x = np.arange(len(labels))
    for i, (key, name) in enumerate([("limit_iops", results[0]["limit_tool"]), ("diskstore_iops", "DiskStore")]):
        med = [r[key][0] for r in results]
        err = [[m - r[key][1] for m, r in zip(med, results)], [r[key][2] - m for m, r in zip(med, results)]]
        a.bar(x + i * 0.4, med, 0.4, yerr=err, label=name)
    a.set_xticks(x + 0.2, labels)
    a.set_ylabel("reads per second")
    a.set_title(f"random reads at QD {args.qd}")
    a.legend(fontsize=8)
    for i, (key, name) in enumerate([("diskstore_rows_per_s", "DiskStore"), ("memmap_rows_per_s", "np.memmap cold"),
                                     ("pread_rows_per_s", "pread per row")]):
        b.bar(x + i * 0.27, [r[key][0] for r in results], 0.27, label=name)
    b.set_xticks(x + 0.27, labels)
    b.set_yscale("log")
    b.set_ylabel("rows per second (log)")
    b.set_title("random rows, page cache bypassed")
    b.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, RESULTS / f"{args.name}.png")
    print(f"wrote {RESULTS / (args.name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of tests/stores/test_exchange.py: ``python exchange_rank.py RANK WORLD PORT SCENARIO WORKDIR``.

Every rank builds the same tables (seeded), keeps its partition in a local store and reads batches through
``PartitionedStore(local, RowExchange(local, bounds), bounds)``; what it saw goes to stdout as one JSON line,
the last.  Scenarios: ``reads`` (every case below, checked against the table), ``kill`` (read, say "ready",
then rank 0 reads once the test has killed rank 1), ``silent`` (rank 1 raises on bad ids and stops
reading; rank 0's next read must time out), ``zero`` (rows of 0 bytes) and the tables of :data:`DISAGREE`
(ranks that hold different tables: each must raise one ``ExchangeError``).
"""

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from directload.stores import ClosedError, DiskStore, PartitionedStore, TensorStore, write_disk_store
from directload.stores.exchange import ExchangeError, RowExchange
from directload.stores.partitioned import partition_bounds

# (rows, row shape, dtype, local store, bounds: "even" or the partition sizes)
CASES = {
    2: [(1000, (37,), torch.float32, "tensor", "even"), (777, (1,), torch.float16, "disk", "even"),
        (500, (3, 4), torch.bfloat16, "tensor", [0, 500]), (900, (11,), torch.int8, "disk", "even"),
        (300, (), torch.int64, "tensor", [100, 200])],
    3: [(1000, (37,), torch.float32, "tensor", "even"), (600, (3, 4), torch.float16, "disk", [250, 0, 350])],
}


#: scenario: {rank: (dtype, row shape, partition sizes)} where a rank's table differs from the others'
#: (float32 rows of (100,), 10 rows split evenly)
DISAGREE = {"dtype": {1: (torch.int32, (100,), None)}, "width": {1: (torch.float64, (100,), None)},
            "shape": {1: (torch.float32, (10, 10), None)}, "length": {1: (torch.float32, (99,), None)},
            "empty": {1: (torch.float32, (100, 0), None)}, "bounds": {1: (torch.float32, (100,), [4, 6])},
            "third": {2: (torch.float64, (100,), None)},
            "several": {1: (torch.int32, (100,), None), 2: (torch.int32, (100,), None),
                        3: (torch.float32, (2, 50), None)}}


def table_of(rows, shape, dtype):
    """The same random bits on every rank."""
    g = torch.Generator().manual_seed(rows)
    size = torch.empty(0, dtype=dtype).element_size()
    if 0 in shape:
        return torch.empty((rows, *shape), dtype=dtype)
    bits = torch.randint(0, 256, (rows, int(np.prod(shape, dtype=np.int64)) * size), dtype=torch.uint8, generator=g)
    return bits.view(dtype).view(rows, *shape)


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                                                      b.contiguous().view(-1).view(torch.uint8))


def batches(r, bounds, seed):
    """Rank ``r``'s batches: random with duplicates, empty, all its own, all remote, int32, numpy, heavy duplicates."""
    rng = np.random.default_rng([seed, r])
    n, lo, hi = int(bounds[-1]), int(bounds[r]), int(bounds[r + 1])
    remote = np.concatenate([np.arange(0, lo), np.arange(hi, n)])
    return [torch.from_numpy(rng.integers(0, n, 300)), torch.empty(0, dtype=torch.int64),
            torch.from_numpy(rng.integers(lo, hi, 50) if hi > lo else np.zeros(0, np.int64)),
            torch.from_numpy(rng.choice(remote, 200) if remote.size else remote),
            torch.from_numpy(rng.integers(0, n, 257)).to(torch.int32),
            rng.integers(0, n, 64), torch.from_numpy(rng.choice(n, 8)[rng.integers(0, 8, 400)])]


def expected_stats(rank, world, bounds, seed):
    """The exchange's counters after every rank read its batches: what each asked of the others."""
    owner = lambda ids: np.searchsorted(bounds, ids, side="right") - 1  # noqa: E731
    want = dict(rounds=0, rows_asked=0, rows_received=0, duplicates_saved=0, rows_sent=0)
    for r in range(world):
        for b in batches(r, bounds, seed):
            ids = np.asarray(b, dtype=np.int64)
            far = ids[owner(ids) != r]  # what PartitionedStore passes to the exchange
            uniq = np.unique(far)
            if r == rank:
                want["rounds"] += 1
                want["rows_asked"] += far.size
                want["rows_received"] += uniq.size
                want["duplicates_saved"] += far.size - uniq.size
            else:
                want["rows_sent"] += int((owner(uniq) == rank).sum())
    return want


def local_store(kind, rows, work, name):
    if kind == "tensor":
        return TensorStore(rows.clone())
    where = Path(work) / name  # a directory per rank: writers of one directory take turns
    where.mkdir()
    path = write_disk_store(rows, where / "rows.npy", progress=False)
    return DiskStore(path, staging_bytes=1 << 20)


def run_reads(rank, world, work):
    failures, stats = [], []
    for case, (n, shape, dtype, kind, parts) in enumerate(CASES[world]):
        table = table_of(n, shape, dtype)
        bounds = partition_bounds(n, world) if parts == "even" else np.concatenate([[0], np.cumsum(parts)])
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        local = local_store(kind, table[lo:hi], work, f"case{case}-rank{rank}")
        exchange = RowExchange(local, bounds, timeout=20, own=True)
        store = PartitionedStore(local, exchange, bounds, part=rank, own=True)
        what = f"case {case} ({dtype}, {shape}, {kind}, bounds {bounds.tolist()})"
        for i, ids in enumerate(batches(rank, bounds, case)):
            out = torch.empty((len(ids), *shape), dtype=dtype) if i == 6 else None
            got = store.read(ids, out=out)
            if not same_bits(got, table[torch.as_tensor(ids).long()]) or (out is not None and got is not out):
                failures.append(f"{what}: batch {i} differs")
        want = expected_stats(rank, world, bounds, case)
        have = exchange.stats()["exchange"]
        if {k: have[k] for k in want} != want or have["local_rows"]:
            failures.append(f"{what}: stats {dict(have)} != {want}")
        if have["bytes_received"] < have["rows_received"] * local.row_nbytes or not have["seconds"] > 0:
            failures.append(f"{what}: bytes or seconds not counted: {dict(have)}")
        stats.append(dict(have))
        if case == 0:
            failures += refusals(store, exchange, table, n)
        store.close()
        try:
            exchange.read([0])
            failures.append(f"{what}: a closed exchange read")
        except ClosedError:
            pass
        exchange.close()  # idempotent
        if exchange.group is not None or not local.closed:
            failures.append(f"{what}: close left the group or the local store open")
    return {"failures": failures, "stats": stats}


def refusals(store, exchange, table, n):
    """Bad input raises on the caller before any collective: the next good round still runs in lockstep."""
    failures = []
    for bad, error in (([n], IndexError), ([-1], IndexError), (torch.tensor([0.5]), TypeError),
                       (torch.zeros(2, 2, dtype=torch.int64), ValueError), ("abc", TypeError)):
        for target in (store, exchange):
            try:
                target.read(bad)
                failures.append(f"{bad!r} was read")
            except error:
                pass
    before = exchange.stats()["exchange"]["rounds"]
    ids = torch.arange(n - 1, -1, -97)  # own rows and others', through the exchange alone: own ones read here
    if not same_bits(exchange.read(ids), table[ids]) or exchange.stats()["exchange"]["rounds"] != before + 1:
        failures.append("a round after refused reads went wrong")
    if not exchange.stats()["exchange"]["local_rows"]:
        failures.append("own rows read through the exchange were not counted as local")
    return failures


def run_failure(rank, world, scenario, work):
    n, timeout = 400, 5.0 if scenario == "kill" else 2.0
    table = table_of(n, (16,), torch.float32)
    bounds = partition_bounds(n, world)
    local = TensorStore(table[bounds[rank]:bounds[rank + 1]].clone())
    store = PartitionedStore(local, RowExchange(local, bounds, timeout=timeout), bounds, part=rank)
    for _ in range(3):
        store.read(torch.randint(0, n, (100,)))
    if rank == 1:
        if scenario == "silent":
            try:
                store.read([n + 5])  # refused here, so rank 0 waits in a round rank 1 never joins
            except IndexError:
                pass
            time.sleep(timeout + 1)
            return {"failures": []}
        print("ready", flush=True)
        time.sleep(600)  # killed by the test
    if scenario == "kill":
        print("ready", flush=True)
        sys.stdin.readline()  # the test has killed rank 1
    t0 = time.monotonic()
    report = {"failures": []}
    try:
        store.read(torch.arange(n))
        report["failures"].append("a read with the peer gone returned")
    except ExchangeError as exc:
        report.update(error=str(exc), seconds=time.monotonic() - t0)
    t0 = time.monotonic()
    try:
        store.read([0, n - 1])
        report["failures"].append("a read after the error returned")
    except ExchangeError as exc:
        report.update(again=str(exc), again_seconds=time.monotonic() - t0)
    t0 = time.monotonic()
    store.close()
    store.remote.close()
    report["close_seconds"] = time.monotonic() - t0
    return report


def run_disagree(rank, world, scenario):
    """Read twice from a table whose dtype, row shape or bounds differ on some rank: every rank must raise the
    same ``ExchangeError`` both times, with no collective left waiting."""
    n = 10
    dtype, shape, parts = DISAGREE[scenario].get(rank, (torch.float32, (100,), None))
    bounds = partition_bounds(n, world) if parts is None else np.concatenate([[0], np.cumsum(parts)])
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    exchange = RowExchange(TensorStore(table_of(n, shape, dtype)[lo:hi].clone()), bounds, timeout=60, own=True)
    report = {"failures": []}
    for key in ("error", "again"):
        try:
            got = exchange.read(torch.arange(n))
            report["failures"].append(f"read {got.dtype} {tuple(got.shape)}: {got.view(-1)[:3].tolist()}")
        except ExchangeError as exc:
            report[key] = str(exc)
    exchange.close()
    return report


def run_zero(rank, world):
    """Rows of 0 bytes (a row shape with a 0 in it) read as the right empty rows, through a PartitionedStore
    and the exchange alone, whatever the ids (a list, numpy, int32, none, into ``out``) and bounds (a rank
    that holds no rows), and keep the ranks in step for a table of real rows after them."""
    failures = []
    for n, shape, dtype, parts in ((7, (0,), torch.float32, None), (5, (3, 0), torch.float64, None),
                                   (4, (0,), torch.int8, [4] + [0] * (world - 1)), (40, (6,), torch.int16, None)):
        table = table_of(n, shape, dtype)
        bounds = partition_bounds(n, world) if parts is None else np.concatenate([[0], np.cumsum(parts)])
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        local = TensorStore(table[lo:hi].clone())
        exchange = RowExchange(local, bounds, timeout=30)
        store = PartitionedStore(local, exchange, bounds, part=rank, own=True)
        ids = [n - 1, 0, 0, n // 2, rank % n]
        for target in (store, exchange, store):
            for given, out in ((torch.tensor(ids), None), (ids, None), (np.array(ids, np.int32), None),
                               (torch.tensor(ids, dtype=torch.int32), torch.empty((len(ids), *shape), dtype=dtype)),
                               ([], None)):
                got = target.read(given, out=out)
                want = table[torch.as_tensor(given, dtype=torch.int64)]
                if not same_bits(got, want) or (out is not None and got is not out):
                    failures.append(f"{dtype} {shape} {bounds.tolist()}: {type(given).__name__} read {got.dtype} "
                                    f"{tuple(got.shape)}")
        store.close()
        exchange.close()
    return {"failures": failures}


def main():
    rank, world, port, scenario, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    if scenario == "reads":
        report = run_reads(rank, world, work)
    elif scenario in DISAGREE:
        report = run_disagree(rank, world, scenario)
    elif scenario == "zero":
        report = run_zero(rank, world)
    else:
        report = run_failure(rank, world, scenario, work)
    print(json.dumps(report), flush=True)
    if scenario != "kill" and scenario != "silent":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One stack of tests/stores/test_held_memory.py: ``python held_worker.py KIND WORKDIR``.

In a fresh process: load everything a read loads (a throwaway stack of the same kind reads once), measure
the process's resident memory, open a stack of KIND over the table in WORKDIR (made by the test), read
batches as a loader does (each announced a few ahead, read one at a time, its rows dropped), and print one
JSON line: the resident growth since the baseline, the stack's ``held_bytes()`` and, for a stack opened
from a :class:`~directload.stores.StoreSpec`, its ``held_estimate``.

Recycled output blocks (:func:`directload.kernels.host_pool.default_pool`) are the caller's rows, not the
stack's: the pool keeps none here.  The test runs this with ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, so
every large buffer freed goes back to the system at once.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from directload.kernels.host_pool import default_pool
from directload.stores import (
    BudgetSpec,
    DeviceCache,
    DiskStore,
    HostCache,
    PartitionedStore,
    StoreSpec,
    TensorStore,
    open_store,
)

ROWS, WIDTH = 8192, 1024  # float32 rows of 4 KiB: a 32 MiB table
TABLE = ROWS * WIDTH * 4
BATCHES, BATCH, AHEAD = 24, 3000, 4  # ids per batch (with repeats), batches announced ahead


def resident():
    """Resident anonymous and shared memory of this process, in bytes (file pages are the libraries')."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    return sum(int(fields[key].split()[0]) * 1024 for key in ("RssAnon", "RssShmem"))


def table_rows():
    return torch.from_numpy(np.random.default_rng(1).standard_normal((ROWS, WIDTH), dtype=np.float32))


def open_kind(kind, work):
    """(the stack, its spec or None) of ``kind`` over the files in ``work``."""
    disk, packed = work / "table.npy", work / "packed.npy"
    spec = None
    if kind == "tensor":
        store = TensorStore(table_rows())
    elif kind == "disk":
        store = DiskStore(disk)
    elif kind == "host":
        store = HostCache(DiskStore(disk), TABLE // 4, "lru", staging_bytes=2 << 20)
    elif kind == "device":
        store = DeviceCache(DiskStore(disk), TABLE // 8, "lookahead", device="cpu")
    elif kind in ("tiered", "tiered-packed", "budget", "hot"):
        budget = BudgetSpec(host_bytes=TABLE if kind == "budget" else 0, name=f"held-{work.name}",
                            shared_hot_bytes=TABLE // 8 if kind == "hot" else 0, directory=str(work))
        spec = StoreSpec(packed if kind in ("tiered-packed", "hot") else disk, host_bytes=TABLE // 4,
                         gpu_bytes=TABLE // 16, staging_bytes=2 << 20, packed=kind in ("tiered-packed", "hot"),
                         budget=budget)
        store = open_store(spec)
    elif kind == "partitioned":
        rows = table_rows()
        bounds = [0, ROWS // 2, ROWS]
        store = PartitionedStore(HostCache(TensorStore(rows[:ROWS // 2].clone()), TABLE // 8, "sieve"),
                                 TensorStore(rows), bounds, part=0, own=True)
    else:
        raise ValueError(kind)
    if kind == "tiered-packed":
        store.warm()
    return store, spec


def read_batches(store, rng, batches=BATCHES):
    weights = 1.0 / np.arange(1, ROWS + 1) ** 0.8  # a few hot rows, as a sampler's input nodes have
    ids = [torch.from_numpy(rng.choice(ROWS, BATCH, p=weights / weights.sum())) for _ in range(batches + AHEAD)]
    for batch in ids[:AHEAD]:
        store.prefetch(batch)
    for i in range(batches):
        store.prefetch(ids[i + AHEAD])
        store.read(ids[i])  # dropped at once, as a loader's batch is after its step


def main():
    kind, work = sys.argv[1], Path(sys.argv[2])
    default_pool().max_cached_bytes = 0
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    if kind == "tensor":  # loads the tensor store's gather and makes the table once
        table_rows()
    warm, _ = open_kind(kind, work)  # everything a read loads (kernels, thread pools), then let go
    read_batches(warm, rng, batches=2)
    warm.close()
    del warm
    base = resident()
    store, spec = open_kind(kind, work)
    read_batches(store, rng)
    warming = getattr(getattr(store, "top", None), "warming", None)
    if warming is not None:
        warming.join()
    out = {"growth": resident() - base, "held": store.held_bytes()}
    if spec is not None:
        out["estimate"] = sum(spec.held_estimate(ROWS, WIDTH * 4, batch_rows=BATCH, lookahead=AHEAD,
                                                 cuda=False).values())
    store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

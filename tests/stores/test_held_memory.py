"""Every byte a stack holds is counted: for every kind of store, the process's resident growth while it reads
batches is at most what ``held_bytes()`` says (plus a small slack) and not far below it; a stack opened
from a spec holds at most its ``held_estimate``; and what a cache holds besides its slots (its read buffers,
the policy's state) is named.

Each stack runs in a fresh process (tests/stores/held_worker.py), so nothing another test allocated, and no
allocator state it left, counts.  The slack covers what a process allocates while reading that no store
holds: reader threads' stacks, futures, a batch's index arrays (measured: at most 1 MiB on every kind).
A budget's host cache counts its whole room, which it touches only as it grows: the lower bound is half.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from directload.stores import DiskStore, HostCache, TensorStore, TieredStore, renumber, write_disk_store
from directload.stores.held import ReadBuffer, nbytes_of, span_bytes
from directload.stores.policies import POLICY_NAMES, make_policy, policy_class

WORKER = Path(__file__).with_name("held_worker.py")
SLACK = 8 << 20
KINDS = ["tensor", "disk", "host", "device", "tiered", "tiered-packed", "hot", "partitioned", "budget"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The worker's table as a disk store, and a copy renumbered by hotness."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        import held_worker
    finally:
        sys.path.remove(str(WORKER.parent))
    work = tmp_path_factory.mktemp("held")
    rows = held_worker.table_rows().numpy()
    write_disk_store(rows, work / "table.npy", progress=False)
    counts = np.random.default_rng(2).integers(0, 100, rows.shape[0])
    renumber(work / "table.npy", work / "packed.npy", counts, progress=False)
    return work


def run_worker(kind, work):
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), kind, str(work)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", KINDS)
def test_resident_growth_is_what_the_stack_says_it_holds(kind, tables):
    got = run_worker(kind, tables)
    growth, held = got["growth"], got["held"]
    assert growth <= held + SLACK, f"{kind}: the process grew {growth >> 20} MiB, the stack says {held >> 20} MiB"
    assert growth >= held // 2, f"{kind}: the stack says {held >> 20} MiB but the process grew {growth >> 20} MiB"
    if "estimate" in got:
        assert held <= got["estimate"], f"{kind}: holds {held >> 20} MiB, estimated {got['estimate'] >> 20} MiB"


def test_a_cache_names_its_read_buffers_and_counts_its_bookkeeping(tmp_path):
    table = torch.zeros(4096, 256)
    path = write_disk_store(table, tmp_path / "t.npy", progress=False)
    with HostCache(DiskStore(path), 1 << 20, "lru") as cache:
        cache.read(torch.arange(3000))
        buffers = [m for m in cache.held_memory() if isinstance(m, np.ndarray)]
        assert len(buffers) == 1 and buffers[0].nbytes >= 3000 * 1024  # the read's staging of its misses
        slots = cache.held_memory()[0]
        assert cache.held_bytes() >= slots.nbytes + sum(m.nbytes for m in buffers) + cache.slots.nbytes()
        assert cache.slots.nbytes() >= cache.policy.nbytes() > 256 * 32  # a dict of the rows kept


def test_a_tiered_stack_counts_each_tier_once():
    table = torch.zeros(2048, 64)
    with TieredStore(TensorStore(table), gpu_bytes=1 << 16, host_bytes=1 << 18, staging_bytes=0,
                     device="cpu") as store:
        store.read(torch.arange(2048))
        device, host = store.tiers[0], store.tiers[1]
        assert store.held_bytes() == (span_bytes(store.held_memory()) + device.slots.nbytes()
                                      + host.slots.nbytes())
        assert span_bytes([table, table[3:5]]) == table.nbytes


def test_read_buffers_grow_to_what_a_read_needs_not_twice_their_size():
    buf = ReadBuffer(pin="never")
    buf.take(60 << 20)
    assert buf.take(62 << 20).nbytes == 64 << 20  # (a StagingBuffer grows to 120 MiB here)
    assert ReadBuffer(limit=1 << 20, pin="never").take(900 << 10).nbytes == 1 << 20


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_policy_holds_at_most_its_estimate(name):
    num_rows, capacity = 200_000, 20_000
    policy = make_policy(name, capacity, num_rows=num_rows)
    rng = np.random.default_rng(0)
    batches = [np.unique(rng.choice(num_rows, 4000)) for _ in range(30)]
    for i, batch in enumerate(batches):
        policy.see(i, batches[i:i + 4])
        policy.access_distinct(batch)
        policy.take_evicted()
    assert 0 < policy.nbytes() <= policy_class(name).bytes_for(capacity, num_rows)


def test_the_lookahead_plan_never_grows_past_the_table():
    num_rows = 100_000
    policy = make_policy("lookahead", 1000, num_rows=num_rows)
    policy.access(np.array([60_000]))  # the arrays grow to hold row 60,000 ...
    policy.access(np.array([num_rows - 1]))  # ... then to the table, not to twice 60,000
    assert policy.nbytes() <= policy_class("lookahead").bytes_for(1000, num_rows)
    assert nbytes_of(policy._in) == num_rows

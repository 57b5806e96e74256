"""DiskStore: bit-exact rows from disk through io_uring or pread, errors with where they happened, no hangs."""

import ctypes
import errno
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import ROW_ELEMS, bits, random_table, within

from directload import memory
from directload.files import CorruptFileError
from directload.stores import (
    ClosedError,
    DirectIOWarning,
    DiskStore,
    disk_io,
    disk_staging,
    disk_uring,
    io_path,
    write_disk_store,
)

ENGINES = ["pread"] + (["io_uring"] if disk_uring.uring_available() else [])
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64)


@pytest.fixture(autouse=True)
def no_faults():
    disk_io.FAULTS[:] = 0
    yield
    disk_io.FAULTS[:] = 0


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def _store(tmp_path, table, name="feat.npy", **kw):
    path = write_disk_store(table, tmp_path / name, progress=False)
    return DiskStore(path, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", ROW_ELEMS)
def test_rows_read_back_bit_identical(tmp_path, rng, engine, dtype, row):
    table = random_table(rng, 97, row, dtype)
    with _store(tmp_path, table, engine=engine) as store:
        assert store.shape == (97, row) and store.dtype == dtype and store.engine_name == engine
        ids = torch.from_numpy(rng.integers(0, 97, 150))  # duplicates, any order, rows across block edges
        got = store.read(ids)
        assert got.dtype == dtype and got.device.type == "cpu"
        assert torch.equal(bits(got), bits(table[ids]))
        assert torch.equal(bits(store.read(torch.arange(97))), bits(table))


def test_o_direct_reads_are_aligned_to_the_measured_block(tmp_path, rng, engine):
    table = random_table(rng, 1000, 25, torch.float32)  # 100-byte rows
    with _store(tmp_path, table, engine=engine) as store:
        if not store.direct:
            pytest.skip("this file system refuses O_DIRECT")
        assert store.block in (512, 1024, 2048, 4096)
        offsets, lengths, needed, _ = disk_staging.plan_reads(np.array([0, 3, 700], np.int64), 100, 4096,
                                                         store._layout.file_bytes, store.block, 0, 1 << 17)
        assert np.all(offsets % store.block == 0) and np.all(lengths % store.block == 0)
        assert torch.equal(store.read([700, 3, 0]), table[[700, 3, 0]])


def test_rows_that_share_a_block_are_read_once_and_neighbours_merge(tmp_path, rng, engine):
    table = random_table(rng, 4096, 4, torch.float32)  # 16-byte rows: 32 per 512-byte block
    with _store(tmp_path, table, engine=engine) as store:
        store.read(torch.tensor([0, 1, 1, 2, 5, 0]))
        s = store.stats()
        assert s["rows"] == 6 and s["unique_rows"] == 4 and s["reads"] == 1
        assert s["bytes_read"] == store.block and s["requested_bytes"] == 6 * 16
        store.reset_stats()
        store.read(torch.arange(0, 4096, 8))  # every block touched: merged into max_read pieces
        s = store.stats()
        assert s["reads"] == -(-4096 * 16 // (128 << 10)) and s["read_amplification"] == pytest.approx(8.0)
        assert s["iops"] > 0 and s["gb_per_s"] > 0 and s["cpu_us_per_read"] >= 0 and s["engine"] == engine


def test_plan_merges_small_gaps_only_when_asked():
    rows = np.array([0, 100], np.int64)  # 4-byte rows: blocks 0 and 0 (data offset 0), then 400 -> block 0
    offs, lens, _, pos = disk_staging.plan_reads(np.array([0, 300], np.int64), 4, 0, 1 << 20, 512, 0, 1 << 17)
    assert list(offs) == [0, 1024] and list(lens) == [512, 512] and list(pos) == [0, 512 + 176]
    offs, lens, _, pos = disk_staging.plan_reads(np.array([0, 300], np.int64), 4, 0, 1 << 20, 512, 512, 1 << 17)
    assert list(offs) == [0] and list(lens) == [1536] and list(pos) == [0, 1200]
    offs, lens, need, _ = disk_staging.plan_reads(rows, 4, 0, 402, 512, 0, 1 << 17)  # a file ending mid-block
    assert list(lens) == [512] and list(need) == [402]


def test_out_and_devices_follow_the_contract(tmp_path, rng, engine):
    table = random_table(rng, 50, 11, torch.float16)
    with _store(tmp_path, table, engine=engine) as store:
        out = torch.empty(3, 11, dtype=torch.float16)
        assert store.read([4, 4, 49], out=out) is out and torch.equal(out, table[[4, 4, 49]])
        with pytest.raises(ValueError, match="shape"):
            store.read([1], out=out)
        assert store.read(torch.tensor([], dtype=torch.int64)).shape == (0, 11)
        with pytest.raises(IndexError, match="row id 50"):
            store.read([50])
        assert store.stats()["rows"] == 3 + 0  # the refused reads did no work


def test_injected_io_errors_are_retried_then_raised_with_path_offset_and_length(tmp_path, rng, engine):
    table = random_table(rng, 64, 100, torch.float32)
    with _store(tmp_path, table, engine=engine, retries=2) as store:
        disk_io.FAULTS[:] = (errno.EIO, 2, 0)  # two failures: within the retries
        assert torch.equal(store.read([5, 60]), table[[5, 60]])
        disk_io.FAULTS[:] = (errno.EIO, 1000, 0)
        with pytest.raises(OSError) as info:
            store.read([5])
        assert info.value.errno == errno.EIO and str(store.path) in str(info.value)
        assert "offset" in str(info.value) and "bytes" in str(info.value)
        disk_io.FAULTS[:] = 0
        assert torch.equal(store.read([5]), table[[5]])  # the store still works after an error


def test_short_reads_are_completed(tmp_path, rng, engine):
    table = random_table(rng, 2000, 100, torch.float32)
    with _store(tmp_path, table, engine=engine) as store:
        disk_io.FAULTS[:] = (0, 0, 50)
        ids = torch.arange(0, 2000, 3)
        assert torch.equal(store.read(ids), table[ids])
        assert disk_io.FAULTS[2] < 50  # short reads did happen


@pytest.mark.parametrize("submit_batch", [1, 3, 64, 1000])
def test_any_submit_batch_reads_every_row_right_with_retries_and_short_reads(tmp_path, rng, submit_batch):
    if not disk_uring.uring_available():
        pytest.skip("io_uring is not available here")
    table = random_table(rng, 3000, 100, torch.float32)
    with _store(tmp_path, table, engine="io_uring", submit_batch=submit_batch, queue_depth=16) as store:
        assert store.stats()["submit_batch"] == submit_batch
        ids = torch.from_numpy(rng.integers(0, 3000, 2000))
        assert torch.equal(store.read(ids), table[ids])
        disk_io.FAULTS[:] = (errno.EIO, 5, 40)  # five failed and forty short completions, all recovered
        assert torch.equal(store.read(ids), table[ids])
        assert disk_io.FAULTS[1] == 0 and disk_io.FAULTS[2] < 40


def test_a_file_that_shrinks_after_open_raises_corrupt_file_error(tmp_path, rng, engine):
    table = random_table(rng, 100, 100, torch.float32)
    with _store(tmp_path, table, engine=engine) as store:
        os.truncate(store.path, 4096 + 40 * 400)
        with pytest.raises(CorruptFileError, match="changed size"):
            store.read([90])


def test_close_waits_for_reads_in_flight_and_never_hangs(tmp_path, rng, engine):
    table = random_table(rng, 5000, 64, torch.float32)
    store = _store(tmp_path, table, engine=engine)
    ids = [torch.from_numpy(rng.integers(0, 5000, 500)) for _ in range(8)]
    futures = [store.read_async(i) for i in ids]
    within(30, store.close)
    for i, future in zip(ids, futures):
        assert torch.equal(within(30, future.wait), table[i])
    with pytest.raises(ClosedError):
        store.read([0])
    store.close()


_COLLECTED_IN_THREAD_START = """
import sys, threading
import numpy as np
from directload.stores import DiskStore
np.save(sys.argv[1], np.arange(64, dtype=np.float32).reshape(16, 4))
store = DiskStore(sys.argv[1])
worker = store.read([3])  # its read thread now runs
worker = next(t for t in threading.enumerate() if t.name.startswith("directload-disk"))
# A collection can run inside Thread.start, while threading holds this lock (Python 3.11's
# _maintain_shutdown_locks): a store dropped there must not join its thread, which takes the lock too.
with threading._shutdown_locks_lock:
    del store
worker.join(60)
print("worker alive" if worker.is_alive() else "worker ended")
"""


@pytest.mark.skipif(not hasattr(threading, "_shutdown_locks_lock"), reason="this Python's threading has no such lock")
def test_a_store_collected_while_threading_holds_its_locks_does_not_deadlock(tmp_path):
    # Seen as a hang of the whole test run: a DiskStore left unclosed was collected in another thread's start.
    out = subprocess.run([sys.executable, "-c", _COLLECTED_IN_THREAD_START, str(tmp_path / "t.npy")],
                         capture_output=True, text=True, timeout=120)  # the old code hangs here
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["worker", "ended"]


def _child_reads(store, ids, queue):
    got = store.read(ids)
    queue.put((os.getpid(), store._pid, got.numpy().tobytes()))


def test_a_forked_child_opens_its_own_file_and_ring(tmp_path, rng, engine):
    table = random_table(rng, 300, 9, torch.float32)
    with _store(tmp_path, table, engine=engine) as store:
        store.read([1])  # the parent's ring is in use
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(store, torch.tensor([299, 2]), queue))
        child.start()
        pid, store_pid, data = within(60, lambda: queue.get(timeout=60))
        child.join(30)
        assert child.exitcode == 0 and pid == store_pid == child.pid != os.getpid()
        assert data == table[[299, 2]].numpy().tobytes()
        assert store._pid == os.getpid() and torch.equal(store.read([7]), table[[7]])


def test_a_pickled_store_reopens_its_file(tmp_path, rng):
    table = random_table(rng, 30, 5, torch.int64)
    with _store(tmp_path, table, queue_depth=8) as store:
        with pickle.loads(pickle.dumps(store)) as copy:
            assert copy is not store and copy._options == store._options
            assert torch.equal(copy.read([29, 0]), table[[29, 0]])


def _spawned(store, queue):
    queue.put(store.read([3, 1]).numpy().tobytes())


def test_a_spawned_torch_multiprocessing_child_reads_its_own_copy(tmp_path, rng):
    import torch.multiprocessing as tmp

    table = random_table(rng, 10, 3, torch.float32)
    with _store(tmp_path, table) as store:
        ctx = tmp.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_spawned, args=(store, queue))
        child.start()
        data = queue.get(timeout=120)
        child.join(60)
        assert child.exitcode == 0 and data == table[[3, 1]].numpy().tobytes()


def _reads_buffered(path, table):
    """Opening ``path`` warns that O_DIRECT is refused, then reads right through the page cache."""
    with pytest.warns(DirectIOWarning, match="O_DIRECT"):
        store = DiskStore(path)
    with store:
        assert not store.direct and torch.equal(store.read([len(table) - 1, 0]), table[[len(table) - 1, 0]])
    with pytest.raises(OSError):
        DiskStore(path, direct=True)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_file_systems_without_o_direct_fall_back_to_buffered_reads_with_a_warning(rng):
    import tempfile

    table = random_table(rng, 40, 6, torch.float32)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        path = write_disk_store(table, os.path.join(d, "f.npy"), progress=False)
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            pytest.skip("this /dev/shm accepts O_DIRECT (tmpfs does from Linux 6.6)")
        except OSError:
            pass
        _reads_buffered(path, table)


def test_the_read_path_is_chosen_and_reported(monkeypatch):
    assert io_path() in ("io_uring", "pread") and io_path("pread") == "pread"
    monkeypatch.setattr(disk_uring, "uring_available", lambda: False)
    assert io_path() == "pread"
    with pytest.raises(ValueError, match="engine"):
        io_path("aio")


@pytest.mark.parametrize("kw", [dict(queue_depth=0), dict(rings=True), dict(direct="yes"), dict(retries=-1),
                                dict(queue_depth=5000), dict(max_read=1.5), dict(submit_batch=0)])
def test_bad_options_are_refused(tmp_path, kw):
    path = write_disk_store(torch.zeros(4, 2), tmp_path / "f.npy", progress=False)
    with pytest.raises(ValueError):
        DiskStore(path, **kw)


def test_several_rings_read_one_batch_together(tmp_path, rng):
    if "io_uring" not in ENGINES:
        pytest.skip("io_uring is not available here")
    table = random_table(rng, 20000, 32, torch.float32)
    with _store(tmp_path, table, rings=2, queue_depth=16) as store:
        ids = torch.from_numpy(rng.integers(0, 20000, 3000))
        assert torch.equal(store.read(ids), table[ids])
        assert store.stats()["cpu_seconds"] > 0


def test_raw_files_open_with_dtype_shape_and_any_offset(tmp_path, rng, engine):
    table = random_table(rng, 77, 13, torch.int16)
    path = tmp_path / "raw.bin"
    path.write_bytes(b"x" * 100 + table.numpy().tobytes() + b"tail")
    with DiskStore(path, dtype=torch.int16, shape=(77, 13), offset=100, engine=engine) as store:
        assert store.shape == (77, 13) and torch.equal(store.read([76, 0, 40]), table[[76, 0, 40]])
    with pytest.raises(CorruptFileError, match="need"):
        DiskStore(path, dtype=torch.int16, shape=(78, 13), offset=100)
    with pytest.raises(ValueError, match="both dtype and shape"):
        DiskStore(path, dtype=torch.int16)


def test_a_refused_o_direct_falls_back_to_the_page_cache_with_a_warning(tmp_path, rng, monkeypatch):
    import directload.stores.disk as disk

    table = random_table(rng, 40, 6, torch.float32)
    path = write_disk_store(table, tmp_path / "f.npy", progress=False)
    real_open = os.open

    def no_direct(p, flags, *args):  # what tmpfs before Linux 6.6 answers
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *args)

    monkeypatch.setattr(disk.os, "open", no_direct)
    _reads_buffered(path, table)
    with DiskStore(path, direct=False) as store:
        assert not store.direct and torch.equal(store.read([5]), table[[5]])


@pytest.mark.parametrize("staging_bytes", [4096, 8192, 1 << 20])
def test_batches_larger_than_the_staging_buffer_are_read_in_rounds(tmp_path, rng, engine, staging_bytes):
    table = random_table(rng, 3000, 100, torch.float32)  # 400-byte rows: reads span blocks
    with _store(tmp_path, table, engine=engine, staging_bytes=staging_bytes, max_read=8192) as store:
        ids = torch.from_numpy(rng.integers(0, 3000, 2500))
        assert torch.equal(store.read(ids), table[ids])
        assert torch.equal(store.read(torch.arange(2999, -1, -1)), table.flip(0))
        assert store._staging.nbytes <= max(staging_bytes, 8192)
        disk_io.FAULTS[:] = (errno.EIO, 1000, 0)
        with pytest.raises(OSError, match="offset"):
            store.read(ids)


def test_ids_reused_by_the_caller_after_read_async_do_not_change_the_read(tmp_path, rng, engine):
    table = random_table(rng, 20000, 64, torch.float32)
    with _store(tmp_path, table, engine=engine) as store:
        busy = store.read_async(torch.from_numpy(rng.integers(0, 20000, 20000)))  # keeps the worker busy
        ids = torch.arange(10)
        numpy_ids = np.arange(10, 20)
        first, second = store.read_async(ids), store.read_async(numpy_ids)
        ids[:] = 19999
        numpy_ids[:] = -5  # would read the header as rows if the read looked at it later
        busy.wait()
        assert torch.equal(first.wait(), table[:10]) and torch.equal(second.wait(), table[10:20])


def test_a_store_dropped_with_a_read_in_flight_releases_its_file(tmp_path, rng, engine):
    import gc

    table = random_table(rng, 500, 16, torch.float32)
    path = write_disk_store(table, tmp_path / "f.npy", progress=False)
    DiskStore(path, engine=engine).close()  # compile and warm up outside the count

    def held():  # this file's descriptors and io_uring rings: what a store holds (not other threads' files)
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed since the listing
                continue
            if link == str(path.resolve()) or "io_uring" in link:
                found.append(link)
        return sorted(found)

    before = held()
    for _ in range(5):
        future = DiskStore(path, engine=engine).read_async(torch.arange(500))
        assert torch.equal(future.wait(), table)
        del future
        gc.collect()
    within(10, lambda: None)
    assert held() == before


def test_reads_longer_than_a_32_bit_count_are_refused(tmp_path):
    path = write_disk_store(torch.zeros(4, 2), tmp_path / "f.npy", progress=False)
    with pytest.raises(ValueError, match="max_read"):
        DiskStore(path, max_read=2 << 30)


def test_a_ring_the_kernel_refuses_raises_os_error():
    if "io_uring" not in ENGINES:
        pytest.skip("io_uring is not available here")
    with pytest.raises(OSError, match="io_uring_queue_init"):
        disk_uring.UringEngine(queue_depth=1 << 20)  # more entries than the kernel gives one ring


def test_the_staging_buffer_comes_from_the_pinned_pool_where_cuda_runs(tmp_path, rng, engine):
    """With a CUDA host runtime (here libc's malloc standing in for cudaHostAlloc), reads land in
    pinned, page-aligned staging from directload's pool, and come back bit-identical."""
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype, libc.aligned_alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    class Pinned(memory.HostRuntime):  # page-aligned, as cudaHostAlloc's blocks are
        def __init__(self):
            self.allocs = []

        def host_alloc(self, nbytes):
            ptr = libc.aligned_alloc(4096, nbytes)
            self.allocs.append((ptr, nbytes))
            return ptr

        def free_host(self, ptr):
            libc.free(ptr)

    table = random_table(rng, 3000, 100, torch.float32)
    rt = Pinned()
    with memory.use_runtime(rt), _store(tmp_path, table, engine=engine, staging_bytes=1 << 20) as store:
        ids = torch.from_numpy(rng.integers(0, 3000, 2500))
        assert torch.equal(store.read(ids), table[ids])
        staging = store._staging_buffer(0)
        assert staging.ctypes.data % 4096 == 0
        assert any(p <= staging.ctypes.data and staging.ctypes.data + staging.nbytes <= p + n for p, n in rt.allocs)
        # one pinned block no bigger than the pool's rounding of the buffer itself (no padding doubled it)
        assert len(rt.allocs) == 1 and rt.allocs[0][1] <= memory.PinnedPool.block_size(staging.nbytes)
    assert store._staging.nbytes == 0  # closed: the staging buffer went back to the pool
    plain = DiskStore(tmp_path / "feat.npy", engine=engine)  # no CUDA runtime: ordinary memory
    with plain:
        assert torch.equal(plain.read(ids), table[ids]) and plain._staging_buffer(1).ctypes.data % 4096 == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.int64])
def test_the_zero_copy_path_gathers_from_staging_what_the_copy_path_does(tmp_path, rng, engine, dtype):
    """The GPU path (the tiered gather straight from staging) run on the CPU: the same rows, bit for bit."""
    table = random_table(rng, 3000, 37, dtype)
    with _store(tmp_path, table, engine=engine) as store:
        ids = np.concatenate([rng.integers(0, 3000, 700), [0, 2999, 5, 5]])
        got = store._read_zero_copy(store._plan(ids), len(ids), None, torch.device("cpu"))
        assert got.dtype == dtype and got.shape == (len(ids), 37) and bits(got).equal(bits(table[ids]))
        out = torch.empty(len(ids), 37, dtype=dtype)
        assert store._read_zero_copy(store._plan(ids), len(ids), out, torch.device("cpu")) is out
        assert bits(out).equal(bits(table[ids]))
        s = store.stats()
        assert s["zero_copy_batches"] == 2 and s["rows"] == 2 * len(ids) and s["reads"] > 0


def test_the_zero_copy_path_steps_aside_where_it_cannot_serve(tmp_path, rng, engine):
    table = random_table(rng, 3000, 100, torch.float32)
    with _store(tmp_path, table, engine=engine, staging_bytes=4096) as store:  # a batch needs several rounds
        ids = np.arange(0, 3000, 7)
        assert store._read_zero_copy(store._plan(ids), len(ids), None, torch.device("cpu")) is None
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"x" * 3 + table.numpy().tobytes())  # rows start 3 bytes in: not float-aligned
    with DiskStore(raw, dtype=torch.float32, shape=(3000, 100), offset=3, engine=engine) as store:
        assert store._read_zero_copy(store._plan(np.array([4, 1])), 2, None, torch.device("cpu")) is None
        assert torch.equal(store.read([4, 1]), table[[4, 1]])


def test_complex_rows_are_read_to_any_device_by_the_copy_path(tmp_path, rng, engine):
    table = torch.randn(500, 7, dtype=torch.complex128)
    np.save(tmp_path / "c.npy", table.numpy())  # the writer refuses complex rows; DiskStore opens any .npy
    with DiskStore(tmp_path / "c.npy", engine=engine) as store:
        ids = np.array([3, 499, 3, 0])
        # the tiered gather takes 1-8-byte elements
        assert store._read_zero_copy(store._plan(ids), len(ids), None, torch.device("cpu")) is None
        assert torch.equal(store.read(ids), table[ids])


@pytest.mark.skipif(not disk_uring.uring_available(), reason="io_uring is not usable here")
def test_the_io_uring_read_loop_is_compiled_once_and_cached_not_in_every_process(tmp_path, rng):
    # liburing's functions are external symbols, not ctypes pointers baked into the code: Numba can keep
    # the compiled loop on disk (it compiled for 0.8 s in each process's first read before)
    assert type(disk_uring._uring_run._cache).__name__ != "NullCache"
    table = random_table(rng, 64, 8, torch.float32)
    path = write_disk_store(table.numpy(), tmp_path / "t.npy", progress=False)
    script = ("import sys, time, torch; from directload.stores import DiskStore, disk_uring\n"
              "s = DiskStore(sys.argv[1], engine='io_uring'); s.read(torch.tensor([3]))\n"
              "print(disk_uring._uring_run.stats.cache_hits and 'hit' or 'compiled')")
    runs = [subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert runs[1].stdout.split()[-1] == "hit"  # the second process loads what the first one (or any) saved


def test_a_liburing_whose_symbols_resolve_elsewhere_falls_back_to_pread(tmp_path, rng, monkeypatch):
    # the compiled read loop finds liburing's functions by name; if another liburing loaded first would
    # answer, the loop would drive a ring it did not set up: io_uring is then not used at all
    from llvmlite import binding

    table = random_table(rng, 50, 8, torch.float32)
    path = write_disk_store(table.numpy(), tmp_path / "t.npy", progress=False)
    monkeypatch.setattr(disk_uring, "_URING", None)
    monkeypatch.setattr(binding, "address_of_symbol", lambda name: 1)
    assert disk_uring._uring() == {} and not disk_uring.uring_available() and io_path() == "pread"
    with DiskStore(path) as store:
        assert store.engine_name == "pread" and torch.equal(store.read([3, 9]), table[[3, 9]])
    monkeypatch.setattr(disk_uring, "_URING", None)  # the next _uring() probes afresh

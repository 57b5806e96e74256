"""Host memory: the pinned pool, chunked registration, pin failures and resident memory over time.

The CUDA driver is absent here, so these tests drive the real pool and
registration code through ``MallocRuntime``: real memory from libc, and
registration calls that are recorded and can be made to fail like the driver's.
"""

import ctypes
import gc
import os

import psutil
import pytest
import torch

import directload
from directload import memory

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


class DriverError(RuntimeError):
    pass


class MallocRuntime(memory.HostRuntime):
    def __init__(self, fail_alloc=False, register_cap=None):
        self.calls = []
        self.fail_alloc = fail_alloc
        self.register_cap = register_cap
        self.registered = set()

    def host_alloc(self, nbytes):
        self.calls.append(("alloc", nbytes))
        if self.fail_alloc:
            raise DriverError("cudaErrorMemoryAllocation: out of memory")
        return _libc.malloc(nbytes)

    def free_host(self, ptr):
        self.calls.append(("free", ptr))
        _libc.free(ptr)

    def host_register(self, ptr, nbytes, read_only):
        self.calls.append(("register", nbytes, read_only))
        if self.register_cap is not None and len(self.registered) >= self.register_cap:
            raise DriverError("cudaErrorHostMemoryAlreadyRegistered")
        self.registered.add(ptr)

    def host_unregister(self, ptr):
        self.calls.append(("unregister", ptr))
        self.registered.remove(ptr)


def test_pool_reuses_blocks_and_cuts_driver_calls():
    rt = MallocRuntime()
    with memory.use_runtime(rt) as pool:
        for _ in range(100):
            x = directload.empty((1000, 25))  # 100 KB -> one 128 KiB block
            assert x.memory_kind == "pinned-mapped"
            x.close()
        assert [c[0] for c in rt.calls] == ["alloc"]
        assert pool.stats["reused"] == 99 and pool.cached_bytes() == 128 * 1024
    assert [c[0] for c in rt.calls] == ["alloc", "free"]  # the cache is emptied on exit


def test_pool_block_sizes():
    assert memory.PinnedPool.block_size(1) == 64 * 1024
    assert memory.PinnedPool.block_size(64 * 1024 + 1) == 128 * 1024
    assert memory.PinnedPool.block_size(3 << 20) == 4 << 20


def test_registration_is_chunked_and_undone_once():
    rt = MallocRuntime()
    with memory.use_runtime(rt):
        data = torch.zeros(10 * 1024 + 5, dtype=torch.uint8)
        alloc = memory.register(data.data_ptr(), data.numel(), data, rt, chunk=4096)
        assert [c[1] for c in rt.calls] == [4096, 4096, 2053]
        assert len(rt.registered) == 3
        alloc.release()
        alloc.release()
        assert rt.registered == set() and [c[0] for c in rt.calls].count("unregister") == 3


def test_failed_registration_rolls_back_and_explains():
    rt = MallocRuntime(register_cap=2)
    data = torch.zeros(5 * 4096, dtype=torch.uint8)
    with pytest.raises(directload.PinError, match=r"cudaHostRegister failed at byte 8192 .*ulimit -l.*pin='auto'"):
        memory.register(data.data_ptr(), data.numel(), data, rt, chunk=4096)
    assert rt.registered == set()  # the two chunks that succeeded were unregistered


def test_failed_pin_names_cause_and_fallback_works():
    rt = MallocRuntime(fail_alloc=True)
    with memory.use_runtime(rt):
        with pytest.raises(directload.PinError, match="cudaHostAlloc failed .*out of memory.*locked-memory limit"):
            directload.zeros(100)
        x = directload.zeros(100, pin="auto")
        assert x.memory_kind == "host" and x.sum().item() == 0
    rt = MallocRuntime(register_cap=0)
    with memory.use_runtime(rt):
        with pytest.raises(directload.PinError):
            directload.to_unified(torch.zeros(10))
        assert directload.to_unified(torch.zeros(10), pin="auto").memory_kind == "host"


def test_without_cuda_memory_is_plain_host_memory():
    with memory.use_runtime(None):
        x = directload.ones(10)
        assert x.memory_kind == "host"
        assert directload.to_unified(torch.ones(3)).memory_kind == "host"


def _rss():
    return psutil.Process(os.getpid()).memory_info().rss


@pytest.mark.parametrize("through_pool", [False, True], ids=["host", "pool"])
def test_resident_memory_flat_over_10000_create_free_cycles(through_pool):
    rt = MallocRuntime() if through_pool else None
    with memory.use_runtime(rt):
        def cycle():
            x = directload.empty((256, 1024), dtype=torch.float32)  # 1 MiB
            x.host[0, 0] = 1.0
            x.close()

        for _ in range(200):  # warm up allocator caches
            cycle()
        gc.collect()
        before = _rss()
        for _ in range(10_000):
            cycle()
        gc.collect()
        growth = _rss() - before
    print(f"RSS growth over 10,000 cycles ({'pool' if through_pool else 'host'}): {growth / 2**20:.2f} MiB")
    assert growth < 8 << 20


@pytest.mark.parametrize("bad", ["yes", None, 1, "REQUIRE", "", 0.0])
def test_pin_is_one_closed_set(bad, tmp_path):
    import numpy as np

    np.save(tmp_path / "t.npy", np.zeros((2, 2), np.float32))
    for make in (lambda: directload.empty(4, pin=bad), lambda: directload.zeros(4, pin=bad),
                 lambda: directload.ones(4, pin=bad), lambda: directload.to_unified(torch.zeros(4), pin=bad),
                 lambda: directload.from_file(tmp_path / "t.npy", pin=bad), lambda: memory.allocate(8, pin=bad)):
        with pytest.raises(ValueError, match="pin must be one of"):
            make()


def test_pin_values_mean_what_they_say():
    assert [memory.resolve_pin(p) for p in ("require", "auto", "never", True, False)] == [
        "require", "auto", "never", "require", "never"]
    rt = MallocRuntime()
    with memory.use_runtime(rt):
        assert directload.zeros(10, pin=False).memory_kind == "host"  # never pins, even with CUDA
        assert directload.to_unified(torch.zeros(10), pin=False).memory_kind == "host"
        assert rt.calls == []
        assert directload.zeros(10, pin=True).memory_kind == "pinned-mapped"
    with memory.use_runtime(MallocRuntime(fail_alloc=True)):
        with pytest.raises(directload.PinError):  # True requires pinning: no quiet fallback
            directload.zeros(10, pin=True)
    with memory.use_runtime(MallocRuntime(register_cap=0)):
        with pytest.raises(directload.PinError):
            directload.to_unified(torch.zeros(10), pin=True)

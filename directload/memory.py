"""Host memory for unified tensors: pooled pinned allocations, chunked registration, plain fallback."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from directload.capabilities import capabilities
from directload.errors import DirectloadError
from directload.kernels.host_bytes import host_view, nbytes_of

__all__ = [
    "PinError",
    "Allocation",
    "HostRuntime",
    "CupyRuntime",
    "NumbaMappedRuntime",
    "PinnedPool",
    "runtime",
    "use_runtime",
    "pool",
    "allocate",
    "register",
    "release_pages",
    "REGISTER_CHUNK",
    "host_array",
    "host_view",
    "nbytes_of",
    "PIN_MODES",
    "resolve_pin",
]

# cudaHostAlloc / cudaHostRegister flags (CUDA Runtime API, "Memory Management").
HOST_ALLOC_PORTABLE = 1
HOST_ALLOC_MAPPED = 2
HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_MAPPED = 2
HOST_REGISTER_READ_ONLY = 8

#: Bytes per cudaHostRegister call.  Drivers cap one registration (seen at 4 GiB
#: on some systems), so large tables register in chunks; with unified virtual
#: addressing each chunk's device pointer is its host pointer, so the chunks
#: form one contiguous device range.
REGISTER_CHUNK = 1 << 30


#: What ``pin=`` may say: pinned or an error, pinned where possible, never pinned.
PIN_MODES = ("require", "auto", "never")


def resolve_pin(pin: str | bool) -> str:
    """The pin mode ``pin`` names: one of :data:`PIN_MODES`.  Pure.

    ``True`` means ``"require"`` and ``False`` means ``"never"``; anything else
    raises, so a typo never silently changes what memory a table gets.

    Examples
    --------
    >>> resolve_pin("auto"), resolve_pin(True), resolve_pin(False)
    ('auto', 'require', 'never')
    """
    if pin is True:
        return "require"
    if pin is False:
        return "never"
    if isinstance(pin, str) and pin in PIN_MODES:
        return pin
    raise ValueError(f"pin must be one of {PIN_MODES} (or True for 'require', False for 'never'), got {pin!r}")


class PinError(DirectloadError, RuntimeError):
    """Host memory could not be pinned or registered; the message says why and how to fix it.

    Examples
    --------
    >>> issubclass(PinError, RuntimeError)
    True
    """


def _limits_hint(nbytes):
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def fmt(v):
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v / 2**20:.0f} MiB"

    shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    shm_txt = f"{shm.free / 2**30:.1f} GiB free in /dev/shm" if shm else "no /dev/shm"
    return (f"asked for {nbytes / 2**20:.1f} MiB; locked-memory limit (ulimit -l) is {fmt(soft)} soft / "
            f"{fmt(hard)} hard; {shm_txt}.  Raise the limit (ulimit -l unlimited, or --ulimit memlock=-1 for "
            "a container, --shm-size for /dev/shm), use a smaller table, or pass pin='auto' to fall back "
            "to unpinned memory")


class HostRuntime:
    """The CUDA runtime calls unified memory needs.  Subclasses bind a real runtime.

    Examples
    --------
    >>> isinstance(HostRuntime(), HostRuntime)
    True
    """

    def host_alloc(self, nbytes: int) -> int:
        """Pinned, mapped, portable host memory; returns a pointer."""
        raise NotImplementedError

    def free_host(self, ptr: int) -> None:
        raise NotImplementedError

    def host_register(self, ptr: int, nbytes: int, read_only: bool) -> None:
        raise NotImplementedError

    def host_unregister(self, ptr: int) -> None:
        raise NotImplementedError


class CupyRuntime(HostRuntime):
    """``HostRuntime`` over ``cupy.cuda.runtime`` (needs a CUDA driver).

    Examples
    --------
    >>> issubclass(CupyRuntime, HostRuntime)
    True
    """

    def __init__(self):
        from cupy.cuda import runtime as rt

        self._rt = rt

    def host_alloc(self, nbytes: int) -> int:
        return self._rt.hostAlloc(nbytes, HOST_ALLOC_MAPPED | HOST_ALLOC_PORTABLE)

    def free_host(self, ptr: int) -> None:
        self._rt.freeHost(ptr)

    def host_register(self, ptr: int, nbytes: int, read_only: bool) -> None:
        flags = HOST_REGISTER_MAPPED | HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
        self._rt.hostRegister(ptr, nbytes, flags)

    def host_unregister(self, ptr: int) -> None:
        self._rt.hostUnregister(ptr)


class NumbaMappedRuntime(HostRuntime):
    """``HostRuntime`` over ``numba.cuda.mapped_array``: mapped, pinned blocks from Numba.

    Works with a real driver and under the Numba CUDA simulator, which is how
    the simulator lane exercises the mapped path.  Registration of existing
    memory is not offered (it needs CuPy's runtime).

    Examples
    --------
    >>> issubclass(NumbaMappedRuntime, HostRuntime)
    True
    """

    def __init__(self):
        self._blocks = {}

    def host_alloc(self, nbytes: int) -> int:
        from numba import cuda  # CUDA only: numba.cuda and its kernels load on first use

        from directload.kernels.numba_cuda import array_address

        arr = cuda.mapped_array(nbytes, dtype=np.uint8)
        ptr = array_address(arr)
        self._blocks[ptr] = arr
        return ptr

    def free_host(self, ptr: int) -> None:
        del self._blocks[ptr]

    def mapped_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """The device-visible mapped array over ``[ptr, ptr+nbytes)`` of one block."""
        for base, arr in self._blocks.items():
            if base <= ptr and ptr + nbytes <= base + arr.shape[0]:
                return arr[ptr - base:ptr - base + nbytes]
        raise ValueError(f"{ptr:#x} (+{nbytes}) is not inside a block of this runtime")

    def host_register(self, ptr: int, nbytes: int, read_only: bool) -> None:
        raise NotImplementedError("registering existing memory needs CuPy's CUDA runtime")

    def host_unregister(self, ptr: int) -> None:
        raise NotImplementedError("registering existing memory needs CuPy's CUDA runtime")


@dataclass(eq=False)
class Allocation:
    """One block of host memory behind a unified tensor, freed exactly once.

    Attributes
    ----------
    ptr : int
        Host address; with CUDA it is also the device address (UVA).
    nbytes : int
    kind : str
        ``"pinned-mapped"`` (cudaHostAlloc), ``"registered"`` (cudaHostRegister
        of memory someone else owns) or ``"host"`` (ordinary memory, no CUDA).
    owner : object
        What keeps the bytes themselves alive (a pool block, array or mmap).

    Examples
    --------
    >>> a = allocate(100, pin="never")
    >>> isinstance(a, Allocation), a.nbytes >= 100, host_array(a).nbytes >= 100
    (True, True, True)
    """

    ptr: int
    nbytes: int
    kind: str
    owner: object = None
    _release: object = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        # The finalizer runs once, at release() or when the last reference goes.
        self._finalizer = weakref.finalize(self, _run_release, self._release)

    def release(self) -> None:
        """Free or unregister now (idempotent).  Views must be gone first."""
        with self._lock:
            if not self._released:
                self._released = True
                self._finalizer()

    @property
    def released(self) -> bool:
        """Whether the memory has been freed or unregistered."""
        return not self._finalizer.alive


def _run_release(fn):
    if fn is not None:
        fn()


class PinnedPool:
    """A caching allocator for pinned host blocks, as PyTorch-Direct adapted PyTorch's.

    Sizes round up to a power of two (at least 64 KiB); freed blocks wait in a
    per-size free list for the next request, so steady-state create/free cycles
    make no CUDA calls.  ``empty_cache()`` returns cached blocks to the driver.

    Examples
    --------
    >>> PinnedPool.block_size(5000) >= 5000
    True
    """

    MIN_BLOCK = 64 * 1024

    def __init__(self, rt: HostRuntime) -> None:
        self._rt = rt
        self._free: dict[int, list[int]] = {}  # block size: pointers
        self._lock = threading.Lock()
        self.stats = {"host_alloc": 0, "free_host": 0, "reused": 0}

    @classmethod
    def block_size(cls, nbytes: int) -> int:
        return max(cls.MIN_BLOCK, 1 << max(0, int(nbytes - 1).bit_length()))

    def allocate(self, nbytes: int) -> Allocation:
        size = self.block_size(nbytes)
        with self._lock:
            blocks = self._free.get(size)
            ptr = blocks.pop() if blocks else None
            if ptr is not None:
                self.stats["reused"] += 1
        if ptr is None:
            ptr = self._host_alloc(size)
        return Allocation(ptr, nbytes, "pinned-mapped", _release=lambda: self._give_back(size, ptr))

    def _host_alloc(self, size):
        try:
            ptr = self._rt.host_alloc(size)
        except Exception as exc:  # the runtime's own error type; re-raised with the cause attached
            self.empty_cache()
            try:
                ptr = self._rt.host_alloc(size)
            except Exception:
                raise PinError(f"cudaHostAlloc failed ({exc}): {_limits_hint(size)}") from exc
        self.stats["host_alloc"] += 1
        return ptr

    def _give_back(self, size, ptr):
        with self._lock:
            self._free.setdefault(size, []).append(ptr)

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(size * len(v) for size, v in self._free.items())

    def empty_cache(self) -> None:
        """Return every cached block to the driver."""
        with self._lock:
            blocks, self._free = self._free, {}
        for ptrs in blocks.values():
            for ptr in ptrs:
                self._rt.free_host(ptr)
                self.stats["free_host"] += 1


def register(ptr: int, nbytes: int, owner: object, rt: HostRuntime, *, read_only: bool = False,
             chunk: int = REGISTER_CHUNK) -> Allocation:
    """Register existing memory (``[ptr, ptr+nbytes)``) with CUDA, in chunks.

    Returns
    -------
    Allocation
        Kind ``"registered"``; releasing it unregisters every chunk.

    Raises
    ------
    PinError
        A chunk failed; the chunks already registered are unregistered first.
    """
    done: list[int] = []

    def unregister():
        for p in done:
            rt.host_unregister(p)

    try:
        for start in range(0, nbytes, chunk):
            rt.host_register(ptr + start, min(chunk, nbytes - start), read_only)
            done.append(ptr + start)
    except Exception as exc:  # the runtime's own error type; re-raised with the cause attached
        unregister()
        raise PinError(f"cudaHostRegister failed at byte {len(done) * chunk} of {nbytes} ({exc}): "
                       f"{_limits_hint(nbytes)}") from exc
    return Allocation(ptr, nbytes, "registered", owner=owner, _release=unregister)


_state: dict[str, Any] = {}  # "runtime": HostRuntime or None, "pool": PinnedPool or None
_state_lock = threading.Lock()


def runtime() -> HostRuntime | None:
    """The process's ``HostRuntime``: CuPy's where CUDA is usable (else Numba's), ``None`` without CUDA."""
    with _state_lock:
        if "runtime" not in _state:
            caps = capabilities()
            if not caps.cuda:
                _state["runtime"] = None
            elif caps.cupy:
                _state["runtime"] = CupyRuntime()
            else:  # new tables still get mapped memory; registering existing memory needs CuPy
                _state["runtime"] = NumbaMappedRuntime() if caps.numba_cuda else None
        return _state["runtime"]


@contextlib.contextmanager
def use_runtime(rt: HostRuntime | None) -> Iterator[PinnedPool | None]:
    """Use ``rt`` (a :class:`HostRuntime`, or ``None`` for no CUDA) and a fresh pool inside the block.

    For runtimes other than the process's CUDA one, such as the Numba CUDA
    simulator's mapped arrays in the simulator test lane.  The previous runtime
    and pool come back on exit; blocks cached by the temporary pool are freed.
    """
    with _state_lock:
        saved = dict(_state)
        _state["runtime"] = rt
        _state["pool"] = PinnedPool(rt) if rt is not None else None
    try:
        yield _state["pool"]
    finally:
        with _state_lock:
            temp = _state.get("pool")
            _state.clear()
            _state.update(saved)
        if temp is not None:
            temp.empty_cache()


def pool() -> PinnedPool | None:
    """The process's ``PinnedPool`` (``None`` without CUDA)."""
    rt = runtime()
    with _state_lock:
        if "pool" not in _state:
            _state["pool"] = PinnedPool(rt) if rt is not None else None
        return _state["pool"]


def host_array(alloc: Allocation, writable: bool = True) -> np.ndarray:
    """A uint8 numpy array over an allocation's bytes; it keeps the allocation alive."""
    return host_view(alloc.ptr, alloc.nbytes, alloc, writable)


def allocate(nbytes: int, *, pin: str | bool = "require", shared: bool = False) -> Allocation:
    """Fresh host memory for a unified tensor.

    Parameters
    ----------
    nbytes : int
    pin : {"require", "auto", "never"} or bool
        With CUDA, ``"require"`` (or ``True``) raises :class:`PinError` when
        pinning fails, ``"auto"`` falls back to ordinary memory and ``"never"``
        (or ``False``) does not pin; without CUDA every mode gives ordinary
        memory (there is nothing to pin for).  See :func:`resolve_pin`.
    shared : bool
        Shared memory (``/dev/shm``), so ``torch.multiprocessing`` workers map
        the same pages; registered with CUDA where CUDA is usable.

    Returns
    -------
    Allocation
    """
    import torch

    pin = resolve_pin(pin)
    rt = runtime() if pin != "never" else None
    if shared:
        t = torch.empty(max(nbytes, 1), dtype=torch.uint8).share_memory_()
        if rt is not None:
            try:
                return register(t.data_ptr(), max(nbytes, 1), t, rt)
            except PinError:
                if pin == "require":
                    raise
        return Allocation(t.data_ptr(), nbytes, "host", owner=t)
    if rt is not None:
        try:
            return pool().allocate(max(nbytes, 1))  # type: ignore[union-attr]  # a runtime has a pool
        except PinError:
            if pin == "require":
                raise
    buf = np.empty(max(nbytes, 1), np.uint8)
    return Allocation(buf.ctypes.data, nbytes, "host", owner=buf)



_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_DONTNEED = 4


def release_pages(allocation: Allocation, start: int, stop: int) -> int:
    """Give the whole pages inside bytes ``[start, stop)`` of ``allocation`` back to the system; they read as
    zeros, and cost a page fault, when next written.  Only ordinary private host memory (kind ``"host"``,
    not shared) is given back: pinned, registered and shared memory keep their pages.  Returns the bytes
    given back.

    Examples
    --------
    >>> a = allocate(1 << 20, pin="never")
    >>> host_array(a)[:] = 1
    >>> given = release_pages(a, 0, 1 << 20)    # the whole pages inside: all but the two ends at most
    >>> given >= (1 << 20) - 2 * 4096, int(host_array(a)[8192:12288].sum())
    (True, 0)
    """
    import ctypes

    if allocation.kind != "host" or not isinstance(allocation.owner, np.ndarray) or allocation.released:
        return 0
    start, stop = max(0, int(start)), min(int(stop), allocation.nbytes)
    lo = -(-(allocation.ptr + start) // _PAGE) * _PAGE
    hi = (allocation.ptr + stop) // _PAGE * _PAGE
    if hi <= lo:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), f"madvise(MADV_DONTNEED) of {hi - lo} bytes failed")
    return hi - lo

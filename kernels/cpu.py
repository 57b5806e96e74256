"""CPU backend: naive and aligned row gathers compiled by Numba, run on all cores.

Two ways to run them in parallel, the same row code in both:

``team="torch"`` (the default where it exists)
    A Numba ``cfunc`` started with ``GOMP_parallel`` of torch's own OpenMP
    runtime, so gathers and torch's ops share one team of threads.  Numba's
    ``parallel=True`` brings a second OpenMP runtime with a team of its own;
    on 2 cores the two teams' idle-spinning threads took the cores from each
    other at every switch between a gather and a torch op (+20-40 us on a 2 MB
    gather, measured side by side).  Thread count: ``torch.get_num_threads()``.
``team="numba"``
    ``njit(parallel=True)`` kernels on Numba's threading layer.  The fallback
    where torch's OpenMP runtime is not found (a torch without OpenMP, or not
    Linux).  Thread count: ``numba.get_num_threads()``.

:func:`set_team` or ``$DIRECTLOAD_CPU_TEAM`` picks one.

Every kernel checks the whole index before it writes: one call checks and
copies, and an index out of range leaves the output untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import struct
import threading
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import TYPE_CHECKING

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import carray, cfunc, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import forks
from .carriers import CARRIERS, ELEMENT_SIZES
from .indexing import naive_element
from .operands import check_launch, check_readable

if TYPE_CHECKING:
    from numba.core.typing.templates import Signature

__all__ = ["launch", "first_invalid", "prefetch", "set_num_threads", "get_num_threads", "set_team", "team",
           "wait_policy", "LIBGOMP_SPINS", "prepare", "ready", "note_fallback", "LOAD_AFTER_S",
           "SERIAL_BYTES", "PREFETCH_ROWS", "PREFETCH_LINES", "MEMCPY_BYTES"]

_naive = njit(inline="always")(naive_element)

#: The aligned kernel prefetches the row this many rows ahead of the one it copies...
PREFETCH_ROWS = 8
#: ...up to this many 64-byte cache lines of it (the hardware prefetcher follows longer rows).
PREFETCH_LINES = 16
#: Rows of this many bytes and more are copied by libc's memcpy, shorter ones by a vector loop
#: (each the faster side of the line, measured: +25% loop at 256 B, +6-10% memcpy from 1 KiB).
MEMCPY_BYTES = 1024
#: Output bytes below which the serial kernel runs: starting a team costs more than the copy.
SERIAL_BYTES = 256 * 1024


# ---------------------------------------------------------------- LLVM helpers

@intrinsic
def prefetch(typingctx: object, table: types.Array, row: types.Integer,
             offset: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """``llvm.prefetch`` (read, keep in all levels) of byte ``offset`` of ``table[row]``."""
    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        row, offset = (context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:]))
        first = cgutils.get_item_pointer(context, builder, aty, ary, [row, zero], wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        addr = builder.gep(builder.bitcast(first, byte_ptr), [offset])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), "llvm.prefetch.p0i8")
        builder.call(fn, [addr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(table, row, offset), codegen


@intrinsic
def _copy_row(typingctx, out, i, table, row, nbytes):
    """``memcpy(&out[i, 0], &table[row, 0], nbytes)``: libc's copy, tuned for long runs."""
    def codegen(context, builder, signature, args):
        zero = context.get_constant(types.intp, 0)
        ends = []
        for array, at in ((0, 1), (2, 3)):
            aty = signature.args[array]
            ary = context.make_array(aty)(context, builder, args[array])
            pos = context.cast(builder, args[at], signature.args[at], types.intp)
            ends.append(cgutils.get_item_pointer(context, builder, aty, ary, [pos, zero], wraparound=False))
        count = context.cast(builder, args[4], signature.args[4], types.intp)
        cgutils.raw_memcpy(builder, ends[0], ends[1], count, 1)
        return context.get_dummy_value()

    return types.void(out, i, table, row, nbytes), codegen


@intrinsic
def _pointer(typingctx, address):
    """An integer address as a ``void*`` (for ``numba.carray``)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@intrinsic
def _call_int(typingctx, address):
    """Call the C function ``int f(void)`` at ``address``."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        value = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return builder.sext(value, ir.IntType(64))

    return types.int64(address), codegen


@intrinsic
def _call_void(typingctx, address):
    """Call the C function ``void f(void)`` at ``address``."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()

    return types.void(address), codegen


# ---------------------------------------------------------------- the row code, shared by every launch

@njit(nogil=True, cache=True)
def first_invalid(idx: np.ndarray, n_rows: int) -> int:
    """Position of the first index outside ``[0, n_rows)``, or -1 when all are valid."""
    for i in range(idx.shape[0]):
        v = idx[i]
        if v < 0 or v >= n_rows:
            return i
    return -1


@njit(inline="always")
def _aligned_rows(src, idx, out, lo, hi):
    # The aligned mapping's partition of work: whole rows per worker, as one warp
    # per row on the GPU.  The circular order inside a row only serves the GPU's
    # 128-byte coalescing; a CPU core copies the row as one contiguous run, which
    # the compiler vectorises (computing the GPU plan per row cost 30% at 256 B).
    # Random rows make the copy latency-bound, so each worker prefetches the row
    # PREFETCH_ROWS ahead (+5-30% at 256 B-4 KiB rows, measured side by side).
    row_elems = src.shape[1]
    row_bytes = row_elems * src.itemsize
    lines = min((row_bytes + 63) // 64, PREFETCH_LINES)
    for i in range(lo, hi):
        ahead = i + PREFETCH_ROWS
        if ahead < hi:
            far = idx[ahead]
            for line in range(lines):
                prefetch(src, far, line * 64)
        row = idx[i]
        if row_bytes >= MEMCPY_BYTES:
            _copy_row(out, i, src, row, row_bytes)
        else:
            for c in range(row_elems):
                out[i, c] = src[row, c]


@njit(inline="always")
def _naive_elements(src, idx, out, lo, hi):
    # The naive mapping: one work item per output element (PyTorch's own index kernel).
    row_elems = src.shape[1]
    for i in range(lo, hi):
        r, c = _naive(i, row_elems)
        out[r, c] = src[idx[r], c]


@njit(inline="always")
def _share(units, part, parts):
    """``[lo, hi)`` of ``part`` out of ``parts`` equal shares of ``units``."""
    return units * part // parts, units * (part + 1) // parts


# ---------------------------------------------------------------- serial and Numba-team kernels
# ``parts`` equal shares run on Numba's threads (one part: serial), so a worker
# prefetches within its own run of rows, as on the torch team.

def _aligned_kernel(src, idx, out, parts):
    bad = first_invalid(idx, src.shape[0])
    if bad >= 0:
        return bad
    for p in prange(parts):
        lo, hi = _share(idx.shape[0], p, parts)
        _aligned_rows(src, idx, out, lo, hi)
    return -1


def _naive_kernel(src, idx, out, parts):
    bad = first_invalid(idx, src.shape[0])
    if bad >= 0:
        return bad
    units = idx.shape[0] * src.shape[1]
    for p in prange(parts):
        lo, hi = _share(units, p, parts)
        _naive_elements(src, idx, out, lo, hi)
    return -1


def _specialise(body, name, **constants):
    """A copy of ``body`` under its own name, with module constants overridden.

    Numba's on-disk cache is keyed by qualified name, so every variant needs its own.
    """
    fn = FunctionType(body.__code__, dict(body.__globals__, **constants), body.__name__)
    fn.__qualname__ = f"{body.__qualname__}_{name}"
    return fn


_KERNELS = {
    (aligned, parallel): njit(parallel=parallel, nogil=True, cache=True, boundscheck=False)(
        _specialise(body, "parallel" if parallel else "serial"))
    for aligned, body in ((True, _aligned_kernel), (False, _naive_kernel))
    for parallel in (True, False)
}


# ---------------------------------------------------------------- torch-team kernels

# Compile-time constants of the team body; _team_kernel overrides them per specialisation.
ALIGNED, CARRIER, INDEX = True, np.int32, np.int64
# The argument block of one team launch (int64 slots): the launch, the result, the
# runtime's functions, then a flag per thread.
_SRC, _ROWS, _ROW_ELEMS, _IDX, _N, _OUT, _RESULT, _TID, _NTHREADS, _BARRIER, _FLAGS = range(11)
_LAUNCH = struct.Struct("<6q")  # _SRC.._OUT, written in one call


def _team_body(data):
    a = carray(_pointer(data), _FLAGS, np.int64)
    src = carray(_pointer(a[_SRC]), (a[_ROWS], a[_ROW_ELEMS]), CARRIER)
    idx = carray(_pointer(a[_IDX]), a[_N], INDEX)
    out = carray(_pointer(a[_OUT]), (a[_N], a[_ROW_ELEMS]), CARRIER)
    part = _call_int(a[_TID])
    parts = _call_int(a[_NTHREADS])
    flags = carray(_pointer(data + 8 * _FLAGS), parts, np.int64)
    lo, hi = _share(a[_N], part, parts)
    bad = first_invalid(idx[lo:hi], a[_ROWS])
    flags[part] = lo + bad if bad >= 0 else -1
    _call_void(a[_BARRIER])  # every part checked before any part writes
    first = -1
    for p in range(parts):  # parts cover the index in order: the first flagged one holds the first bad index
        if flags[p] >= 0:
            first = flags[p]
            break
    if part == 0:
        a[_RESULT] = first
    if first >= 0:
        return
    if ALIGNED:
        _aligned_rows(src, idx, out, lo, hi)
    else:
        lo, hi = _share(a[_N] * a[_ROW_ELEMS], part, parts)
        _naive_elements(src, idx, out, lo, hi)


_NP_CARRIER = {size: np.dtype(CARRIERS[size].numpy).type for size in ELEMENT_SIZES}
_NP_INDEX = {4: np.int32, 8: np.int64}


@functools.cache
def _team_kernel(aligned, carrier_size, index_size):
    """The compiled team body's address, one per mapping, element size and index size."""
    name = f"{'aligned' if aligned else 'naive'}_e{carrier_size}_i{index_size}"
    fn = _specialise(_team_body, name, ALIGNED=aligned, CARRIER=_NP_CARRIER[carrier_size],
                     INDEX=_NP_INDEX[index_size])
    return cfunc(types.void(types.intp), nopython=True, nogil=True, cache=True, boundscheck=False)(fn).address


class _TorchOpenMP:
    """Torch's OpenMP runtime: ``GOMP_parallel`` and the calls a team body makes."""

    def __init__(self, lib):
        self.parallel = lib.GOMP_parallel
        self.parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self.parallel.restype = None
        self.functions = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                          for n in ("omp_get_thread_num", "omp_get_num_threads", "GOMP_barrier")]
        self.blocks = threading.local()

    def block(self, threads):
        """This thread's argument block (a ctypes int64 array), with room for ``threads`` flags."""
        block = getattr(self.blocks, "block", None)
        if block is None or len(block) < _FLAGS + threads:
            block = (ctypes.c_int64 * (_FLAGS + max(threads, 64)))()
            block[_TID:_FLAGS] = self.functions
            self.blocks.block = block
            self.blocks.address = ctypes.addressof(block)
        return block, self.blocks.address


@functools.cache
def _torch_openmp():
    """Torch's loaded OpenMP runtime, or None (then the Numba team runs the kernels)."""
    if not forks.TORCH_ON_OPENMP:
        return None
    try:
        with open("/proc/self/maps") as maps:
            loaded = set(re.findall(r"(/\S*lib(?:g|i)?omp\S*\.so\S*)", maps.read()))
    except OSError:
        return None
    torch_dir = os.path.dirname(torch.__file__)
    own = sorted(p for p in loaded if p.startswith(torch_dir))
    candidates = own or (sorted(loaded) if len(loaded) == 1 else [])  # a system libgomp shared with torch
    for path in candidates:
        try:
            return _TorchOpenMP(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    return None


_team: str | None = None




def set_team(name: str) -> None:
    """Run parallel CPU gathers on ``"torch"``'s OpenMP team (the default where it exists)
    or on ``"numba"``'s threading layer.  Raises ``RuntimeError`` for "torch" without one."""
    global _team
    if name not in ("torch", "numba"):
        raise ValueError(f"team must be 'torch' or 'numba', got {name!r}")
    if name == "torch" and _torch_openmp() is None:
        raise RuntimeError("torch's OpenMP runtime was not found in this process; use team 'numba'")
    _team = name


def team() -> str:
    """The team that runs parallel CPU gathers: ``"torch"`` or ``"numba"``.

    Until :func:`set_team` is called: ``$DIRECTLOAD_CPU_TEAM`` if set, else
    ``"torch"`` where torch's OpenMP runtime is found, else ``"numba"``.
    """
    if _team is None:
        choice = os.environ.get("DIRECTLOAD_CPU_TEAM", "")
        if choice:
            set_team(choice)
        else:
            set_team("torch" if _torch_openmp() is not None else "numba")
    return _team  # type: ignore[return-value]  # set_team() above has set it


def get_num_threads() -> int:
    """Threads a parallel CPU gather uses: torch's count on the torch team, else Numba's;
    1 in a forked child (see :mod:`directload.kernels.forks`)."""
    if forks.forked():
        return 1
    return torch.get_num_threads() if team() == "torch" else numba.get_num_threads()


#: Rounds libgomp spins before an idle thread sleeps, where neither ``$GOMP_SPINCOUNT`` nor ``$OMP_WAIT_POLICY``
#: says (about 3 ms by libgomp's own estimate).
LIBGOMP_SPINS = 300_000


def wait_policy() -> str:
    """How the idle threads of torch's OpenMP team (libgomp) wait between parallel regions, by the variables
    libgomp reads when it loads (setting them later changes nothing in this process): ``"passive"`` (they
    sleep at once, ``OMP_WAIT_POLICY=PASSIVE``), ``"active"`` (they spin), or ``"spin N"``: N rounds, then
    sleep (``GOMP_SPINCOUNT``, which wins over ``OMP_WAIT_POLICY``, or libgomp's default
    :data:`LIBGOMP_SPINS`).

    Spinning costs nothing on a quiet machine and a great deal on a busy one: beside two busy processes on
    2 cores, a GraphSAGE epoch took a median 3.1-3.6x its quiet time with either loader at libgomp's
    default (3 runs in 10 at about 6x, all their epochs), against 1.8-2.0x spinning 10,000 rounds or
    sleeping at once (``directload bench loader --hog 2``; the guide to the benchmarks has the tables).

    Examples
    --------
    >>> wait_policy() in ("passive", "active") or wait_policy().startswith("spin ")
    True
    """
    count = os.environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if count in ("infinite", "infinity"):
        return "active"
    scale = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}.get(count[-1:], 1)  # libgomp's suffixes
    digits = count[:-1].strip() if scale > 1 else count
    if digits.isdigit():
        spins = int(digits) * scale
        return "passive" if spins == 0 else f"spin {spins}"
    value = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    return value if value in ("passive", "active") else f"spin {LIBGOMP_SPINS}"


def set_num_threads(n: int) -> None:
    """Threads of Numba's team (the torch team follows ``torch.set_num_threads``)."""
    numba.set_num_threads(n)


# ---------------------------------------------------------------- readiness
# A process's first kernel load (from Numba's on-disk cache) first initialises Numba's CPU target: 0.73 s
# measured on 2 cores, most of it imports, which hold the GIL (a load on a thread of its own slowed the
# training loop beside it about as much).  The kernels gather 7-19% faster than torch's index_select
# (measured side by side, 20k-100k rows of 400-2408 bytes), so the load pays only after seconds of
# gathering.  kernels.api's gather therefore runs torch's index_select (the same bits, the same index
# check) until the kernel is loaded, and starts the load the ski-rental way: once gathers on
# index_select have taken LOAD_AFTER_S in this process, about what the load costs over what the kernel
# saves.  Short runs never pay the load; long runs pay it once.  prepare() loads at once.

#: Seconds of gathering on torch's index_select after which a process loads the kernel (see above).
LOAD_AFTER_S = 5.0
#: (team, aligned, carrier size, index size) of the kernels this process has loaded.
_loaded: set[tuple[str, bool, int, int]] = set()
_loading: dict[tuple[str, bool, int, int], threading.Thread] = {}  # the same keys -> the thread loading them
_ready_lock = threading.Lock()
_fallback_s = 0.0  # seconds gathered on index_select so far in this process


def note_fallback(seconds: float, aligned: bool, carrier_size: int, index_size: int) -> None:
    """A gather ran on torch's ``index_select`` for ``seconds`` because its kernel was not loaded: start
    the load once such gathers have taken :data:`LOAD_AFTER_S`."""
    global _fallback_s
    _fallback_s += seconds
    if _fallback_s >= LOAD_AFTER_S:
        prepare((carrier_size,), (index_size,), aligned=aligned)


def _ready_key(aligned, carrier_size, index_size):
    return team(), bool(aligned), int(carrier_size), int(index_size)


def ready(aligned: bool, carrier_size: int, index_size: int) -> bool:
    """Whether the kernel of a gather of ``carrier_size``-byte elements by ``index_size``-byte ids is loaded
    in this process (so a gather runs it at once, without a load)."""
    return _ready_key(aligned, carrier_size, index_size) in _loaded


def _load(key):
    """Load the kernel of ``key``; it is no longer under way afterwards, loaded or failed (a failed load is
    tried again by the next :func:`prepare`)."""
    team_name, aligned, carrier_size, index_size = key
    try:
        if team_name == "torch":
            _team_kernel(aligned, carrier_size, index_size)
        else:
            src = np.zeros((1, 1), _NP_CARRIER[carrier_size])
            idx = np.zeros(1, _NP_INDEX[index_size])
            for parallel in (False, True):
                _KERNELS[aligned, parallel](src, idx, np.zeros((1, 1), src.dtype), 1)
        with _ready_lock:
            _loaded.add(key)
    finally:
        with _ready_lock:
            _loading.pop(key, None)


def prepare(element_sizes: Sequence[int] = ELEMENT_SIZES, index_sizes: Sequence[int] = (8, 4), *, aligned: bool = True,
            background: bool = True) -> None:
    """Load the CPU gather kernels of these element and index sizes in this process (from Numba's on-disk
    cache; compiled once per machine): on a daemon thread of its own (``background``, the default: returns
    at once; gathers run torch's ``index_select`` until it is done), or now.  Idempotent; a load already
    under way is not started twice.  Long jobs and benchmarks call it up front; otherwise gathers start
    the load themselves once it pays (:data:`LOAD_AFTER_S`).

    Not in a forked child that inherited no loaded kernel: its gathers are serial, and torch's
    ``index_select`` does them without the load (each of a DataLoader's workers would pay it).
    """
    if forks.forked():
        return
    keys = [_ready_key(aligned, c, i) for c in element_sizes for i in index_sizes]
    with _ready_lock:
        todo = [k for k in keys if k not in _loaded and k not in _loading]
        if not todo:
            return
        if not background:
            for k in todo:
                _loading[k] = threading.current_thread()
    if not background:
        for k in todo:
            _load(k)
        return

    def run():
        for k in todo:
            with contextlib.suppress(Exception):  # a gather that needs the kernel loads it, and raises there
                _load(k)

    thread = threading.Thread(target=run, name="directload-kernel-load", daemon=True)
    with _ready_lock:
        for k in todo:
            _loading[k] = thread
    thread.start()


# ---------------------------------------------------------------- entry point

def launch(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, *, aligned: bool = True, stream: int = 0) -> int:
    """The backends' shared launch: ``out[i] = src[index[i]]``, after checking every index.

    ``cpu``, ``numba_cuda`` and ``cupy`` each export ``launch`` with this one
    signature, and :mod:`directload.kernels.api` calls whichever the gather's
    placement picked.  Its type hints name what all three take (torch
    tensors); this one takes numpy arrays too: ``src`` and ``out`` of one
    kind, both tensors or both arrays, and the index of either kind (as
    :func:`~directload.kernels.gather` takes it, without a copy).

    Parameters
    ----------
    src : torch.Tensor or numpy.ndarray
        ``[rows, row_elems]`` C-contiguous, a 1/2/4/8-byte integer bit-carrier dtype.
    index : torch.Tensor or numpy.ndarray
        1-D contiguous int32/int64 on the CPU.
    out : torch.Tensor or numpy.ndarray
        ``[len(index), row_elems]``, ``src``'s dtype; written in full, or not at
        all when an index is out of range.
    aligned : bool
        Whole rows per worker (the aligned kernels' partition), or one work item
        per output element (the naive kernels' flat mapping).
    stream : int
        Unused here: a CPU gather runs now, on the caller's thread and its team.

    Returns
    -------
    int
        -1, or the position of the first index outside ``[0, rows)`` (then
        nothing was written).

    Raises
    ------
    TypeError
        An operand is neither a torch tensor nor a numpy array, ``src`` and
        ``out`` are of different kinds, or the index is not int32/int64.
    ValueError
        Shapes, element sizes or layouts no kernel may write through
        (:func:`~directload.kernels.operands.check_launch`).

    Examples
    --------
    >>> import numpy as np
    >>> src = np.arange(6, dtype=np.uint32).reshape(3, 2)
    >>> out = np.empty((2, 2), np.uint32)
    >>> launch(src, np.array([2, 0]), out)
    -1
    >>> out.tolist()
    [[4, 5], [0, 1]]
    >>> launch(src, np.array([0, 3]), out)
    1
    >>> launch(src, torch.tensor([1]), out[:1])  # the index may be a tensor
    -1
    >>> launch(torch.zeros(3, 2, dtype=torch.int32), np.array([1]), out[:1])
    Traceback (most recent call last):
    ...
    TypeError: src and out must be of one kind, ... got src Tensor and out ndarray
    """
    _check_kinds(src, index, out)
    check_launch(src, index, out)
    for name, a in (("src", src), ("index", index), ("out", out)):
        if isinstance(a, torch.Tensor):
            check_readable(a, name, ("cpu",))  # a CPU kernel dereferences raw host pointers
    if type(out) is np.ndarray:
        return _launch_arrays(src, index, out, aligned)
    threads = get_num_threads() if out.numel() * out.element_size() >= SERIAL_BYTES else 1
    if team() != "torch":
        return _KERNELS[bool(aligned), threads > 1](src.numpy(), _numpy(index), out.numpy(), threads)
    if not (src.is_contiguous() and out.is_contiguous()):
        raise ValueError("the CPU kernel's tensors must be C-contiguous")
    index = torch.from_numpy(np.ascontiguousarray(index)) if type(index) is np.ndarray else index.contiguous()
    return _run_team(_team_kernel(bool(aligned), src.element_size(), index.element_size()), threads,
                     src.data_ptr(), src.shape[0], src.shape[1], index.data_ptr(), index.shape[0], out.data_ptr())


def _check_kinds(src, index, out):
    """``TypeError`` unless every operand is a tensor or an array, and ``src`` and ``out`` of one kind (the
    kernels take the raw pointers of one or the other)."""
    for name, a in (("src", src), ("index", index), ("out", out)):
        if not isinstance(a, (torch.Tensor, np.ndarray)):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if isinstance(src, torch.Tensor) != isinstance(out, torch.Tensor):
        raise TypeError("src and out must be of one kind, both torch tensors or both numpy arrays (the index may "
                        f"be either), got src {type(src).__name__} and out {type(out).__name__}")


def _launch_arrays(src, index, out, aligned):
    """:func:`launch` over numpy arrays."""
    threads = get_num_threads() if out.nbytes >= SERIAL_BYTES else 1
    if team() != "torch":
        return _KERNELS[bool(aligned), threads > 1](src, _numpy(index), out, threads)
    if not (src.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("the CPU kernel's arrays must be C-contiguous")
    index = index.contiguous() if isinstance(index, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(index))
    return _run_team(_team_kernel(bool(aligned), src.itemsize, index.element_size()), threads, src.ctypes.data,
                     src.shape[0], src.shape[1], index.data_ptr(), index.shape[0], out.ctypes.data)


def _run_team(body, threads, *launch_args):
    """The team body over one argument block: on torch's team, or right here when serial (outside
    a parallel region the runtime's thread number is 0 of 1 and its barrier returns at once)."""
    omp = _torch_openmp()
    block, block_addr = omp.block(threads)
    _LAUNCH.pack_into(block, 0, *launch_args)
    if threads > 1:
        omp.parallel(body, block_addr, threads, 0)
    else:
        _serial(body)(block_addr)
    return block[_RESULT]


@functools.cache
def _serial(body):
    """A ctypes caller of a compiled team body, for a run on the caller's thread alone."""
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)


def _numpy(a):
    return a if isinstance(a, np.ndarray) else a.numpy()

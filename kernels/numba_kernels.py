"""The Numba CUDA kernels: device code from memoized factories, one specialisation per carrier and index type.

A specialisation is the tuple ``(kind, carrier, index_bytes, lanes, traced)``: ``kind`` one of
:data:`KINDS`, ``carrier`` the bytes each copy moves (1, 2, 4, 8, or 16 carried as complex128), ``index_bytes``
4 or 8 (int32 or int64 ids), ``lanes`` rowvec's lanes per row (0 otherwise), ``traced`` whether the kernel
also records which thread copied each element.  The carrier, lanes and tracing are closure constants, so the
element size, the unit and the line math fold to shifts and masks (no division in the aligned and rowvec
kernels).  ``kernels.numba_cuda`` launches them; nothing here touches a GPU at import.
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
from numba import cuda, types
from numba.extending import register_jitable
from numba.np.numpy_support import from_dtype

from .indexing import LINE, WARP, aligned_geometry, aligned_span, naive_element, tier_row

if TYPE_CHECKING:
    from collections.abc import Callable

    from numba.cuda.dispatcher import CUDADispatcher

__all__ = ["KINDS", "CARRIER_DTYPES", "INDEX_DTYPES", "dispatcher", "signature", "offline_ptx", "compile_offline",
           "checked_row"]

#: What a specialisation's ``kind`` may be.
KINDS = ("naive", "aligned", "rowvec", "check_clamp", "tiered_naive", "tiered_aligned")
#: A specialisation: ``(kind, carrier, index_bytes, lanes, traced)``.
Spec = tuple[str, int, int, int, bool]


def _load_numpy_support():
    """Load numba-cuda's NumPy typing on NumPy 2.5, which removed ``np.row_stack``.

    numba-cuda (0.30.4 and earlier) registers an overload for ``np.row_stack``
    when its NumPy support first loads, which is when the first kernel
    compiles; on NumPy 2.5 that raises ``AttributeError`` and no kernel
    compiles (numba itself checks first).  The alias is lent to NumPy for that
    one import and taken back, so NumPy is left as it was.
    """
    import sys

    module = "numba.cuda.np.arrayobj"
    if hasattr(np, "row_stack") or module in sys.modules:
        return
    np.row_stack = np.vstack
    try:
        __import__(module)
    finally:
        del np.row_stack


_load_numpy_support()

# The same pure functions the CPU kernel and the PCIe model use, inlined into the
# kernels (register_jitable compiles them for whichever target calls them, and
# needs no device to do so, unlike cuda.jit(device=True), whose compile asks the
# driver for the compute capability).  Nothing here touches a GPU at import.
_geometry = register_jitable(aligned_geometry)
_span = register_jitable(aligned_span)
_naive = register_jitable(naive_element)
_tier_row = register_jitable(tier_row)


@register_jitable
def checked_row(row: int, n_rows: int, err: np.ndarray, stamp: int) -> int:
    """``row`` clamped to ``[0, n_rows)``; an id outside it stores ``stamp`` in ``err`` (when given) first.

    A plain store (every bad id of a launch stores the same stamp), and the clamp comes before any load: a
    read past a mapped table kills the CUDA context (the bounds contract of ``kernels.bounds``).
    """
    if row < 0 or row >= n_rows:
        if err.shape[0] != 0:
            err[0] = stamp
        return 0 if row < 0 else n_rows - 1
    return row


# Grid-stride loops are while loops: Numba's range() with a runtime step divides to count its iterations
# (LLVM still counts a simple loop's trips with one division at its entry, as in check_clamp; the aligned
# and rowvec kernels compile to none, which tests/kernels/test_numba_ptx.py checks).

@functools.cache
def _row_kernels(carrier, traced):
    """The naive, aligned and tiered kernels moving ``carrier``-byte units (1, 2, 4, 8 or 16).

    ``carrier`` is a closure constant, so every ``// elem`` and ``% line`` folds to shifts and masks.
    ``traced`` kernels also write, per output element, the flat thread id and step that copied it (tests
    compare them with ``kernels.pcie_model.thread_map``); production launches use the untraced ones, whose
    trace parameters are never touched and get empty descriptors.
    """
    elem = carrier

    def _gather_naive(src, idx, pos, out, row_elems, src_mod, n_rows, err, stamp, trace_tid, trace_step):
        tid = cuda.grid(1)
        stride = cuda.gridsize(1)
        total = idx.shape[0] * row_elems
        permuted = pos.shape[0] != 0
        i = tid
        step = 0
        while i < total:
            r, c = _naive(i, row_elems)
            row = checked_row(idx[r], n_rows, err, stamp)
            o = pos[r] if permuted else r
            out[o, c] = src[row, c]
            if traced:
                trace_tid[i] = tid
                trace_step[i] = step
            i += stride
            step += 1

    def _gather_aligned(src, idx, pos, out, row_elems, src_mod, n_rows, err, stamp, trace_tid, trace_step):
        warps_per_block = cuda.blockDim.x // WARP
        lane = cuda.threadIdx.x % WARP
        tid = cuda.grid(1)
        total_warps = cuda.gridDim.x * warps_per_block
        row_bytes = row_elems * elem
        permuted = pos.shape[0] != 0
        r = cuda.blockIdx.x * warps_per_block + cuda.threadIdx.x // WARP
        while r < idx.shape[0]:
            row = checked_row(idx[r], n_rows, err, stamp)
            o = pos[r] if permuted else r
            row_addr = src_mod + row * row_bytes
            base, first, last, steps, wrap = _geometry(row_addr, row_bytes, elem, WARP, LINE)
            step = 0
            while step < steps:
                lo, hi = _span(lane, step, row_addr, row_bytes, elem, WARP, base, first, last, steps, wrap)
                c = lo
                while c < hi:
                    out[o, c] = src[row, c]
                    if traced:
                        trace_tid[r * row_elems + c] = tid
                        trace_step[r * row_elems + c] = step
                    c += 1
                step += 1
            r += total_warps

    def _tiered_naive(cache, flat, where, out, row_elems, cache_mod, flat_mod):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        total = where.shape[0] * row_elems
        while i < total:
            r, c = _naive(i, row_elems)
            tier, first, _ = _tier_row(where[r], row_elems, 1, 0, 0)
            if tier == 0:
                out[r, c] = cache[first + c]
            else:
                out[r, c] = flat[first + c]
            i += stride

    def _tiered_aligned(cache, flat, where, out, row_elems, cache_mod, flat_mod):
        warps_per_block = cuda.blockDim.x // WARP
        lane = cuda.threadIdx.x % WARP
        total_warps = cuda.gridDim.x * warps_per_block
        row_bytes = row_elems * elem
        r = cuda.blockIdx.x * warps_per_block + cuda.threadIdx.x // WARP
        while r < where.shape[0]:
            tier, first, row_addr = _tier_row(where[r], row_elems, elem, cache_mod, flat_mod)
            base, lo_unit, hi_unit, steps, wrap = _geometry(row_addr, row_bytes, elem, WARP, LINE)
            step = 0
            while step < steps:
                lo, hi = _span(lane, step, row_addr, row_bytes, elem, WARP, base, lo_unit, hi_unit, steps, wrap)
                c = lo
                while c < hi:
                    if tier == 0:
                        out[r, c] = cache[first + c]
                    else:
                        out[r, c] = flat[first + c]
                    c += 1
                step += 1
            r += total_warps

    return SimpleNamespace(naive=cuda.jit(_gather_naive), aligned=cuda.jit(_gather_aligned),
                           tiered_naive=cuda.jit(_tiered_naive), tiered_aligned=cuda.jit(_tiered_aligned))


@functools.cache
def _rowvec_kernel(carrier, lanes):
    """rowvec in Numba: a sub-warp of ``lanes`` lanes (a closure constant) copies one whole row at a time,
    lane ``j`` taking units ``j, j + lanes, ...`` of ``carrier`` bytes.  The CUDA C kernel's vector loads,
    head and tail are a CUDA C concern; the output is the same."""
    del carrier  # the signature's array types carry it

    def _gather_rowvec(src, idx, pos, out, row_elems, src_mod, n_rows, err, stamp, trace_tid, trace_step):
        tid = cuda.grid(1)
        lane = tid % lanes
        groups = cuda.gridsize(1) // lanes
        permuted = pos.shape[0] != 0
        r = tid // lanes
        while r < idx.shape[0]:
            row = checked_row(idx[r], n_rows, err, stamp)
            o = pos[r] if permuted else r
            c = lane
            while c < row_elems:
                out[o, c] = src[row, c]
                c += lanes
            r += groups

    return cuda.jit(_gather_rowvec)


@cuda.jit
def _check_clamp(idx, clamped, n_rows, err, stamp):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    write = clamped.shape[0] != 0  # an empty ``clamped``: only check (rows of zero bytes)
    while i < idx.shape[0]:
        row = checked_row(idx[i], n_rows, err, stamp)
        if write:
            clamped[i] = row
        i += stride


# ---- specialisations -> dispatcher and Numba signature ----

#: Carrier bytes -> the numpy dtype the kernels move (complex128 only carries 16 bytes, no arithmetic).
CARRIER_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                  8: np.dtype(np.uint64), 16: np.dtype(np.complex128)}
#: Index bytes -> the ids' dtype.
INDEX_DTYPES = {4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_I64, _I32, _U64 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.uint64)


def dispatcher(spec: Spec) -> CUDADispatcher:
    """The Numba dispatcher (``cuda.jit`` kernel) of a specialisation, made once."""
    kind, carrier, _, lanes, traced = spec
    if kind == "rowvec":
        return _rowvec_kernel(carrier, lanes)
    if kind == "check_clamp":
        return _check_clamp
    return getattr(_row_kernels(carrier, traced), kind)


def signature(spec: Spec) -> tuple[types.Type, ...]:
    """The Numba argument types of a specialisation, in launch order.

    Gathers take ``(src, idx, pos, out, row_elems, src_mod, n_rows, err, stamp, trace_tid, trace_step)``,
    tiered gathers ``(cache, flat, where, out, row_elems, cache_mod, flat_mod)``, check_clamp
    ``(idx, clamped, n_rows, err, stamp)``; every array C-contiguous, 2-D tables, the rest 1-D.
    """
    kind, carrier, index_bytes, _, _ = spec

    def arr(dtype, ndim):
        return types.Array(from_dtype(dtype), ndim, "C")

    if kind == "check_clamp":
        i = arr(INDEX_DTYPES[index_bytes], 1)
        return (i, i, types.int64, arr(_U64, 1), types.uint64)
    t = CARRIER_DTYPES[carrier]
    if kind.startswith("tiered_"):
        return (arr(t, 1), arr(t, 1), arr(_I64, 1), arr(t, 2), types.int64, types.int64, types.int64)
    return (arr(t, 2), arr(INDEX_DTYPES[index_bytes], 1), arr(_I64, 1), arr(t, 2), types.int64, types.int64,
            types.int64, arr(_U64, 1), types.uint64, arr(_I64, 1), arr(_I32, 1))


def offline_ptx(spec: Spec, cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of a specialisation for compute capability ``cc``, compiled with no GPU."""
    return compile_offline(dispatcher(spec).py_func, signature(spec), cc)


def compile_offline(py_func: Callable[..., None], sig: tuple[types.Type, ...], cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of the kernel ``py_func`` over argument types ``sig`` for compute capability ``cc``, with no GPU."""
    # numba-cuda 0.30 compiles called device functions for the *current* device's
    # compute capability even inside compile_ptx, which needs a driver.  Offline,
    # answer that question with the requested cc instead.
    from numba.cuda import dispatcher as _cuda_dispatcher

    device = SimpleNamespace(compute_capability=tuple(cc))
    with _swapped(_cuda_dispatcher, "get_current_device", lambda: device):
        ptx, _ = cuda.compile_ptx(py_func, sig, cc=cc)
    return ptx


@contextlib.contextmanager
def _swapped(owner, name, value):
    """``owner.name`` is ``value`` inside the block, and what it was after it."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)

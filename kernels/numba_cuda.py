"""Numba CUDA backend: naive and aligned row-gather kernels (also run under the CUDA simulator)."""

import contextlib
from types import SimpleNamespace

import numpy as np
from numba import config, cuda, types
from numba.extending import register_jitable
from numba.np.numpy_support import from_dtype

from .indexing import BLOCK, LINE, WARP, aligned_geometry, aligned_span, launch_grid, naive_element, tier_row
from .interop import cuda_array
from .operands import check_launch

__all__ = ["launch", "launch_tiered", "gather_rows", "gather_tiered_rows", "compile_ptx", "compile_tiered_ptx",
           "kernel_signature", "array_address"]


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


@cuda.jit
def _gather_naive(src, idx, out, row_elems, trace_tid, trace_step):
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    total = idx.shape[0] * row_elems
    tracing = trace_tid.shape[0] > 0
    step = 0
    for i in range(tid, total, stride):
        r, c = _naive(i, row_elems)
        out[r, c] = src[idx[r], c]
        if tracing:
            trace_tid[i] = tid
            trace_step[i] = step
        step += 1


@cuda.jit
def _gather_aligned(src, idx, out, row_elems, elem, src_mod, trace_tid, trace_step):
    warps_per_block = cuda.blockDim.x // WARP
    lane = cuda.threadIdx.x % WARP
    tid = cuda.grid(1)
    total_warps = cuda.gridDim.x * warps_per_block
    row_bytes = row_elems * elem
    tracing = trace_tid.shape[0] > 0
    for r in range(cuda.blockIdx.x * warps_per_block + cuda.threadIdx.x // WARP, idx.shape[0], total_warps):
        row = idx[r]
        row_addr = src_mod + row * row_bytes
        base, first, last, steps, wrap = _geometry(row_addr, row_bytes, elem, WARP, LINE)
        for step in range(steps):
            lo, hi = _span(lane, step, row_addr, row_bytes, elem, WARP, base, first, last, steps, wrap)
            for c in range(lo, hi):
                out[r, c] = src[row, c]
                if tracing:
                    trace_tid[r * row_elems + c] = tid
                    trace_step[r * row_elems + c] = step


@cuda.jit
def _tiered_naive(cache, flat, where, out, row_elems):
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(tid, where.shape[0] * row_elems, stride):
        r, c = _naive(i, row_elems)
        tier, first, _ = _tier_row(where[r], row_elems, 1, 0, 0)
        if tier == 0:
            out[r, c] = cache[first + c]
        else:
            out[r, c] = flat[first + c]


@cuda.jit
def _tiered_aligned(cache, flat, where, out, row_elems, elem, cache_mod, flat_mod):
    warps_per_block = cuda.blockDim.x // WARP
    lane = cuda.threadIdx.x % WARP
    total_warps = cuda.gridDim.x * warps_per_block
    row_bytes = row_elems * elem
    for r in range(cuda.blockIdx.x * warps_per_block + cuda.threadIdx.x // WARP, where.shape[0], total_warps):
        tier, first, row_addr = _tier_row(where[r], row_elems, elem, cache_mod, flat_mod)
        base, lo_unit, hi_unit, steps, wrap = _geometry(row_addr, row_bytes, elem, WARP, LINE)
        for step in range(steps):
            lo, hi = _span(lane, step, row_addr, row_bytes, elem, WARP, base, lo_unit, hi_unit, steps, wrap)
            for c in range(lo, hi):
                if tier == 0:
                    out[r, c] = cache[first + c]
                else:
                    out[r, c] = flat[first + c]


def gather_tiered_rows(cache, flat, where, out, *, aligned=True, grid=None, block=BLOCK, stream=0):
    """Launch the tiered gather: ``out[r] = cache row where[r]`` or the flat tier's row at element ``-where[r]-1``.

    One fused kernel over both tiers (see ``kernels.indexing.tier_row``): rows
    of a GPU cache and rows zero-copy from mapped host memory land in one
    output.  ``cache`` and ``flat`` are 1-D arrays of one bit-carrier dtype
    (device and mapped memory, or anything with ``__cuda_array_interface__``),
    ``where`` 1-D int64, already checked (``kernels.tiered.check_where``), and
    ``out`` ``[len(where), row_elems]``.  Nothing synchronises.
    """
    if block % WARP:
        raise ValueError(f"block ({block}) must be a multiple of the warp size {WARP}")
    row_elems = out.shape[1]
    if aligned:
        elem = np.dtype(out.dtype).itemsize
        blocks = grid or launch_grid(where.shape[0] * WARP, block)
        _tiered_aligned[blocks, block, stream](cache, flat, where, out, row_elems, elem,
                                               array_address(cache) % LINE, array_address(flat) % LINE)
    else:
        blocks = grid or launch_grid(where.shape[0] * row_elems, block)
        _tiered_naive[blocks, block, stream](cache, flat, where, out, row_elems)


def array_address(a):
    """Data address of a CUDA array, a mapped array, or a simulator/host array."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is not None:
        return iface["data"][0]
    host = getattr(a, "_ary", a)  # the simulator's FakeCUDAArray wraps a numpy array
    return np.asarray(host).ctypes.data


def gather_rows(src, idx, out, *, aligned=True, grid=None, block=BLOCK, stream=0, trace=False):
    """Launch the Numba kernel: ``out[i] = src[idx[i]]``.

    Parameters
    ----------
    src : device or mapped array
        ``[rows, row_elems]`` C-contiguous (``cuda.mapped_array``, a device array,
        anything with ``__cuda_array_interface__``).  Elements of 1-8 bytes, or
        complex128 as the carrier of 16-byte units (whole-unit rows only).
    idx : device array
        1-D int32/int64, already checked to lie in ``[0, rows)``.
    out : device array
        ``[len(idx), row_elems]``, same dtype as ``src``.  Written in full.
    aligned : bool
        Aligned (one warp per row) or naive (one thread per element) kernel.
    grid, block : int, optional
        Launch geometry; ``block`` must be a multiple of 32.
    stream : numba stream or 0
        Stream to launch on; the call does not synchronise.
    trace : bool
        Also return device arrays: the flat thread id and step that wrote each
        output element (tests compare them with the model).

    Returns
    -------
    None or (trace_tid, trace_step)

    Examples
    --------
    >>> import numpy as np
    >>> from numba import cuda
    >>> src = cuda.to_device(np.arange(6, dtype=np.float32).reshape(3, 2))  # doctest: +SKIP
    >>> out = cuda.device_array((1, 2), np.float32)  # doctest: +SKIP
    >>> gather_rows(src, cuda.to_device(np.array([2])), out)  # doctest: +SKIP
    """
    if block % WARP:
        raise ValueError(f"block ({block}) must be a multiple of the warp size {WARP}")
    row_elems = out.shape[1]
    n_out = idx.shape[0] * row_elems
    if trace:
        trace_tid = cuda.to_device(np.full(n_out, -1, np.int64), stream=stream)
        trace_step = cuda.to_device(np.full(n_out, -1, np.int32), stream=stream)
    else:
        trace_tid = cuda.device_array(0, np.int64, stream=stream)
        trace_step = cuda.device_array(0, np.int32, stream=stream)
    if aligned:
        blocks = grid or launch_grid(idx.shape[0] * WARP, block)
        elem = np.dtype(src.dtype).itemsize
        _gather_aligned[blocks, block, stream](src, idx, out, row_elems, elem, array_address(src) % LINE,
                                               trace_tid, trace_step)
    else:
        blocks = grid or launch_grid(n_out, block)
        _gather_naive[blocks, block, stream](src, idx, out, row_elems, trace_tid, trace_step)
    return (trace_tid, trace_step) if trace else None


def launch(src, index, out, *, aligned=True, stream=0):
    """The backends' shared launch (see ``kernels.cpu.launch``) on Numba CUDA: ``out[i] = src[index[i]]``.

    ``src`` is a torch tensor in device memory or pinned, GPU-mapped host
    memory (``[rows, row_elems]`` of a bit carrier, or complex128 for 16-byte
    units), ``index`` and ``out`` CUDA tensors; ``index`` is already
    range-checked.  ``stream`` is a ``cudaStream_t``; nothing synchronises.
    Returns -1 (a GPU launch has nothing to flag).
    """
    check_launch(src, index, out)
    gather_rows(_device_array(src), _device_array(index), _device_array(out), aligned=aligned,
                stream=_stream(stream))
    return -1


def launch_tiered(cache, flat, where, out, *, aligned=True, stream=0):
    """The backends' shared tiered launch (see ``kernels.tiered.launch_tiered``) on Numba CUDA: torch
    tensors, ``cache`` in device or mapped memory, ``flat`` mapped, ``where`` checked, ``stream`` a
    ``cudaStream_t``; nothing synchronises."""
    gather_tiered_rows(_device_array(cache), _device_array(flat), _device_array(where), _device_array(out),
                       aligned=aligned, stream=_stream(stream))


def _device_array(t):
    """The torch tensor ``t`` (CUDA, or pinned host memory) as a Numba device array over its memory, no copy;
    under Numba's CUDA simulator, whose kernels run on host arrays, its numpy view (the same memory)."""
    if config.ENABLE_CUDASIM:
        return t.numpy()
    return cuda.as_cuda_array(cuda_array(t))


def _stream(handle):
    """A ``cudaStream_t`` as Numba's stream (0: the default stream)."""
    return cuda.external_stream(handle) if handle else 0


def kernel_signature(aligned, elem_dtype, index_dtype):
    """Numba signature of one specialisation, for :func:`compile_ptx`."""
    t = from_dtype(np.dtype(elem_dtype))
    i = from_dtype(np.dtype(index_dtype))
    tr = (types.int64[::1], types.int32[::1])
    if aligned:
        return (t[:, ::1], i[::1], t[:, ::1], types.int64, types.int64, types.int64) + tr
    return (t[:, ::1], i[::1], t[:, ::1], types.int64) + tr


def compile_ptx(aligned, elem_dtype, index_dtype, cc=(9, 0)):
    """PTX of one kernel specialisation, compiled offline (no GPU needed).

    Returns
    -------
    str
        The PTX text.
    """
    kernel = _gather_aligned if aligned else _gather_naive
    return _offline_ptx(kernel, kernel_signature(aligned, elem_dtype, index_dtype), cc)


def tiered_signature(aligned, elem_dtype):
    """Numba signature of one tiered-gather specialisation, for :func:`compile_tiered_ptx`."""
    t = from_dtype(np.dtype(elem_dtype))
    head = (t[::1], t[::1], types.int64[::1], t[:, ::1], types.int64)
    return head + (types.int64, types.int64, types.int64) if aligned else head


def compile_tiered_ptx(aligned, elem_dtype, cc=(9, 0)):
    """PTX of one tiered-gather specialisation, compiled offline (no GPU needed)."""
    return _offline_ptx(_tiered_aligned if aligned else _tiered_naive, tiered_signature(aligned, elem_dtype), cc)


def _offline_ptx(kernel, sig, cc):
    # numba-cuda 0.30 compiles called device functions for the *current* device's
    # compute capability even inside compile_ptx, which needs a driver.  Offline,
    # answer that question with the requested cc instead.
    from numba.cuda import dispatcher as _cuda_dispatcher

    device = SimpleNamespace(compute_capability=tuple(cc))
    with _swapped(_cuda_dispatcher, "get_current_device", lambda: device):
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
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

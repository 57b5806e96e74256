"""Numba CUDA backend: the row-gather kernels for the simulator and CI lanes (and real GPUs).

Every kernel comes from a memoized factory keyed by its carrier (the element size it moves), so the element
size, the unit and the line math are compile-time constants (no 64-bit division in the aligned kernel).  On a
real GPU a launch packs Numba's kernel arguments itself from raw pointers and launches the cached kernel
handle through ``cuda.core``: no device-array objects, no dispatcher type checks, no scratch arrays per call.
Under ``NUMBA_ENABLE_CUDASIM=1`` the same kernels run on host views of the same pointers.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import TYPE_CHECKING

import numpy as np
from numba import config, cuda

from .indexing import BLOCK, LINE, WARP, persistent_grid
from .numba_kernels import CARRIER_DTYPES, INDEX_DTYPES, dispatcher, offline_ptx, signature
from .operands import check_launch
from .variants import legal_width

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch
    from numba.core import types
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import Stream

    from .variants import Variant

__all__ = ["launch", "launch_tiered", "launch_variant", "launch_check_clamp", "gather_rows",
           "gather_tiered_rows", "compile_ptx", "compile_kernel_ptx", "compile_tiered_ptx", "kernel_signature",
           "tiered_signature", "array_address", "carrier_for", "GATHER_KERNELS"]

_I64, _I32, _U64 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.uint64)

#: The row kernels :func:`launch_variant` runs (``index_select`` is torch's, after :func:`launch_check_clamp`).
GATHER_KERNELS = ("rowvec", "naive", "aligned")


# ---- launching: real GPU ----

class _DeviceLaunches:
    """Launches on a real GPU: per (device, specialisation) the loaded kernel handle, the persistent grid's
    size (SMs x resident blocks) and launch configurations, per (device, stream) ``cuda.core``'s stream.

    Kernel arguments are packed as Numba's own launch does (``numba.cuda.dispatcher._Kernel._prepare_args``,
    numba-cuda 0.30: an array is meminfo, parent, nitems, itemsize, data, shape, strides; a test checks the
    packing against that function), straight from raw pointers.
    """

    def __init__(self):
        from cuda.core import LaunchConfig, Stream, launch  # numba-cuda's own launcher (imported with it)

        self._config, self._from_handle, self._launch = LaunchConfig, Stream.from_handle, launch
        self._kernels = {}
        self._streams = {}
        self._tls = threading.local()

    @staticmethod
    def array(ptr, shape, dtype):
        itemsize = dtype.itemsize
        if len(shape) == 1:
            return (0, 0, shape[0], itemsize, ptr, shape[0], itemsize)
        rows, cols = shape
        return (0, 0, rows * cols, itemsize, ptr, rows, cols, cols * itemsize, itemsize)

    @staticmethod
    def i64(value):
        return (value,)  # a Python int goes as intptr_t, as Numba's own array fields do

    @staticmethod
    def u64(value):
        return (ctypes.c_uint64(value),)

    def run(self, spec, device_id, threads, stream_ptr, args, grid=None, block=None):
        if device_id not in getattr(self._tls, "ready", ()):
            self._make_ready(device_id)
        loaded = self._kernels.get((device_id, spec)) or self._load(device_id, spec)
        kernel, max_blocks, configs = loaded
        block = block or BLOCK
        shape = (grid or persistent_grid(threads, max_blocks, block), block)
        cfg = configs.get(shape)
        if cfg is None:
            cfg = configs[shape] = self._config(grid=shape[0], block=block)
        stream = self._streams.get((device_id, stream_ptr)) or self._stream(device_id, stream_ptr)
        self._launch(stream, cfg, kernel, *args)

    def _load(self, device_id, spec):
        with cuda.gpus[device_id]:
            compiled = dispatcher(spec).compile(signature(spec))
            compiled.bind()
            handle = compiled._codelibrary.get_cufunc().kernel
            max_blocks = compiled.max_cooperative_grid_blocks(BLOCK)
        loaded = self._kernels[device_id, spec] = (handle, max(1, max_blocks), {})
        return loaded

    def _make_ready(self, device_id):
        """Once per thread and device: a thread with no current CUDA context gets the device's primary context
        (as the CUDA runtime's first call would); a current one (torch's) stays."""
        from numba.cuda.cudadrv.driver import driver

        with driver.get_active_context() as active:
            if not active:
                cuda.gpus[device_id].get_primary_context().push()
        if not hasattr(self._tls, "ready"):
            self._tls.ready = set()
        self._tls.ready.add(device_id)

    def _stream(self, device_id, stream_ptr):
        if len(self._streams) > 64:
            self._streams.clear()
        stream = self._streams[device_id, stream_ptr] = self._from_handle(stream_ptr)
        return stream


# ---- launching: the simulator ----

#: The simulator's "device": few, small blocks (each simulated thread is a Python thread), so tests of a
#: handful of rows still stride the grid.
_SIM_BLOCK, _SIM_MAX_BLOCKS = 64, 2


class _SimLaunches:
    """Launches under Numba's CUDA simulator, whose kernels run on host arrays: the pointers are host
    addresses (CPU tensors stand in for CUDA ones), viewed as numpy arrays over the same memory."""

    _empty: dict[tuple[np.dtype, tuple[int, ...]], np.ndarray] = {}

    @classmethod
    def array(cls, ptr, shape, dtype):
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            key = (dtype, shape)
            if key not in cls._empty:
                cls._empty[key] = np.empty(shape, dtype)
            return (cls._empty[key],)
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return (np.frombuffer(raw, np.uint8).view(dtype).reshape(shape),)

    @staticmethod
    def i64(value):
        return (int(value),)

    u64 = i64

    @staticmethod
    def run(spec, device_id, threads, stream_ptr, args, grid=None, block=None):
        del device_id, stream_ptr  # one simulated device, run at once
        block = block or _SIM_BLOCK
        dispatcher(spec)[grid or persistent_grid(threads, _SIM_MAX_BLOCKS, block), block](*args)


_RUN = _SimLaunches() if config.ENABLE_CUDASIM else _DeviceLaunches()

# Empty descriptors for the nullable arrays (no positions, no error word, an untraced kernel), made once.
_NO_IDS = {size: _RUN.array(0, (0,), dtype) for size, dtype in INDEX_DTYPES.items()}
_NO_POS = _RUN.array(0, (0,), _I64)
_NO_ERR = _RUN.array(0, (0,), _U64)
_NO_TRACE = _RUN.array(0, (0,), _I64) + _RUN.array(0, (0,), _I32)


# ---- the launches ----

def carrier_for(kernel: str, width: int, row_bytes: int, elem_bytes: int, src_addr: int, out_addr: int) -> int:
    """Bytes each copy moves for ``kernel``: rowvec its vector width where legal between the tables
    (:func:`~kernels.variants.legal_width`), aligned 16-byte units where rows and tables are 16-byte aligned
    (PyTorch-Direct's ``uint4`` path), naive one element.  ``ValueError`` for another kernel.  Pure.

    >>> carrier_for("rowvec", 16, 400, 4, 0x1000, 0x2000), carrier_for("rowvec", 16, 404, 4, 0x1000, 0x2000)
    (16, 4)
    >>> carrier_for("aligned", 0, 400, 4, 0x1000, 0x2000), carrier_for("naive", 0, 400, 4, 0x1000, 0x2000)
    (16, 4)
    """
    if kernel == "rowvec":
        return min(width, legal_width(row_bytes, src_addr, out_addr))
    if kernel == "aligned":
        aligned16 = row_bytes % 16 == 0 and src_addr % 16 == 0 and out_addr % 16 == 0
        return 16 if aligned16 else elem_bytes
    if kernel == "naive":
        return elem_bytes
    raise ValueError(f"the Numba backend launches {GATHER_KERNELS}, got {kernel!r}")


def launch_variant(variant: Variant, *, device_id: int, src_ptr: int, n_rows: int, row_bytes: int, elem_bytes: int,
                   index: torch.Tensor, positions: torch.Tensor | None, out_ptr: int, err_ptr: int, stamp: int,
                   stream_ptr: int) -> None:
    """Start ``out[positions[i] if positions else i] = src[clamp(index[i])]`` with ``variant``'s kernel.

    Parameters
    ----------
    variant : kernels.variants.Variant
        ``variant.kernel`` in ``("rowvec", "naive", "aligned")``.
    device_id : int
        The CUDA device of the tables and ``stream_ptr``.  The launch runs in the calling thread's current
        context (torch's, for its current device); a thread with none gets the device's primary context.
    src_ptr, out_ptr : int
        The table (``n_rows`` rows of ``row_bytes``; device memory or pinned, mapped host memory) and the
        C-contiguous output (``len(index)`` rows), as raw addresses.
    elem_bytes : int
        The table's element size (the naive kernel's unit).
    index : torch.Tensor
        Contiguous CUDA int32/int64 ids (sorted ids when ``variant.sorted``).
    positions : torch.Tensor or None
        Contiguous CUDA int64 output rows of the ids (torch.sort's permutation), or None.
    err_ptr, stamp : int
        An id outside ``[0, n_rows)`` stores ``stamp`` at ``err_ptr`` (0: no flagging) and is clamped.
    stream_ptr : int
        The ``cudaStream_t``.  Nothing synchronises and nothing is allocated.

    Examples
    --------
    >>> from directload.kernels.variants import Variant
    >>> launch_variant(Variant("rowvec", 16, 8), device_id=0, src_ptr=table.data_ptr(), n_rows=100,
    ...                row_bytes=400, elem_bytes=4, index=ids, positions=None, out_ptr=out.data_ptr(),
    ...                err_ptr=0, stamp=0, stream_ptr=0)  # doctest: +SKIP
    """
    kind = variant.kernel
    carrier = carrier_for(kind, variant.width, row_bytes, elem_bytes, src_ptr, out_ptr)
    n = index.shape[0]
    if n == 0:
        return
    index_bytes = index.element_size()
    if row_bytes == 0:  # nothing to copy, but the ids must still exist
        _run_check(device_id, index.data_ptr(), index_bytes, n, 0, n_rows, err_ptr, stamp, stream_ptr)
        return
    pos = 0 if positions is None else positions.data_ptr()
    _run_rows(kind, carrier, variant.lanes, device_id, src_ptr, n_rows, row_bytes // carrier, index.data_ptr(),
              index_bytes, n, pos, out_ptr, err_ptr, stamp, stream_ptr)


def launch_check_clamp(*, device_id: int, index: torch.Tensor, clamped: torch.Tensor, n_rows: int, err_ptr: int,
                       stamp: int, stream_ptr: int) -> None:
    """Start ``clamped[i] = min(max(index[i], 0), n_rows - 1)``, storing ``stamp`` at ``err_ptr`` (when not 0)
    for any id outside ``[0, n_rows)``: the ids torch's ``index_select`` may then read.

    ``index`` and ``clamped`` are contiguous CUDA tensors of one dtype (int32 or int64); as
    :func:`launch_variant` otherwise.

    Examples
    --------
    >>> launch_check_clamp(device_id=0, index=ids, clamped=torch.empty_like(ids), n_rows=100, err_ptr=0,
    ...                    stamp=0, stream_ptr=0)  # doctest: +SKIP
    """
    if clamped.dtype != index.dtype:
        raise TypeError(f"clamped must have the index's dtype {index.dtype}, got {clamped.dtype}")
    n = index.shape[0]
    if n:
        _run_check(device_id, index.data_ptr(), index.element_size(), n, clamped.data_ptr(), n_rows, err_ptr,
                   stamp, stream_ptr)


def _run_check(device_id, index_ptr, index_bytes, n, clamped_ptr, n_rows, err_ptr, stamp, stream_ptr):
    ids = INDEX_DTYPES[index_bytes]
    clamped = _RUN.array(clamped_ptr, (n,), ids) if clamped_ptr else _NO_IDS[index_bytes]
    args = _RUN.array(index_ptr, (n,), ids) + clamped + _RUN.i64(n_rows) + _err(err_ptr) + _RUN.u64(stamp)
    _RUN.run(("check_clamp", 0, index_bytes, 0, False), device_id, n, stream_ptr, args)


def _err(err_ptr):
    return _RUN.array(err_ptr, (1,), _U64) if err_ptr else _NO_ERR


def _run_rows(kind, carrier, lanes, device_id, src_ptr, n_rows, row_elems, index_ptr, index_bytes, n, pos_ptr,
              out_ptr, err_ptr, stamp, stream_ptr, *, grid=None, block=None, trace=None):
    """One gather launch from raw pointers (``pos_ptr``/``err_ptr`` 0: none; ``trace``: the traced kernel
    writing into the ``(tid_ptr, step_ptr)`` arrays)."""
    t = CARRIER_DTYPES[carrier]
    lanes = lanes if kind == "rowvec" else 0
    traces = (_RUN.array(trace[0], (n * row_elems,), _I64) + _RUN.array(trace[1], (n * row_elems,), _I32)
              if trace else _NO_TRACE)
    args = (_RUN.array(src_ptr, (n_rows, row_elems), t) + _RUN.array(index_ptr, (n,), INDEX_DTYPES[index_bytes])
            + (_RUN.array(pos_ptr, (n,), _I64) if pos_ptr else _NO_POS) + _RUN.array(out_ptr, (n, row_elems), t)
            + _RUN.i64(row_elems) + _RUN.i64(src_ptr % LINE) + _RUN.i64(n_rows) + _err(err_ptr) + _RUN.u64(stamp)
            + traces)
    threads = n * (row_elems if kind == "naive" else WARP if kind == "aligned" else lanes)
    _RUN.run((kind, carrier, index_bytes, lanes, bool(trace)), device_id, threads, stream_ptr, args, grid, block)


def launch(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, *, aligned: bool = True, stream: int = 0) -> int:
    """The backends' shared launch (see ``kernels.registry``) on Numba CUDA: ``out[i] = src[index[i]]``.

    ``src`` is a torch tensor in device memory or pinned, GPU-mapped host
    memory (``[rows, row_elems]`` of a bit carrier, or complex128 for 16-byte
    units), ``index`` and ``out`` CUDA tensors; ``index`` is already
    range-checked (an id out of range would still be clamped, unreported).
    ``stream`` is a ``cudaStream_t``; nothing synchronises.  Returns -1 (a GPU
    launch has nothing to flag).
    """
    check_launch(src, index, out)
    index = index.contiguous()
    n = index.shape[0]
    if n and src.shape[1]:
        device_id = index.device.index if index.is_cuda else 0
        _run_rows("aligned" if aligned else "naive", src.element_size(), 0, device_id, src.data_ptr(), src.shape[0],
                  src.shape[1], index.data_ptr(), index.element_size(), n, 0, out.data_ptr(), 0, 0, stream)
    return -1


def launch_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, out: torch.Tensor, *,
                  aligned: bool = True, stream: int = 0) -> None:
    """The backends' shared tiered launch (see ``kernels.registry``) on Numba CUDA: torch
    tensors, ``cache`` in device or mapped memory, ``flat`` mapped, ``where`` checked, ``stream`` a
    ``cudaStream_t``; nothing synchronises."""
    device_id = where.device.index if where.is_cuda else 0
    _run_tiered(aligned, out.element_size(), device_id, (cache.data_ptr(), cache.shape[0]),
                (flat.data_ptr(), flat.shape[0]), where.data_ptr(), where.shape[0], out.data_ptr(), out.shape[1],
                stream)


def _run_tiered(aligned, carrier, device_id, cache, flat, where_ptr, n, out_ptr, row_elems, stream_ptr, *,
                grid=None, block=None):
    if n == 0 or row_elems == 0:
        return
    t = CARRIER_DTYPES[carrier]
    args = (_RUN.array(cache[0], (cache[1],), t) + _RUN.array(flat[0], (flat[1],), t)
            + _RUN.array(where_ptr, (n,), _I64) + _RUN.array(out_ptr, (n, row_elems), t) + _RUN.i64(row_elems)
            + _RUN.i64(cache[0] % LINE) + _RUN.i64(flat[0] % LINE))
    kind = "tiered_aligned" if aligned else "tiered_naive"
    threads = n * (WARP if aligned else row_elems)
    _RUN.run((kind, carrier, 8, 0, False), device_id, threads, stream_ptr, args, grid, block)


# ---- Numba arrays in (tests, the simulator lane, mapped-memory tools) ----

def gather_tiered_rows(cache: DeviceNDArray, flat: DeviceNDArray, where: DeviceNDArray, out: DeviceNDArray, *,
                       aligned: bool = True, grid: int | None = None, block: int = BLOCK,
                       stream: Stream | int = 0) -> None:
    """Launch the tiered gather: ``out[r] = cache row where[r]`` or the flat tier's row at element ``-where[r]-1``.

    One fused kernel over both tiers (see ``kernels.indexing.tier_row``): rows
    of a GPU cache and rows zero-copy from mapped host memory land in one
    output.  ``cache`` and ``flat`` are 1-D arrays of one bit-carrier dtype
    (device and mapped memory, or anything with ``__cuda_array_interface__``),
    ``where`` 1-D int64, already checked (``kernels.operands.check_where``), and
    ``out`` ``[len(where), row_elems]``.  Nothing synchronises.
    """
    _check_block(block)
    _run_tiered(aligned, np.dtype(out.dtype).itemsize, _current_device(), (array_address(cache), cache.shape[0]),
                (array_address(flat), flat.shape[0]), array_address(where), where.shape[0], array_address(out),
                out.shape[1], _stream_handle(stream), grid=grid, block=block)


def gather_rows(src: DeviceNDArray, idx: DeviceNDArray, out: DeviceNDArray, *, aligned: bool = True,
                grid: int | None = None, block: int = BLOCK, stream: Stream | int = 0,
                trace: bool = False) -> tuple[DeviceNDArray, DeviceNDArray] | None:
    """Launch the Numba kernel: ``out[i] = src[idx[i]]``.

    Parameters
    ----------
    src : device or mapped array
        ``[rows, row_elems]`` C-contiguous (``cuda.mapped_array``, a device array,
        anything with ``__cuda_array_interface__``).  Elements of 1-8 bytes, or
        complex128 as the carrier of 16-byte units (whole-unit rows only).
    idx : device array
        1-D int32/int64; ids outside ``[0, rows)`` are clamped (unreported).
    out : device array
        ``[len(idx), row_elems]``, same dtype as ``src``.  Written in full.
    aligned : bool
        Aligned (one warp per row) or naive (one thread per element) kernel.
    grid, block : int, optional
        Launch geometry; ``block`` must be a multiple of 32.
    stream : numba stream or 0
        Stream to launch on; the call does not synchronise.
    trace : bool
        Run the traced kernel and also return device arrays: the flat thread id
        and step that wrote each output element (tests compare them with the model).

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
    _check_block(block)
    n, row_elems = out.shape
    traces = None
    if trace:  # the test-only path allocates its trace arrays
        traces = (cuda.to_device(np.full(n * row_elems, -1, np.int64), stream=stream),
                  cuda.to_device(np.full(n * row_elems, -1, np.int32), stream=stream))
    if n and row_elems:
        ptrs = (array_address(traces[0]), array_address(traces[1])) if trace else None  # type: ignore[index]  # set if trace
        _run_rows("aligned" if aligned else "naive", np.dtype(src.dtype).itemsize, 0, _current_device(),
                  array_address(src), src.shape[0], row_elems, array_address(idx), np.dtype(idx.dtype).itemsize, n,
                  0, array_address(out), 0, 0, _stream_handle(stream), grid=grid, block=block, trace=ptrs)
    return traces


def _check_block(block):
    if block % WARP:
        raise ValueError(f"block ({block}) must be a multiple of the warp size {WARP}")


def _current_device():
    return 0 if config.ENABLE_CUDASIM else cuda.get_current_device().id


def _stream_handle(stream):
    """A Numba stream (or 0) as its ``cudaStream_t``."""
    return int(stream) if stream and not config.ENABLE_CUDASIM else 0


def array_address(a: object) -> int:
    """Data address of a CUDA array, a mapped array, or a simulator/host array."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is not None:
        return iface["data"][0]
    host = getattr(a, "_ary", a)  # the simulator's FakeCUDAArray wraps a numpy array
    return np.asarray(host).ctypes.data


# ---- offline PTX (no GPU needed) ----

def kernel_signature(aligned: bool, elem_dtype: npt.DTypeLike, index_dtype: npt.DTypeLike) -> tuple[types.Type, ...]:
    """Numba signature of one naive/aligned specialisation, for :func:`compile_ptx`."""
    return signature(_gather_spec("aligned" if aligned else "naive", elem_dtype, index_dtype))


def _gather_spec(kind, elem_dtype, index_dtype, lanes=0, traced=False):
    return (kind, np.dtype(elem_dtype).itemsize, np.dtype(index_dtype).itemsize, lanes, traced)


def compile_ptx(aligned: bool, elem_dtype: npt.DTypeLike, index_dtype: npt.DTypeLike,
                cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of one naive/aligned kernel specialisation (untraced), compiled offline (no GPU needed).

    Returns
    -------
    str
        The PTX text.
    """
    return compile_kernel_ptx("aligned" if aligned else "naive", elem_dtype, index_dtype, cc=cc)


def compile_kernel_ptx(kernel: str, elem_dtype: npt.DTypeLike, index_dtype: npt.DTypeLike, *, lanes: int = 0,
                       traced: bool = False, cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of any gather specialisation, compiled offline: ``kernel`` in ``("naive", "aligned", "rowvec",
    "check_clamp")`` (rowvec with ``lanes``), moving units of ``elem_dtype``'s size, over ``index_dtype`` ids.

    >>> ".entry" in compile_kernel_ptx("rowvec", np.uint32, np.int64, lanes=8)  # doctest: +SKIP
    True
    """
    return offline_ptx(_gather_spec(kernel, elem_dtype, index_dtype, lanes if kernel == "rowvec" else 0, traced), cc)


def tiered_signature(aligned: bool, elem_dtype: npt.DTypeLike) -> tuple[types.Type, ...]:
    """Numba signature of one tiered-gather specialisation, for :func:`compile_tiered_ptx`."""
    return signature(_tiered_spec(aligned, elem_dtype))


def _tiered_spec(aligned, elem_dtype):
    return ("tiered_aligned" if aligned else "tiered_naive", np.dtype(elem_dtype).itemsize, 8, 0, False)


def compile_tiered_ptx(aligned: bool, elem_dtype: npt.DTypeLike, cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of one tiered-gather specialisation, compiled offline (no GPU needed)."""
    return offline_ptx(_tiered_spec(aligned, elem_dtype), cc)

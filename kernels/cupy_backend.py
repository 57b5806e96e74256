"""CuPy backend: the CUDA C kernels of kernels/cuda/gather.cu, loaded from our own NVRTC cubins through CuPy.

Every launch passes raw pointers as numpy scalars to a kernel handle cached per (device, specialisation), on a
grid cached with it: persistent and grid-strided, as many blocks as the device holds at once (SMs x resident
blocks per SM, from the occupancy API), never more than the work needs.  Nothing per call builds an array
object, reads the device or synchronizes.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .indexing import BLOCK, WARP, persistent_grid
from .nvrtc import (
    check_clamp_kernel_name,
    compile_gather,
    decode_kernel_name,
    kernel_name,
    rowvec_kernel_name,
    tiered_kernel_name,
)
from .operands import check_launch
from .sources import CUDA_DIR, cache_dir
from .variants import Variant, legal_width

if TYPE_CHECKING:
    import cupy
    import torch

__all__ = ["launch", "launch_variant", "launch_decode", "launch_check_clamp", "launch_tiered", "kernel",
           "tiered_kernel",
           "gather_rows", "gather_tiered_rows", "launch_kernel"]

_NULL = np.uint64(0)  # a null pointer argument (no pos, no err word, no trace)
_NAIVE = Variant("naive")
_ALIGNED = Variant("aligned")


@functools.cache
def kernel(device_id: int, aligned: bool, elem_bytes: int, index_bytes: int) -> cupy.RawKernel:
    """The compiled row-gather kernel of one specialisation on one device (memoized).

    The cubin comes from our own NVRTC call (the same one CI runs offline), for
    the device's exact ``sm_XY``, cached on disk by source hash, and is loaded
    with ``cupy.RawModule(path=...)``.

    Returns
    -------
    cupy.RawKernel
    """
    return _function(device_id, kernel_name(aligned, elem_bytes, index_bytes))


@functools.cache
def tiered_kernel(device_id: int, aligned: bool, elem_bytes: int) -> cupy.RawKernel:
    """The compiled tiered-gather kernel of one specialisation on one device (memoized, as :func:`kernel`)."""
    return _function(device_id, tiered_kernel_name(aligned, elem_bytes))


def _function(device_id, name, source="gather.cu", options=()):
    import cupy

    with cupy.cuda.Device(device_id) as dev:
        major, minor = dev.compute_capability[:-1], dev.compute_capability[-1]
        arch = f"sm_{major}{minor}"
        digest = hashlib.sha256((CUDA_DIR / source).read_bytes() + name.encode() + arch.encode()
                                + " ".join(options).encode())
        path = cache_dir() / "cubin" / f"{digest.hexdigest()[:20]}.cubin"
        lowered_path = path.with_suffix(".name")
        if not path.exists():
            res = compile_gather(arch, [name], options, source=source)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(f"{path}.{os.getpid()}")
            tmp.write_bytes(res.image)
            lowered_path.write_text(res.lowered[name])
            os.replace(tmp, path)
        module = cupy.RawModule(path=str(path))
        return module.get_function(lowered_path.read_text())


@functools.cache
def _sm_count(device_id):
    import cupy

    rt = cupy.cuda.runtime
    return rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, device_id)


@functools.cache
def _handle(device_id, name, source="gather.cu", options=()):
    """``(function, resident)``: the kernel bound to the device, and the blocks of :data:`BLOCK` threads the device
    holds at once (its SMs times the blocks per SM its registers allow)."""
    import cupy

    raw = _function(device_id, name, source, options)
    with cupy.cuda.Device(device_id):
        fn = raw.kernel  # the cupy.cuda.function.Function loaded on this device
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK, 0)
    return fn, max(1, per_sm) * _sm_count(device_id)


@functools.lru_cache(maxsize=64)
def _stream(stream_ptr, device_id):
    """A CuPy handle on a caller's ``cudaStream_t`` (RawKernel launches take ``stream=`` with its ``ptr``)."""
    import cupy

    return cupy.cuda.ExternalStream(stream_ptr, device_id)


def _run(device_id, name, threads, args, stream_ptr):
    launch_kernel(device_id, name, threads, args, stream_ptr)


def launch_kernel(device_id: int, name: str, threads: int, args: Sequence[np.generic], stream_ptr: int, *,
                  source: str = "gather.cu", options: Iterable[str] = ()) -> None:
    """Start kernel ``name`` (a template name expression) of ``kernels/cuda/<source>`` on ``stream_ptr``: a
    persistent grid for ``threads`` grid-strided threads, ``args`` numpy scalars of the kernel's parameter sizes.

    The cubin is compiled for the device by our NVRTC with ``options`` and cached as :func:`kernel`'s are.
    No host sync.
    """
    fn, resident = _handle(device_id, name, source, tuple(options))
    fn((persistent_grid(threads, resident),), (BLOCK,), args, 0, _stream(stream_ptr, device_id))


def launch_variant(variant: Variant, *, device_id: int, src_ptr: int, n_rows: int, row_bytes: int, elem_bytes: int,
                   index: torch.Tensor, positions: torch.Tensor | None, out_ptr: int, err_ptr: int, stamp: int,
                   stream_ptr: int) -> None:
    """Start ``out[positions[i] if positions is not None else i] = src[index[i]]`` on ``stream_ptr``.

    No host sync, no event: an id out of ``[0, n_rows)`` is clamped and stores ``stamp`` into the error word.

    Parameters
    ----------
    variant : kernels.variants.Variant
        ``rowvec`` (at its width and lanes), ``naive`` (one thread per element) or ``aligned`` (a warp per row,
        on 16-byte units when the rows and both tables are 16-byte aligned).  ``variant.sorted`` is the caller's
        business: it passes sorted ids and their permutation.
    device_id : int
        The CUDA device of the ids, the output and the stream.
    src_ptr, out_ptr : int
        Addresses of the table (device memory, or pinned host memory mapped at the same address) and of a
        contiguous output of ``len(index)`` rows on the device.
    n_rows, row_bytes, elem_bytes : int
        The table's rows, bytes per row and bytes per element.
    index : torch.Tensor
        Contiguous CUDA int32/int64 ids.
    positions : torch.Tensor or None
        Contiguous CUDA int64 output row of each id.
    err_ptr : int
        Device address of a 64-bit error word (pinned, mapped host memory), or 0: no flagging.
    stamp : int
        What a bad id stores into the error word.
    stream_ptr : int
        The ``cudaStream_t`` to launch on.
    """
    n = index.shape[0]
    if n == 0 or row_bytes == 0:
        return
    ids, pos = np.uint64(index.data_ptr()), _NULL if positions is None else np.uint64(positions.data_ptr())
    src, out, err, bounds = np.uint64(src_ptr), np.uint64(out_ptr), np.uint64(err_ptr), np.int64(n_rows)
    if variant.kernel == "rowvec":
        args: tuple[np.generic, ...] = (src, ids, pos, out, np.int64(n), np.int64(row_bytes), bounds,
                                        np.int32(variant.lanes), err, np.uint64(stamp))
        _run(device_id, rowvec_kernel_name(variant.width, index.element_size()), n * variant.lanes, args,
             stream_ptr)
        return
    if variant.kernel not in ("naive", "aligned"):
        raise ValueError(f"the CuPy backend launches rowvec, naive and aligned kernels, not {variant.kernel!r}")
    aligned = variant.kernel == "aligned"
    unit = 16 if aligned and legal_width(row_bytes, src_ptr, out_ptr) == 16 else elem_bytes
    row_elems = row_bytes // unit
    args = (src, ids, pos, out, np.int64(n), np.int64(row_elems), bounds, err, np.uint64(stamp), _NULL, _NULL)
    _run(device_id, kernel_name(aligned, unit, index.element_size()), n * (WARP if aligned else row_elems), args,
         stream_ptr)


def launch_decode(*, device_id: int, codes_ptr: int, n_rows: int, code_row_bytes: int, dim: int, codec_id: int,
                  out_id: int, index: torch.Tensor, out_ptr: int, err_ptr: int, stamp: int, stream_ptr: int) -> None:
    """Start the decoding gather ``out[i] = decode(codes[index[i]])`` (``gather_decode`` of gather.cu) on
    ``stream_ptr``: a warp per row; no host sync, no event; an id out of ``[0, n_rows)`` is clamped and stores
    ``stamp`` into the error word at ``err_ptr`` (0: none).  ``codec_id`` and ``out_id`` number the codec and the
    output dtype as :mod:`directload.kernels.decode_cpu` does; ``codes_ptr`` addresses device or mapped host
    memory, ``out_ptr`` a contiguous ``[len(index), dim]`` output on the device; ``index`` contiguous CUDA
    int32/int64."""
    n = index.shape[0]
    if n == 0 or dim == 0:
        return
    args = (np.uint64(codes_ptr), np.uint64(index.data_ptr()), np.uint64(out_ptr), np.int64(n),
            np.int64(code_row_bytes), np.int64(dim), np.int64(n_rows), np.uint64(err_ptr), np.uint64(stamp))
    _run(device_id, decode_kernel_name(codec_id, out_id, index.element_size()), n * WARP, args, stream_ptr)


def launch_check_clamp(*, device_id: int, index: torch.Tensor, clamped: torch.Tensor, n_rows: int, err_ptr: int,
                       stamp: int, stream_ptr: int) -> None:
    """Start ``clamped[i] = min(max(index[i], 0), n_rows - 1)`` on ``stream_ptr``, a bad id storing ``stamp`` into
    the error word at ``err_ptr`` (0: none): the ids ``torch.index_select`` may then read.

    ``index`` and ``clamped`` are contiguous CUDA tensors of one dtype, int32 or int64.
    """
    n = index.shape[0]
    if n == 0:
        return
    args = (np.uint64(index.data_ptr()), np.uint64(clamped.data_ptr()), np.int64(n), np.int64(n_rows),
            np.uint64(err_ptr), np.uint64(stamp))
    _run(device_id, check_clamp_kernel_name(index.element_size()), n, args, stream_ptr)


def launch(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, *, aligned: bool = True, stream: int = 0) -> int:
    """The backends' shared launch (see ``kernels.registry``) on CuPy: ``out[i] = src[index[i]]``.

    Same operands as ``kernels.numba_cuda.launch``: torch tensors, ``src`` in
    device or GPU-mapped host memory, ``index`` range-checked, ``stream`` a
    ``cudaStream_t``.  Returns -1.
    """
    check_launch(src, index, out)
    index = index.contiguous()
    launch_variant(_ALIGNED if aligned else _NAIVE, device_id=index.device.index, src_ptr=src.data_ptr(),
                   n_rows=src.shape[0], row_bytes=src.element_size() * src.shape[1], elem_bytes=src.element_size(),
                   index=index, positions=None, out_ptr=out.data_ptr(), err_ptr=0, stamp=0, stream_ptr=stream)
    return -1


def gather_rows(src: cupy.ndarray, idx: cupy.ndarray, out: cupy.ndarray, *, aligned: bool = True,
                stream_ptr: int = 0) -> None:
    """:func:`launch` on CuPy arrays: ``src`` ``[rows, row_elems]`` (device or mapped host memory), ``idx`` 1-D
    int32/int64 in range, ``out`` ``[len(idx), row_elems]``, all C-contiguous on the current device."""
    n = idx.shape[0]
    if n == 0 or out.shape[1] == 0:
        return
    row_elems = out.shape[1]
    args = (np.uint64(src.data.ptr), np.uint64(idx.data.ptr), _NULL, np.uint64(out.data.ptr), np.int64(n),
            np.int64(row_elems), np.int64(src.shape[0]), _NULL, _NULL, _NULL, _NULL)
    _run(out.device.id, kernel_name(aligned, src.itemsize, idx.itemsize), n * (WARP if aligned else row_elems),
         args, stream_ptr)


def gather_tiered_rows(cache_ptr: int, flat_ptr: int, where: torch.Tensor, out: torch.Tensor, *, aligned: bool = True,
                       stream_ptr: int = 0) -> None:
    """Start ``gather_tiered_aligned``/``gather_tiered_naive`` (see ``kernels.tiered``) on ``stream_ptr``.

    ``cache_ptr``/``flat_ptr`` address the tiers (one bit-carrier element size, that of ``out``), ``where`` is a
    contiguous CUDA int64 tensor already checked, ``out`` a contiguous CUDA ``[len(where), row_elems]`` tensor.
    """
    n, row_elems = out.shape
    if n == 0 or row_elems == 0:
        return
    args = (np.uint64(cache_ptr), np.uint64(flat_ptr), np.uint64(where.data_ptr()), np.uint64(out.data_ptr()),
            np.int64(n), np.int64(row_elems))
    _run(out.device.index, tiered_kernel_name(aligned, out.element_size()), n * (WARP if aligned else row_elems),
         args, stream_ptr)


def launch_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, out: torch.Tensor, *,
                  aligned: bool = True, stream: int = 0) -> None:
    """The backends' shared tiered launch (see ``kernels.registry``) on CuPy: torch tensors,
    ``cache`` in device or mapped memory, ``flat`` mapped, ``where`` checked, ``stream`` a ``cudaStream_t``."""
    gather_tiered_rows(cache.data_ptr(), flat.data_ptr(), where.contiguous(), out, aligned=aligned,
                       stream_ptr=stream)

"""CuPy backend: the CUDA C kernels of kernels/cuda/gather.cu, loaded through ``cupy.RawModule``."""

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from .indexing import BLOCK, WARP, launch_grid
from .interop import cuda_array
from .nvrtc import compile_gather, kernel_name, tiered_kernel_name
from .operands import check_launch
from .sources import CUDA_DIR, cache_dir

__all__ = ["launch", "launch_tiered", "kernel", "tiered_kernel", "gather_rows", "gather_tiered_rows"]

_NULL = np.uint64(0)  # trace pointers: off


@functools.cache
def kernel(device_id, aligned, elem_bytes, index_bytes):
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
def tiered_kernel(device_id, aligned, elem_bytes):
    """The compiled tiered-gather kernel of one specialisation on one device (memoized, as :func:`kernel`)."""
    return _function(device_id, tiered_kernel_name(aligned, elem_bytes))


def _function(device_id, name):
    import cupy

    with cupy.cuda.Device(device_id) as dev:
        major, minor = dev.compute_capability[:-1], dev.compute_capability[-1]
        arch = f"sm_{major}{minor}"
        digest = hashlib.sha256((CUDA_DIR / "gather.cu").read_bytes() + name.encode() + arch.encode())
        path = cache_dir() / "cubin" / f"{digest.hexdigest()[:20]}.cubin"
        lowered_path = path.with_suffix(".name")
        if not path.exists():
            res = compile_gather(arch, [name])
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(f"{path}.{os.getpid()}")
            tmp.write_bytes(res.image)
            lowered_path.write_text(res.lowered[name])
            os.replace(tmp, path)
        module = cupy.RawModule(path=str(path))
        return module.get_function(lowered_path.read_text())


def gather_rows(src, idx, out, *, aligned=True, stream_ptr=0, grid=None, block=BLOCK):
    """Launch ``gather_naive``/``gather_aligned`` on ``stream_ptr``: ``out[i] = src[idx[i]]``.

    Parameters
    ----------
    src, idx, out : cupy.ndarray
        ``src`` ``[rows, row_elems]`` (device or mapped host memory), ``idx``
        1-D int32/int64 in range, ``out`` ``[len(idx), row_elems]``; all C-contiguous
        and on the current device.
    aligned : bool
        Which kernel.
    stream_ptr : int
        ``cudaStream_t`` to launch on (torch's current stream, say); no sync.
    grid, block : int, optional
        Launch geometry.
    """
    import cupy

    row_elems = out.shape[1]
    work = idx.shape[0] * (WARP if aligned else row_elems)
    fn = kernel(src.device.id, aligned, src.itemsize, idx.itemsize)
    blocks = grid or launch_grid(work, block)
    with cupy.cuda.ExternalStream(stream_ptr):
        fn((blocks,), (block,), (src, idx, out, cupy.int64(idx.shape[0]), cupy.int64(row_elems), _NULL, _NULL))


def launch(src, index, out, *, aligned=True, stream=0):
    """The backends' shared launch (see ``kernels.cpu.launch``) on CuPy: ``out[i] = src[index[i]]``.

    Same operands as ``kernels.numba_cuda.launch``: torch tensors, ``src`` in
    device or GPU-mapped host memory, ``index`` range-checked, ``stream`` a
    ``cudaStream_t``.  Returns -1.
    """
    check_launch(src, index, out)
    import cupy

    gather_rows(cupy.asarray(cuda_array(src)), cupy.asarray(index), cupy.asarray(out), aligned=aligned,
                stream_ptr=stream)
    return -1


def gather_tiered_rows(cache, flat, where, out, *, aligned=True, stream_ptr=0, grid=None, block=BLOCK):
    """Launch ``gather_tiered_aligned``/``gather_tiered_naive`` (see ``kernels.tiered``) on ``stream_ptr``.

    ``cache`` and ``flat`` are 1-D cupy arrays of one bit-carrier dtype,
    ``where`` 1-D int64 already checked, ``out`` ``[len(where), row_elems]``.
    """
    import cupy

    n, row_elems = out.shape
    fn = tiered_kernel(out.device.id, aligned, out.itemsize)
    blocks = grid or launch_grid(n * (WARP if aligned else row_elems), block)
    with cupy.cuda.ExternalStream(stream_ptr):
        fn((blocks,), (block,), (cache, flat, where, out, cupy.int64(n), cupy.int64(row_elems)))


def launch_tiered(cache, flat, where, out, *, aligned=True, stream=0):
    """The backends' shared tiered launch (see ``kernels.tiered.launch_tiered``) on CuPy: torch tensors,
    ``cache`` in device or mapped memory, ``flat`` mapped, ``where`` checked, ``stream`` a ``cudaStream_t``."""
    import cupy

    gather_tiered_rows(cupy.asarray(cuda_array(cache)), cupy.asarray(cuda_array(flat)), cupy.asarray(where),
                       cupy.asarray(out), aligned=aligned, stream_ptr=stream)

"""Host-emulation build: compiles kernels/cuda/gather.cu with g++ and runs its kernels on the CPU."""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .indexing import BLOCK
from .sources import CUDA_DIR, cache_dir

__all__ = ["CUDA_DIR", "EmulationError", "library", "launch", "launch_tiered", "aligned_mirror", "tier_row_mirror"]

_SOURCES = ("gather.cu", "cuda_shim.h", "emu_launch.cpp")


class EmulationError(RuntimeError):
    """The host-emulation build could not be compiled or run."""


def _cache_dir():
    return cache_dir() / "emu"


@functools.cache
def library():
    """Build (once per source hash) and load the emulation library.

    Returns
    -------
    ctypes.CDLL

    Raises
    ------
    EmulationError
        When no C++ compiler is found or the build fails (its log is attached).
    """
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if cxx is None:
        raise EmulationError("no C++ compiler: install g++ or set CXX to run the host emulation")
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((CUDA_DIR / name).read_bytes())
    digest.update(cxx.encode())
    target = _cache_dir() / f"gather_emu_{digest.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            cmd = [cxx, "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                   "-o", str(out), str(CUDA_DIR / "emu_launch.cpp")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise EmulationError(f"host-emulation build failed:\n{proc.stderr}")
            os.replace(out, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    lib.dl_emu_gather.restype = ctypes.c_int
    lib.dl_emu_gather.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                  ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p,
                                  ctypes.c_void_p]
    lib.dl_emu_gather_tiered.restype = ctypes.c_int
    lib.dl_emu_gather_tiered.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong,
                                         ctypes.c_longlong]
    lib.dl_emu_tier_row.restype = None
    lib.dl_emu_tier_row.argtypes = [ctypes.c_longlong] * 5 + [ctypes.c_void_p]
    lib.dl_emu_aligned.restype = None
    lib.dl_emu_aligned.argtypes = [ctypes.c_longlong] * 7 + [ctypes.c_void_p]
    return lib


def launch(src, idx, out, *, aligned, grid, block=BLOCK, trace=False):
    """Run ``gather_naive`` or ``gather_aligned`` from gather.cu on the CPU.

    Parameters
    ----------
    src : numpy.ndarray
        ``[rows, row_elems]`` C-contiguous table of 1-, 2-, 4- or 8-byte elements,
        or 16-byte units (any 16-byte dtype; runs the ``uint4`` specialisation).
    idx : numpy.ndarray
        1-D int32 or int64 rows to gather (not bounds-checked here).
    out : numpy.ndarray
        ``[len(idx), row_elems]`` C-contiguous output, same dtype as ``src``.
    aligned : bool
        Which kernel.
    grid, block : int
        Launch geometry, as on a GPU.
    trace : bool
        Also return which flat thread and step wrote each output element.

    Returns
    -------
    None or (numpy.ndarray, numpy.ndarray)
        With ``trace``, int64 thread ids and int32 steps, one per output element.

    Examples
    --------
    >>> import numpy as np
    >>> src = np.arange(12, dtype=np.float32).reshape(4, 3)
    >>> out = np.empty((2, 3), np.float32)
    >>> launch(src, np.array([3, 1]), out, aligned=True, grid=1)
    >>> out[0].tolist()
    [9.0, 10.0, 11.0]
    """
    for name, a in (("src", src), ("idx", idx), ("out", out)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    row_elems = int(np.prod(src.shape[1:], dtype=np.int64))
    tid = step = None
    if trace:
        tid = np.full(out.size, -1, np.int64)
        step = np.full(out.size, -1, np.int32)
    rc = library().dl_emu_gather(
        int(aligned), src.itemsize, idx.itemsize, grid, block, src.ctypes.data, idx.ctypes.data,
        out.ctypes.data, idx.shape[0], row_elems,
        None if tid is None else tid.ctypes.data, None if step is None else step.ctypes.data)
    if rc != 0:
        raise EmulationError(f"dl_emu_gather returned {rc} (element {src.itemsize} B, index {idx.itemsize} B)")
    return (tid, step) if trace else None


def launch_tiered(cache, flat, where, out, *, aligned=True, stream=0, grid=1, block=BLOCK):
    """Run ``gather_tiered_naive``/``gather_tiered_aligned`` from gather.cu on the CPU.

    ``cache`` and ``flat`` are 1-D C-contiguous arrays of one 1/2/4/8-byte
    dtype (the aligned kernel takes each tier's line offset from its address,
    as on a GPU), ``where`` 1-D int64 (not checked here), ``out``
    ``[len(where), row_elems]``.  The backends' tiered signature, plus the launch shape (``stream`` means
    nothing here).
    """
    for name, a in (("cache", cache), ("flat", flat), ("where", where), ("out", out)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    rc = library().dl_emu_gather_tiered(int(aligned), out.itemsize, grid, block, cache.ctypes.data,
                                        flat.ctypes.data, where.ctypes.data, out.ctypes.data, where.shape[0],
                                        out.shape[1])
    if rc != 0:
        raise EmulationError(f"dl_emu_gather_tiered returned {rc} (element {out.itemsize} B)")


def tier_row_mirror(where, row_elems, elem, cache_mod, flat_mod):
    """The C++ ``dl_tier_row`` for one input: ``(tier, first, row_addr)``."""
    res = np.zeros(3, np.int64)
    library().dl_emu_tier_row(where, row_elems, elem, cache_mod, flat_mod, res.ctypes.data)
    return tuple(int(v) for v in res)


def aligned_mirror(lane, step, row_addr, row_bytes, elem, warp, line):
    """gather.cu's ``dl_aligned_geometry`` + ``dl_aligned_span`` for one input.

    Returns
    -------
    tuple of int
        ``(base, first, last, steps, wrap, lo, hi)``, comparable with
        :func:`kernels.indexing.aligned_geometry` and ``aligned_span``.
    """
    res = (ctypes.c_longlong * 7)()
    library().dl_emu_aligned(lane, step, row_addr, row_bytes, elem, warp, line, res)
    return tuple(res)

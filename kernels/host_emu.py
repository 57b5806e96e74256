"""Host-emulation build: compiles kernels/cuda/gather.cu and sample.cu with g++ and runs their kernels on the CPU."""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from directload.errors import DirectloadError

from .indexing import BLOCK
from .sources import CUDA_DIR, cache_dir

__all__ = ["CUDA_DIR", "LOCK", "EmulationError", "AccessCounts", "library", "launch", "launch_rowvec",
           "launch_check_clamp", "launch_tiered", "launch_decode", "counters", "reset_counters", "probe",
           "aligned_mirror",
           "tier_row_mirror"]

_SOURCES = ("gather.cu", "sample.cu", "cuda_shim.h", "emu_launch.cpp", "emu_sample.cpp")
_MAINS = ("emu_launch.cpp", "emu_sample.cpp")
#: The emulated launch state (thread indices, fences, counters) is global to the library: one launch at a time.
LOCK = threading.Lock()


class EmulationError(DirectloadError, RuntimeError):
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
                   "-o", str(out), *(str(CUDA_DIR / m) for m in _MAINS)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise EmulationError(f"host-emulation build failed:\n{proc.stderr}")
            os.replace(out, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    ptr, i64, u64, uint = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_uint
    lib.dl_emu_gather.restype = ctypes.c_int
    lib.dl_emu_gather.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, uint, uint, ptr, i64, ptr, ptr, ptr, i64,
                                  i64, i64, i64, ptr, u64, ptr, ptr]
    lib.dl_emu_rowvec.restype = ctypes.c_int
    lib.dl_emu_rowvec.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, uint, uint, ptr, i64, ptr, ptr, ptr, i64,
                                  i64, i64, i64, ptr, u64]
    lib.dl_emu_check_clamp.restype = ctypes.c_int
    lib.dl_emu_check_clamp.argtypes = [ctypes.c_int, uint, uint, ptr, ptr, i64, i64, ptr, u64]
    lib.dl_emu_counters.restype = None
    lib.dl_emu_counters.argtypes = [ptr]
    lib.dl_emu_reset_counters.restype = None
    lib.dl_emu_reset_counters.argtypes = []
    lib.dl_emu_probe.restype = ctypes.c_int
    lib.dl_emu_probe.argtypes = [ptr, ctypes.c_int, ctypes.c_int]
    lib.dl_emu_gather_tiered.restype = ctypes.c_int
    lib.dl_emu_gather_tiered.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong,
                                         ctypes.c_longlong]
    lib.dl_emu_tier_row.restype = None
    lib.dl_emu_tier_row.argtypes = [ctypes.c_longlong] * 5 + [ctypes.c_void_p]
    lib.dl_emu_decode.restype = ctypes.c_int
    lib.dl_emu_decode.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, uint, uint, ptr, i64, ptr, ptr, i64, i64,
                                  i64, i64, i64, ptr, u64]
    lib.dl_emu_aligned.restype = None
    lib.dl_emu_aligned.argtypes = [ctypes.c_longlong] * 7 + [ctypes.c_void_p]
    return lib


def _pointer(a):
    """The address of an optional array, or None (a null pointer)."""
    return None if a is None else a.ctypes.data


def _check_contiguous(**arrays):
    for name, a in arrays.items():
        if a is not None and not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")


def _row_bytes(a):
    return a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


def _check_rows(src, idx, out, pos, err):
    """Shapes shared by the row gathers: ``out`` holds ``len(idx)`` rows of ``src``'s size."""
    if idx.ndim != 1 or idx.itemsize not in (4, 8) or idx.dtype.kind not in "iu":
        raise ValueError(f"idx must be 1-D int32 or int64, got {idx.dtype} of shape {idx.shape}")
    if out.shape[0] != idx.shape[0] or _row_bytes(out) != _row_bytes(src):
        raise ValueError(f"out must hold {idx.shape[0]} rows of {_row_bytes(src)} bytes, got shape {out.shape} "
                         f"of {out.dtype}")
    if pos is not None and (pos.dtype != np.int64 or pos.shape != idx.shape):
        raise ValueError(f"pos must be int64 of shape {idx.shape}, got {pos.dtype} of shape {pos.shape}")
    if err is not None and (err.dtype != np.uint64 or err.size < 1):
        raise ValueError("err must be a uint64 array of at least one word")


def launch(src, idx, out, *, aligned, grid, block=BLOCK, trace=False, pos=None, n_rows=None, err=None, stamp=0):
    """Run ``gather_naive`` or ``gather_aligned`` from gather.cu on the CPU.

    Parameters
    ----------
    src : numpy.ndarray
        ``[rows, row_elems]`` C-contiguous table of 1-, 2-, 4- or 8-byte elements,
        or 16-byte units (any 16-byte dtype; runs the ``uint4`` specialisation).
    idx : numpy.ndarray
        1-D int32 or int64 rows to gather (sorted ids when ``pos`` is given).
    out : numpy.ndarray
        ``[len(idx), row_elems]`` C-contiguous output, same dtype as ``src``.
    aligned : bool
        Which kernel.
    grid, block : int
        Launch geometry, as on a GPU (``grid * block < 2**32``).
    trace : bool
        Also return which flat thread and step wrote each output element.
    pos : numpy.ndarray, optional
        int64 output row of each id (the sorted variant: ``out[pos[i]] = src[idx[i]]``).
    n_rows : int, optional
        Rows the kernel may read (the bounds contract); ``len(src)`` by default.
    err : numpy.ndarray, optional
        A uint64 word that a bad id sets to ``stamp`` (such an id is clamped into ``[0, n_rows)``).
    stamp : int
        The value a bad id stores into ``err``.

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
    _check_contiguous(src=src, idx=idx, out=out, pos=pos)
    _check_rows(src, idx, out, pos, err)
    if grid * block >= 1 << 32:
        raise ValueError(f"grid * block must stay under 2**32 threads, got {grid} * {block}")
    row_elems = int(np.prod(src.shape[1:], dtype=np.int64))
    tid = step = None
    if trace:
        tid = np.full(out.size, -1, np.int64)
        step = np.full(out.size, -1, np.int32)
    with LOCK:
        rc = library().dl_emu_gather(
            int(aligned), src.itemsize, idx.itemsize, grid, block, src.ctypes.data, src.nbytes, idx.ctypes.data,
            _pointer(pos), out.ctypes.data, out.nbytes, idx.shape[0], row_elems,
            src.shape[0] if n_rows is None else n_rows, _pointer(err), stamp, _pointer(tid), _pointer(step))
    if rc != 0:
        raise EmulationError(f"dl_emu_gather returned {rc} (element {src.itemsize} B, index {idx.itemsize} B)")
    return (tid, step) if trace else None


def launch_rowvec(src, idx, out, *, width, lanes, grid, block=BLOCK, pos=None, n_rows=None, err=None, stamp=0):
    """Run ``gather_rowvec<I, width>`` from gather.cu on the CPU: ``out[pos[i] or i] = src[idx[i]]``, bytewise.

    Parameters
    ----------
    src, out : numpy.ndarray
        C-contiguous tables of any dtype whose rows have the same number of bytes; ``out`` has
        ``len(idx)`` rows.  Their addresses fix the head, tail and store widths, as on a GPU.
    idx : numpy.ndarray
        1-D int32 or int64 ids (sorted ids when ``pos`` is given).
    width : {16, 8, 4, 2, 1}
        Load width in bytes.
    lanes : int
        Lanes per row: a power of two from 1 to 32 that divides ``block``.
    grid, block : int
        Launch geometry.
    pos, n_rows, err, stamp
        As in :func:`launch`.

    Examples
    --------
    >>> import numpy as np
    >>> src = np.arange(20, dtype=np.uint8).reshape(4, 5)
    >>> out = np.zeros((2, 5), np.uint8)
    >>> launch_rowvec(src, np.array([3, 0], np.int32), out, width=16, lanes=4, grid=1, block=32)
    >>> out.tolist()
    [[15, 16, 17, 18, 19], [0, 1, 2, 3, 4]]
    """
    _check_contiguous(src=src, idx=idx, out=out, pos=pos)
    _check_rows(src, idx, out, pos, err)
    with LOCK:
        rc = library().dl_emu_rowvec(
            width, idx.itemsize, lanes, grid, block, src.ctypes.data, src.nbytes, idx.ctypes.data, _pointer(pos),
            out.ctypes.data, out.nbytes, idx.shape[0], _row_bytes(src), src.shape[0] if n_rows is None else n_rows,
            _pointer(err), stamp)
    if rc == -3:
        raise ValueError(f"lanes must be a power of two from 1 to 32 dividing the block ({block}), got {lanes}")
    if rc != 0:
        raise EmulationError(f"dl_emu_rowvec returned {rc} (width {width} B, index {idx.itemsize} B)")


def launch_check_clamp(idx, clamped, n_rows, *, grid=1, block=BLOCK, err=None, stamp=0):
    """Run ``check_clamp<I>`` from gather.cu on the CPU: ``clamped = clip(idx, 0, n_rows - 1)``, a bad id
    setting ``err[0] = stamp``.

    >>> import numpy as np
    >>> clamped, err = np.empty(3, np.int64), np.zeros(1, np.uint64)
    >>> launch_check_clamp(np.array([5, -1, 2]), clamped, 4, err=err, stamp=7)
    >>> clamped.tolist(), int(err[0])
    ([3, 0, 2], 7)
    """
    _check_contiguous(idx=idx, clamped=clamped)
    if clamped.dtype != idx.dtype or clamped.shape != idx.shape:
        raise ValueError(f"clamped must match idx ({idx.dtype}, {idx.shape}), got {clamped.dtype}, {clamped.shape}")
    with LOCK:
        rc = library().dl_emu_check_clamp(idx.itemsize, grid, block, idx.ctypes.data, clamped.ctypes.data,
                                          idx.shape[0], n_rows, _pointer(err), stamp)
    if rc != 0:
        raise EmulationError(f"dl_emu_check_clamp returned {rc} (index {idx.itemsize} B)")


def launch_decode(codes, idx, out, *, codec, grid, block=BLOCK, n_rows=None, err=None, stamp=0):
    """Run ``gather_decode<codec, out, I>`` from gather.cu on the CPU: ``out[i] = decode(codes[idx[i]])``.

    ``codes`` is a C-contiguous 2-D array of ``codec``'s code rows (uint8 rows for ``"int8"``, 16-bit rows for
    the half codecs), ``idx`` 1-D int32/int64, ``out`` ``[len(idx), dim]``: float32, or the 16-bit bits of
    float16 or bfloat16 output, which ``codec`` then names after an arrow (``"int8->bfloat16"``; NumPy has no
    bfloat16).  ``n_rows``, ``err`` and ``stamp`` as in :func:`launch`.

    >>> import numpy as np
    >>> codes = np.array([[0, 255, 0, 0, 128, 59, 0, 0, 128, 63]], np.uint8)  # scale 1/255, offset 1
    >>> out = np.empty((1, 2), np.float32)
    >>> launch_decode(codes, np.array([0]), out, codec="int8", grid=1)
    >>> out.tolist()
    [[1.0, 2.0]]
    """
    from .decode_cpu import CODEC_IDS, OUT_IDS  # the kernels' numbering

    name, _, out_name = codec.partition("->")
    out_name = out_name or ("float32" if out.dtype == np.float32 else "float16")
    _check_contiguous(codes=codes, idx=idx, out=out)
    if name not in CODEC_IDS or out_name not in OUT_IDS:
        raise ValueError(f"codec must be one of {sorted(CODEC_IDS)}, optionally '->float16' or '->bfloat16'")
    dim = codes.shape[1] * codes.itemsize - 8 if name == "int8" else codes.shape[1]
    if idx.ndim != 1 or out.shape != (idx.shape[0], dim) or out.itemsize != (4 if out_name == "float32" else 2):
        raise ValueError(f"out must be [{idx.shape[0]}, {dim}] of {out_name}, got {out.dtype} of shape {out.shape}")
    with LOCK:
        rc = library().dl_emu_decode(CODEC_IDS[name], OUT_IDS[out_name], idx.itemsize, grid, block, codes.ctypes.data,
                                     codes.nbytes, idx.ctypes.data, out.ctypes.data, out.nbytes, idx.shape[0],
                                     codes.shape[1] * codes.itemsize, dim,
                                     codes.shape[0] if n_rows is None else n_rows, _pointer(err), stamp)
    if rc != 0:
        raise EmulationError(f"dl_emu_decode returned {rc} (codec {codec}, index {idx.itemsize} B)")


@dataclass(frozen=True)
class AccessCounts:
    """What the emulation's checked loads and stores saw since the last :func:`reset_counters`.

    Attributes
    ----------
    misaligned : int
        Accesses at an address that is not a multiple of their width (a GPU faults on them).
    stray_loads, stray_stores : int
        Accesses outside the launch's table (loads) or output (stores); they were skipped.
    """

    misaligned: int
    stray_loads: int
    stray_stores: int


def counters():
    """The access counters (see :class:`AccessCounts`).

    >>> reset_counters(); counters()
    AccessCounts(misaligned=0, stray_loads=0, stray_stores=0)
    """
    res = (ctypes.c_longlong * 3)()
    library().dl_emu_counters(res)
    return AccessCounts(*res)


def reset_counters():
    """Zero the access counters."""
    library().dl_emu_reset_counters()


def probe(buf, offset, width, *, store=False):
    """One checked load (or store of zeros) of ``width`` bytes at byte ``offset`` of ``buf``, as a kernel's.

    Shows that the counters catch what x86 allows: ``probe(buf, 1, 16)`` counts one misaligned access.
    """
    _check_contiguous(buf=buf)
    if not 0 <= offset <= buf.nbytes - width:
        raise ValueError(f"{width} bytes at offset {offset} do not fit a buffer of {buf.nbytes}")
    with LOCK:
        rc = library().dl_emu_probe(buf.ctypes.data + offset, width, int(store))
    if rc != 0:
        raise ValueError(f"width must be 1, 2, 4, 8 or 16 bytes, got {width}")


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
    with LOCK:
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

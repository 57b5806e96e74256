"""The decoding gather in Numba CUDA: ``out[i] = decode(codes[index[i]])``, for the CUDA simulator, the offline PTX
check, and GPUs without CuPy.

One thread per output feature, the grid striding over them; the codes are read as bytes (an int8 row's scale and
offset assembled from its tail, at any alignment), the output written as its bits (uint32 for float32, uint16 for
float16 and bfloat16).  The arithmetic is the reference decode's, bit for bit, as in the CPU and CUDA C kernels:
``code * scale`` and then ``+ offset``, each rounded once (libdevice's ``fmul_rn``/``fadd_rn``: NVVM would
otherwise contract them into one fused multiply-add); half floats convert by :mod:`directload.kernels.half_bits`.
Under ``NUMBA_ENABLE_CUDASIM=1`` the bit casts and the arithmetic are NumPy's (libdevice has no simulator).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from numba import config, cuda, types
from numba.core.extending import register_jitable
from numba.np.numpy_support import from_dtype

from . import half_bits
from .cpu_kernels import specialise
from .numba_kernels import checked_row, compile_offline

if TYPE_CHECKING:
    from numba.cuda.dispatcher import CUDADispatcher

__all__ = ["decode_kernel", "decode_signature", "decode_ptx", "OUT_BITS"]

#: Output dtype number (:data:`directload.kernels.decode_cpu.OUT_IDS`) -> the dtype of its bits.
OUT_BITS = {0: np.dtype(np.uint32), 1: np.dtype(np.uint16), 2: np.dtype(np.uint16)}

if config.ENABLE_CUDASIM:
    _as_float, _float_bits = half_bits.as_float, half_bits.float_bits

    def _mul(a, b):
        return np.float32(np.float32(a) * np.float32(b))

    def _add(a, b):
        return np.float32(np.float32(a) + np.float32(b))
else:
    from numba.cuda import libdevice

    @register_jitable
    def _as_float(bits):
        return libdevice.int_as_float(np.int32(bits))

    @register_jitable
    def _float_bits(value):
        return np.uint32(libdevice.float_as_int(np.float32(value)))

    @register_jitable
    def _mul(a, b):
        return libdevice.fmul_rn(np.float32(a), np.float32(b))

    @register_jitable
    def _add(a, b):
        return libdevice.fadd_rn(np.float32(a), np.float32(b))


def _device(fn):
    return register_jitable(specialise(fn, "cuda", as_float=_as_float, float_bits=_float_bits))


_half_to_float = _device(half_bits.half_to_float)
_bfloat_to_float = _device(half_bits.bfloat_to_float)
_float_to_half = _device(half_bits.float_to_half)
_float_to_bfloat = _device(half_bits.float_to_bfloat)


@register_jitable
def _word(codes, row, at):
    """The little-endian uint32 at byte ``at`` of ``codes[row]``."""
    return (np.uint32(codes[row, at]) | (np.uint32(codes[row, at + 1]) << np.uint32(8))
            | (np.uint32(codes[row, at + 2]) << np.uint32(16)) | (np.uint32(codes[row, at + 3]) << np.uint32(24)))


@functools.cache
def decode_kernel(codec_id: int, out_id: int) -> CUDADispatcher:
    """The decoding gather's kernel for one codec and output dtype (numbered as in
    :mod:`directload.kernels.decode_cpu`): ``kernel(codes, idx, out, dim, n_rows, err, stamp)`` over ``codes`` as
    2-D uint8 (the code rows' bytes), ``idx`` int32/int64, ``out`` ``[len(idx), dim]`` of :data:`OUT_BITS`, ``err``
    a uint64 word (or an empty array: no flagging) that an id out of ``[0, n_rows)`` sets to ``stamp`` (the id is
    clamped first)."""
    int8, copy = codec_id == 2, (codec_id, out_id) in ((0, 1), (1, 2))

    def gather_decode(codes, idx, out, dim, n_rows, err, stamp):
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        total = idx.shape[0] * dim
        while k < total:
            i = k // dim
            c = k - i * dim
            row = checked_row(idx[i], n_rows, err, stamp)
            if int8:
                scale = _as_float(_word(codes, row, dim))
                offset = _as_float(_word(codes, row, dim + 4))
                x = _add(_mul(np.float32(codes[row, c]), scale), offset)
            else:
                h = np.uint32(codes[row, 2 * c]) | (np.uint32(codes[row, 2 * c + 1]) << np.uint32(8))
                x = _bfloat_to_float(h) if codec_id == 1 else _half_to_float(h)
            if copy:
                out[i, c] = h
            elif out_id == 0:
                out[i, c] = _float_bits(x)
            elif out_id == 1:
                out[i, c] = _float_to_half(x)
            else:
                out[i, c] = _float_to_bfloat(x)
            k += stride

    return cuda.jit(gather_decode)


def decode_signature(codec_id: int, out_id: int, index_bytes: int) -> tuple[types.Type, ...]:
    """The Numba argument types of :func:`decode_kernel`'s kernel, in launch order."""
    def arr(dtype, ndim):
        return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")

    return (arr(np.uint8, 2), arr({4: np.int32, 8: np.int64}[index_bytes], 1), arr(OUT_BITS[out_id], 2),
            types.int64, types.int64, arr(np.uint64, 1), types.uint64)


def decode_ptx(codec_id: int, out_id: int, index_bytes: int, cc: tuple[int, int] = (9, 0)) -> str:
    """PTX of one decoding gather for compute capability ``cc``, compiled with no GPU."""
    return compile_offline(decode_kernel(codec_id, out_id).py_func, decode_signature(codec_id, out_id, index_bytes),
                           cc)

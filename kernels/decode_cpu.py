"""The CPU kernels of the decoding gather: ``out[i] = decode(codes[index[i]])``, compiled by Numba, run on torch's
thread team.

One team body per (codec, output dtype, index size), as the plain gather's
(:func:`directload.kernels.cpu_kernels.team_kernel`): every part checks its share of the index, a barrier,
then each part decodes whole rows of its share straight into ``out``.  A row is read once, whole: an int8 row's
scale and offset sit after its codes.  The arithmetic is the reference decode's
(:meth:`directload.codecs.Codec.decode`, in torch), bit for bit:

* int8 rowwise: ``float32(code) * scale``, rounded, then ``+ offset``, rounded (two roundings, never a fused
  multiply-add, as torch's two ops);
* float16 to float32 exactly; float32 to float16 and bfloat16 rounded to nearest even, as torch's ``.to()``
  (NaN stays NaN, beyond 65504 becomes an infinity in float16).

Numba has no float16 on the CPU, so half floats move as their uint16 bits: float16 converts by LLVM's own
``fpext``/``fptrunc`` (:mod:`directload.kernels.intrinsics`), bfloat16 in integer arithmetic
(:mod:`directload.kernels.half_bits`, compiled here with LLVM bit casts).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray, cfunc, njit, types

from . import half_bits
from .cpu_kernels import FLAGS, PREFETCH_LINES, prefetch_ahead, specialise, team_check
from .intrinsics import bits_of_float, float_from_bits, float_from_half_bits, half_bits_of_float, pointer

__all__ = ["CODEC_IDS", "OUT_IDS", "half_to_float", "bfloat_to_float", "float_to_half", "float_to_bfloat",
           "decode_team_kernel"]

#: Codec name -> its number in the kernels (the CUDA C kernels number them alike).
CODEC_IDS = {"float16": 0, "bfloat16": 1, "int8": 2}
#: Output dtype name -> its number in the kernels.
OUT_IDS = {"float32": 0, "float16": 1, "bfloat16": 2}
_TAIL = 8  # an int8 row's scale and offset, after its codes


def _cpu(fn, **more):
    """A copy of a :mod:`directload.kernels.half_bits` conversion on the CPU: LLVM bit casts, inlined."""
    return njit(inline="always")(specialise(fn, "cpu", as_float=float_from_bits, float_bits=bits_of_float, **more))


# float16 converts by LLVM's own fpext/fptrunc (F16C's one instruction, vectorised): the integer arithmetic of
# half_bits, which the simulator and GPUs without CuPy run, decoded float16 rows at 0.66-0.85x the float32 gather's
# rows/s here, against 1.1-1.5x for bfloat16 (measured).  Both are exact and tested against torch.
half_to_float = float_from_half_bits
float_to_half = half_bits_of_float
bfloat_to_float = _cpu(half_bits.bfloat_to_float)
float_to_bfloat = _cpu(half_bits.float_to_bfloat)


@njit(inline="always")
def _tail_float(codes, row, at):
    """The float32 stored little-endian at byte ``at`` of ``codes[row]`` (any alignment)."""
    bits = (np.uint32(codes[row, at]) | (np.uint32(codes[row, at + 1]) << np.uint32(8))
            | (np.uint32(codes[row, at + 2]) << np.uint32(16)) | (np.uint32(codes[row, at + 3]) << np.uint32(24)))
    return float_from_bits(bits)


# Compile-time constants of the team body and its two helpers below (plain functions: decode_team_kernel compiles a
# copy of each per specialisation, with these overridden).
CODEC, OUT, INDEX = 2, 0, np.int64
_CODE_DTYPE = {0: np.uint16, 1: np.uint16, 2: np.uint8}
_OUT_DTYPE = {0: np.float32, 1: np.uint16, 2: np.uint16}
CODES_T, OUT_T = np.uint8, np.float32
# The argument block's launch slots: the plain gather's layout (kernels.cpu_kernels.LAUNCH), codes for src.
_SRC, _ROWS, _ROW_ELEMS, _IDX, _N, _OUT = range(6)


def _decoded(codes, row, c, dim, scale, offset):
    """Feature ``c`` of code row ``row``, as a float32."""
    if CODEC == 2:
        return np.float32(np.float32(codes[row, c]) * scale) + offset
    if CODEC == 1:
        return bfloat_to_float(codes[row, c])
    return half_to_float(codes[row, c])


def _decode_rows(codes, idx, out, dim, lo, hi):
    # As the plain aligned kernel: each worker prefetches the row PREFETCH_ROWS ahead (random rows make the
    # gather latency-bound; without it int8 rows of 64-128 features decoded at 0.77-0.86x fp32's rows/s).
    lines = min((codes.shape[1] * codes.itemsize + 63) // 64, PREFETCH_LINES)
    scale = offset = np.float32(0.0)
    for i in range(lo, hi):
        prefetch_ahead(codes, idx, i, hi, lines)
        row = idx[i]
        if CODEC == 2:
            scale = _tail_float(codes, row, dim)
            offset = _tail_float(codes, row, dim + 4)
        if (CODEC == 0 and OUT == 1) or (CODEC == 1 and OUT == 2):
            for c in range(dim):  # the codes are the output's bits
                out[i, c] = codes[row, c]
        elif OUT == 0:
            for c in range(dim):
                out[i, c] = _decoded(codes, row, c, dim, scale, offset)
        elif OUT == 1:
            for c in range(dim):
                out[i, c] = float_to_half(_decoded(codes, row, c, dim, scale, offset))
        else:
            for c in range(dim):
                out[i, c] = float_to_bfloat(_decoded(codes, row, c, dim, scale, offset))


def _decode_team_body(data):
    a = carray(pointer(data), FLAGS, np.int64)
    row_elems = a[_ROW_ELEMS]
    dim = row_elems - _TAIL if CODEC == 2 else row_elems
    codes = carray(pointer(a[_SRC]), (a[_ROWS], row_elems), CODES_T)
    idx = carray(pointer(a[_IDX]), a[_N], INDEX)
    out = carray(pointer(a[_OUT]), (a[_N], dim), OUT_T)
    first, _, _, lo, hi = team_check(data, idx)
    if first >= 0:
        return
    _decode_rows(codes, idx, out, dim, lo, hi)


@functools.cache
def decode_team_kernel(codec_name: str, out_name: str, index_size: int) -> int:
    """The compiled decoding team body's address (a C ``void body(int64 block_address)``, the plain gather's
    block layout with the codes as ``src``), one per codec, output dtype and index size; compiled, or loaded
    from Numba's cache, on first use."""
    codec_id, out_id = CODEC_IDS[codec_name], OUT_IDS[out_name]
    name = f"{codec_name}_to_{out_name}_i{index_size}"
    constants = {"CODEC": codec_id, "OUT": out_id}
    decoded = njit(inline="always")(specialise(_decoded, name, **constants))
    rows = njit(inline="always")(specialise(_decode_rows, name, _decoded=decoded, **constants))
    fn = specialise(_decode_team_body, name, _decode_rows=rows, INDEX={4: np.int32, 8: np.int64}[index_size],
                     CODES_T=_CODE_DTYPE[codec_id], OUT_T=_OUT_DTYPE[out_id], **constants)
    return cfunc(types.void(types.intp), nopython=True, nogil=True, cache=True, boundscheck=False)(fn).address

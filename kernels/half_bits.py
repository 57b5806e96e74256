"""Half-float conversions in integer arithmetic, one source for the CPU and the Numba CUDA decoders.

Numba has no float16 on the CPU and the CUDA simulator runs device code as Python, so half floats move as their
uint16 bits.  These are plain functions over two bit casts, ``as_float(bits)`` (uint32 bits to the float32 they
spell) and ``float_bits(value)`` (a float32's bits as a uint32), which each target supplies with
:func:`directload.kernels.cpu_kernels.specialise`: LLVM bit casts on the CPU, libdevice's on a GPU, NumPy views
in the simulator.  Rounding is torch's ``.to()``: to nearest, ties to even; NaN stays NaN (its bits are the
CPU's: a GPU's torch may spell a NaN otherwise); beyond float16's range is an infinity.  Tests check them
against torch over every half and a spread of floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["half_to_float", "float_to_half", "float_to_bfloat", "bfloat_to_float", "as_float", "float_bits"]


def as_float(bits: Any) -> np.float32:
    """The float32 the uint32 ``bits`` spell (NumPy's view: what the simulator runs; targets replace it)."""
    return np.uint32(bits).view(np.float32)


def float_bits(value: Any) -> np.uint32:
    """The bits of ``value`` as a float32, a uint32 (NumPy's view; targets replace it)."""
    return np.float32(value).view(np.uint32)


def half_to_float(h: Any) -> np.float32:
    """The float32 a float16 of bits ``h`` (0 to 65535) holds, exactly (infinities and NaN included; a NaN made
    quiet, as x86's conversion and torch on the CPU make it).

    Branch-free (Fabian Giesen's ``half_to_float``, every case computed and one kept by masks), so the CPU
    compiler vectorises the decode of a row: with branches, float16 rows decoded at 0.5-0.8x the float32
    gather's rows/s (measured).  No operand is ever a float32 subnormal, so a flush-to-zero mode changes
    nothing."""
    u = np.uint32(h)
    o = (u & np.uint32(0x7FFF)) << np.uint32(13)  # exponent and mantissa, in float32's places
    exp = o & np.uint32(0x0F800000)
    o = o + np.uint32(112 << 23)  # rebias the exponent
    ones = np.uint32(0xFFFFFFFF)
    top = ones * np.uint32(exp == np.uint32(0x0F800000))  # all ones for an infinity or a NaN
    low = ones * np.uint32(exp == np.uint32(0))  # all ones for a zero or a subnormal
    nan = ones * np.uint32((o & np.uint32(0x007FFFFF)) != np.uint32(0))
    o = (o + (top & np.uint32(112 << 23))) | (top & nan & np.uint32(0x00400000))  # the quiet bit: or, never add
    # a zero or subnormal: its bits as a normal float32 2**-14 too high in value, less 2**-14 (exact)
    renormal = float_bits(as_float(o + np.uint32(1 << 23)) - np.float32(6.103515625e-05))
    o = (renormal & low) | (o & ~low)
    return as_float(o | ((u & np.uint32(0x8000)) << np.uint32(16)))


def bfloat_to_float(b: Any) -> np.float32:
    """The float32 a bfloat16 of bits ``b`` holds (its bits are float32's upper half)."""
    return as_float(np.uint32(b) << np.uint32(16))


def float_to_half(value: Any) -> np.uint16:
    """The bits of the float16 nearest ``value`` (a float32), as a uint16 (NumPy's ``npy_floatbits_to_halfbits``)."""
    f = np.uint32(float_bits(value))
    sign = (f & np.uint32(0x80000000)) >> np.uint32(16)
    f_exp = f & np.uint32(0x7F800000)
    if f_exp >= np.uint32(0x47800000):
        f_sig = f & np.uint32(0x007FFFFF)
        if f_exp == np.uint32(0x7F800000) and f_sig != 0:
            nan = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
            return np.uint16(sign + (nan + np.uint32(1) if nan == np.uint32(0x7C00) else nan))
        return np.uint16(sign + np.uint32(0x7C00))
    if f_exp <= np.uint32(0x38000000):
        if f_exp < np.uint32(0x33000000):
            return np.uint16(sign)
        shift = np.uint32(113) - (f_exp >> np.uint32(23))
        f_sig = (np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))) >> shift
        if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            f_sig += np.uint32(0x1000)
        return np.uint16(sign + (f_sig >> np.uint32(13)))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    f_sig = f & np.uint32(0x007FFFFF)
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    return np.uint16(sign + (f_sig >> np.uint32(13)) + h_exp)


def float_to_bfloat(value: Any) -> np.uint16:
    """The bits of the bfloat16 nearest ``value`` (a float32), as a uint16; NaN is 0x7FC0 (torch's rounding)."""
    f = np.uint32(float_bits(value))
    if (f & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(0x7FC0)
    return np.uint16((f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))

"""LLVM intrinsics for the CPU kernels: a cache-line prefetch, libc's memcpy of a row, calls into C by address,
float32 bit casts and float16 conversions.

Numba exposes none of these, so each is written here once, as LLVM IR, for the row gathers
(:mod:`directload.kernels.cpu_kernels`) and the sampler (:mod:`directload.kernels.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

if TYPE_CHECKING:
    from numba.core.typing.templates import Signature

__all__ = ["prefetch", "copy_row", "pointer", "call_int", "call_void", "float_from_bits", "bits_of_float",
           "float_from_half_bits", "half_bits_of_float"]


@intrinsic
def prefetch(typingctx: object, table: types.Array, row: types.Integer,
             offset: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """``llvm.prefetch`` (read, keep in all levels) of byte ``offset`` of ``table[row]``."""
    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        row, offset = (context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:]))
        first = cgutils.get_item_pointer(context, builder, aty, ary, [row, zero], wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        addr = builder.gep(builder.bitcast(first, byte_ptr), [offset])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), "llvm.prefetch.p0i8")
        builder.call(fn, [addr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(table, row, offset), codegen


@intrinsic
def copy_row(typingctx: object, out: types.Array, i: types.Integer, table: types.Array, row: types.Integer,
             nbytes: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """``memcpy(&out[i, 0], &table[row, 0], nbytes)``: libc's copy, tuned for long runs."""
    def codegen(context, builder, signature, args):
        zero = context.get_constant(types.intp, 0)
        ends = []
        for array, at in ((0, 1), (2, 3)):
            aty = signature.args[array]
            ary = context.make_array(aty)(context, builder, args[array])
            pos = context.cast(builder, args[at], signature.args[at], types.intp)
            ends.append(cgutils.get_item_pointer(context, builder, aty, ary, [pos, zero], wraparound=False))
        count = context.cast(builder, args[4], signature.args[4], types.intp)
        cgutils.raw_memcpy(builder, ends[0], ends[1], count, 1)
        return context.get_dummy_value()

    return types.void(out, i, table, row, nbytes), codegen


@intrinsic
def pointer(typingctx: object, address: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """An integer address as a ``void*`` (for ``numba.carray``)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@intrinsic
def call_int(typingctx: object, address: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """Call the C function ``int f(void)`` at ``address``."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        value = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return builder.sext(value, ir.IntType(64))

    return types.int64(address), codegen


@intrinsic
def call_void(typingctx: object, address: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """Call the C function ``void f(void)`` at ``address``."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()

    return types.void(address), codegen


@intrinsic
def float_from_bits(typingctx: object, bits: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """The float32 whose IEEE bits are the low 32 bits of ``bits`` (a bit cast, no conversion)."""
    def codegen(context, builder, signature, args):
        low = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bits_of_float(typingctx: object, value: types.Float) -> tuple[Signature, Callable[..., object]]:
    """The IEEE bits of ``value`` as a float32, as a uint32 (a bit cast after rounding to float32)."""
    def codegen(context, builder, signature, args):
        single = context.cast(builder, args[0], signature.args[0], types.float32)
        return builder.bitcast(single, ir.IntType(32))

    return types.uint32(value), codegen


@intrinsic
def float_from_half_bits(typingctx: object, bits: types.Integer) -> tuple[Signature, Callable[..., object]]:
    """The float32 the float16 of bits ``bits`` (the low 16) holds: LLVM's ``fpext half to float``, exact, which x86
    with F16C runs as ``vcvtph2ps`` and vectorises (a NaN made quiet, as torch's CPU conversion makes it)."""
    def codegen(context, builder, signature, args):
        low = context.cast(builder, args[0], signature.args[0], types.uint16)
        return builder.fpext(builder.bitcast(low, ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def half_bits_of_float(typingctx: object, value: types.Float) -> tuple[Signature, Callable[..., object]]:
    """The bits of the float16 nearest ``value`` (a float32), as a uint16: LLVM's ``fptrunc float to half`` (round to
    nearest, ties to even; ``vcvtps2ph`` with F16C)."""
    def codegen(context, builder, signature, args):
        single = context.cast(builder, args[0], signature.args[0], types.float32)
        return builder.bitcast(builder.fptrunc(single, ir.HalfType()), ir.IntType(16))

    return types.uint16(value), codegen

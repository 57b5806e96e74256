"""Offline NVRTC compilation of kernels/cuda/gather.cu (or sample.cu) to PTX or cubin, with no GPU or driver."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from directload.capabilities import find_libnvrtc
from directload.errors import DirectloadError

from .carriers import CARRIERS
from .sources import CUDA_DIR

__all__ = ["NvrtcError", "CompileResult", "find_libnvrtc", "kernel_name", "tiered_kernel_name", "rowvec_kernel_name",
           "check_clamp_kernel_name", "decode_kernel_name", "all_kernel_names", "compile_gather", "ELEM_TYPES",
           "INDEX_TYPES",
           "ROWVEC_WIDTHS"]

#: C++ bit-carrier type for each element size, and C++ type per index size.
#: Bit-carrier type by element size; 16 is the vector unit (``uint4``) of 16-byte-aligned rows.
ELEM_TYPES = {size: c.cxx for size, c in CARRIERS.items()}
INDEX_TYPES = {4: "int", 8: "long long"}
#: Load widths, in bytes, that ``gather_rowvec`` is instantiated for (``kernels.variants.VECTOR_WIDTHS``).
ROWVEC_WIDTHS = (16, 8, 4, 2, 1)


class NvrtcError(DirectloadError, RuntimeError):
    """NVRTC is missing or rejected the source; the message carries its log.

    Examples
    --------
    >>> try:
    ...     compile_gather("compute_0", [kernel_name(True, 4, 8)])  # no such architecture
    ... except NvrtcError:
    ...     print("refused")
    refused
    """


@dataclass(frozen=True)
class CompileResult:
    """Output of :func:`compile_gather`.

    Attributes
    ----------
    image : bytes
        PTX text (``arch="compute_XX"``) or a cubin ELF (``arch="sm_XX"``).
    lowered : dict
        Template name expression -> mangled symbol in ``image``.
    log : str
        NVRTC's program log (warnings).

    Examples
    --------
    >>> name = kernel_name(True, 4, 8)
    >>> if find_libnvrtc() is not None:  # libnvrtc comes with the cuda12/cuda13 extras and CUDA builds of torch
    ...     res = compile_gather("compute_90", [name])
    ...     assert b".target sm_90" in res.image and res.lowered[name] in res.image.decode()
    """

    image: bytes
    lowered: dict[str, str]
    log: str


@functools.cache
def _lib():
    path = find_libnvrtc()
    if path is None:
        raise NvrtcError("libnvrtc not found: install directload[cuda12] or directload[cuda13] (the CUDA build of "
                         "torch brings it too)")
    return ctypes.CDLL(path)


def _check(rc, what, prog=None):
    if rc != 0:
        lib = _lib()
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        msg = lib.nvrtcGetErrorString(rc).decode()
        log = _log(prog) if prog is not None else ""
        raise NvrtcError(f"{what} failed: {msg}\n{log}")


def _log(prog):
    lib = _lib()
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def kernel_name(aligned: bool, elem_bytes: int, index_bytes: int) -> str:
    """Template name expression of one specialisation, e.g. ``gather_aligned<unsigned int, long long>``."""
    kind = "gather_aligned" if aligned else "gather_naive"
    return f"{kind}<{ELEM_TYPES[elem_bytes]}, {INDEX_TYPES[index_bytes]}>"


def tiered_kernel_name(aligned: bool, elem_bytes: int) -> str:
    """Template name expression of one tiered-gather specialisation, e.g. ``gather_tiered_aligned<unsigned int>``."""
    return f"{'gather_tiered_aligned' if aligned else 'gather_tiered_naive'}<{ELEM_TYPES[elem_bytes]}>"


def rowvec_kernel_name(width: int, index_bytes: int) -> str:
    """Template name expression of one whole-row vector kernel, e.g. ``gather_rowvec<long long, 16>``.

    >>> rowvec_kernel_name(16, 8)
    'gather_rowvec<long long, 16>'
    """
    if width not in ROWVEC_WIDTHS:
        raise ValueError(f"rowvec width must be one of {ROWVEC_WIDTHS} bytes, got {width}")
    return f"gather_rowvec<{INDEX_TYPES[index_bytes]}, {width}>"


def check_clamp_kernel_name(index_bytes: int) -> str:
    """Template name expression of the id check-and-clamp kernel, e.g. ``check_clamp<int>``.

    >>> check_clamp_kernel_name(4)
    'check_clamp<int>'
    """
    return f"check_clamp<{INDEX_TYPES[index_bytes]}>"


def decode_kernel_name(codec_id: int, out_id: int, index_bytes: int) -> str:
    """Template name expression of one decoding gather (codec and output numbered as in
    :mod:`directload.kernels.decode_cpu`), e.g. ``gather_decode<2, 0, long long>``.

    >>> decode_kernel_name(2, 0, 8)
    'gather_decode<2, 0, long long>'
    """
    return f"gather_decode<{int(codec_id)}, {int(out_id)}, {INDEX_TYPES[index_bytes]}>"


def all_kernel_names() -> list[str]:
    """Every specialisation gather.cu is compiled for: naive and aligned per element and index size, tiered per
    element size, rowvec per width and index size, check_clamp per index size, and the decoding gather per
    codec, output dtype and index size.

    >>> len(all_kernel_names())
    58
    """
    names = [kernel_name(a, e, i) for a in (False, True) for e in ELEM_TYPES for i in INDEX_TYPES]
    names += [tiered_kernel_name(a, e) for a in (False, True) for e in ELEM_TYPES if e != 16]
    names += [rowvec_kernel_name(w, i) for w in ROWVEC_WIDTHS for i in INDEX_TYPES]
    names += [check_clamp_kernel_name(i) for i in INDEX_TYPES]
    names += [decode_kernel_name(c, o, i) for c in range(3) for o in range(3) for i in INDEX_TYPES]
    return names


def compile_gather(arch: str = "compute_90", names: Sequence[str] | None = None, extra_options: Sequence[str] = (), *,
                   source: str = "gather.cu") -> CompileResult:
    """Compile gather.cu (or ``source``) with NVRTC.

    Parameters
    ----------
    arch : str
        ``compute_XX`` gives PTX, ``sm_XX`` gives a cubin.
    names : sequence of str, optional
        Template name expressions to instantiate; every specialisation by default.
    extra_options : sequence of str
        More NVRTC options.
    source : str
        The file of ``kernels/cuda`` to compile; ``names`` is then required (``sample.cu``: see
        ``kernels.sampling_gpu.kernel_names``).

    Returns
    -------
    CompileResult

    Examples
    --------
    >>> kernel_name(True, 4, 8)
    'gather_aligned<unsigned int, long long>'
    >>> if find_libnvrtc() is not None:  # libnvrtc comes with the cuda12/cuda13 extras and CUDA builds of torch
    ...     res = compile_gather("compute_90", [kernel_name(True, 4, 8)])
    ...     assert b".target sm_90" in res.image
    """
    if names is None:
        if source != "gather.cu":
            raise ValueError(f"name the kernels of {source} to compile")
        names = all_kernel_names()
    lib = _lib()
    text = (CUDA_DIR / source).read_bytes()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), text, source.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        for n in names:
            _check(lib.nvrtcAddNameExpression(prog, n.encode()), f"nvrtcAddNameExpression({n})")
        opts = [f"--gpu-architecture={arch}", "-std=c++17", *extra_options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        _check(lib.nvrtcCompileProgram(prog, len(opts), arr), f"nvrtcCompileProgram({arch})", prog)
        lowered = {}
        for n in names:
            p = ctypes.c_char_p()
            _check(lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(p)), "nvrtcGetLoweredName")
            lowered[n] = p.value.decode()  # type: ignore[union-attr]  # set, as nvrtcGetLoweredName succeeded
        size = ctypes.c_size_t()
        if arch.startswith("sm_"):
            _check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            buf = ctypes.create_string_buffer(size.value)
            _check(lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            image = buf.raw
        else:
            _check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            buf = ctypes.create_string_buffer(size.value)
            _check(lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            image = buf.value
        return CompileResult(image, lowered, _log(prog))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))

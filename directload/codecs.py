"""Compressed feature rows: the codecs a table may be stored in, each with its encoding, its reference decode and
its error bound.

A codec turns a float table ``[rows, dim]`` into a table of codes that every tier carries as it is (one code row
per feature row, read whole) and that only the last hop decodes:

* ``float16``: IEEE half precision, 2 bytes a feature; relative error at most 2**-11 for normal values, absolute
  at most 2**-25 below them; values beyond +-65504 are refused.
* ``bfloat16``: 2 bytes a feature, float32's range; relative error at most 2**-8 (absolute 2**-134 below the
  normal range).
* ``int8`` rowwise (FBGEMM's fused 8-bit rowwise layout): each row's ``dim`` uint8 codes followed by its float32
  scale and offset, inside the row, so one row read brings everything its decode needs (``dim + 8`` bytes: 108
  for 100 features, against 400 in float32).  ``x = code * scale + offset`` with ``offset`` the row's least
  value and ``scale = (max - min) / 255``: an error of at most ``scale / 2`` per feature (plus float32 rounding
  of the decode), and a constant row (zero scale) decodes exactly.

Values that are not finite (NaN, +-infinity) are refused by every codec with :class:`CodecValueError`, naming the
row, before anything is written: a scale cannot span them, and a NaN would silently spread through a row.

Encoding streams: :meth:`Codec.encode` reads ``chunk_rows`` rows at a time (a NumPy memmap stays on disk) and
writes them into one output allocated up front (or the caller's ``out``, a memmap or a unified tensor), so it
never holds two full copies of the table; ``progress`` shows a bar.

Examples
--------
>>> import torch
>>> from directload.codecs import codec
>>> x = torch.tensor([[0.0, 1.0, 2.0], [5.0, 5.0, 5.0]])
>>> int8 = codec("int8")
>>> codes = int8.encode(x)
>>> codes.dtype, tuple(codes.shape), int8.row_bytes(3)  # 3 codes, then the scale and the offset
(torch.uint8, (2, 11), 11)
>>> decoded = int8.decode(codes)
>>> decoded[1].tolist(), bool(((decoded - x).abs() <= int8.error_bound(x)[:, None]).all())  # constant: exact
([5.0, 5.0, 5.0], True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .errors import DirectloadError

__all__ = ["Codec", "CodecError", "CodecValueError", "CODECS", "codec", "DEFAULT_CHUNK_ROWS", "INT8_TAIL",
           "EncodedTable", "encode", "DECODED_DTYPES"]

#: Rows encoded at a time: a chunk's float32 copy and its codes are all an encode holds beside its output.
DEFAULT_CHUNK_ROWS = 1 << 16
#: Bytes after an int8 row's codes: its float32 scale, then its float32 offset.
INT8_TAIL = 8
#: The dtypes a decode may write.
DECODED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DECODED = DECODED_DTYPES


class CodecError(DirectloadError, ValueError):
    """A codec that does not exist, or a table a codec cannot take (shape, dtype).

    Examples
    --------
    >>> from directload.codecs import codec
    >>> codec("zstd")
    Traceback (most recent call last):
    ...
    directload.codecs.CodecError: no codec 'zstd': one of float16, bfloat16, int8
    """


class CodecValueError(CodecError):
    """A value a codec cannot encode: NaN or an infinity (every codec), or beyond float16's range (float16),
    named with its row.

    Examples
    --------
    >>> import torch
    >>> from directload.codecs import codec
    >>> codec("int8").encode(torch.tensor([[1.0, 2.0], [float("nan"), 0.0]]))
    Traceback (most recent call last):
    ...
    directload.codecs.CodecValueError: row 1 holds NaN, which int8 cannot encode (nor an infinity): clean the ...
    """


def _as_float32(chunk) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(chunk)) if isinstance(chunk, np.ndarray) else chunk
    return t.to(torch.float32)


def _check_finite(x: torch.Tensor, first_row: int, name: str) -> None:
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        row = int((~finite).any(1).nonzero()[0, 0])
        value = x[row][~finite[row]][0].item()
        what = "NaN" if math.isnan(value) else ("+infinity" if value > 0 else "-infinity")
        raise CodecValueError(f"row {first_row + row} holds {what}, which {name} cannot encode (nor "
                              f"{'an infinity' if what == 'NaN' else 'NaN'}): clean the table first")


@dataclass(frozen=True)
class Codec:
    """One codec: its name, the dtype of its codes, and how many of them a row of ``dim`` features takes.

    Attributes
    ----------
    name : str
        ``"float16"``, ``"bfloat16"`` or ``"int8"``.
    code_dtype : torch.dtype
        The codes' dtype (``uint8`` for int8 rowwise, whose rows also hold their scale and offset).
    tail : int
        Bytes a row holds after its codes (8 for int8 rowwise: the scale and offset).

    Examples
    --------
    >>> from directload.codecs import codec
    >>> half = codec("float16")
    >>> half.row_bytes(100), half.code_shape(10, 100), half.decode(half.encode(torch.ones(1, 2))).tolist()
    (200, (10, 100), [[1.0, 1.0]])
    """

    name: str
    code_dtype: torch.dtype
    tail: int = 0

    # -- layout ----------------------------------------------------------------------------------------------------
    def row_bytes(self, dim: int) -> int:
        """Bytes of one encoded row of ``dim`` features."""
        return dim * torch.empty(0, dtype=self.code_dtype).element_size() + self.tail

    def code_shape(self, rows: int, dim: int) -> tuple[int, int]:
        """The encoded table's shape, in elements of :attr:`code_dtype`."""
        return rows, self.row_bytes(dim) // torch.empty(0, dtype=self.code_dtype).element_size()

    def dim_of(self, code_cols: int) -> int:
        """The features of a row of ``code_cols`` code elements (the inverse of :meth:`code_shape`)."""
        dim = code_cols - self.tail // torch.empty(0, dtype=self.code_dtype).element_size()
        if dim < 0:
            raise CodecError(f"rows of {code_cols} {self.code_dtype} elements are too short for {self.name} codes")
        return dim

    # -- encode ----------------------------------------------------------------------------------------------------
    def encode(self, table: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
               chunk_rows: int = DEFAULT_CHUNK_ROWS, progress: bool = False) -> torch.Tensor:
        """The codes of ``table`` (a 2-D float tensor or NumPy array, a memmap included), ``chunk_rows`` rows at a
        time, into ``out`` (``code_shape`` of ``code_dtype``; allocated when None) and returned.

        Raises
        ------
        CodecError
            A table that is not 2-D floats, or an ``out`` of the wrong shape or dtype, before any work.
        CodecValueError
            NaN or an infinity (every codec), a value beyond +-65504 (float16): naming the row; rows before it
            may be written already (the table itself is never written).
        """
        rows, dim = self._check_table(table)
        shape = self.code_shape(rows, dim)
        if out is None:
            out = torch.empty(shape, dtype=self.code_dtype)
        elif not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != self.code_dtype:
            raise CodecError(f"out must be a {self.code_dtype} tensor of shape {shape}, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
        chunk_rows = max(1, int(chunk_rows))
        with tqdm(total=rows, desc=f"encoding ({self.name})", unit="row", disable=not progress) as bar:
            for start in range(0, rows, chunk_rows):
                stop = min(rows, start + chunk_rows)
                out[start:stop] = self.encode_rows(table[start:stop], first_row=start)
                bar.update(stop - start)
        return out

    def encode_rows(self, rows: torch.Tensor | np.ndarray, *, first_row: int = 0) -> torch.Tensor:
        """The codes of a 2-D float block of rows, as a new tensor: one step of :meth:`encode`, for writers that
        stream rows of their own (a disk store).  Errors name a row as ``first_row`` plus its place here."""
        self._check_table(rows)
        x = _as_float32(rows)
        _check_finite(x, first_row, self.name)
        return self._encode_chunk(x, first_row)

    def _check_table(self, table):
        if not isinstance(table, (torch.Tensor, np.ndarray)):
            raise CodecError(f"{self.name} encodes a 2-D float tensor or array, got {type(table).__name__}")
        dtype = table.dtype
        floating = dtype.is_floating_point if isinstance(dtype, torch.dtype) else np.issubdtype(dtype, np.floating)
        if table.ndim != 2 or not floating:
            raise CodecError(f"{self.name} encodes a 2-D table of floats, got {dtype} of shape {tuple(table.shape)}")
        return int(table.shape[0]), int(table.shape[1])

    def _encode_chunk(self, x: torch.Tensor, first_row: int) -> torch.Tensor:
        if self.name == "float16":
            big = x.abs() > torch.finfo(torch.float16).max
            if bool(big.any()):
                row = int(big.any(1).nonzero()[0, 0])
                raise CodecValueError(f"row {first_row + row} holds {x[row][big[row]][0].item():g}, beyond float16's "
                                      "range (+-65504): use bfloat16 or int8, or scale the table")
            return x.to(torch.float16)
        if self.name == "bfloat16":
            return x.to(torch.bfloat16)
        return _int8_rows(x)

    # -- decode ----------------------------------------------------------------------------------------------------
    def decode(self, codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The rows ``codes`` hold, in ``dtype`` (float32, float16 or bfloat16): the reference decode, in torch,
        on ``codes``' device (the oracle of the gather kernels' fused decode)."""
        if dtype not in _DECODED:
            raise CodecError(f"{self.name} decodes to float32, float16 or bfloat16, not {dtype}")
        if codes.dtype != self.code_dtype or codes.dim() != 2:
            raise CodecError(f"{self.name} codes are a 2-D {self.code_dtype} table, got {codes.dtype} of shape "
                             f"{tuple(codes.shape)}")
        if self.name != "int8":
            return codes.to(dtype)
        dim = self.dim_of(codes.shape[1])
        # Copied into a fresh [rows, 8] buffer: a one-row slice is contiguous already, at an offset and a stride
        # float32 may not view.
        tail = torch.empty((codes.shape[0], INT8_TAIL), dtype=torch.uint8, device=codes.device)
        tail = tail.copy_(codes[:, dim:]).view(torch.float32)  # [rows, 2]: scale, offset
        rows = codes[:, :dim].to(torch.float32) * tail[:, :1] + tail[:, 1:]
        return rows.to(dtype)

    def error_bound(self, table: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Per row, the largest absolute error a decode (to float32) of ``table``'s encoding may have: float16
        ``|x| * 2**-11`` (at least 2**-25), bfloat16 ``|x| * 2**-8`` (at least 2**-134), int8 ``scale / 2`` plus
        the decode's float32 rounding.  A float32 tensor of one value per row."""
        x = _as_float32(table)
        if x.shape[0] == 0:
            return torch.empty(0)
        top = x.abs().amax(1) if x.shape[1] else torch.zeros(x.shape[0])
        if self.name == "float16":
            return torch.clamp(top * 2.0**-11, min=2.0**-25)
        if self.name == "bfloat16":
            return torch.clamp(top * 2.0**-8, min=2.0**-134)
        lo, hi = (x.amin(1), x.amax(1)) if x.shape[1] else (torch.zeros(x.shape[0]),) * 2
        scale = (hi - lo) / 255
        return scale / 2 + 4 * torch.finfo(torch.float32).eps * torch.maximum(top, scale * 255)


def _int8_rows(x: torch.Tensor) -> torch.Tensor:
    """FBGEMM's fused 8-bit rowwise rows: ``dim`` uint8 codes, the float32 scale, the float32 offset."""
    rows, dim = x.shape
    out = torch.empty((rows, dim + INT8_TAIL), dtype=torch.uint8)
    if dim:
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    else:
        lo = hi = torch.zeros(rows, 1)
    scale = (hi - lo) / 255
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.where(scale > 0, torch.round((x - lo) / safe), torch.zeros_like(x))
    out[:, :dim] = codes.clamp_(0, 255).to(torch.uint8)
    out[:, dim:] = torch.cat([scale, lo], 1).contiguous().view(torch.uint8)
    return out


#: Every codec by name.
CODECS: dict[str, Codec] = {
    "float16": Codec("float16", torch.float16),
    "bfloat16": Codec("bfloat16", torch.bfloat16),
    "int8": Codec("int8", torch.uint8, tail=INT8_TAIL),
}


def codec(name: str | Codec) -> Codec:
    """The :class:`Codec` called ``name`` (a Codec is returned as it is); :class:`CodecError` for another name."""
    if isinstance(name, Codec):
        return name
    found = CODECS.get(name) if isinstance(name, str) else None
    if found is None:
        raise CodecError(f"no codec {name!r}: one of {', '.join(CODECS)}")
    return found


@dataclass(frozen=True, eq=False)
class EncodedTable:
    """A table of codes and their codec: what :func:`directload.kernels.gather` decodes inside the gather.

    ``codes`` is the 2-D tensor of :attr:`Codec.code_dtype` that :meth:`Codec.encode` writes (one code row per
    feature row), contiguous, in host memory (plain or pinned and mapped) or on a CUDA device.  The table
    reads as ``[rows, dim]`` decoded features.

    Raises
    ------
    CodecError
        ``codes`` of another dtype, not 2-D, not contiguous, or rows too short for the codec.

    Examples
    --------
    >>> import torch
    >>> from directload.codecs import encode
    >>> table = encode(torch.tensor([[1.0, 2.0, 3.0]]), "int8")
    >>> table.shape, table.row_bytes, table.codes.dtype
    ((1, 3), 11, torch.uint8)
    """

    codes: torch.Tensor
    codec: Codec

    def __post_init__(self):
        object.__setattr__(self, "codec", codec(self.codec))
        want = self.codec.code_dtype
        if not isinstance(self.codes, torch.Tensor) or self.codes.dtype != want or self.codes.dim() != 2:
            raise CodecError(f"{self.codec.name} codes are a 2-D {want} tensor, got "
                             f"{getattr(self.codes, 'dtype', type(self.codes).__name__)} of shape "
                             f"{tuple(getattr(self.codes, 'shape', ()))}")
        if not self.codes.is_contiguous():
            raise CodecError(f"{self.codec.name} codes must be contiguous (a gather reads whole code rows)")
        self.codec.dim_of(self.codes.shape[1])

    @property
    def dim(self) -> int:
        """Features per decoded row."""
        return self.codec.dim_of(self.codes.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, dim)``: the decoded table's shape."""
        return int(self.codes.shape[0]), self.dim

    @property
    def row_bytes(self) -> int:
        """Bytes of one code row (what every tier moves per row)."""
        return self.codes.shape[1] * self.codes.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of all the codes."""
        return self.codes.shape[0] * self.row_bytes

    @property
    def device(self) -> torch.device:
        """The codes' device."""
        return self.codes.device

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def decode(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Every row, decoded to ``dtype`` by the reference decode (:meth:`Codec.decode`)."""
        return self.codec.decode(self.codes, dtype)


def encode(table: torch.Tensor | np.ndarray, name: str | Codec, *, out: torch.Tensor | None = None,
           chunk_rows: int = DEFAULT_CHUNK_ROWS, progress: bool = False) -> EncodedTable:
    """``table`` encoded by the codec called ``name``, as an :class:`EncodedTable` (:meth:`Codec.encode` streams
    it: same arguments, same errors)."""
    chosen = codec(name)
    return EncodedTable(chosen.encode(table, out=out, chunk_rows=chunk_rows, progress=progress), chosen)

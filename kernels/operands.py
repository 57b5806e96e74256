"""The operands of a gather, checked and viewed in one place.

A kernel writes ``out`` through raw pointers, so operands of the wrong shape, element size or layout are
refused here (:func:`check_launch`) rather than written past their end; ids outside a table get the one
out-of-range message (:func:`out_of_range`); rows of elements no kernel moves are viewed as words it does
(:func:`row_words`); and memory that must not overlap is compared here (:func:`memory_span`,
:func:`overlaps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .carriers import ELEMENT_SIZES

__all__ = ["check_launch", "check_readable", "out_of_range", "RowWords", "row_words", "memory_span", "overlaps",
           "host_of", "can_gather"]


def host_of(x: Any, *, checked: bool = False) -> Any:
    """The plain host tensor under a unified tensor (its ``host``), or ``x`` itself.

    With ``checked``, the unified tensor's ``check_backing()`` first: a closed
    tensor, or a mapped file whose size changed, raises instead.  Duck-typed
    (``is_unified``), so the layers below the unified tensor use it too.

    Examples
    --------
    >>> import directload, torch
    >>> t = torch.zeros(2)
    >>> host_of(t) is t, type(host_of(directload.zeros(2))).__name__
    (True, 'Tensor')
    """
    if not getattr(x, "is_unified", False):
        return x
    return x.check_backing() if checked else x.host


def can_gather(table: Any) -> bool:
    """Whether directload's kernels take ``table`` as a table of rows.

    A plain tensor (a unified tensor's :func:`host_of`, not the subclass:
    tensor subclasses keep their own indexing) of at least one dimension,
    contiguous, without autograd, of 1, 2, 4 or 8-byte real elements, in host
    or CUDA memory.  Callers add their own rules on where it lives.

    Examples
    --------
    >>> import torch
    >>> can_gather(torch.zeros(4, 3)), can_gather(torch.zeros(4, 3).t())
    (True, False)
    >>> can_gather(torch.zeros(2, dtype=torch.complex64)), can_gather(torch.zeros(()))
    (False, False)
    """
    return (type(table) is torch.Tensor and table.dim() >= 1 and table.is_contiguous() and not table.requires_grad
            and table.element_size() in ELEMENT_SIZES and not table.is_complex()
            and table.device.type in ("cpu", "cuda"))

_DEVICE_TYPES = ("cpu", "cuda")  # where a gather reads and writes; "meta" tensors have no memory at all


@dataclass(frozen=True)
class RowWords:
    """How rows of a table are held and moved by the kernels: as ``dtype`` elements, ``shape`` per row, each
    element of the table ``ratio`` of them (1: the table's own dtype).

    Examples
    --------
    >>> row_words(torch.complex128, (2,)).same, row_words(torch.float16, (2,)).same
    (False, True)
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    ratio: int

    @property
    def same(self) -> bool:
        """Whether the rows move in their own dtype (no view needed)."""
        return self.ratio == 1


def row_words(dtype: torch.dtype, row_shape: Sequence[int]) -> RowWords:
    """The words the kernels move rows of ``dtype`` and ``row_shape`` in: the dtype itself for 1, 2, 4 and
    8-byte elements; wider ones (complex128) as their bytes, in 8-byte words (or bytes).

    Examples
    --------
    >>> row_words(torch.float32, (3,))
    RowWords(dtype=torch.float32, shape=(3,), ratio=1)
    >>> row_words(torch.complex128, (3,))
    RowWords(dtype=torch.int64, shape=(6,), ratio=2)
    """
    elem = torch.empty(0, dtype=dtype).element_size()
    if elem in ELEMENT_SIZES:
        return RowWords(dtype, tuple(row_shape), 1)
    carrier = torch.int64 if elem % 8 == 0 else torch.uint8
    ratio = elem // torch.empty(0, dtype=carrier).element_size()
    return RowWords(carrier, (int(np.prod(row_shape, dtype=np.int64)) * ratio,), ratio)


def memory_span(t: torch.Tensor | np.ndarray, *, whole: bool = False) -> tuple[int, int]:
    """``[first, end)`` byte addresses of a contiguous tensor's elements, or with ``whole`` of all the memory
    under a tensor or numpy array (its whole storage, or its base array's).

    Examples
    --------
    >>> t = torch.zeros(8)
    >>> a, b = memory_span(t[2:4]); b - a
    8
    >>> overlaps(memory_span(t[2:4]), memory_span(t, whole=True)), overlaps(memory_span(t[:2]), memory_span(t[2:]))
    (True, False)
    """
    if isinstance(t, np.ndarray):
        base = t
        while isinstance(base.base, np.ndarray):
            base = base.base
        return (base.ctypes.data, base.ctypes.data + base.nbytes) if whole else \
            (t.ctypes.data, t.ctypes.data + t.nbytes)
    if whole:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two non-empty ``[first, end)`` spans share a byte."""
    return a[0] < b[1] and b[0] < a[1] and a[0] != a[1] and b[0] != b[1]


def out_of_range(value: int, n: int | None, *, what: str = "index", unit: str = "rows", position: int | None = None,
                 negatives: bool = False) -> IndexError:
    """The one ``IndexError`` for an id outside its table: ``value`` of ``n`` ``unit`` (``n`` None: beyond
    int64), at ``position`` in its batch if given; ``negatives`` where ids may count from the end.

    Examples
    --------
    >>> str(out_of_range(7, 6))
    'index 7 is out of range for 6 rows (valid 0..5)'
    >>> str(out_of_range(-1, 10, what="row id", position=3))
    'row id -1 is out of range for 10 rows (valid 0..9) (at position 3)'
    >>> str(out_of_range(0, 0))
    'index 0 is out of range for 0 rows (there are none)'
    """
    where = "" if position is None else f" (at position {position})"
    if n is None:
        return IndexError(f"{what} {value} is out of range (ids are int64){where}")
    valid = "there are none" if n <= 0 else f"valid {-n if negatives else 0}..{n - 1}"
    return IndexError(f"{what} {value} is out of range for {n} {unit} ({valid}){where}")


def _shape(a):
    return tuple(a.shape)


def _itemsize(a):
    return a.element_size() if hasattr(a, "element_size") else a.itemsize


def _contiguous(a):
    return a.is_contiguous() if hasattr(a, "is_contiguous") else a.flags.c_contiguous


def _is_int_index(a):
    name = str(a.dtype).removeprefix("torch.")
    return name in ("int32", "int64")


def check_readable(t: torch.Tensor, name: str, devices: Sequence[str] = _DEVICE_TYPES) -> None:
    """Raise unless the tensor ``t`` has memory a gather can address: ``TypeError`` for a sparse (or other
    non-strided) layout, ``ValueError`` for a device of another type than ``devices`` (a ``meta`` tensor has
    shapes but no memory: a kernel given its null pointer would crash the process).

    Examples
    --------
    >>> check_readable(torch.zeros(2), "ids")
    >>> check_readable(torch.zeros(2, device="meta"), "out")
    Traceback (most recent call last):
    ...
    ValueError: out is on the meta device, which holds no data: pass a tensor on the CPU or a CUDA device
    >>> check_readable(torch.zeros(2).to_sparse(), "ids")
    Traceback (most recent call last):
    ...
    TypeError: ids must be a dense tensor, got layout torch.sparse_coo: call .to_dense() first
    """
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout}: call .to_dense() first")
    if t.device.type not in devices:
        where = " or ".join("the CPU" if d == "cpu" else "a CUDA device" for d in devices)
        raise ValueError(f"{name} is on the {t.device.type} device, which holds no data: pass a tensor on {where}"
                         if t.device.type == "meta" else f"{name} is on {t.device}: pass a tensor on {where}")


def check_launch(src: torch.Tensor | np.ndarray, index: torch.Tensor | np.ndarray,
                 out: torch.Tensor | np.ndarray) -> None:
    """Raise ``ValueError`` (``TypeError`` for the index's dtype) unless ``out[i] = src[index[i]]`` is a
    well-formed launch: ``src`` and ``out`` C-contiguous 2-D of one element size, ``out`` of
    ``[len(index), src.shape[1]]``, ``index`` 1-D int32/int64.  Torch tensors or numpy arrays.

    Examples
    --------
    >>> import numpy as np
    >>> check_launch(np.zeros((4, 3), np.int32), np.arange(2), np.zeros((2, 3), np.int32))
    >>> check_launch(np.zeros((4, 3), np.int32), np.arange(2), np.zeros((5, 3), np.int32))
    Traceback (most recent call last):
    ...
    ValueError: out has shape (5, 3); this launch writes (2, 3)
    """
    if len(_shape(src)) != 2 or len(_shape(out)) != 2:
        raise ValueError(f"src and out must be 2-D [rows, row_elems], got {_shape(src)} and {_shape(out)}")
    if len(_shape(index)) != 1:  # (a strided index is made contiguous by the backend)
        raise ValueError(f"index must be 1-D, got shape {_shape(index)}")
    if not _is_int_index(index):
        raise TypeError(f"index must be int32 or int64, got {index.dtype}")
    want = (_shape(index)[0], _shape(src)[1])
    if _shape(out) != want:
        raise ValueError(f"out has shape {_shape(out)}; this launch writes {want}")
    if _itemsize(out) != _itemsize(src):
        raise ValueError(f"out's elements are {_itemsize(out)} bytes but src's are {_itemsize(src)}")
    if not (_contiguous(src) and _contiguous(out)):
        raise ValueError("src and out must be C-contiguous")

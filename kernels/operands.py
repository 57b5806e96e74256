"""The operands of a gather, checked in one place.

A kernel writes ``out`` through raw pointers, so operands of the wrong shape, element size or layout are
refused here (:func:`check_launch`) rather than written past their end; ids outside a table get the one
out-of-range message (:func:`out_of_range`); and memory that must not overlap is compared here
(:func:`memory_span`, :func:`overlaps`).  The arguments of a gather (:func:`as_index`, :func:`check_src`,
:func:`check_out`, ...) and of a tiered gather (:func:`check_tiered`) are checked here too, before any work, each
with the typed error a caller can act on: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong
shape, layout, device or overlap, ``IndexError`` for an id out of range.  The fast paths
(:mod:`directload.kernels.cpu_path`, :mod:`directload.kernels.gpu_path`) check only what a cached table leaves
open and hand anything unusual back to these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from directload.units import dtype_name

from .carriers import ELEMENT_SIZES
from .cpu_kernels import first_invalid
from .devices import MAPPED, memory_of
from .views import RowWords, row_words

# RowWords and row_words lived here before views had a module of its own, and are imported from here still.
__all__ = ["check_launch", "check_readable", "out_of_range", "RowWords", "row_words", "memory_span", "overlaps",
           "host_of", "can_gather", "INDEX_DTYPES", "as_index", "check_cpu_bounds", "check_strict_bounds",
           "check_tensor", "check_elements", "check_src", "check_devices", "check_out", "check_disjoint",
           "check_no_overlap", "check_tiered", "check_where"]


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
    name = dtype_name(a.dtype)
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


# ---------------------------------------------------------------- a gather's arguments

#: The dtypes of a gather's ids.
INDEX_DTYPES = (torch.int32, torch.int64)


def as_index(index: torch.Tensor | np.ndarray, n_rows: int, *, cpu_bounds: bool = True,
             strict: bool = False) -> torch.Tensor:
    """The index as a contiguous tensor, after dtype, shape and range checks.

    ``cpu_bounds=False`` leaves the range check of a CPU index to the kernel,
    which checks every index before it writes anything (one pass, not two).  A CUDA
    index is range-checked by the GPU kernel (:mod:`kernels.bounds`), never read here,
    unless ``strict`` (one sync: :func:`check_strict_bounds`).

    Examples
    --------
    >>> as_index(np.array([2, 0]), 3)
    tensor([2, 0])
    >>> as_index(torch.tensor([1.0]), 3)
    Traceback (most recent call last):
    ...
    TypeError: index must be int32 or int64, got torch.float32
    """
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"index must be a torch.Tensor or numpy.ndarray, got {type(index).__name__}")
    check_readable(index, "index")
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"index must be int32 or int64, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"index must be 1-D, got {index.dim()}-D with shape {tuple(index.shape)}")
    index = index.contiguous()
    if index.is_cuda:
        if strict:
            check_strict_bounds(index, n_rows)
    elif cpu_bounds:
        check_cpu_bounds(index, n_rows)
    return index


def check_cpu_bounds(index: torch.Tensor, n_rows: int) -> None:
    """Raise ``IndexError`` if a CPU id is out of range (a read of host memory, no sync)."""
    bad = first_invalid(index.numpy(), n_rows)
    if bad >= 0:
        raise out_of_range(int(index[bad]), n_rows, position=bad)


def check_strict_bounds(index: torch.Tensor, n_rows: int) -> None:
    """Raise ``IndexError`` now if an id is outside ``[0, n_rows)``, naming it and its position in the flattened
    ids: ``strict=True``'s check of CUDA ids (its one device-to-host sync), and a unified tensor's of CPU ids
    before they travel to the GPU."""
    if index.numel():
        lo, hi = torch.stack(torch.aminmax(index)).tolist()  # the one sync of strict mode
        if lo < 0 or hi >= n_rows:
            flat = index.reshape(-1)
            bad = int(((flat < 0) | (flat >= n_rows)).nonzero()[0, 0])
            raise out_of_range(int(flat[bad]), n_rows, position=bad)


def check_tensor(t: object, name: str) -> None:
    """Raise unless ``t`` is a torch tensor with memory a gather can address (``TypeError``, or ``ValueError``
    for a ``meta`` tensor: see :func:`check_readable`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_readable(t, name)


def check_elements(t: torch.Tensor, name: str) -> None:
    """Raise ``TypeError`` unless ``t``'s elements are of a size the kernels move (1, 2, 4 or 8 bytes)."""
    if t.element_size() not in ELEMENT_SIZES:
        raise TypeError(f"{name} elements must be 1, 2, 4 or 8 bytes, got {t.dtype} ({t.element_size()} B)")


def check_src(src: torch.Tensor) -> None:
    """Raise unless ``src`` is a table a gather reads: a tensor of at least one dimension (rows), elements of
    1, 2, 4 or 8 bytes, contiguous.

    Examples
    --------
    >>> check_src(torch.zeros(4, 3))
    >>> check_src(torch.zeros(4, 3).t())
    Traceback (most recent call last):
    ...
    ValueError: src must be contiguous: a strided table would need a full copy, ...
    """
    check_tensor(src, "src")
    if src.dim() == 0:
        raise ValueError("src must have at least one dimension (rows)")
    check_elements(src, "src")
    if not src.is_contiguous():
        raise ValueError("src must be contiguous: a strided table would need a full copy, which "
                         "gather never makes silently; call .contiguous() once up front")


def check_devices(index_device: torch.device, src_location: str, src_device: torch.device) -> None:
    """Raise ``ValueError`` when a CUDA index and CUDA ``src`` sit on different devices.

    Mapped host memory is readable from every device (portable), so only
    device memory must match.
    """
    if index_device.type == "cuda" and src_location == "cuda" and src_device != index_device:
        raise ValueError(f"index is on {index_device} but src is on {src_device}; move one of them")


def check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Raise unless ``out`` can take a gather's result: a contiguous tensor of ``shape`` and ``dtype`` on
    ``device`` (``TypeError`` for the type or dtype, ``ValueError`` for the rest).

    Examples
    --------
    >>> check_out(torch.empty(2, 3), (2, 3), torch.float32, torch.device("cpu"))
    >>> check_out(torch.empty(2, 4), (2, 3), torch.float32, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    ValueError: out has shape (2, 4), expected (2, 3)
    """
    check_tensor(out, "out")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def check_disjoint(out: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` when ``out`` shares memory with one of ``inputs`` (name -> tensor).

    The kernel would read what it has just written: rows already overwritten
    (wrong rows, silently), or ids overwritten mid-gather (wild reads).
    torch refuses ``index_select(..., out=)`` on overlapping memory for the
    same reason.  Addresses are compared as they are: with unified addressing
    a mapped host table and its CUDA view share them.
    """
    span = memory_span(out)
    for name, other in inputs.items():
        if overlaps(span, memory_span(other)):
            raise ValueError(f"out shares memory with {name}: a gather cannot write where it reads; "
                             "pass a separate out (or clone() the input first)")


def check_no_overlap(out: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    """Raise ``ValueError`` when ``out`` shares memory with ``src`` or ``index`` (:func:`check_disjoint`)."""
    check_disjoint(out, {"src": src, "index": index})


def check_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, out: torch.Tensor | None,
                 device: torch.device | str | None) -> tuple[torch.Tensor, torch.device]:
    """Check a tiered gather's arguments (:func:`directload.kernels.tiered.gather_tiered`'s) before any work:
    ``(where, device)``, ``where`` contiguous and ``device`` the one the gather runs on (a CUDA device with its
    index, or the CPU for a CPU ``where``).  Raises as the plain gather's checks do, and ``IndexError`` for a
    host ``where`` value outside its tier (:func:`check_where`); a CUDA ``where`` is checked on its device
    (``kernels.bounds.check_where_on_device``).

    Examples
    --------
    >>> check_tiered(torch.zeros(2, 3), torch.zeros(9), torch.tensor([1, -7]), None, None)
    (tensor([ 1, -7]), device(type='cpu'))
    >>> check_tiered(torch.zeros(2, 3), torch.zeros(9), torch.tensor([2]), None, None)
    Traceback (most recent call last):
    ...
    IndexError: cache slot 2 is out of range for 2 slots (valid 0..1)
    """
    for name, t in (("cache", cache), ("flat", flat), ("where", where)):
        check_tensor(t, name)
    if where.dtype != torch.int64 or where.dim() != 1:
        raise TypeError(f"where must be a 1-D int64 tensor, got {where.dtype} with shape {tuple(where.shape)}")
    where = where.contiguous()  # the CUDA C kernel reads a raw pointer: the values checked are the values read
    run_on = where.device if device is None else torch.device(device)
    if run_on.type == "cuda" and run_on.index is None:
        run_on = torch.device("cuda", torch.cuda.current_device())
    if run_on.type not in ("cpu", "cuda") or (run_on.type == "cpu" and where.is_cuda):
        raise ValueError(f"device must be a CUDA device (or the CPU, for a CPU where), got {run_on}")
    if cache.dim() < 1 or flat.dim() != 1 or cache.dtype != flat.dtype:
        raise ValueError("cache is [slots, *row_shape] and flat 1-D, of one dtype; got "
                         f"{cache.dtype}{tuple(cache.shape)} and {flat.dtype}{tuple(flat.shape)}")
    check_elements(cache, "cache")
    if not (cache.is_contiguous() and flat.is_contiguous()):
        raise ValueError("cache and flat must be contiguous")
    if out is not None:
        check_out(out, (where.shape[0], *cache.shape[1:]), cache.dtype, run_on)
        check_disjoint(out, {"cache": cache, "flat": flat, "where": where})
    if run_on.type == "cuda":
        if memory_of(flat) != MAPPED or memory_of(cache) not in (MAPPED, run_on):
            raise ValueError("a GPU tiered gather reads the flat tier zero-copy (pinned, mapped host memory) and "
                             f"the cache from {run_on} or mapped memory")
    elif cache.is_cuda or flat.is_cuda:
        raise ValueError("a CPU where (a CPU gather) cannot read tiers in GPU memory")
    if not where.is_cuda:  # a CUDA where is checked on its device (kernels.bounds), which reads nothing back
        check_where(where, cache.shape[0], flat.numel(), math.prod(cache.shape[1:]))
    return where, run_on


def check_where(where: np.ndarray | torch.Tensor, n_slots: int, flat_elems: int, row_elems: int) -> None:
    """Raise ``IndexError`` when a ``where`` value points outside its tier.  Every value, before any copy.

    Parameters
    ----------
    where : numpy.ndarray or torch.Tensor
        1-D int64 (see :func:`directload.kernels.tiered.flat_where`): ``>= 0`` a cache slot, ``< 0`` the flat
        tier's row at element ``-where - 1``.
    n_slots, flat_elems, row_elems : int
        Cache slots, elements of the flat tier, elements per row.
    """
    if isinstance(where, torch.Tensor):
        where = where.detach()
    if not len(where):
        return
    w = torch.as_tensor(where)
    slots = w[w >= 0]
    if slots.numel():
        hi = int(slots.max())
        if hi >= n_slots:
            raise out_of_range(hi, n_slots, what="cache slot", unit="slots")
    offs = -w[w < 0] - 1
    if offs.numel():
        hi = int(offs.max())
        if hi + row_elems > flat_elems:
            raise IndexError(f"flat-tier row at element {hi} ends past the tier's {flat_elems} elements "
                             f"(rows of {row_elems})")

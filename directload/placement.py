"""Placement rules for unified tensors: where an op runs and where its result lands.

The rules follow PyTorch-Direct (PyTorch-Direct paper, section 4.4.3, Table 4.2), resolved
by :func:`compute_device` from the operands alone:

=====  ===========================================  ===================  ===============
rule   operands                                     computation          result
=====  ===========================================  ===================  ===============
1      indexing (``x[idx]``, ``index_select``,      GPU aligned gather   CUDA tensor
       ``F.embedding``); CUDA index, or affinity
       ``cuda`` with a CUDA device
2      indexing; CPU index, affinity ``host``       CPU gather kernel    CPU tensor
3      other op; any CUDA tensor operand            GPU, zero-copy       CUDA tensor
                                                    (``cuda_view()``)
4      other op; a unified operand with affinity    GPU, zero-copy       CUDA tensor
       ``cuda``; no CUDA operand, no non-scalar
       plain CPU operand
5      other op; otherwise (affinity ``host``, or   CPU over ``.host``   CPU tensor
       a non-scalar plain CPU operand)
6      write (``x[idx] = v``, ``x.copy_(v)``)       where ``v`` lives    ``x`` updated
7      metadata (``shape``, ``dtype``, ``size()``)  none                 as torch
=====  ===========================================  ===================  ===============

0-d CPU tensors never decide placement (as in PyTorch, a CPU scalar may join
a CUDA op).  On a machine without CUDA, affinity ``cuda`` computes on the CPU.
No rule copies the table: GPU computation reads it in place over PCIe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from directload.kernels.devices import MAPPED, read_devices

__all__ = ["AFFINITIES", "describe", "place", "compute_device", "index_device", "INDEX_FUNCS", "WRITE_FUNCS",
           "METADATA_FUNCS", "HOST_FUNCS", "REFUSED_FUNCS", "write_target", "mutated_operands"]

AFFINITIES = ("cuda", "host")

if TYPE_CHECKING:
    class _HasAffinity(Protocol):
        """A table with an affinity (a unified tensor, or anything that says one)."""

        @property
        def affinity(self) -> str: ...


def describe(x: object) -> tuple[str, Any] | None:
    """An operand as placement sees it: ``("unified", affinity)``, ``("cuda", device)``,
    ``("cpu", ndim)``, or ``None`` for non-tensors."""
    if not isinstance(x, torch.Tensor):
        return None
    if getattr(x, "is_unified", False):  # a unified tensor (a class above this module: cast, not imported)
        return ("unified", cast("_HasAffinity", x).affinity)
    if x.is_cuda:
        return ("cuda", x.device)
    return ("cpu", x.dim())


def place(described: Iterable[tuple[str, Any] | None], *, has_cuda: bool, current: int = 0) -> torch.device:
    """Rules 3-5 on described operands (see :func:`describe`).  Pure.

    Examples
    --------
    >>> place([("unified", "cuda")], has_cuda=True)
    device(type='cuda', index=0)
    >>> place([("unified", "cuda"), ("cpu", 1)], has_cuda=True)
    device(type='cpu')
    """
    wants_cuda = plain_cpu = False
    for d in described:
        if d is None:
            continue
        kind, what = d
        if kind == "cuda":
            return what  # rule 3
        if kind == "unified":
            wants_cuda |= what == "cuda"
        elif what > 0:  # 0-d CPU tensors do not decide placement
            plain_cpu = True
    if wants_cuda and has_cuda and not plain_cpu:
        return torch.device("cuda", current)  # rule 4
    return torch.device("cpu")  # rule 5


def compute_device(operands: Iterable[object], *, has_cuda: bool) -> torch.device:
    """The device an op over ``operands`` runs on (rules 3-5).

    Examples
    --------
    >>> import torch
    >>> compute_device([torch.zeros(2)], has_cuda=False)
    device(type='cpu')
    """
    current = torch.cuda.current_device() if has_cuda else 0
    return place([describe(a) for a in operands], has_cuda=has_cuda, current=current)


def index_device(table: _HasAffinity, index: torch.Tensor, *, has_cuda: bool) -> torch.device:
    """The device a gather of ``table[index]`` runs on (rules 1-2).  Pure.

    Rule 1's "affinity ``cuda``" asks for a GPU result; where the gather then
    runs is :func:`directload.kernels.devices.read_devices`' call, as for every
    gather and store.

    Examples
    --------
    >>> import torch
    >>> class T:  # anything with an affinity
    ...     affinity = "cuda"
    >>> index_device(T(), torch.tensor([1]), has_cuda=False)
    device(type='cpu')
    """
    on_cuda = isinstance(index, torch.Tensor) and index.is_cuda
    wanted = "cuda" if not on_cuda and table.affinity == "cuda" and has_cuda else None
    return read_devices(index.device if on_cuda else "cpu", wanted, MAPPED)[0]


def _int_index(key):
    if isinstance(key, (list, np.ndarray)):
        try:
            key = torch.as_tensor(key)
        except (TypeError, ValueError):
            return None
    if isinstance(key, torch.Tensor) and key.dtype in (torch.int32, torch.int64) and key.dim() >= 1:
        return key
    return None


def _getitem(table, key):
    idx = _int_index(key)
    # x[idx] counts negative indices from the end, as torch's indexing does.
    return (table, idx, True) if idx is not None and getattr(table, "is_unified", False) else None


def _index_select(table, dim, index, *, out=None):
    if out is not None or not getattr(table, "is_unified", False) or dim not in (0, -table.dim()):
        return None
    return table, index, False  # torch's index_select rejects negative indices too


def _embedding(input, weight, padding_idx=None, max_norm=None, *args, **kwargs):
    if max_norm is not None or not getattr(weight, "is_unified", False):
        return None
    return weight, input, False


#: Functions answered by the gather kernel; each maps args to ``(table, index, negative_from_end)``,
#: or None to decline.
INDEX_FUNCS = {
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.index_select: _index_select,
    # torch's own builtin: PyG (torch_geometric.hash_tensor) replaces ``torch.index_select`` with a
    # wrapper that calls this one, so the wrapper's name may be what was imported first.
    torch._C._VariableFunctions.index_select: _index_select,
    torch.index_select: _index_select,
    torch.nn.functional.embedding: _embedding,
}

#: Writes into the unified memory (rule 6).
WRITE_FUNCS = frozenset({torch.Tensor.__setitem__, torch.Tensor.copy_})

#: Pure metadata: answered from the host tensor, no computation.
METADATA_FUNCS = frozenset({
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.ndimension, torch.Tensor.numel, torch.Tensor.nelement,
    torch.Tensor.stride, torch.Tensor.is_contiguous, torch.Tensor.element_size, torch.Tensor.data_ptr,
    torch.Tensor.storage_offset, torch.Tensor.__len__, torch.Tensor.is_pinned, torch.Tensor.is_shared,
    torch.Tensor.untyped_storage, torch.Tensor.__repr__, torch.Tensor.__format__,
})

#: Always served by the host view (they produce host objects).
HOST_FUNCS = frozenset({torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.__array__})


def write_target(func: Callable[..., object], args: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> tuple[torch.Tensor, Any, Any]:
    """(destination, value, index or None) of a write call."""
    if func is torch.Tensor.__setitem__:
        dst, key, value = args
        return dst, value, key
    dst, value = args[0], args[1] if len(args) > 1 else kwargs["src"]
    return dst, value, None


#: Ops that would swap or reallocate a tensor's memory; a unified tensor's bytes are fixed.
REFUSED_FUNCS = {
    torch.Tensor.set_: "set_()",
    torch.Tensor.resize_: "resize_()",
    torch.Tensor.resize_as_: "resize_as_()",
    # cast: on the class, .data is its attribute descriptor (torch's stubs type the instance's tensor)
    cast(Any, torch._C.TensorBase.data).__set__: "assigning .data",
}

#: In-place operator methods (``x += y`` usually arrives as ``add_``, but not always).
_INPLACE_DUNDERS = frozenset({
    "__iadd__", "__isub__", "__imul__", "__imatmul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__ilshift__", "__irshift__", "__iand__", "__ior__", "__ixor__", "__setitem__",
})

#: Names ending in ``_`` that change no element.
_NOT_WRITES = frozenset({"requires_grad_", "detach_", "retain_grad", "share_memory_", "pin_memory_"})


def mutated_operands(func: Callable[..., object], args: Sequence[Any],
                     kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The operands ``func(*args, **kwargs)`` writes to, by torch's naming rules.  Pure.

    In-place methods and functions end in ``_`` (``add_``, ``index_put_``,
    ``torch.nn.init.zeros_``, which calls ``zero_``) and write their first
    argument; in-place operators (``__iadd__``) and ``__setitem__`` write
    ``self``; any op writes its ``out=`` tensors.

    Examples
    --------
    >>> import torch
    >>> x, y = torch.zeros(2), torch.ones(2)
    >>> [t is x for t in mutated_operands(torch.Tensor.add_, (x, y), {})]
    [True]
    >>> mutated_operands(torch.add, (y, y), {"out": x})[0] is x, mutated_operands(torch.add, (x, y), {})
    (True, [])
    """
    out = kwargs.get("out") if kwargs else None
    targets = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
    name = getattr(func, "__name__", "")
    writes_first = name in _INPLACE_DUNDERS or (
        name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES)
    if writes_first:
        # torch.nn.init passes its tensor by keyword through handle_torch_function.
        first = args[0] if args else next((kwargs[k] for k in ("self", "input", "tensor") if k in kwargs), None)
        targets.extend(first if isinstance(first, (tuple, list)) else [first])  # _foreach_*_ take lists
    return [t for t in targets if t is not None]

"""A read's operands, the same for every store: the ids it takes (:func:`as_index`, one check and one
conversion before any work starts) and where its rows land (:func:`deliver`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.kernels.operands import check_readable, out_of_range

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeAlias

    #: What a read takes as ids: a 1-D integer tensor or numpy array, or a sequence of ints.
    Ids: TypeAlias = torch.Tensor | np.ndarray | Sequence[int]

__all__ = ["as_index", "deliver"]


def _zero_d(ids):
    # torch's indexing would give one row without its batch dimension, index_select a batch of one: a read
    # gives neither silently, it always returns [len(ids), *row_shape]
    return (f"ids must be 1-D, got a 0-d {type(ids).__name__} (a single id): pass [i] to read one row as a "
            "batch of one")


def as_index(ids: Ids) -> torch.Tensor:
    """``ids`` as a 1-D int64/int32 tensor (numpy arrays and lists accepted), or a typed error.

    Examples
    --------
    >>> as_index([3, 1]).tolist(), as_index(np.arange(2, dtype=np.uint8)).dtype
    ([3, 1], torch.int64)
    >>> as_index(torch.tensor(4))
    Traceback (most recent call last):
    ...
    ValueError: ids must be 1-D, got a 0-d Tensor (a single id): pass [i] to read one row as a batch of one
    """
    if isinstance(ids, torch.Tensor):
        t = ids
    elif isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"ids must be integers, got a numpy array of {ids.dtype}")
        if ids.ndim == 0:
            raise ValueError(_zero_d(ids))
        if ids.dtype == np.uint64 and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
            raise out_of_range(int(ids.max()), None, what="row id")
        t = torch.from_numpy(np.ascontiguousarray(ids).astype(np.int64, copy=False))
    elif isinstance(ids, (list, tuple, range)):
        if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in ids):
            raise TypeError("ids must be integers")
        big = next((int(i) for i in ids if not -2 ** 63 <= int(i) < 2 ** 63), None)
        if big is not None:
            raise out_of_range(big, None, what="row id")
        t = torch.tensor(list(ids), dtype=torch.int64) if len(ids) else torch.empty(0, dtype=torch.int64)
    else:
        raise TypeError(f"ids must be a tensor, a numpy array or a list of integers, not {type(ids).__name__}")
    check_readable(t, "ids")
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"ids must be integer row ids, got {t.dtype}")
    if t.dim() == 0:
        raise ValueError(_zero_d(ids))
    if str(t.dtype) in ("torch.uint32", "torch.uint64"):  # torch >= 2.3: check before int64 could wrap
        return as_index(t.cpu().numpy()).to(t.device)
    if t.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        t = t.to(torch.int64)
    return t


def deliver(rows: torch.Tensor, out: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """``rows`` as a read returns them: written into ``out`` when given (unless they are ``out`` already),
    else on ``device`` (moved there if they are elsewhere).  The one place a read's result is placed.

    Examples
    --------
    >>> rows = torch.ones(2, 3)
    >>> deliver(rows, None, torch.device("cpu")) is rows
    True
    >>> out = torch.zeros(2, 3)
    >>> deliver(rows, out, torch.device("cpu")) is out, out.sum().item()
    (True, 6.0)
    """
    if out is not None:
        if out.data_ptr() != rows.data_ptr():
            out.copy_(rows)
        return out
    return rows if rows.device == device else rows.to(device)

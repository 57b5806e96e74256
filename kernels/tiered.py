"""The tiered gather: one output from two tiers, in one fused kernel.

Each output row comes either from a cache (rows in slots, usually GPU memory)
or from a flat tier (host memory the GPU reads zero-copy, such as a disk
store's pinned staging buffer, where rows sit at any element offset).  One int64
per output row says which (``kernels.indexing.tier_row``): ``where >= 0`` is a
cache slot, ``where < 0`` the flat tier's element offset ``-where - 1``.  So a
batch whose rows are partly cached needs one kernel, not one per tier, and a
GPU result needs no host copy: rows go from mapped host memory straight into
the output.

The same index math runs in the Numba CUDA kernels (``numba_cuda``), the CUDA
C kernels (``cuda/gather.cu``, through CuPy), the CPU kernels (``cpu_kernels``)
and the transaction model (``pcie_model.count_tiered``).  This module checks the
operands (:func:`directload.kernels.operands.check_tiered`, beside the plain
gather's checks) and launches the backend :mod:`directload.kernels.registry` picks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from .bounds import bounds_for, check_where_on_device
from .cpu_launch import fill_rows, launch_tiered
from .cpu_path import new_output
from .operands import check_tiered, check_where, out_of_range
from .registry import choose_backend, tiered_launcher
from .views import bits, flat_bits

if TYPE_CHECKING:
    import numpy.typing as npt

# check_where, launch_tiered and tiered_launcher were defined here before the checks, the CPU kernels and the
# backend registry had one home each, and are imported from here still.
__all__ = ["gather_tiered", "check_where", "flat_where", "fill_slots", "launch_tiered", "tiered_launcher"]


def flat_where(offsets: npt.ArrayLike) -> np.ndarray:
    """``where`` values for rows of the flat tier at element ``offsets`` (``-offset - 1``)."""
    return -np.asarray(offsets, np.int64) - 1


def fill_slots(table: torch.Tensor, slots: npt.ArrayLike, flat: torch.Tensor, offsets: npt.ArrayLike) -> torch.Tensor:
    """``table[slots[k]]`` = the flat tier's row at element ``offsets[k]``: a cache taking in rows that
    just arrived in staging, in one copy.  A GPU ``table`` is filled by the tiered gather and a copy.

    Parameters
    ----------
    table : torch.Tensor
        ``[slots, *row_shape]``, contiguous.
    slots, offsets : numpy.ndarray
        1-D int64 of one length; slots distinct.
    flat : torch.Tensor
        1-D host memory of ``table``'s dtype.
    """
    slots = np.ascontiguousarray(slots, np.int64)
    offsets = np.ascontiguousarray(offsets, np.int64)
    if slots.shape != offsets.shape or slots.ndim != 1:
        raise ValueError("slots and offsets must be 1-D and of one length")
    if not slots.size:
        return table
    row_elems = math.prod(tuple(table.shape[1:]))
    if table.dtype != flat.dtype or flat.dim() != 1 or not (table.is_contiguous() and flat.is_contiguous()):
        raise ValueError("table and flat must be contiguous, of one dtype, flat 1-D")
    if np.unique(slots).shape[0] != slots.shape[0]:
        raise ValueError("slots must be distinct: two rows cannot go into one slot")
    if slots.min() < 0 or slots.max() >= table.shape[0]:
        raise out_of_range(int(slots.max() if slots.max() >= table.shape[0] else slots.min()), table.shape[0],
                           what="slot", unit="slots")
    check_where(flat_where(offsets), 0, flat.numel(), row_elems)
    if table.is_cuda:  # host values, checked above: sent from pinned staging, without a wait
        empty = torch.empty((0, *table.shape[1:]), dtype=table.dtype, device=table.device)
        rows = gather_tiered(empty, flat, torch.from_numpy(flat_where(offsets)), device=table.device)
        table.index_copy_(0, torch.from_numpy(slots).pin_memory().to(table.device, non_blocking=True), rows)
        return table
    if flat.is_cuda:
        raise ValueError("a host table cannot be filled from GPU memory")
    fill_rows(bits(table, table.shape[0]).numpy(), slots, flat_bits(flat).numpy(), offsets)
    return table


def gather_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, *, out: torch.Tensor | None = None,
                  aligned: bool = True, backend: str = "auto",
                  device: torch.device | str | None = None) -> torch.Tensor:
    """``out[r]`` = cache row ``where[r]`` (``>= 0``) or the flat tier's row at element ``-where[r] - 1``.

    Parameters
    ----------
    cache : torch.Tensor
        ``[slots, *row_shape]`` (0 slots is fine), contiguous: GPU memory (or
        mapped host memory) for a GPU gather, host memory for a CPU one.
    flat : torch.Tensor
        1-D, ``cache``'s dtype, contiguous: host memory, mapped (pinned) for a
        GPU gather, which reads it zero-copy.
    where : torch.Tensor
        1-D int64 (see :func:`flat_where`).  Its device decides where the gather
        runs and where the result lives, unless ``device`` is given.  A CUDA
        ``where`` is checked on its device, as a plain gather's ids are
        (:mod:`kernels.bounds`): a value outside its tier is clamped and
        stamps the device's error word, which the next gather on the device
        (or ``bounds_for(device).raise_pending()``) raises; nothing is read
        back.  A CPU one with ``device`` a GPU is checked on the CPU, for free,
        then copied there from pinned staging.
    device : torch.device or str, optional
        Where the gather runs and the result lives (default: ``where``'s device).
    out : torch.Tensor, optional
        ``[len(where), *row_shape]``, contiguous, on ``where``'s device.
    aligned : bool
        The aligned (one warp per row, whole 128-byte lines) or the naive GPU kernel.
    backend : {"auto", "cupy", "numba_cuda"}
        The GPU kernel's flavour; ``auto`` takes CuPy, else Numba.

    Raises
    ------
    TypeError, ValueError, IndexError
        Before any copy: bad types, dtypes, shapes or devices (in the plain gather's words:
        :func:`~directload.kernels.operands.check_tiered`), or a host ``where`` value outside its tier
        (:func:`~directload.kernels.operands.check_where`); for a CUDA ``where``, at the device's next gather.

    Examples
    --------
    >>> cache, flat = torch.tensor([[1.0, 2.0]]), torch.arange(6.0)
    >>> gather_tiered(cache, flat, torch.tensor([0, -4 - 1]))  # cache slot 0, the flat row at element 4
    tensor([[1., 2.],
            [4., 5.]])
    """
    where, run_on = check_tiered(cache, flat, where, out, device)
    shape = (where.shape[0], *cache.shape[1:])
    if out is None:  # a large CPU result comes from the recycling pool, as a plain gather's does
        out = (torch.empty(shape, dtype=cache.dtype, device=run_on) if run_on.type == "cuda"
               else new_output(shape, cache.dtype))
    if where.device != run_on:  # a CPU where, checked above without a sync, for a GPU gather
        where = where.pin_memory().to(run_on, non_blocking=True)
    elif where.is_cuda and where.numel():  # checked on its device: clamped, the error word stamped
        bounds = bounds_for(run_on.index)
        bounds.raise_pending()
        where = check_where_on_device(where, cache.shape[0], flat.numel(), math.prod(cache.shape[1:]),
                                      bounds.on_device(run_on), bounds)
    if out.numel() == 0:
        return out
    name = choose_backend(backend, where.is_cuda, "mapped" if where.is_cuda else "host")
    tiered_launcher(name)(flat_bits(cache), flat_bits(flat), where, bits(out, shape[0]), aligned=aligned,
                          stream=torch.cuda.current_stream(where.device).cuda_stream if where.is_cuda else 0)
    return out

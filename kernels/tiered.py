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
C kernels (``cuda/gather.cu``, through CuPy), the CPU kernel below and the
transaction model (``pcie_model.count_tiered``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from numba import njit, prange

from directload.capabilities import capabilities

from . import cpu
from .api import _CARRIER, BACKEND_MODULES, _new_cpu_out, resolve_backend
from .devices import MAPPED, memory_of
from .indexing import tier_row
from .operands import memory_span, out_of_range, overlaps

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["gather_tiered", "check_where", "flat_where", "fill_slots"]

_tier_row = njit(inline="always")(tier_row)


def flat_where(offsets: npt.ArrayLike) -> np.ndarray:
    """``where`` values for rows of the flat tier at element ``offsets`` (``-offset - 1``)."""
    return -np.asarray(offsets, np.int64) - 1


def check_where(where: np.ndarray | torch.Tensor, n_slots: int, flat_elems: int, row_elems: int) -> None:
    """Raise ``IndexError`` when a ``where`` value points outside its tier.  Every value, before any copy.

    Parameters
    ----------
    where : numpy.ndarray or torch.Tensor
        1-D int64.
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


@njit(inline="always")
def _tiered_row(cache, flat, where, out, row_elems, r):
    tier, first, _ = _tier_row(where[r], row_elems, 1, 0, 0)
    if tier == 0:
        out[r, :] = cache[first:first + row_elems]
    else:
        out[r, :] = flat[first:first + row_elems]


@njit(inline="always")
def _fill_row(table, slots, flat, offsets, row_elems, k):
    _, first, _ = _tier_row(-offsets[k] - 1, row_elems, 1, 0, 0)
    table[slots[k], :] = flat[first:first + row_elems]


# Each loop twice: on Numba's threads, and serial for a forked child (whose inherited threading layer
# aborts at its first parallel loop: "fork() called from a process already using GNU OpenMP") or one thread.
@njit(parallel=True, nogil=True, cache=True)
def _cpu_tiered_parallel(cache, flat, where, out, row_elems):
    for r in prange(where.shape[0]):
        _tiered_row(cache, flat, where, out, row_elems, r)


@njit(nogil=True, cache=True)
def _cpu_tiered_serial(cache, flat, where, out, row_elems):
    for r in range(where.shape[0]):
        _tiered_row(cache, flat, where, out, row_elems, r)


@njit(parallel=True, nogil=True, cache=True)
def _cpu_fill_parallel(table, slots, flat, offsets, row_elems):
    for k in prange(slots.shape[0]):
        _fill_row(table, slots, flat, offsets, row_elems, k)


@njit(nogil=True, cache=True)
def _cpu_fill_serial(table, slots, flat, offsets, row_elems):
    for k in range(slots.shape[0]):
        _fill_row(table, slots, flat, offsets, row_elems, k)


def _cpu_tiered(*args):
    return (_cpu_tiered_parallel if cpu.get_num_threads() > 1 else _cpu_tiered_serial)(*args)


def _cpu_fill(*args):
    return (_cpu_fill_parallel if cpu.get_num_threads() > 1 else _cpu_fill_serial)(*args)


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
    if table.is_cuda:
        empty = torch.empty((0, *table.shape[1:]), dtype=table.dtype, device=table.device)
        rows = gather_tiered(empty, flat, torch.from_numpy(flat_where(offsets)).to(table.device))
        table.index_copy_(0, torch.from_numpy(slots).to(table.device), rows)
        return table
    if flat.is_cuda:
        raise ValueError("a host table cannot be filled from GPU memory")
    carrier = _CARRIER[table.element_size()]
    _cpu_fill(table.view(carrier).reshape(table.shape[0], row_elems).numpy(), slots, _flat_bits(flat).numpy(),
              offsets, row_elems)
    return table


def _flat_bits(t):
    """``t``'s elements as a 1-D carrier-dtype view."""
    return t.view(_CARRIER[t.element_size()]).reshape(-1)


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
        ``where`` is checked on the GPU, which costs one host sync; a CPU one
        with ``device`` a GPU is checked on the CPU, for free, then copied there
        from pinned staging: the gather then reads nothing back from the GPU.
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
        Before any copy: bad dtypes, shapes or devices, or a ``where`` value
        outside its tier (:func:`check_where`).
    """
    for name, t in (("cache", cache), ("flat", flat), ("where", where)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if where.dtype != torch.int64 or where.dim() != 1:
        raise TypeError(f"where must be a 1-D int64 tensor, got {where.dtype} with shape {tuple(where.shape)}")
    where = where.contiguous()  # the CUDA C kernel reads a raw pointer: the values checked are the values read
    device = where.device if device is None else torch.device(device)
    # Ignored below: ``device`` is a torch.device from here on, but mypy keeps the parameter's ``str``.
    if device.type == "cuda" and device.index is None:  # type: ignore[union-attr]
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda") or (device.type == "cpu" and where.is_cuda):  # type: ignore[union-attr]
        raise ValueError(f"device must be a CUDA device (or the CPU, for a CPU where), got {device}")
    if cache.dim() < 1 or flat.dim() != 1 or cache.dtype != flat.dtype:
        raise ValueError("cache is [slots, *row_shape] and flat 1-D, of one dtype; got "
                         f"{cache.dtype}{tuple(cache.shape)} and {flat.dtype}{tuple(flat.shape)}")
    if cache.element_size() not in _CARRIER:
        raise TypeError(f"elements must be 1, 2, 4 or 8 bytes, got {cache.dtype}")
    if not (cache.is_contiguous() and flat.is_contiguous()):
        raise ValueError("cache and flat must be contiguous")
    row_shape = tuple(cache.shape[1:])
    row_elems = math.prod(row_shape)
    shape = (where.shape[0], *row_shape)
    if out is None:  # a large CPU result comes from the recycling pool, as a plain gather's does
        out = (torch.empty(shape, dtype=cache.dtype, device=device) if device.type == "cuda"  # type: ignore[union-attr]
               else _new_cpu_out(shape, cache.dtype))
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != cache.dtype
          or out.device != device or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {cache.dtype} tensor of shape {shape} on {device}")
    if device.type == "cuda":  # type: ignore[union-attr]
        if memory_of(flat) != MAPPED or memory_of(cache) not in (MAPPED, device):
            raise ValueError("a GPU tiered gather reads the flat tier zero-copy (pinned, mapped host memory) and "
                             f"the cache from {device} or mapped memory")
    elif cache.is_cuda or flat.is_cuda:
        raise ValueError("a CPU where (a CPU gather) cannot read tiers in GPU memory")
    for name, t in (("cache", cache), ("flat", flat), ("where", where)):
        if overlaps(memory_span(out), memory_span(t)):
            raise ValueError(f"out shares memory with {name}: a gather cannot write where it reads")
    check_where(where, cache.shape[0], flat.numel(), row_elems)
    if where.device != device:  # a CPU where, checked above without a sync, for a GPU gather
        where = where.pin_memory().to(device, non_blocking=True)
    if out.numel() == 0:
        return out
    c, f, o = _flat_bits(cache), _flat_bits(flat), out.view(_CARRIER[out.element_size()]).reshape(shape[0], row_elems)
    if where.is_cuda:
        caps = capabilities()
        backend = resolve_backend(backend, True, "mapped", has_cupy=caps.cupy, has_numba_cuda=caps.numba_cuda)
    else:
        backend = resolve_backend(backend, False, "host", has_cupy=False, has_numba_cuda=False)
    tiered_launcher(backend)(c, f, where, o, aligned=aligned,
                             stream=torch.cuda.current_stream(where.device).cuda_stream if where.is_cuda else 0)
    return out


def launch_tiered(cache: torch.Tensor, flat: torch.Tensor, where: torch.Tensor, out: torch.Tensor, *,
                  aligned: bool = True, stream: int = 0) -> None:
    """The CPU backend's tiered launch (the same signature as ``numba_cuda.launch_tiered`` and
    ``cupy_backend.launch_tiered``): ``out[r]`` = cache row ``where[r]``, or the flat tier's row at element
    ``-where[r] - 1``.  Torch tensors of one bit carrier, ``cache`` and ``flat`` 1-D, ``out``
    ``[len(where), row_elems]``, ``where`` checked; ``aligned`` and ``stream`` mean nothing on the CPU."""
    _cpu_tiered(cache.numpy(), flat.numpy(), where.numpy(), out.numpy(), out.shape[1])


def tiered_launcher(name: str) -> Callable[..., None]:
    """The ``launch_tiered`` function of backend ``name`` (``"cpu"``, ``"numba_cuda"`` or ``"cupy"``)."""
    if name == "cpu":
        return launch_tiered
    return importlib.import_module(BACKEND_MODULES[name], __package__).launch_tiered


"""The CPU gather's hot path: carrier views of recurring tables, the output, and the kernel once it is loaded.

A gather of CPU ids from a table (and into an ``out``) gathered before needs no more than a dict lookup, a few
attribute checks and the kernel (:func:`gather_fast`); anything unusual goes back to ``kernels.api``'s full checks
(:mod:`directload.kernels.operands`).  Until this process has loaded the kernel it would run, torch's
``index_select`` gathers the same bits, and the load starts once it pays (see "readiness" below).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from . import cpu_kernels
from .carriers import ELEMENT_SIZES
from .cpu_launch import launch, team
from .host_bytes import nbytes_of
from .host_pool import default_pool
from .loads import KernelLoads
from .operands import INDEX_DTYPES, memory_span, out_of_range, overlaps
from .views import bits

__all__ = ["gather_fast", "run", "new_output", "POOL_BYTES", "prepare", "ready", "note_fallback", "LOAD_AFTER_S",
           "first_out_of_range", "LOADS", "ready_key"]

#: CPU outputs from this size on come from the recycling host pool (kernels/host_pool.py).
POOL_BYTES = 1 << 20


def new_output(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new CPU output: from the recycling pool from :data:`POOL_BYTES` on, else ``torch.empty``."""
    if nbytes_of(shape, dtype) >= POOL_BYTES:
        return default_pool().empty(shape, dtype)
    return torch.empty(shape, dtype=dtype)


# ---------------------------------------------------------------- carrier views, cached per tensor

_views: dict[int, tuple[weakref.ref[torch.Tensor], torch.Size, torch.dtype, tuple[torch.Tensor, int]]] = {}


def _host_bits(t):
    """``(bits, address)``: ``bits(t)`` (a carrier-dtype view) and its data address, cached per
    tensor object, since tables and ``out=`` buffers recur.

    Only for tensors already checked as CPU ``src`` or ``out``.  The entry goes
    when the tensor dies.
    """
    hit = _cached_bits(t)
    if hit is None:
        ident = id(t)
        hit = (bits(t.detach(), t.shape[0]), t.data_ptr())
        _views[ident] = (weakref.ref(t, lambda _: _views.pop(ident, None)), t.shape, t.dtype, hit)
    return hit


def _cached_bits(t):
    """The cached ``(bits, address)`` of ``t``, or None.  A hit is the same live object, still
    at the same address, shape and dtype and contiguous, so a tensor changed in place
    (``set_``, ``resize_``) gets a fresh, re-checked view."""
    entry = _views.get(id(t))
    if (entry is not None and entry[0]() is t and entry[3][1] == t.data_ptr() and entry[1] == t.shape
            and entry[2] == t.dtype and t.is_contiguous()):
        return entry[3]
    return None


def _out_bits(out, src_bits):
    """``(bits, address)`` of an output made for this call, viewed as its table's bits are (same dtype and row
    shape, so the same carrier and row width): nothing to cache."""
    return out.view(src_bits.dtype).reshape(out.shape[0], src_bits.shape[1]), out.data_ptr()


# ---------------------------------------------------------------- the gathers

def gather_fast(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None, aligned: bool) -> torch.Tensor | None:
    """The common CPU gather, from a table (and ``out``) gathered before: only cache hits and
    cheap attribute checks, then the kernel, which checks the index range before it
    writes.  ``None`` when anything is unusual; the general path then checks it all.

    Worth it: right after a gather, the caches and TLB are cold (random rows of a big
    table), and the general path's Python work took ~20 us of a 2 MB gather (measured).
    """
    if (type(index) is not torch.Tensor or type(src) is not torch.Tensor or index.device.type != "cpu"
            or index.layout != torch.strided or index.dtype not in INDEX_DTYPES or index.dim() != 1
            or not index.is_contiguous()):
        return None
    n = index.shape[0]
    src_hit = _cached_bits(src)
    if src_hit is None or n == 0:
        return None
    if out is None:
        out = new_output((n, *src.shape[1:]), src.dtype)
        out_hit = _out_bits(out, src_hit[0])
    else:
        out_hit = _cached_bits(out)
        if out_hit is None or out.dtype != src.dtype or out.shape[0] != n or out.shape[1:] != src.shape[1:]:
            return None
        out_span = (out_hit[1], out_hit[1] + out_hit[0].nbytes)
        if (overlaps(out_span, (src_hit[1], src_hit[1] + src_hit[0].nbytes))
                or overlaps(out_span, memory_span(index))):
            return None  # the general path raises
    return _kernel(src_hit, index, out, out_hit, aligned)


def run(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, aligned: bool, fresh_out: bool) -> torch.Tensor:
    """The CPU gather after ``kernels.api``'s checks: ``out``, written, or ``IndexError`` (nothing written).  A
    caller's ``out`` gets a cached view, a fresh one (``fresh_out``) not."""
    src_hit = _host_bits(src)
    return _kernel(src_hit, index, out, _out_bits(out, src_hit[0]) if fresh_out else _host_bits(out), aligned)


def _kernel(src_hit, index, out, out_hit, aligned):
    """Run the CPU kernel over ``(bits, address)`` views; ``IndexError`` (nothing written) if out of range.

    Until the kernel is loaded in this process (:func:`ready`), torch's ``index_select`` gathers the same
    bits, and the load starts once it pays (:func:`note_fallback`)."""
    src_bits = src_hit[0]
    carrier, index_size = src_bits.element_size(), index.element_size()
    if ready(aligned, carrier, index_size):
        bad = launch(src_bits, index, out_hit[0], aligned=aligned)
    else:
        t0 = time.perf_counter()
        bad = _index_select(src_bits, index, out_hit[0])
        note_fallback(time.perf_counter() - t0, aligned, carrier, index_size)
    if bad >= 0:
        raise out_of_range(int(index[bad]), src_bits.shape[0], position=bad)
    return out


def first_out_of_range(index: torch.Tensor, rows: int) -> int:
    """The position of the first of the CPU ids ``index`` outside ``[0, rows)``, else -1: the check torch's path
    makes before it writes, as the kernels do."""
    if index.numel():
        # numpy's min and max: one serial vectorised pass.  torch.aminmax runs a parallel region here, which
        # waits for a descheduled thread when another process holds a core (0.81-0.87x index_select's time
        # under a one-core hog, measured); index_select itself is then the gather's only parallel region.
        ids = index.numpy()
        if int(ids.min()) < 0 or int(ids.max()) >= rows:
            return int(((index < 0) | (index >= rows)).nonzero()[0, 0])
    return -1


def _index_select(src, index, out):
    """torch's ``index_select`` of 2-D ``src`` rows into ``out``, after the kernels' own check: the position of
    the first id out of range (nothing written), else -1."""
    bad = first_out_of_range(index, src.shape[0])
    if bad < 0:
        torch.index_select(src, 0, index, out=out)
    return bad


# ---------------------------------------------------------------- readiness
# A process's first kernel load (from Numba's on-disk cache) first initialises Numba's CPU target: 0.73 s
# measured on 2 cores, most of it imports, which hold the GIL (a load on a thread of its own slowed the
# training loop beside it about as much).  The kernels gather 7-19% faster than torch's index_select
# (measured side by side, 20k-100k rows of 400-2408 bytes), so the load pays only after seconds of
# gathering.  The gathers therefore run torch's index_select (the same bits, the same index check) until
# the kernel is loaded, and start the load the ski-rental way: once gathers on index_select have taken
# LOAD_AFTER_S in this process, about what the load costs over what the kernel saves.  Short runs never
# pay the load; long runs pay it once.  prepare() loads at once.

#: Seconds of gathering on torch's index_select after which a process loads the kernel (see above).
LOAD_AFTER_S = 5.0


def _load(key):
    """Load the kernel of ``key`` (team, aligned, carrier size, index size); raises if it cannot."""
    team_name, aligned, carrier_size, index_size = key
    if team_name == "torch":
        cpu_kernels.team_kernel(aligned, carrier_size, index_size)
        return
    src = np.zeros((1, 1), cpu_kernels.NP_CARRIER[carrier_size])
    idx = np.zeros(1, cpu_kernels.NP_INDEX[index_size])
    for parallel in (False, True):
        cpu_kernels.KERNELS[aligned, parallel](src, idx, np.zeros((1, 1), src.dtype), 1)


#: The plain gather's kernels in this process, by (team, aligned, carrier size, index size).
LOADS: KernelLoads[tuple[str, bool, int, int]] = KernelLoads(_load, name="directload-kernel-load")


def note_fallback(seconds: float, aligned: bool, carrier_size: int, index_size: int) -> None:
    """A gather ran on torch's ``index_select`` for ``seconds`` because its kernel was not loaded: start
    the load once such gathers have taken :data:`LOAD_AFTER_S`."""
    LOADS.note_fallback(seconds, [ready_key(aligned, carrier_size, index_size)], after=LOAD_AFTER_S)


def ready_key(aligned: bool, carrier_size: int, index_size: int) -> tuple[str, bool, int, int]:
    """The key of :data:`LOADS` of a gather of ``carrier_size``-byte elements by ``index_size``-byte ids."""
    return team(), bool(aligned), int(carrier_size), int(index_size)


def ready(aligned: bool, carrier_size: int, index_size: int) -> bool:
    """Whether the kernel of a gather of ``carrier_size``-byte elements by ``index_size``-byte ids is loaded
    in this process (so a gather runs it at once, without a load)."""
    return LOADS.ready(ready_key(aligned, carrier_size, index_size))


def prepare(element_sizes: Sequence[int] = ELEMENT_SIZES, index_sizes: Sequence[int] = (8, 4), *, aligned: bool = True,
            background: bool = True) -> None:
    """Load the CPU gather kernels of these element and index sizes in this process (from Numba's on-disk
    cache; compiled once per machine): on a daemon thread of its own (``background``, the default: returns
    at once; gathers run torch's ``index_select`` until it is done), or now.  Idempotent; a load already
    under way is not started twice.  Long jobs and benchmarks call it up front; otherwise gathers start
    the load themselves once it pays (:data:`LOAD_AFTER_S`).

    Not in a forked child that inherited no loaded kernel: its gathers are serial, and torch's
    ``index_select`` does them without the load (each of a DataLoader's workers would pay it).
    """
    LOADS.prepare([ready_key(aligned, c, i) for c in element_sizes for i in index_sizes], background=background)

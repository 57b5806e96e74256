"""The public row gather: validation, backend choice, and the async/sync ladder."""

from __future__ import annotations

import atexit
import functools
import importlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.capabilities import capabilities

from . import cpu, gpu_path
from .carriers import CARRIERS, ELEMENT_SIZES
from .cpu import first_invalid
from .devices import memory_of, read_devices
from .host_bytes import nbytes_of
from .host_pool import default_pool
from .operands import check_readable, memory_span, out_of_range, overlaps
from .tune_keys import key_for
from .tuner import get_tuner
from .variants import Variant, candidates, legal_width

if TYPE_CHECKING:
    from .bounds import DeviceBounds

__all__ = ["gather", "gather_async", "GatherFuture", "resolve_backend", "check_devices", "check_no_overlap",
           "launcher", "BACKENDS"]

BACKENDS = ("auto", "cpu", "numba_cuda", "cupy")
_GPU_BACKENDS = ("numba_cuda", "cupy")
#: CPU outputs from this size on come from the recycling host pool (kernels/host_pool.py).
POOL_BYTES = 1 << 20
# The bit-carrier dtype of each element size: the gather copies bits, so every
# dtype of one size (fp16, bf16, int16) shares one kernel specialisation.
# (Every element size's carrier has a torch name: only the 16-byte vector unit has none.)
_CARRIER = {size: getattr(torch, CARRIERS[size].torch) for size in ELEMENT_SIZES}  # type: ignore[arg-type]
# Every backend module exports ``launch(src, index, out, *, aligned, stream) -> int`` (see
# kernels.cpu.launch); the GPU ones import Numba CUDA or CuPy, so they load on first use.
BACKEND_MODULES = {"cpu": ".cpu", **gpu_path.BACKEND_MODULES}


def launcher(name: str) -> Callable[..., int]:
    """The ``launch`` function of backend ``name`` (``"cpu"``, ``"numba_cuda"`` or ``"cupy"``)."""
    if name == "cpu":
        return cpu.launch
    return importlib.import_module(BACKEND_MODULES[name], __package__).launch


def resolve_backend(requested: str, index_on_cuda: bool, src_location: str, *, has_cupy: bool | str,
                    has_numba_cuda: bool | str) -> str:
    """Pick the backend for one gather.  Pure; raises on an impossible combination.

    Parameters
    ----------
    requested : str
        One of :data:`BACKENDS`.
    index_on_cuda : bool
        Whether the index is a CUDA tensor (this decides CPU vs GPU kernel).
    src_location : {"host", "mapped", "cuda"}
        Pageable host memory, pinned GPU-mapped host memory, or device memory.
    has_cupy, has_numba_cuda : bool or str
        What the machine offers for GPU launches (truth values: :func:`~directload.capabilities.capabilities`
        gives version strings, ``""`` for none).

    Returns
    -------
    str
        ``"cpu"``, ``"numba_cuda"`` or ``"cupy"``.

    Examples
    --------
    >>> resolve_backend("auto", False, "host", has_cupy=False, has_numba_cuda=False)
    'cpu'
    >>> resolve_backend("auto", True, "mapped", has_cupy=True, has_numba_cuda=True)
    'cupy'
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    index_device = "cuda" if index_on_cuda else "cpu"
    run, out = read_devices(index_device, None, "cuda" if src_location == "cuda" else src_location)
    if run.type != out.type:  # the rows would need a copy, which a gather never makes silently
        if out.type == "cpu":
            raise ValueError("src is in CUDA memory but the index is on the CPU: pass a CUDA index "
                             "(a CPU index runs the CPU kernel, which cannot read device memory)")
        raise ValueError("src is pageable host memory, which a GPU kernel cannot read: make it a "
                         "unified tensor (directload.to_unified) or pin it, or pass a CPU index")
    if run.type == "cpu":
        if requested in _GPU_BACKENDS:
            raise ValueError(f"backend {requested!r} needs a CUDA index; a CPU index runs the 'cpu' backend")
        return "cpu"
    if requested == "cpu":
        raise ValueError("backend 'cpu' needs a CPU index; a CUDA index runs a GPU kernel")
    if requested == "auto":
        if has_cupy:
            return "cupy"
        if has_numba_cuda:
            return "numba_cuda"
        raise RuntimeError("a CUDA index needs CuPy or Numba CUDA; install cupy-cuda12x or numba-cuda")
    return requested


def _src_location(src):
    """``memory_of(src)`` in resolve_backend's words: "host", "mapped" or "cuda"."""
    memory = memory_of(src)
    return memory if isinstance(memory, str) else "cuda"


def _check_index(index, n_rows, *, cpu_bounds=True, strict=False):
    """The index as a contiguous tensor, after dtype, shape and range checks.

    ``cpu_bounds=False`` leaves the range check of a CPU index to the kernel,
    which checks every index before it writes anything (one pass, not two).  A CUDA
    index is range-checked by the GPU kernel (:mod:`kernels.bounds`), never read here,
    unless ``strict`` (one sync: :func:`_strict_bounds`).
    """
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"index must be a torch.Tensor or numpy.ndarray, got {type(index).__name__}")
    check_readable(index, "index")
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"index must be int32 or int64, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"index must be 1-D, got {index.dim()}-D with shape {tuple(index.shape)}")
    index = index.contiguous()
    if index.is_cuda:
        if strict:
            _strict_bounds(index, n_rows)
    elif cpu_bounds:
        _cpu_bounds(index, n_rows)
    return index


def _cpu_bounds(index, n_rows):
    """Raise if a CPU id is out of range (a read of host memory, no sync)."""
    bad = first_invalid(index.numpy(), n_rows)
    if bad >= 0:
        raise out_of_range(int(index[bad]), n_rows, position=bad)


def _strict_bounds(index, n_rows):
    """``strict=True``: raise now if a CUDA id is out of range, after one device-to-host sync."""
    if index.numel():
        lo, hi = torch.aminmax(index).tolist()  # the one sync of strict mode
        if lo < 0 or hi >= n_rows:
            bad = int(((index < 0) | (index >= n_rows)).nonzero()[0, 0])
            raise out_of_range(int(index[bad]), n_rows, position=bad)


def _check_src(src):
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src must be a torch.Tensor, got {type(src).__name__}")
    check_readable(src, "src")
    if src.dim() == 0:
        raise ValueError("src must have at least one dimension (rows)")
    if src.element_size() not in _CARRIER:
        raise TypeError(f"src elements must be 1, 2, 4 or 8 bytes, got {src.dtype} ({src.element_size()} B)")
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


def _check_out(out, shape, src, on_cuda, device):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    check_readable(out, "out")
    if out.dtype != src.dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {src.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if out.is_cuda != on_cuda or (on_cuda and out.device != device):
        raise ValueError(f"out is on {out.device}, expected {device if on_cuda else 'cpu'}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")


def check_no_overlap(out: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    """Raise ``ValueError`` when ``out`` shares memory with ``src`` or ``index``.

    The kernel would read what it has just written: rows of ``src`` already
    overwritten (wrong rows, silently), or index values overwritten mid-gather
    (wild reads).  torch refuses ``index_select(..., out=)`` on overlapping
    memory for the same reason.  Addresses are compared as they are: with
    unified addressing a mapped host table and its CUDA view share them.
    """
    span = memory_span(out)
    for name, other in (("src", src), ("index", index)):
        if overlaps(span, memory_span(other)):
            raise ValueError(f"out shares memory with {name}: a gather cannot write where it reads; "
                             "pass a separate out (or clone() the input first)")


class GatherFuture:
    """A gather in flight.  :meth:`wait` gives the output tensor.

    A CPU gather has already run when :func:`gather_async` returns (on the
    caller's thread and its OpenMP team: the CPU has no queue to put it on),
    unless it was started with ``background=True``, in which case a worker
    thread runs it and ``wait()`` blocks until it is done.  A GPU gather is
    launched at once on the caller's current stream; ``wait()`` orders a caller
    now on another stream after it (no host block), so the tensor is safe to
    use in stream order.

    A CUDA gather checks its ids on the GPU (see :mod:`kernels.bounds`): ``wait()``
    and ``done()`` raise ``IndexError`` if the kernel has already reported an id out
    of range, :meth:`check` waits for the kernel and then tells for sure, and the
    next gather on the device raises what no one has seen yet.

    Examples
    --------
    >>> import torch
    >>> from directload.kernels import gather_async
    >>> table = torch.arange(6.0).reshape(3, 2)
    >>> future = gather_async(table, torch.tensor([2, 0]))
    >>> future.done()  # a CPU gather has run by the time gather_async returns
    True
    >>> future.wait()
    tensor([[4., 5.],
            [0., 1.]])
    >>> gather_async(table, torch.tensor([1]), background=True).wait()  # on a worker thread
    tensor([[2., 3.]])
    """

    __slots__ = ("_result", "_out", "_stream", "_bounds", "_stamp")

    def __init__(self, result: Future[torch.Tensor] | None, out: torch.Tensor, stream: torch.cuda.Stream | None = None,
                 bounds: DeviceBounds | None = None, stamp: int = 0) -> None:
        # A GPU gather's future has both ``stream`` and ``bounds``; a CPU gather's neither.
        self._result = result
        self._out = out
        self._stream = stream  # the CUDA stream a GPU gather was launched on
        self._bounds = bounds
        self._stamp = stamp

    def wait(self) -> torch.Tensor:
        """Finish the gather and return its output tensor."""
        if self._stream is not None:
            current = torch.cuda.current_stream(self._out.device)
            if current.cuda_stream != self._stream.cuda_stream:
                # An event recorded now follows the kernel (and what came after it on that stream).
                current.wait_event(self._stream.record_event())
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
        elif self._result is not None:
            self._result.result()  # re-raises the worker's exception, traceback intact
        return self._out

    def done(self) -> bool:
        """Whether the gather has finished (never blocks)."""
        if self._stream is not None:
            if not self._stream.query():  # the stream's work so far, this gather included
                return False
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
            return True
        if self._result is not None:
            return self._result.done()
        return True

    def check(self) -> torch.Tensor:
        """Wait (on the host) for the gather to finish and raise ``IndexError`` if an id was out of range.

        The one way to be sure of a CUDA gather's ids before using its rows; a sync.  Returns the output.
        """
        if self._stream is not None:
            self._stream.record_event().synchronize()
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
            return self._out
        return self.wait()


_pool = None
_pool_lock = threading.Lock()


def _after_fork_in_child():
    # The parent's worker thread did not come along: a new child builds its own pool.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _cpu_pool():
    # One worker: Numba's workqueue threading layer must not be entered from two
    # threads at once, and one worker already overlaps the caller (nogil kernels).
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="directload-cpu-worker")
            atexit.register(_pool.shutdown, wait=True)
        return _pool


_views: dict[int, tuple[weakref.ref[torch.Tensor], torch.Size, torch.dtype, tuple[torch.Tensor, int]]] = {}


def _host_bits(t):
    """``(bits, address)``: ``_bits(t)`` (a carrier-dtype view) and its data address, cached per
    tensor object, since tables and ``out=`` buffers recur.

    Only for tensors already checked as CPU ``src`` or ``out``.  The entry goes
    when the tensor dies.
    """
    hit = _cached_bits(t)
    if hit is None:
        ident = id(t)
        hit = (_bits(t.detach(), t.shape[0]), t.data_ptr())
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


def _bits(t, rows):
    """The tensor's bits as a 2-D carrier-dtype view ``[rows, row_elems]`` (also for 0 rows)."""
    return t.view(_CARRIER[t.element_size()]).reshape(rows, math.prod(t.shape[1:]))


_INDEX_DTYPES = (torch.int32, torch.int64)


def _gather_cpu_fast(src, index, out, aligned):
    """The common CPU gather, from a table (and ``out``) gathered before: only cache hits and
    cheap attribute checks, then the kernel, which checks the index range before it
    writes.  ``None`` when anything is unusual; the general path then checks it all.

    Worth it: right after a gather, the caches and TLB are cold (random rows of a big
    table), and the general path's Python work took ~20 us of a 2 MB gather (measured).
    """
    if (type(index) is not torch.Tensor or type(src) is not torch.Tensor or index.device.type != "cpu"
            or index.layout != torch.strided or index.dtype not in _INDEX_DTYPES or index.dim() != 1
            or not index.is_contiguous()):
        return None
    n = index.shape[0]
    src_hit = _cached_bits(src)
    if src_hit is None or n == 0:
        return None
    if out is None:
        out = _new_cpu_out((n, *src.shape[1:]), src.dtype)
        out_hit = _fresh_bits(out)
    else:
        out_hit = _cached_bits(out)
        if out_hit is None or out.dtype != src.dtype or out.shape[0] != n or out.shape[1:] != src.shape[1:]:
            return None
        out_span = (out_hit[1], out_hit[1] + out_hit[0].nbytes)
        if (overlaps(out_span, (src_hit[1], src_hit[1] + src_hit[0].nbytes))
                or overlaps(out_span, memory_span(index))):
            return None  # the general path raises
    return _cpu_kernel(src_hit, index, out, out_hit, aligned)


def _new_cpu_out(shape, dtype):
    """A new CPU output: from the recycling pool from ``POOL_BYTES`` on, else ``torch.empty``."""
    if nbytes_of(shape, dtype) >= POOL_BYTES:
        return default_pool().empty(shape, dtype)
    return torch.empty(shape, dtype=dtype)


def _fresh_bits(t):
    """``(bits, address)`` of a tensor made for this call: nothing to cache."""
    return _bits(t, t.shape[0]), t.data_ptr()


def _cpu_kernel(src_hit, index, out, out_hit, aligned):
    """Run the CPU kernel over ``(bits, address)`` views; ``IndexError`` (nothing written) if out of range.

    Until the kernel is loaded in this process (``cpu.ready``), torch's ``index_select`` gathers the same
    bits, and the load starts once it pays (``cpu.note_fallback``): a process's first load takes most of a
    second."""
    src_bits = src_hit[0]
    carrier, index_size = src_bits.element_size(), index.element_size()
    if cpu.ready(aligned, carrier, index_size):
        bad = cpu.launch(src_bits, index, out_hit[0], aligned=aligned)
    else:
        t0 = time.perf_counter()
        bad = _index_select(src_bits, index, out_hit[0])
        cpu.note_fallback(time.perf_counter() - t0, aligned, carrier, index_size)
    if bad >= 0:
        raise out_of_range(int(index[bad]), src_bits.shape[0], position=bad)
    return out


def _index_select(src, index, out):
    """torch's ``index_select`` of 2-D ``src`` rows into ``out``, after the kernels' own check: the position of
    the first id out of range (nothing written), else -1."""
    if index.numel():
        lo, hi = (int(v) for v in torch.aminmax(index))
        if lo < 0 or hi >= src.shape[0]:
            return int(((index < 0) | (index >= src.shape[0])).nonzero()[0, 0])
    torch.index_select(src, 0, index, out=out)
    return -1


def _plan(src, index, out, backend, *, cpu_bounds, strict=False):
    """Check everything and pick the backend: ``(name, index, out)``, out allocated if None."""
    _check_src(src)
    n_rows = src.shape[0]
    index = _check_index(index, n_rows, cpu_bounds=cpu_bounds, strict=strict)
    shape = (index.shape[0], *src.shape[1:])
    if index.is_cuda:
        loc = _src_location(src)
        caps = capabilities()
        name = resolve_backend(backend, True, loc, has_cupy=caps.cupy, has_numba_cuda=caps.numba_cuda)
        check_devices(index.device, loc, src.device)
    else:  # a CPU index needs src off the device; whether host memory is mapped does not matter
        name = resolve_backend(backend, False, "cuda" if src.is_cuda else "host", has_cupy=False,
                               has_numba_cuda=False)
    if out is None:
        if name == "cpu":
            out = _new_cpu_out(shape, src.dtype)
        else:
            out = torch.empty(shape, dtype=src.dtype, device=index.device)
    else:
        _check_out(out, shape, src, index.is_cuda, index.device)
        check_no_overlap(out, src, index)
    return name, index, out


def _run_cpu(src, index, out, aligned, fresh_out):
    """The CPU kernel after the general checks; a caller's ``out`` gets a cached view, a fresh one not."""
    return _cpu_kernel(_host_bits(src), index, out, _fresh_bits(out) if fresh_out else _host_bits(out), aligned)


def gather_async(src: torch.Tensor, index: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
                 backend: str = "auto", aligned: bool = True, background: bool = False,
                 variant: Variant | str | None = None, strict: bool = False) -> GatherFuture:
    """Start ``out[i] = src[index[i]]`` and return a :class:`GatherFuture`.

    Same arguments, checks and memory contract as :func:`gather`, which is
    exactly ``gather_async(...).wait()``.  Every check of the arguments runs before
    this returns, so a bad input raises here, not in ``wait()``; CUDA ids are
    checked on the GPU (see :func:`gather`).  A GPU gather is launched at once; a
    CPU gather runs at once on the caller's thread, or on a worker thread with
    ``background=True`` (see :class:`GatherFuture`).
    """
    if type(index) is torch.Tensor and index.is_cuda:  # type: ignore[union-attr]  # a tensor: type() just said so
        if not (background or strict or out is not None) and backend == "auto":
            done = _gather_gpu_fast(src, index, aligned, variant)
            if done is not None:
                return done
    elif variant is None and not background and backend in ("auto", "cpu"):
        done = _gather_cpu_fast(src, index, out, aligned)
        if done is not None:
            return GatherFuture(None, done)
    chosen = gpu_path.as_variant(variant)
    fresh = out is None
    # Run now, the CPU kernel checks the index range itself before it writes: one pass over the index.
    name, index, out = _plan(src, index, out, backend, cpu_bounds=background, strict=strict)
    if chosen is not None and not index.is_cuda:
        raise ValueError("variant chooses among GPU kernels: it needs CUDA ids (a CPU index runs the CPU kernel)")
    if index.is_cuda:
        if chosen is None and not aligned:
            chosen = Variant("naive")
        return _launch_gpu(gpu_path.table_for(src, index.device, name), index, out, chosen)
    if out.numel() == 0:
        if not background and index.numel():  # zero-width rows: the ids must still exist
            _check_index(index, src.shape[0])
        return GatherFuture(None, out)
    work = functools.partial(_run_cpu, src, index, out, aligned, fresh)
    if background:
        return GatherFuture(_cpu_pool().submit(work), out)
    return GatherFuture(None, work())


def _gather_gpu_fast(src, index, aligned, variant):
    """The common GPU gather, over a table gathered before on this device: a cache hit and cheap attribute
    checks, then the launch; ``None`` when anything is unusual (the general path then checks it all).
    Reads nothing from the device."""
    table = gpu_path.cached_table(src, index.device)
    if (table is None or table.backend != _auto_backend() or index.dtype not in _INDEX_DTYPES
            or index.dim() != 1 or not index.is_contiguous() or index.layout != torch.strided):
        return None
    out = torch.empty((index.shape[0], *table.row_shape), dtype=table.dtype, device=index.device)
    chosen = gpu_path.as_variant(variant) if variant is not None else (None if aligned else Variant("naive"))
    return _launch_gpu(table, index, out, chosen)


def _auto_backend():
    """The backend ``"auto"`` takes for CUDA ids on this machine."""
    caps = capabilities()
    return "cupy" if caps.cupy else "numba_cuda"


def _launch_gpu(table, index, out, variant):
    """Launch on the caller's current stream of the ids' device; no host sync, no event."""
    if index.shape[0] and table.n_rows == 0:
        _no_rows(index)
    if index.shape[0] == 0:
        table.bounds.raise_pending()
        return GatherFuture(None, out)
    stream = torch.cuda.current_stream(table.device)
    if variant is None and table.row_bytes:
        variant = table.variant_for(index.shape[0], out.data_ptr(), _tuned)
    if table.device_index != torch.cuda.current_device():
        with torch.cuda.device(table.device):
            stamp = _start_gpu(table, index, out, variant, stream)
    else:
        stamp = _start_gpu(table, index, out, variant, stream)
    return GatherFuture(None, out, stream, table.bounds, stamp)


def _start_gpu(table, index, out, variant, stream):
    """The launch of a GPU gather (its stamp): the row kernel, or for rows of 0 bytes, with nothing to move,
    the kernels' check of the ids alone (:func:`_check_ids_gpu`), as a CPU gather checks them."""
    if table.row_bytes == 0:
        return _check_ids_gpu(table, index, stream)
    return gpu_path.launch(table, index, out, variant, stream)


def _check_ids_gpu(table, index, stream):
    """Check ``index`` against ``table`` on the device as every GPU gather does (:mod:`kernels.bounds`): the
    ``check_clamp`` kernel stamps the error word for an id out of range; its clamped ids are scratch.  Returns
    the launch's stamp; reads nothing back."""
    bounds = table.bounds
    bounds.raise_pending()
    stamp = bounds.stamp(index, table.n_rows)
    table.launch_check_clamp(device_id=table.device_index, index=index, clamped=torch.empty_like(index),
                             n_rows=table.n_rows, err_ptr=bounds.ptr, stamp=stamp, stream_ptr=stream.cuda_stream)
    return stamp


def _no_rows(index):
    """Every id is out of range of a table of no rows: raise, naming the first (a sync, on the error path)."""
    raise out_of_range(int(index[0]), 0, position=0)


def _tuned(table, n, out_ptr):
    """The tuner's variant for ``n`` ids over ``table``: cached, else timed now over random ids in range
    (``kernels.tuner``; None where timing is off, for the default)."""
    tuner = get_tuner()
    if not tuner.enabled:
        return None
    key = key_for(table.device, table.row_bytes, table.elem, n, table.n_rows,
                  align=legal_width(table.row_bytes, table.ptr, out_ptr))
    found = tuner.lookup(key)
    if found is not None:
        return found
    ids = torch.randint(0, table.n_rows, (n,), device=table.device)
    scratch = torch.empty((n, *table.row_shape), dtype=table.dtype, device=table.device)

    def run(variant):
        gpu_path.launch(table, ids, scratch, variant, torch.cuda.current_stream(table.device))

    return tuner.choose(key, candidates(table.row_bytes, table.ptr, out_ptr), run)


def vector_units(row_bytes: int, src_addr: int, out_addr: int) -> bool:
    """Whether the aligned GPU kernel may read 16-byte units (CUDA ``uint4`` vector loads).

    Every row must start and end on a 16-byte boundary in both tables: rows a
    multiple of 16 bytes, both tables 16-byte aligned.  Pure.

    Examples
    --------
    >>> vector_units(400, 0x1000, 0x2040), vector_units(404, 0x1000, 0x2040), vector_units(400, 0x1004, 0)
    (True, False, False)
    """
    return row_bytes > 0 and row_bytes % 16 == 0 and src_addr % 16 == 0 and out_addr % 16 == 0


def _gpu_bits(t, rows, vector):
    """``_bits(t)``, or with ``vector`` a view in 16-byte units (complex128 only carries the bits)."""
    if vector:
        return t.view(torch.uint8).reshape(rows, t.element_size() * math.prod(t.shape[1:])).view(torch.complex128)
    return _bits(t, rows)


def gather(src: torch.Tensor, index: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
           backend: str = "auto", aligned: bool = True, variant: Variant | str | None = None,
           strict: bool = False) -> torch.Tensor:
    """Gather rows: ``out[i] = src[index[i]]``, bit-exact.

    Parameters
    ----------
    src : torch.Tensor
        The table; its first dimension is the row.  Elements of 1, 2, 4 or 8
        bytes (float16/32/64, bfloat16, int8/uint8, int32/int64, bool), any row
        length.  Ordinary host memory, pinned GPU-mapped host memory (a unified
        tensor, or a pinned tensor on a UVA system), or CUDA memory.  Must be
        contiguous: a strided ``src`` raises ``ValueError`` rather than being
        copied.
    index : torch.Tensor or numpy.ndarray
        1-D int32 or int64 rows, on the CPU or a CUDA device.  Duplicates and an
        empty index are fine.
    out : torch.Tensor, optional
        Preallocated output ``[len(index), *src.shape[1:]]``, ``src``'s dtype,
        contiguous, on the output device below.
    backend : {"auto", "cpu", "numba_cuda", "cupy"}
        ``"auto"`` takes ``cpu`` for a CPU index and CuPy (else Numba) for a
        CUDA index.
    aligned : bool
        On the CPU, the aligned kernel (default) or the naive one.  For CUDA
        ids, ``False`` forces the naive GPU kernel; the default leaves the
        choice to ``variant``.
    variant : kernels.variants.Variant or str, optional
        CUDA ids only: the GPU kernel, by :class:`~kernels.variants.Variant` or
        name (``"rowvec16x8"``, ``"index_select+sort"``, ...).  None: the
        tuner's choice for this table, row size and id count (see the tuning
        guide), else rowvec at 16-byte loads.
    strict : bool
        CUDA ids only: check their range before the launch, at the cost of one
        device-to-host sync, so an id out of range raises here.  By default
        the kernel checks them (see below).

    Returns
    -------
    torch.Tensor
        Memory contract:

        ===================  ==================  ===========  ===============
        index                src                 kernel       output
        ===================  ==================  ===========  ===============
        CPU                  host or mapped      cpu          CPU
        CPU                  CUDA                ValueError
        CUDA (device d)      mapped or CUDA (d)  GPU          CUDA, device d
        CUDA                 pageable host       ValueError
        ===================  ==================  ===========  ===============

        A CPU result is complete when this returns; a new CPU output of 1 MiB
        or more lives in a recycling pool (its pages are reused once the
        tensor and all its views are gone), so it cannot be resized.  A CUDA
        result is ordered on the current stream of device d.  The output
        carries no autograd history (this is data loading, not a model op).

    Raises
    ------
    IndexError
        An index value is negative or ``>= src.shape[0]`` (the message names the
        value, the bound and the position).  CPU ids are checked before
        anything is written.  CUDA ids are checked by the GPU kernel, with no
        host sync: a bad id is clamped (its row is some valid row) and the
        kernel flags it; the error is raised by this call if the kernel has
        finished when it returns, else by the next gather on that device, or
        at once by ``gather_async(...).check()``.  ``strict=True`` raises
        before the launch instead (one sync).
    TypeError
        Index dtype is not int32/int64 (float, bool, ...), or element size is not
        1, 2, 4 or 8 bytes, or ``out`` has the wrong dtype.
    ValueError
        Index is not 1-D, devices do not match, ``src``/``out`` not contiguous,
        ``out`` has the wrong shape, or ``out`` shares memory with ``src`` or
        ``index``, or a ``variant`` with CPU ids.

    Examples
    --------
    >>> import torch
    >>> from directload.kernels import gather
    >>> table = torch.arange(12.0).reshape(4, 3)
    >>> gather(table, torch.tensor([3, 0, 3]))
    tensor([[ 9., 10., 11.],
            [ 0.,  1.,  2.],
            [ 9., 10., 11.]])
    """
    future = gather_async(src, index, out=out, backend=backend, aligned=aligned, variant=variant, strict=strict)
    if future._stream is not None:  # launched on this thread's current stream: ordered already
        future._bounds.raise_for(future._stamp)  # type: ignore[union-attr]  # set with _stream
        return future._out
    return future.wait()

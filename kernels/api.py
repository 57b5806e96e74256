"""The public row gather: ``gather_async`` and ``gather``, its exact ``wait()``.

A gather first tries its fast path (:mod:`directload.kernels.cpu_path`, :mod:`directload.kernels.gpu_path`): a
table gathered before needs only cache hits and cheap checks.  Otherwise every argument is checked
(:mod:`directload.kernels.operands`), the backend is chosen (:mod:`directload.kernels.registry`), and the gather
runs on the caller's thread, on the CPU worker thread, or on the caller's CUDA stream; its
:class:`~directload.kernels.futures.GatherFuture` says when it is done.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from directload.codecs import EncodedTable

from . import cpu_path, decode, futures, gpu_path
from .cpu_path import POOL_BYTES
from .devices import memory_of
from .futures import GatherFuture
from .operands import as_index, check_devices, check_no_overlap, check_out, check_src
from .registry import BACKENDS, choose_backend, launcher, resolve_backend
from .variants import Variant, vector_units

# The names after gather and gather_async were defined here before their modules were split by job, and are
# imported from here still.
__all__ = ["gather", "gather_async", "GatherFuture", "resolve_backend", "check_devices", "check_no_overlap",
           "launcher", "BACKENDS", "POOL_BYTES", "vector_units"]


def _src_location(src):
    """``memory_of(src)`` in resolve_backend's words: "host", "mapped" or "cuda"."""
    memory = memory_of(src)
    return memory if isinstance(memory, str) else "cuda"


def _plan(src, index, out, backend, *, cpu_bounds, strict=False) -> tuple[str, torch.Tensor, torch.Tensor]:
    """Check everything and pick the backend: ``(name, index, out)``, out allocated if None."""
    check_src(src)
    index = as_index(index, src.shape[0], cpu_bounds=cpu_bounds, strict=strict)
    shape = (index.shape[0], *src.shape[1:])
    if index.is_cuda:
        loc = _src_location(src)
        name = choose_backend(backend, True, loc)
        check_devices(index.device, loc, src.device)
    else:  # a CPU index needs src off the device; whether host memory is mapped does not matter
        name = choose_backend(backend, False, "cuda" if src.is_cuda else "host")
    if out is None:
        if name == "cpu":
            out = cpu_path.new_output(shape, src.dtype)
        else:
            out = torch.empty(shape, dtype=src.dtype, device=index.device)
    else:
        check_out(out, shape, src.dtype, index.device)
        check_no_overlap(out, src, index)
    return name, index, out


def gather_async(src: torch.Tensor | EncodedTable, index: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
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
    if isinstance(src, EncodedTable):
        if variant is not None:
            raise ValueError("variant chooses among the plain gather's kernels; an EncodedTable has its own")
        return decode.gather_encoded(src, index, out=out, backend=backend, background=background, strict=strict)
    if type(index) is torch.Tensor and index.is_cuda:  # type: ignore[union-attr]  # a tensor: type() just said so
        if not (background or strict or out is not None) and backend == "auto":
            done = gpu_path.gather_fast(src, index, aligned, variant)
            if done is not None:
                return done
    elif variant is None and not background and backend in ("auto", "cpu"):
        written = cpu_path.gather_fast(src, index, out, aligned)  # type: ignore[arg-type]  # None unless a tensor
        if written is not None:
            return GatherFuture(None, written)
    chosen = gpu_path.as_variant(variant)
    fresh = out is None
    # Run now, the CPU kernel checks the index range itself before it writes: one pass over the index.
    name, index, out = _plan(src, index, out, backend, cpu_bounds=background, strict=strict)
    if chosen is not None and not index.is_cuda:
        raise ValueError("variant chooses among GPU kernels: it needs CUDA ids (a CPU index runs the CPU kernel)")
    if index.is_cuda:
        if chosen is None and not aligned:
            chosen = Variant("naive")
        return gpu_path.start(gpu_path.table_for(src, index.device, name), index, out, chosen)
    if out.numel() == 0:
        if not background and index.numel():  # zero-width rows: the ids must still exist
            as_index(index, src.shape[0])
        return GatherFuture(None, out)
    work = functools.partial(cpu_path.run, src, index, out, aligned, fresh)
    if background:
        return futures.submit(work, out)
    return GatherFuture(None, work())


def gather(src: torch.Tensor | EncodedTable, index: torch.Tensor | np.ndarray, *, out: torch.Tensor | None = None,
           backend: str = "auto", aligned: bool = True, variant: Variant | str | None = None,
           strict: bool = False) -> torch.Tensor:
    """Gather rows: ``out[i] = src[index[i]]``, bit-exact.

    Parameters
    ----------
    src : torch.Tensor or directload.codecs.EncodedTable
        The table; its first dimension is the row.  Elements of 1, 2, 4 or 8
        bytes (float16/32/64, bfloat16, int8/uint8, int32/int64, bool), any row
        length.  Ordinary host memory, pinned GPU-mapped host memory (a unified
        tensor, or a pinned tensor on a UVA system), or CUDA memory.  Must be
        contiguous: a strided ``src`` raises ``ValueError`` rather than being
        copied.  An :class:`~directload.codecs.EncodedTable` (compressed rows)
        is decoded inside the gather: ``out[i]`` is the reference decode of
        code row ``index[i]``, bit for bit, in ``out``'s dtype (float32,
        float16 or bfloat16; float32 when ``out`` is None), with no copy of the
        codes in between (:mod:`directload.kernels.decode`).
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
    return future.wait_in_order()  # launched on this thread's current stream: ordered already

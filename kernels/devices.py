"""Where a gather runs and where its result lives: the one rule every gather, store and loader follows.

Two questions, answered once, here, by pure functions:

* :func:`memory_of`: what kind of memory holds a table: ``"host"`` (pageable,
  readable by the CPU only), ``"mapped"`` (pinned and GPU-mapped host memory:
  a unified tensor, or a pinned tensor on a machine with CUDA; readable by the
  CPU and, zero-copy over PCIe, by every GPU) or the CUDA device that holds it.
* :func:`read_devices`: given that, where the ids are and where the caller
  wants the rows, on which device the gather runs and where its result lives.

``kernels.api.gather`` (which refuses any read that would need a hidden copy),
the stores (which make that copy when asked for a result elsewhere), the
unified tensor's indexing rules and the loaders all call these two.
"""

from __future__ import annotations

import torch

__all__ = ["HOST", "MAPPED", "memory_of", "read_devices"]

HOST = "host"
MAPPED = "mapped"


def memory_of(table: torch.Tensor, *, has_cuda: bool | None = None) -> str | torch.device:
    """``"host"``, ``"mapped"`` or the ``torch.device`` of the GPU memory that holds ``table``.

    Pinned memory counts as mapped only where CUDA runs (with unified virtual
    addressing a pinned host pointer is also a device pointer).

    Examples
    --------
    >>> memory_of(torch.zeros(2), has_cuda=False)
    'host'
    """
    if getattr(table, "is_unified", False):
        return MAPPED
    if table.is_cuda:
        return table.device
    if has_cuda is None:
        # Only a process whose CUDA is up can hold pinned memory, and asking is_pinned() elsewhere would
        # start CUDA (or fail, in a worker forked from a process that had started it).
        has_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if has_cuda and table.is_pinned():
        return MAPPED
    return HOST


def _cuda(device):
    """``device`` with its index filled in (``cuda`` means the current device)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def read_devices(index_device: torch.device | str, requested: torch.device | str | None,
                 memory: str | torch.device) -> tuple[torch.device, torch.device]:
    """``(run_device, out_device)`` of a read of rows held in ``memory``.  Pure.

    * The result lives on ``requested`` when given, else on the index's device.
    * Rows in GPU memory are gathered on that GPU (then copied out if the
      result lives elsewhere).
    * Mapped host rows are gathered by the GPU that wants them, zero-copy, or
      by the CPU for a CPU result.
    * Pageable host rows are gathered by the CPU (then copied to a GPU result).

    Parameters
    ----------
    index_device : torch.device or str
        Where the ids are.
    requested : torch.device, str or None
        Where the caller wants the rows; ``None``: with the ids.
    memory : {"host", "mapped"} or torch.device
        What :func:`memory_of` says of the table (a file's staging buffer is
        ``"host"``).  A bare ``cpu`` device counts as ``"host"``: it says
        nothing of pinning, so the CPU reads it.

    Raises
    ------
    ValueError
        The result would live somewhere other than the CPU or a CUDA device.

    Examples
    --------
    >>> cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    >>> read_devices(cpu, None, "host")
    (device(type='cpu'), device(type='cpu'))
    >>> read_devices(cpu, gpu, "mapped")
    (device(type='cuda', index=0), device(type='cuda', index=0))
    >>> read_devices(cpu, gpu, "host")
    (device(type='cpu'), device(type='cuda', index=0))
    >>> read_devices(gpu, cpu, gpu)
    (device(type='cuda', index=0), device(type='cpu'))
    """
    out = _cuda(torch.device(requested if requested is not None else index_device))
    if out.type not in ("cpu", "cuda"):
        raise ValueError(f"rows are read to the CPU or a CUDA device, not {out}")
    if isinstance(memory, str) and memory in (HOST, MAPPED):
        return (out if memory == MAPPED and out.type == "cuda" else torch.device("cpu")), out
    where = _cuda(torch.device(memory))
    if where.type == "cpu":  # a bare CPU device says nothing of pinning: read it as pageable
        return torch.device("cpu"), out
    if where.type != "cuda":
        raise ValueError(f"memory must be 'host', 'mapped' or a CUDA device, got {memory!r}")
    return where, out

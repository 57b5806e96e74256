"""How sample.cu's kernels are launched: their names and specialisations, the launcher contract the sampling
drivers (``kernels.sampling_gpu``, ``kernels.sampling_gpu_hetero``) launch through, CuPy's launcher on a GPU, and
the count of host reads a batch path makes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["SOURCE", "NVRTC_OPTIONS", "name_expression", "kernel_names", "SampleLauncher", "HostReads",
           "CupyLauncher"]

#: The CUDA C source, in ``kernels/cuda``.
SOURCE = "sample.cu"
#: No fused multiply-adds: the picks' float arithmetic must round as the CPU twin's does.
NVRTC_OPTIONS = ("--fmad=false",)

_C_TYPES = {torch.int32: "int", torch.int64: "long long", torch.float32: "float", torch.float64: "double"}
_INDEX = (torch.int32, torch.int64)
_REAL = (torch.float32, torch.float64)


def name_expression(kernel: str, types: Sequence[torch.dtype]) -> str:
    """The template name expression of ``kernel`` over torch dtypes ``types``.

    >>> name_expression("sample_counts", (torch.int64, torch.float32))
    'sample_counts<long long, float>'
    >>> name_expression("reset_marks", ())
    'reset_marks'
    """
    if not types:
        return kernel
    return f"{kernel}<{', '.join(_C_TYPES[t] for t in types)}>"


def kernel_names() -> list[str]:
    """Every specialisation of sample.cu: indptr and indices int32/int64, edge ids int32/int64, weights
    float32/float64.

    >>> len(kernel_names())
    31
    """
    names = [name_expression("sample_counts", (p, w)) for p in _INDEX for w in _REAL]
    names += [name_expression("sample_picks", (p, i, e, w)) for p in _INDEX for i in _INDEX for e in _INDEX
              for w in _REAL]
    names += [name_expression(k, (i,)) for k in ("relabel_claim", "place_seeds", "relabel_flag", "relabel_append",
                                                  "relabel_rows") for i in _INDEX]
    return names + ["reset_marks"]


@runtime_checkable
class SampleLauncher(Protocol):
    """What :func:`run_hop` and :func:`run_batch` launch through: :class:`CupyLauncher`, or the host emulation's
    ``kernels.host_emu_sample.Launcher``.

    >>> isinstance(CupyLauncher(0, 0), SampleLauncher)
    True
    """

    def launch(self, kernel: str, types: Sequence[torch.dtype], threads: int, args: Sequence[np.generic]) -> None:
        """Start ``kernel<types>`` for ``threads`` grid-strided threads; ``args`` are numpy scalars."""

    def empty(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised buffer of ``size`` elements."""

    def read(self, values: torch.Tensor) -> list[int]:
        """``values`` as Python ints: the drivers' one kind of host read (a sync on a GPU), so it is counted."""


class HostReads:
    """A count of the host reads a batch path made (each a wait for the device), safe across threads.

    >>> reads = HostReads()
    >>> reads.add(); reads.add(); reads.count
    2
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        """Count one read."""
        with self._lock:
            self.count += 1

    def __reduce__(self):  # a copy in another process counts its own reads
        return HostReads, ()


class CupyLauncher:
    """Launches sample.cu's kernels on one device and stream through CuPy (``kernels.cupy_backend``).

    Parameters
    ----------
    device_id : int
        The CUDA device.
    stream_ptr : int
        The ``cudaStream_t`` to launch on (torch's current stream, for ordering with torch's own work).
    reads : HostReads, optional
        Where :meth:`read` counts its host reads.

    Examples
    --------
    >>> launcher = CupyLauncher(0, torch.cuda.current_stream().cuda_stream)  # doctest: +SKIP
    >>> launcher.empty(4, torch.int64, torch.device("cuda")).shape  # doctest: +SKIP
    torch.Size([4])
    """

    def __init__(self, device_id: int, stream_ptr: int, reads: HostReads | None = None) -> None:
        self.device_id, self.stream_ptr = device_id, stream_ptr
        self.reads = reads if reads is not None else HostReads()

    def launch(self, kernel: str, types: Sequence[torch.dtype], threads: int, args: Sequence[np.generic]) -> None:
        """Start ``kernel<types>`` for ``threads`` grid-strided threads; ``args`` are numpy scalars."""
        from .cupy_backend import launch_kernel

        launch_kernel(self.device_id, name_expression(kernel, types), threads, args, self.stream_ptr,
                      source=SOURCE, options=NVRTC_OPTIONS)

    def empty(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised buffer of ``size`` elements (the kernels write every element that is read)."""
        return torch.empty(size, dtype=dtype, device=device)

    def read(self, values: torch.Tensor) -> list[int]:
        """``values`` copied to the host as ints (counted in :attr:`reads`): a copy into pinned memory on the
        launcher's stream and a wait for that copy alone (an event), not for the device."""
        self.reads.add()
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)  # on the current stream: the one the launcher was made on
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(values.device))
        done.synchronize()
        return host.tolist()

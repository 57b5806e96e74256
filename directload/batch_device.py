"""Where a GPU batch is made: the seam between the batch path (sample, relabel, gather) and the device it runs on.

The batch path (directload's samplers, the PyG and DGL loaders over them, the harness) asks a
:class:`BatchDevice` for everything that depends on the device:

* :meth:`~BatchDevice.launcher`: what the sampling drivers launch sample.cu's kernels through
  (``kernels.sampling_gpu.SampleLauncher``), and whose ``read`` is the path's one kind of host read;
* :meth:`~BatchDevice.upload`: a host tensor on the device, copied without waiting for it;
* :meth:`~BatchDevice.zeros`: device buffers (the samplers' node marks);
* :meth:`~BatchDevice.readable`: whether the kernels can read a graph array where it lives;
* :meth:`~BatchDevice.table`: a node or edge table as a framework's batch code indexes it on the device;
* :attr:`~BatchDevice.reads`: how many host reads the path made (each waits for the device).

:class:`CudaDevice` is the production device.  The host emulation's device (test machinery,
``directload.emulated_gpu.EmulatedGpu``) runs the same Python code with sample.cu's kernels built for the CPU,
which is how CI proves a GPU batch equals the CPU twin's without a GPU.

Examples
--------
>>> from directload.batch_device import batch_device
>>> batch_device("cpu") is None  # the CPU twin: no device path
True
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from directload.capabilities import usable_device
from directload.kernels.operands import can_gather
from directload.kernels.sampling_gpu import CupyLauncher, HostReads, SampleLauncher

from .unified import UnifiedTensor, is_unified, to_unified

__all__ = ["BatchDevice", "CudaDevice", "DeviceTable", "batch_device", "unified_table", "HostReads"]


class BatchDevice:
    """What the batch path needs of the device it runs on (see the module's text).

    Attributes
    ----------
    device : torch.device
        Where the batch's tensors live.
    reads : HostReads
        The host reads made through this device's launchers.

    Examples
    --------
    >>> from directload.batch_device import BatchDevice
    >>> class Mine(BatchDevice):  # a device of one's own implements the five methods
    ...     name = "mine"
    >>> Mine().zeros.__doc__.split(".")[0]
    'A zeroed buffer of ``size`` elements on the device'
    """

    device: torch.device
    reads: HostReads
    #: Name shown in reports (``"cuda:0"``, ``"emulated"``).
    name: str = "device"

    def launcher(self) -> SampleLauncher:
        """A launcher for one batch, on the calling thread's stream."""
        raise NotImplementedError

    def upload(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (host memory) on the device, without a wait."""
        raise NotImplementedError

    def zeros(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed buffer of ``size`` elements on the device."""
        return torch.zeros(size, dtype=dtype, device=self.device)

    def readable(self, values: torch.Tensor) -> bool:
        """Whether the kernels read ``values`` where it lives (a graph's CSC arrays)."""
        raise NotImplementedError

    def table(self, values: torch.Tensor) -> torch.Tensor:
        """A node or edge table as batch code indexes it on the device: a :class:`DeviceTable` over its unified
        bytes (gathered by directload, never copied whole), or, for a table directload cannot gather, the
        table moved to the device once."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, reads={self.reads.count})"


class CudaDevice(BatchDevice):
    """A CUDA device: sample.cu through CuPy on torch's current stream, tables read zero-copy from mapped memory.

    Parameters
    ----------
    device : torch.device or str
        A usable CUDA device (``NoDeviceError`` otherwise).

    Examples
    --------
    >>> CudaDevice("cuda").device.type  # doctest: +SKIP
    'cuda'
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = usable_device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaDevice needs a CUDA device, got {self.device}")
        self.reads = HostReads()
        self.name = str(self.device)

    def launcher(self) -> SampleLauncher:
        return CupyLauncher(self.device.index, torch.cuda.current_stream(self.device).cuda_stream, self.reads)

    def upload(self, values: torch.Tensor) -> torch.Tensor:
        if values.is_cuda:
            return values.to(self.device, non_blocking=True)
        # From pinned staging: a copy from pageable memory would wait for the stream.
        staged = values if values.is_pinned() else values.pin_memory()
        return staged.to(self.device, non_blocking=True)

    def readable(self, values: torch.Tensor) -> bool:
        return values.device == self.device or is_unified(values) or (values.device.type == "cpu"
                                                                      and values.is_pinned())

    def table(self, values: torch.Tensor) -> torch.Tensor:
        if values.is_cuda:
            return values.to(self.device)
        unified = unified_table(values, "cuda")
        if unified is None or unified.memory_kind == "host":
            return self.upload(values)
        return DeviceTable.of(unified, unified.cuda_view(self.device))


def unified_table(values: torch.Tensor, affinity: str) -> UnifiedTensor | None:
    """``values`` as a unified tensor sharing its bytes (or a contiguous copy's), None when directload cannot
    gather it (autograd, odd element sizes)."""
    if isinstance(values, UnifiedTensor):
        return values
    if values.requires_grad or values.device.type != "cpu" or values.layout != torch.strided:
        return None
    values = values.contiguous()
    if not can_gather(values):
        return None
    return to_unified(values, affinity, pin="auto")


class DeviceTable(torch.Tensor):
    """A unified table seen from a device: a tensor on that device over the table's bytes (mapped, zero-copy)
    whose row reads (``index_select`` on rows, ``table[ids]``) run directload's gather.

    Every other operation is the device's own over the mapped bytes (correct, and read over PCIe).  Its
    ``device`` is the device's, so batch code that moves ids to ``table.device`` (PyG's filters) keeps them
    there.  Made by :meth:`BatchDevice.table`.

    Examples
    --------
    >>> import torch, directload
    >>> from directload.batch_device import DeviceTable
    >>> table = directload.to_unified(torch.arange(6.0).reshape(3, 2), "host", pin="auto")
    >>> view = DeviceTable.of(table, table.host)  # on a GPU: table.cuda_view()
    >>> torch.index_select(view, 0, torch.tensor([2, 0])).tolist()  # directload's gather
    [[4.0, 5.0], [0.0, 1.0]]
    """

    _unified: UnifiedTensor

    @staticmethod
    def of(unified: UnifiedTensor, view: torch.Tensor) -> DeviceTable:
        """``unified`` seen through ``view`` (a tensor over the same bytes on the device)."""
        out = torch.Tensor._make_subclass(DeviceTable, view, False)
        out._unified = unified
        return out

    @property
    def unified(self) -> UnifiedTensor:
        """The unified table behind this view."""
        return self._unified

    def __reduce_ex__(self, protocol):
        raise TypeError("a DeviceTable is one process's view of a table on its GPU and does not pickle; pickle "
                        "its .unified table (shared=True or from a file) and call table() again there")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rows = _row_read(func, args, kwargs)
        if rows is not None:
            table, ids = rows
            if func is torch.Tensor.__getitem__:
                return table._unified[ids]  # -1 is the last row, as x[ids]
            return torch.index_select(table._unified, 0, ids)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


#: ``index_select`` as torch calls it: PyG replaces ``torch.index_select`` with a wrapper over torch's builtin,
#: which is what reaches ``__torch_function__``.
_INDEX_SELECT = frozenset({torch.index_select, torch.Tensor.index_select, torch._C._VariableFunctions.index_select})


def _row_read(func, args, kwargs) -> tuple[Any, torch.Tensor] | None:
    """``(table, ids)`` when ``func(*args, **kwargs)`` reads whole rows of a DeviceTable by integer ids."""
    if func in _INDEX_SELECT:
        if kwargs.get("out") is not None or len(args) < 3 and "index" not in kwargs:
            return None
        table, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim"))
        ids = args[2] if len(args) > 2 else kwargs.get("index")
    elif func is torch.Tensor.__getitem__ and len(args) == 2 and not kwargs:
        table, dim, ids = args[0], 0, args[1]
    else:
        return None
    if (isinstance(table, DeviceTable) and dim == 0 and isinstance(ids, torch.Tensor)
            and type(ids) is torch.Tensor and ids.dtype in (torch.int32, torch.int64) and ids.dim() == 1):
        return table, ids
    return None


_CUDA_DEVICES: dict[torch.device, CudaDevice] = {}
_LOCK = threading.Lock()


def batch_device(device: BatchDevice | torch.device | str | None) -> BatchDevice | None:
    """The :class:`BatchDevice` of ``device``: None for the CPU (the CPU twin runs), a ``BatchDevice`` as given,
    one shared :class:`CudaDevice` per CUDA device (``NoDeviceError`` on a machine without it).

    Examples
    --------
    >>> batch_device(None) is None and batch_device("cpu") is None
    True
    """
    if device is None or isinstance(device, BatchDevice):
        return device
    dev = usable_device(device)
    if dev.type == "cpu":
        return None
    with _LOCK:
        if dev not in _CUDA_DEVICES:
            _CUDA_DEVICES[dev] = CudaDevice(dev)
        return _CUDA_DEVICES[dev]

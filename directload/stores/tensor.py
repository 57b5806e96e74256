"""``TensorStore``: a table already in memory (plain, pinned, unified or GPU), read through directload's gathers;
a table of codes (an :class:`~directload.codecs.EncodedTable`) is decoded inside the gather."""

from __future__ import annotations

import numpy as np
import torch

from directload.codecs import EncodedTable
from directload.kernels import gather_async
from directload.kernels.devices import MAPPED, memory_of
from directload.kernels.operands import can_gather, host_of

from .base import FeatureStore
from .futures import ReadFuture
from .reads import deliver
from .records import Staged

__all__ = ["TensorStore"]


class TensorStore(FeatureStore):
    """Rows of a tensor, gathered by directload's kernels.

    The store keeps a reference to the tensor, not a copy: writes to the
    tensor in place are seen by the next read.  A unified tensor (or a pinned
    one on a machine with UVA) is read zero-copy by the GPU when the result is
    on a GPU; ordinary host memory is gathered on the CPU and then copied over.

    A table of codes (:class:`~directload.codecs.EncodedTable`, whose codes
    may be plain, pinned, unified or on a GPU) holds its rows compressed: the
    store reads as ``[rows, dim]`` float32, and every read decodes inside the
    gather (:mod:`directload.kernels.decode`), so only code rows cross memory
    and PCIe.  :attr:`row_nbytes` is then the decoded row's; :attr:`encoded`
    gives the codes.

    Parameters
    ----------
    table : torch.Tensor, numpy.ndarray or EncodedTable
        At least 1-D; its first dimension is the row.  A numpy array is
        shared, not copied.

    Examples
    --------
    >>> store = TensorStore(torch.arange(12.0).view(6, 2))
    >>> store.read([4, 0])
    tensor([[8., 9.],
            [0., 1.]])
    >>> from directload.codecs import encode
    >>> small = TensorStore(encode(torch.tensor([[0.0, 1.0], [2.0, 4.0]]), "int8"))
    >>> small.shape, small.dtype, small.read([1]).tolist(), small.encoded.nbytes
    ((2, 2), torch.float32, [[2.0, 4.0]], 20)
    """

    tier = "tensor"

    def __init__(self, table: torch.Tensor | np.ndarray | EncodedTable) -> None:
        super().__init__()
        self.encoded: EncodedTable | None = table if isinstance(table, EncodedTable) else None
        if self.encoded is not None:
            table = self.encoded.codes
        if isinstance(table, np.ndarray):
            table = torch.from_numpy(table)
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"TensorStore takes a tensor, a numpy array or an EncodedTable, not "
                            f"{type(table).__name__}")
        if table.dim() < 1:
            raise ValueError("a feature table needs at least one dimension (the row)")
        #: The rows' tensor (an encoded table's codes).
        self.table = table

    @property
    def memory(self) -> str | torch.device:
        return memory_of(self.table)

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

    @property
    def row_shape(self) -> tuple[int, ...]:
        return (self.encoded.dim,) if self.encoded is not None else tuple(self.table.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.encoded is not None else self.table.dtype

    def _gatherable(self, table):
        """What the gathers take for ``table`` (this store's tensor or a view of it): the tensor, or the codes
        with their codec."""
        return table if self.encoded is None else EncodedTable(table, self.encoded.codec)

    def _read_async(self, index, out, run_device, out_device):
        table = self.table
        host = host_of(table, checked=True)  # a unified tensor's plain host view
        if run_device.type == "cuda" and not index.is_cuda:
            # From pinned staging: a copy from pageable memory would wait for the stream.
            index = index.pin_memory().to(run_device, non_blocking=True)
        else:  # a CPU gather must see the copied ids
            index = index.to(run_device)
        if not can_gather(host):
            rows = table.index_select(0, index.to(table.device).long())
            return ReadFuture(result=deliver(rows, out, out_device))
        table = self._gatherable(host if run_device.type == "cpu" else table)
        direct = out if out is not None and out.device == run_device else None
        future = gather_async(table, index, out=direct)
        if run_device.type == "cpu":  # a CPU gather has run when gather_async returns
            return ReadFuture(result=deliver(future.wait(), out, out_device))
        if direct is not None or (out is None and run_device == out_device):
            return ReadFuture(future.wait, done=future.done)
        return ReadFuture(lambda: deliver(future.wait(), out, out_device), done=future.done)


    def _bounds_on_device(self):
        return can_gather(host_of(self.table, checked=True))  # the GPU kernel checks them (kernels.bounds)

    def _own_memory(self):
        return (host_of(self.table, checked=True),)

    def _stage(self, rows, into, mapped):
        host = host_of(self.table, checked=True)
        if (self.encoded is None and can_gather(host) and not host.is_cuda and host.numel()
                and (not mapped or memory_of(host) == MAPPED)):
            # rows in host memory already: the table itself is the flat tier, no copy
            row_elems = int(np.prod(self.row_shape, dtype=np.int64))
            return Staged(host.view(-1), rows * row_elems)
        return self._copy_stage(rows, into)

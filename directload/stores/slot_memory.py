"""Where a cache's slots live: pinned host memory (:class:`HostSlots`) or GPU memory (:class:`DeviceSlots`).

The one difference between a :class:`~directload.stores.HostCache` and a
:class:`~directload.stores.DeviceCache`: an allocator that makes the slot table's memory, gives back the
pages of slots a shrunk cache parks and touches them again when it grows, and (a GPU's) counts the 128-byte
lines its fused gather reads zero-copy over PCIe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from directload import memory
from directload.kernels.indexing import LINE
from directload.kernels.pcie_model import row_min_lines

if TYPE_CHECKING:
    from directload.kernels.operands import RowWords

    from .records import Staged

__all__ = ["SlotMemory", "HostSlots", "DeviceSlots"]


class SlotMemory:
    """The allocator's contract: :meth:`allocate` once, then :meth:`park` / :meth:`unpark` as the cache
    resizes, and :meth:`pcie_lines` after each fused gather.  ``tier`` names the cache's tier.

    Examples
    --------
    >>> [cls.tier for cls in SlotMemory.__subclasses__()]
    ['host', 'device']"""

    tier = "cache"
    if TYPE_CHECKING:  # read-only to its users; a subclass may override it with a property
        @property
        def pinned(self) -> bool: ...
    else:
        pinned = False

    def allocate(self, words: RowWords, slots: int, used: int) -> torch.Tensor:
        """The slots' memory: ``[slots, *words.shape]`` of ``words.dtype``, the first ``used`` in use now."""
        raise NotImplementedError

    def park(self, rows: torch.Tensor, slots: np.ndarray) -> None:
        """Free ``slots`` (sorted) of ``rows`` are past a shrunk cache's limit: their memory may go back."""

    def unpark(self, rows: torch.Tensor, slots: np.ndarray) -> None:
        """Free ``slots`` of ``rows`` are back in use after the cache grew."""

    def pcie_lines(self, staged: Staged, miss: np.ndarray, inv: np.ndarray) -> int:
        """The 128-byte lines a gather reads zero-copy from host memory for the output rows read from the
        staged tier ``staged``: output row ``i`` is distinct row ``inv[i]``, staged where ``miss`` says;
        0 where the slots are in host memory."""
        return 0


class HostSlots(SlotMemory):
    """Slots in pinned host memory (plain memory where CUDA does not run).

    Examples
    --------
    >>> from directload.kernels.operands import row_words
    >>> rows = HostSlots().allocate(row_words(torch.float32, (2,)), 4, 4)
    >>> tuple(rows.shape), rows.dtype, rows.device.type
    ((4, 2), torch.float32, 'cpu')
    """

    tier = "host"

    def __init__(self) -> None:
        self._alloc: memory.Allocation | None = None
        self._row_nbytes = 0

    @property
    def pinned(self) -> bool:
        """Whether the slots are pinned (page-locked) memory, which a node budget counts as pinned bytes too."""
        return self._alloc is not None and self._alloc.kind != "host"

    def allocate(self, words: RowWords, slots: int, used: int) -> torch.Tensor:
        elem = torch.empty(0, dtype=words.dtype).element_size()
        self._row_nbytes = rnb = int(np.prod(words.shape, dtype=np.int64)) * elem
        nbytes = slots * rnb
        self._alloc = memory.allocate(max(nbytes, 1), pin="auto")
        raw = torch.from_numpy(memory.host_array(self._alloc)[:nbytes])
        # Touch every page used now: a first write into a slot would otherwise fault its page in during an
        # epoch (measured: filling fresh slots ran at 0.8 GB/s, a fifth of a gather's speed).
        raw[:used * rnb].zero_()
        self._rows = raw.view(words.dtype).view(slots, *words.shape)
        return self._rows

    def park(self, rows: torch.Tensor, slots: np.ndarray) -> None:
        """Give back the pages of each run of consecutive parked slots (ordinary memory only)."""
        if not slots.size:
            return
        rnb = self._row_nbytes
        cuts = np.flatnonzero(np.diff(slots) != 1) + 1
        for run in np.split(slots, cuts):
            # (allocate() set _alloc: a cache parks slots only after it has them)
            memory.release_pages(self._alloc, int(run[0]) * rnb, (int(run[-1]) + 1) * rnb)  # type: ignore[arg-type]

    def unpark(self, rows: torch.Tensor, slots: np.ndarray) -> None:
        rows[torch.from_numpy(slots)] = 0  # fault the pages in now, not during an epoch


class DeviceSlots(SlotMemory):
    """Slots in the memory of ``device``.  Where CUDA does not run they are a separate host buffer, so
    every policy and counter of a device cache works (and is tested) on a CPU machine.

    Examples
    --------
    >>> from directload.kernels.operands import row_words
    >>> DeviceSlots("cpu").allocate(row_words(torch.float16, (3,)), 2, 2).shape
    torch.Size([2, 3])
    """

    tier = "device"

    def __init__(self, device: torch.device | str | None = None) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            from directload.capabilities import usable_device

            usable_device(device)

    def allocate(self, words: RowWords, slots: int, used: int) -> torch.Tensor:
        self._row_nbytes = int(np.prod(words.shape, dtype=np.int64)) * torch.empty(0, dtype=words.dtype).element_size()
        return torch.empty((slots, *words.shape), dtype=words.dtype, device=self.device)

    def pcie_lines(self, staged: Staged, miss: np.ndarray, inv: np.ndarray) -> int:
        """One per 128-byte line each output row read from the flat tier spans (the transaction model's
        count, :mod:`directload.kernels.pcie_model`)."""
        if not staged.offsets.size:
            return 0
        rank = np.cumsum(miss) - 1  # each output row read from the flat tier: its position among the misses
        picked = rank[inv[miss[inv]]]
        addr = staged.flat.data_ptr() + staged.offsets.astype(np.int64) * staged.flat.element_size()
        return int(row_min_lines(addr, self._row_nbytes, LINE)[picked].sum())

"""Ids out of range on a GPU, reported without a host sync: an error word per device, stamped by the kernels.

A CUDA gather does not read its ids on the host before it launches (each read is a device-to-host sync that
stalls the caller and drains the queue behind it).  The kernels check every id themselves:

* an id outside ``[0, n_rows)`` is clamped before any load (an out-of-range read of mapped memory would kill
  the CUDA context), and
* the kernel stores the launch's *stamp*, a number unique to that launch, into the device's error word: one
  int64 of pinned, GPU-mapped host memory.  A plain store, not an atomic: every bad id of a launch stores
  the same value.

The host reads that word as ordinary memory, which costs no CUDA call.  ``GatherFuture.wait()`` (or
``check()``, which waits for the kernel) and the next gather on the same device raise the ``IndexError``,
naming the position and the value (found on the error path only, where a sync no longer matters).  Stamps grow,
so a word holding a stamp above the last one reported means a launch since then read a bad id.  Until then
the clamped rows are in the output: a gather whose result is used before any later gather or ``wait()`` on
that device can only learn of a bad id through ``check()`` or ``strict=True``.

Ids that count from the end (``x[idx]``, where ``-1`` is the last row) are shifted by the row count on the
device before the launch (no sync): launches made inside :func:`ids_from_end` report an id as the caller
gave it, with the valid range ``-n..n-1``, in the one message every path gives
(:func:`~directload.kernels.operands.out_of_range`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

import torch

from .operands import out_of_range

__all__ = ["DeviceBounds", "bounds_for", "ids_from_end", "check_where_on_device", "RECENT"]

#: Launches whose ids are kept so that an error can name the position and the value.
RECENT = 64


class DeviceBounds:
    """The error word of one CUDA device and the launches that may stamp it.

    Parameters
    ----------
    word : torch.Tensor
        One int64 of pinned host memory (GPU-mapped under unified addressing), zero at first.

    Examples
    --------
    >>> import torch
    >>> b = DeviceBounds(torch.zeros(1, dtype=torch.int64))  # bounds_for(device) pins it; plain memory here
    >>> stamp = b.stamp(torch.tensor([4, 9]), 5)
    >>> b.word[0] = stamp  # what a kernel stores when it meets id 9
    >>> b.raise_pending()
    Traceback (most recent call last):
    IndexError: index 9 is out of range for 5 rows (valid 0..4) (at position 1)
    """

    def __init__(self, word: torch.Tensor) -> None:
        self.word = word
        self.ptr = word.data_ptr()
        self._host = word.numpy()  # reads the pinned word as plain memory: no CUDA call
        self._stamps = itertools.count(1)
        self._reported = 0
        self._recent: OrderedDict[int, _Ids | _Where] = OrderedDict()
        self._lock = threading.Lock()
        self._on_device: torch.Tensor | None = None

    def on_device(self, device: torch.device) -> torch.Tensor:
        """The word as a CUDA tensor on ``device``: its pinned bytes, mapped (no copy), for device-side
        stamps made with torch's ops (:func:`check_where_on_device`)."""
        if self._on_device is None:
            from .interop import CudaArrayView

            with torch.cuda.device(device):
                mapped = torch.as_tensor(CudaArrayView(self.ptr, (1,), 8, self.word), device=device)
            self._on_device = mapped.view(torch.int64)
        return self._on_device

    def stamp(self, index: torch.Tensor, n_rows: int) -> int:
        """A new stamp for a launch over ``index`` (``n_rows`` rows; ids shifted from the end inside
        :func:`ids_from_end`)."""
        return self._stamp(_Ids(index, n_rows, getattr(_from_end, "on", False)))

    def stamp_where(self, where: torch.Tensor, n_slots: int, flat_elems: int, row_elems: int) -> int:
        """A new stamp for a tiered launch over ``where`` (:mod:`kernels.tiered`'s two tiers)."""
        return self._stamp(_Where(where, n_slots, flat_elems, row_elems))

    def _stamp(self, record):
        stamp = next(self._stamps)
        with self._lock:
            self._recent[stamp] = record
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        return stamp

    def raise_pending(self) -> None:
        """Raise the ``IndexError`` of a launch that read a bad id since the last report, if the word shows one."""
        seen = self._host[0]  # a numpy read of host memory
        if seen > self._reported:
            self._report(seen)

    def raise_for(self, stamp: int) -> None:
        """Raise if the launch of ``stamp`` read a bad id, as far as the word shows now."""
        seen = self._host[0]
        if seen == stamp:
            self._report(seen)
        elif seen > stamp:  # a later launch overwrote the word: look at this launch's own ids
            with self._lock:
                record = self._recent.get(stamp)
            if record is not None and record.error() is not None:
                raise record.error()

    def _report(self, seen):
        seen = int(seen)
        with self._lock:
            if seen <= self._reported:
                return
            self._reported = seen
            record = self._recent.pop(seen, None)
        if record is None:
            raise IndexError("an id out of range was read by an earlier CUDA gather on this device "
                             f"(more than {RECENT} launches ago): its rows were clamped")
        raise record.error() or record.unknown()


def _first_bad(index, n_rows, from_end=False):
    """``(position, value)`` of the first id of ``index`` outside ``[0, n_rows)``, or None (syncs).  With
    ``from_end`` the ids were shifted from the end (``id + n_rows`` where negative): the value is the id as
    given (a shifted id still below 0 was below ``-n_rows``; one at or above ``n_rows`` was never shifted)."""
    bad = ((index < 0) | (index >= n_rows)).nonzero()
    if bad.numel() == 0:
        return None
    position = int(bad[0, 0])
    value = int(index[position])
    return position, value - n_rows if from_end and value < 0 else value


class _Ids:
    """A plain gather's launch: its ids, its table's rows, whether the ids were shifted from the end."""

    def __init__(self, index, n_rows, from_end):
        self.index, self.n_rows, self.from_end = index, n_rows, from_end

    def error(self):
        """The ``IndexError`` of the first bad id (syncs: the error path), or None."""
        found = _first_bad(self.index, self.n_rows, self.from_end)
        if found is None:
            return None
        position, value = found
        return out_of_range(value, self.n_rows, position=position, negatives=self.from_end)

    def unknown(self):
        return IndexError(f"an id out of range for {self.n_rows} rows was read by a CUDA gather (its ids have "
                          "changed since, so the position is unknown): its rows were clamped")


class _Where:
    """A tiered gather's launch: its ``where`` and its tiers' sizes."""

    def __init__(self, where, n_slots, flat_elems, row_elems):
        self.where, self.n_slots, self.flat_elems, self.row_elems = where, n_slots, flat_elems, row_elems

    def error(self):
        """The ``IndexError`` of check_where's words (syncs: the error path), or None."""
        from .operands import check_where

        try:
            check_where(self.where.cpu(), self.n_slots, self.flat_elems, self.row_elems)
        except IndexError as exc:
            return exc
        return None

    def unknown(self):
        return IndexError("a where value outside its tier was read by a CUDA tiered gather (its values have "
                          "changed since, so which is unknown): its rows were clamped")


def _bad_where(where, n_slots, flat_elems, row_elems):
    """Which ``where`` values point outside their tier, on ``where``'s device (no sync)."""
    offsets = -where - 1  # a flat-tier row's element offset, for where < 0
    return (where >= n_slots) | ((where < 0) & ((offsets < 0) | (offsets > flat_elems - row_elems)))


def check_where_on_device(where: torch.Tensor, n_slots: int, flat_elems: int, row_elems: int, word: torch.Tensor,
                          bounds: DeviceBounds) -> torch.Tensor:
    """``where`` with every value outside its tier clamped to a valid one, on its device, reading nothing back;
    if any was, ``word`` (the error word, seen from that device) takes the launch's stamp, so the next gather
    on the device, or ``bounds.raise_pending()``, raises the ``IndexError`` that the host check
    (``operands.check_where``) would have.  The same ops run on any device (CI runs them on the CPU).

    Examples
    --------
    >>> b = DeviceBounds(torch.zeros(1, dtype=torch.int64))
    >>> check_where_on_device(torch.tensor([1, 5, -3]), 2, 8, 2, b.word, b).tolist()  # slot 5 of 2: clamped
    [1, 0, -3]
    >>> b.raise_pending()
    Traceback (most recent call last):
    IndexError: cache slot 5 is out of range for 2 slots (valid 0..1)
    """
    if not n_slots and flat_elems < row_elems:
        raise IndexError("no cache slots and no flat-tier rows: every where value is out of range")
    bad = _bad_where(where, n_slots, flat_elems, row_elems)
    stamp = bounds.stamp_where(where, n_slots, flat_elems, row_elems)
    word.masked_fill_(bad.any().reshape(1), stamp)  # written only where a value was bad: no read of the word
    return torch.where(bad, torch.zeros_like(where) if n_slots else torch.full_like(where, -1), where)


_from_end = threading.local()  # .on: launches stamped on this thread take ids shifted from the end


@contextlib.contextmanager
def ids_from_end() -> Iterator[None]:
    """Launches stamped in this block, on this thread, took ids counted from the end (``x[idx]``: ``-1`` is
    the last row) and shifted by the row count on the device: an id out of range is reported as given, in
    the message of the CPU path (``valid -n..n-1``).

    Examples
    --------
    >>> b = DeviceBounds(torch.zeros(1, dtype=torch.int64))
    >>> given = torch.tensor([0, -8, 3])  # 5 rows: -8 is below -5
    >>> with ids_from_end():
    ...     stamp = b.stamp(torch.where(given < 0, given + 5, given), 5)  # the ids the kernel reads
    >>> b.word[0] = stamp
    >>> b.raise_pending()
    Traceback (most recent call last):
    IndexError: index -8 is out of range for 5 rows (valid -5..4) (at position 1)
    """
    saved = getattr(_from_end, "on", False)
    _from_end.on = True
    try:
        yield
    finally:
        _from_end.on = saved


_devices: dict[int, DeviceBounds] = {}
_devices_lock = threading.Lock()


def bounds_for(device_index: int) -> DeviceBounds:
    """The :class:`DeviceBounds` of CUDA device ``device_index`` (made once per process)."""
    found = _devices.get(device_index)
    if found is None:
        with _devices_lock:
            found = _devices.get(device_index)
            if found is None:
                found = DeviceBounds(torch.zeros(1, dtype=torch.int64, pin_memory=True))
                _devices[device_index] = found
    return found


def _after_fork_in_child():
    # A forked child cannot use its parent's CUDA state; it makes its own words if it starts CUDA.
    global _devices_lock
    _devices.clear()
    _devices_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

"""A disk store's counters: what its batches and reads did, kept under a lock of their own."""

from __future__ import annotations

from typing import Any

from .counters import Counters

__all__ = ["DiskCounters", "COUNTERS"]

COUNTERS = ("rows", "unique_rows", "requested_bytes", "bytes_read", "reads", "io_seconds", "cpu_seconds",
            "batches", "zero_copy_batches")


class DiskCounters(Counters):
    """The counters of one disk store, each from zero.

    Examples
    --------
    >>> c = DiskCounters()
    >>> c.add(rows=6, unique_rows=4, requested_bytes=96, bytes_read=512, reads=1, io_seconds=0.5, batches=1)
    >>> s = c.report(16, engine="pread")
    >>> s["engine"], s["read_amplification"], s["iops"]
    ('pread', 8.0, 2.0)
    """

    def __init__(self) -> None:
        super().__init__(COUNTERS)

    def report(self, row_nbytes: int, **settings: object) -> dict[str, Any]:
        """The counts, then ``settings`` (the store's engine and depths), then the rates that follow.

        ``rows`` and ``requested_bytes`` count the ids asked for;
        ``unique_rows`` the distinct ones; ``bytes_read`` what the disk
        delivered, so ``read_amplification`` is ``bytes_read`` over the
        distinct rows' bytes (rows of ``row_nbytes``); ``reads`` the requests
        issued; ``iops`` and ``gb_per_s`` are over the time spent in the engine;
        ``cpu_us_per_read`` is the CPU time of the submitting threads per read;
        ``zero_copy_batches`` the batches a GPU gathered straight from the
        pinned staging buffer (the tiered gather), with no host copy.
        """
        s: dict[str, Any] = dict(self.snapshot())
        unique_bytes = s["unique_rows"] * row_nbytes
        s.update(
            **settings,
            read_amplification=s["bytes_read"] / unique_bytes if unique_bytes else 0.0,
            iops=s["reads"] / s["io_seconds"] if s["io_seconds"] else 0.0,
            gb_per_s=s["bytes_read"] / s["io_seconds"] / 1e9 if s["io_seconds"] else 0.0,
            cpu_us_per_read=s["cpu_seconds"] / s["reads"] * 1e6 if s["reads"] else 0.0)
        return s

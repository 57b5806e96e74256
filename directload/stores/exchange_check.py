"""The first step of a :class:`~directload.stores.RowExchange`: every rank's table described, and the ranks
whose tables differ named in one line."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from directload.units import dtype_name

__all__ = ["describe_table", "disagreement"]

_NAME_BYTES, _DIMS = 32, 16  # a table's description: its dtype's name and up to 16 dims in full (a checksum of all)


def describe_table(dtype: torch.dtype, row_shape: Sequence[int], bounds: npt.ArrayLike) -> np.ndarray:
    """A table as seen by one rank, as int64: dtype name, row bytes, row shape and partition bounds.  It has
    the same length on every rank of a group (``bounds`` has one entry per rank, and one more), so gathering
    them can never be the step whose sizes disagree.

    Examples
    --------
    >>> described = describe_table(torch.float32, (4,), [0, 2, 4])
    >>> described.dtype, described.size, described[4:6].tolist()
    (dtype('int64'), 26, [16, 1])
    """
    name = dtype_name(dtype).encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
    dims = list(row_shape)
    nbytes = int(np.prod(dims, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    head = [nbytes, len(dims), zlib.crc32(repr(tuple(dims)).encode())]
    return np.concatenate([np.frombuffer(name, dtype=np.int64), head, (dims + [0] * _DIMS)[:_DIMS],
                           bounds]).astype(np.int64)


def _shown(described):
    """``(rows, bounds)``: what :func:`describe_table` said, in words."""
    words = _NAME_BYTES // 8
    name = described[:words].tobytes().rstrip(b"\0").decode(errors="replace")
    ndim = int(described[words + 1])
    dims = described[words + 3:words + 3 + min(ndim, _DIMS)].tolist()
    shape = repr(tuple(dims)) if ndim <= _DIMS else f"({', '.join(map(str, dims))}, ... {ndim} dims)"
    bounds = described[words + 3 + _DIMS:].tolist()
    shown = bounds if len(bounds) <= 9 else [*bounds[:4], "...", *bounds[-2:]]
    return f"{name} rows of {shape}", f"bounds [{', '.join(map(str, shown))}]"


def disagreement(described: np.ndarray) -> str | None:
    """``None`` when every rank (a row of ``described``) holds the same table, else the one line that says
    which ranks hold what, those that differ from rank 0 first.

    Examples
    --------
    >>> a, b = describe_table(torch.float32, (4,), [0, 2, 4]), describe_table(torch.int32, (4,), [0, 2, 4])
    >>> disagreement(np.stack([a, a])) is None
    True
    >>> disagreement(np.stack([a, b, b])).split(";")[0]
    'ranks 1, 2 have int32 rows of (4,), rank 0 float32 rows of (4,)'
    """
    shown = [_shown(row) for row in described]
    differ = [i for i, what in enumerate(("rows", "bounds")) if len({s[i] for s in shown}) > 1]
    if not differ:
        return None
    groups: dict[str, list[int]] = {}  # what a rank holds -> the ranks that hold it, rank 0's first
    for rank, s in enumerate(shown):
        groups.setdefault(" and ".join(s[i] for i in differ), []).append(rank)
    parts = [*list(groups.items())[1:], next(iter(groups.items()))]
    said = []
    for n, (what, ranks) in enumerate(parts):
        if len(ranks) == 1:
            who, verb = f"rank {ranks[0]}", "has"
        else:
            more = "" if len(ranks) <= 8 else f" ... ({len(ranks)} ranks)"
            who, verb = f"ranks {', '.join(map(str, ranks[:8]))}{more}", "have"
        said.append(f"{who} {verb} {what}" if n == 0 else f"{who} {what}")
    advice = ("give every rank's store the same dtype and row shape", "give every rank the same bounds")
    return f"{', '.join(said)}; {'; '.join(advice[i] for i in differ)}"

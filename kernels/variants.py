"""The GPU gather's candidates: which kernel, at which vector width, over sorted ids or not.  Pure.

One home for the choices the backends launch, the tuner times and the benchmarks name:

- ``"index_select"``: torch's own ``index_select`` over the mapped view (``cuda_view()``), after our
  ``check_clamp`` kernel (so an id out of range is reported, never a device assert);
- ``"rowvec"``: a whole row at once: loads of ``width`` bytes over the units wholly inside the row (in the
  source's alignment), a scalar head and tail, stores as wide as the output's alignment allows; sub-warps
  of ``lanes`` lanes for rows under 512 B (several rows per warp); every load of a lane issued before its
  stores;
- ``"naive"``: one element per thread (PyTorch's old index kernel);
- ``"aligned"``: one warp per row in 128-byte-line steps, circular shift (PyTorch-Direct's kernel).

``sorted=True`` gathers in the order of the sorted ids and writes ``out[perm[i]]`` (GraphBolt's and
WholeGraph's choice for host tables with small rows: neighbouring ids share pages and lines).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KERNELS", "Variant", "legal_width", "vector_units", "sub_warp_lanes", "candidates", "default_variant",
           "SMALL_ROW", "VECTOR_WIDTHS"]

KERNELS = ("index_select", "rowvec", "naive", "aligned")
#: Vector widths, in bytes, that rowvec is compiled for.
VECTOR_WIDTHS = (16, 8, 4, 2, 1)
#: Rows under this many bytes share a warp (sub-warps of 2-16 lanes).
SMALL_ROW = 512


@dataclass(frozen=True, order=True)
class Variant:
    """One way to run a GPU gather.

    ``width`` is rowvec's vector width in bytes (0 for the other kernels); ``lanes`` rowvec's lanes per
    row (0 for the others); ``sorted`` gathers over sorted ids and writes ``out[perm]``.

    >>> Variant("rowvec", 16, 8).name, Variant("index_select", sorted=True).name
    ('rowvec16x8', 'index_select+sort')
    >>> Variant.parse("rowvec4x32+sort")
    Variant(kernel='rowvec', width=4, lanes=32, sorted=True)
    """

    kernel: str
    width: int = 0
    lanes: int = 0
    sorted: bool = False

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.kernel == "rowvec":
            if self.width not in VECTOR_WIDTHS:
                raise ValueError(f"rowvec width must be one of {VECTOR_WIDTHS} bytes, got {self.width}")
            if self.lanes not in (1, 2, 4, 8, 16, 32):
                raise ValueError(f"rowvec lanes must be a power of two from 1 to 32, got {self.lanes}")
        elif self.width or self.lanes:
            raise ValueError(f"{self.kernel} takes no width or lanes")

    @property
    def name(self) -> str:
        """A short, stable name: ``rowvec16x8``, ``rowvec16x32+sort``, ``index_select``..."""
        base = f"rowvec{self.width}x{self.lanes}" if self.kernel == "rowvec" else self.kernel
        return base + ("+sort" if self.sorted else "")

    @classmethod
    def parse(cls, name: str) -> Variant:
        """The inverse of :attr:`name`."""
        if not isinstance(name, str):
            raise TypeError(f"a variant name is a str, got {type(name).__name__}")
        base, _, tail = name.partition("+")
        if tail not in ("", "sort"):
            raise ValueError(f"unknown variant {name!r}")
        if base.startswith("rowvec"):
            width, sep, lanes = base[len("rowvec"):].partition("x")
            if not (sep and width.isdigit() and lanes.isdigit()):
                raise ValueError(f"unknown variant {name!r}")
            return cls("rowvec", int(width), int(lanes), bool(tail))
        return cls(base, sorted=bool(tail))


def legal_width(row_bytes: int, src_addr: int, out_addr: int) -> int:
    """The widest vector rowvec may use between these tables: ``gcd(16, src, out, row bytes)``.

    ``src_addr``/``out_addr`` are the tables' base addresses.  Every row of both then starts on a
    multiple of the width, so each vector load and store is aligned (CUDA faults on a misaligned one).

    >>> legal_width(400, 0x1000, 0x2000), legal_width(404, 0x1000, 0x2000), legal_width(2052, 0x1000, 0x2000)
    (16, 4, 4)
    """
    if row_bytes <= 0:
        return 1
    return math.gcd(16, row_bytes, src_addr % 16 or 16, out_addr % 16 or 16)


def vector_units(row_bytes: int, src_addr: int, out_addr: int) -> bool:
    """Whether the aligned GPU kernel may read 16-byte units (CUDA ``uint4`` vector loads).

    Every row must start and end on a 16-byte boundary in both tables: rows a
    multiple of 16 bytes, both tables 16-byte aligned (:func:`legal_width` of 16).  Pure.

    Examples
    --------
    >>> vector_units(400, 0x1000, 0x2040), vector_units(404, 0x1000, 0x2040), vector_units(400, 0x1004, 0)
    (True, False, False)
    """
    return row_bytes > 0 and legal_width(row_bytes, src_addr, out_addr) == 16


def sub_warp_lanes(row_bytes: int, width: int) -> int:
    """Lanes per row: enough that each lane copies at least one vector, at most a warp.

    Rows under :data:`SMALL_ROW` bytes get 1-16 lanes, so several rows share a warp; larger rows a whole
    warp, whose lanes each issue several loads before they store.

    >>> sub_warp_lanes(400, 16), sub_warp_lanes(64, 16), sub_warp_lanes(2048, 16), sub_warp_lanes(4, 4)
    (16, 4, 32, 1)
    """
    if row_bytes >= SMALL_ROW:
        return 32
    units = max(1, -(-row_bytes // width))
    lanes = 1
    while lanes * 2 <= min(units, 16):
        lanes *= 2
    return lanes


def default_variant(row_bytes: int, src_addr: int, out_addr: int, *, sort: bool = False) -> Variant:
    """rowvec at 16-byte loads (a head and tail where rows are not 16-byte aligned): the choice when nothing
    was timed."""
    del src_addr, out_addr  # the kernel aligns each row itself
    return Variant("rowvec", 16, sub_warp_lanes(row_bytes, 16), sort)


def candidates(row_bytes: int, src_addr: int, out_addr: int) -> list[Variant]:
    """Every variant for these tables, each unsorted and sorted: what the tuner times.

    rowvec at 16 and 8 bytes (with a head and tail where rows or tables are not that aligned) and at the
    legal width, where that is narrower.
    """
    widths = sorted({16, 8, legal_width(row_bytes, src_addr, out_addr)}, reverse=True)
    out = []
    for sort in (False, True):
        out.append(Variant("index_select", sorted=sort))
        for width in widths:
            out.append(Variant("rowvec", width, sub_warp_lanes(row_bytes, width), sort))
        out.append(Variant("naive", sorted=sort))
        out.append(Variant("aligned", sorted=sort))
    return out

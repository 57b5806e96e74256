"""Pure index math shared by every gather kernel and by the PCIe transaction model."""

from __future__ import annotations

# One source of truth: the Numba CUDA kernels compile these functions as device
# functions, the CPU kernel and the transaction model compile them with njit, and
# kernels/cuda/gather.cu carries a line-for-line C++ mirror that a test compares
# with these, input by input.  Only integer arithmetic, so all three agree exactly.

__all__ = [
    "WARP",
    "LINE",
    "BLOCK",
    "unit_bytes",
    "naive_element",
    "aligned_geometry",
    "aligned_span",
    "tier_row",
    "launch_grid",
    "persistent_grid",
]

#: Threads per warp on every NVIDIA GPU so far.
WARP = 32
#: Bytes per GPU cache line, the unit of a coalesced PCIe read request
#: (CUDA C++ Programming Guide, "Device Memory Accesses"; PyTorch-Direct paper, section 4.4.5).
LINE = 128
#: Threads per block used by every GPU launch.
BLOCK = 256


def unit_bytes(elem: int) -> int:
    """Bytes one lane reads per step of the aligned kernel.

    Elements of 4 bytes or more are read one per lane; smaller ones are read as
    the 4-byte word that holds them, so a warp step still covers a whole line.
    """
    return elem if elem >= 4 else 4


def naive_element(tid: int, row_elems: int) -> tuple[int, int]:
    """(output row, column) that flat thread ``tid`` copies in the naive kernel.

    One thread per element of the flattened output: the access pattern of
    PyTorch's own ``index_select`` kernel (PyTorch-Direct paper, Figure 4.4).
    """
    return tid // row_elems, tid % row_elems


def aligned_geometry(row_addr: int, row_bytes: int, elem: int, warp: int, line: int) -> tuple[int, int, int, int, int]:
    """Per-row plan of the aligned (circular-shift) kernel.

    Parameters
    ----------
    row_addr : int
        Address of the row's first byte, relative to any ``line``-aligned origin.
    row_bytes, elem, warp, line : int
        Row size and element size in bytes, lanes per warp, bytes per line.

    Returns
    -------
    (base, first, last, steps, wrap)
        ``base`` is the line-aligned address below the row.  Units are ``U =
        unit_bytes(elem)`` bytes counted from ``base``; the row occupies units
        ``first..last``.  The warp walks windows of ``warp`` units, lane ``j``
        always reading unit ``j`` of the window, so every step touches only whole
        aligned lines.  ``wrap`` lanes of step 0 (which would idle in front of
        the row) read the last window instead: the circular shift.  It is taken
        only when the last window fits entirely into them, so no line is read
        twice, and ``steps == ceil(units / warp)``, as few as the naive kernel.
    """
    u = elem if elem >= 4 else 4  # unit_bytes(elem), inlined for the kernels
    base = row_addr - row_addr % line
    first = (row_addr - base) // u
    last = (row_addr + row_bytes - 1 - base) // u
    windows = (last + warp) // warp
    tail = last + 1 - warp * (windows - 1)
    wrap = tail if tail <= first else 0
    steps = windows - 1 if wrap > 0 else windows
    return base, first, last, steps, wrap


def aligned_span(lane: int, step: int, row_addr: int, row_bytes: int, elem: int, warp: int, base: int, first: int,
                 last: int, steps: int, wrap: int) -> tuple[int, int]:
    """Elements ``[lo, hi)`` of the row that ``lane`` copies at ``step``.

    The arguments after ``warp`` are :func:`aligned_geometry`'s result.  An
    empty span (``lo >= hi``) means the lane idles at that step.  With
    ``elem >= 4`` the span is one element; with smaller elements it is the
    elements of one 4-byte word that lie inside the row.
    """
    if step == 0 and lane < wrap:
        unit = lane + warp * steps
    else:
        unit = step * warp + lane
    if unit < first or unit > last:
        return 0, 0
    u = elem if elem >= 4 else 4
    lo = base + unit * u - row_addr
    hi = lo + u
    if lo < 0:
        lo = 0
    if hi > row_bytes:
        hi = row_bytes
    return lo // elem, hi // elem


def tier_row(where: int, row_elems: int, elem: int, cache_mod: int, flat_mod: int) -> tuple[int, int, int]:
    """Where output row ``r`` of a tiered gather comes from, given ``where[r]``.

    The tiered gather reads each row from one of two tiers, both addressed as
    flat element arrays: the cache (tier 0, rows of ``row_elems`` elements, in
    GPU memory) and the flat tier (tier 1: mapped host memory, such as a disk
    store's staging buffer, with rows at any element offset).  ``where >= 0``
    is a cache slot; ``where < 0`` is the flat tier's element offset
    ``-where - 1``.

    Returns
    -------
    (tier, first, row_addr)
        The tier, the row's first element in it, and the row's address relative
        to a line-aligned origin (``cache_mod``/``flat_mod`` are the tiers'
        addresses modulo the line), which the aligned kernel's geometry takes.
    """
    if where >= 0:
        first = where * row_elems
        return 0, first, cache_mod + first * elem
    first = -where - 1
    return 1, first, flat_mod + first * elem


def launch_grid(work: int, block: int = BLOCK, max_blocks: int = 65535) -> int:
    """Blocks for ``work`` threads: enough to cover it, capped (kernels grid-stride)."""
    return max(1, min(max_blocks, -(-work // block)))


def persistent_grid(work: int, resident: int, block: int = BLOCK) -> int:
    """Blocks for a persistent, grid-strided launch of ``work`` threads: as many as the device holds at once
    (``resident``: SMs x resident blocks per SM), never more than the work needs, at least one.

    >>> persistent_grid(10_000_000, 132 * 8), persistent_grid(1000, 132 * 8), persistent_grid(0, 8)
    (1056, 4, 1)
    """
    return max(1, min(resident, -(-work // block)))

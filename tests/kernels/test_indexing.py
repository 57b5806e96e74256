"""The pure index functions: the aligned plan covers each element once, and the C++ mirror agrees."""

import numpy as np
import pytest

from directload.kernels import host_emu
from directload.kernels.indexing import LINE, WARP, aligned_geometry, aligned_span, launch_grid, naive_element


def _cover(row_addr, row_bytes, elem, warp=WARP, line=LINE):
    """How many times each element is copied, and the steps taken."""
    n = row_bytes // elem
    g = aligned_geometry(row_addr, row_bytes, elem, warp, line)
    seen = np.zeros(n, np.int64)
    for step in range(g[3]):
        for lane in range(warp):
            lo, hi = aligned_span(lane, step, row_addr, row_bytes, elem, warp, *g)
            seen[lo:hi] += 1
    return seen, g


@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_aligned_plan_copies_every_element_exactly_once(elem, rng):
    for _ in range(300):
        n = int(rng.integers(1, 1200))
        addr = int(rng.integers(0, 1 << 20)) * elem
        seen, (base, first, last, steps, wrap) = _cover(addr, n * elem, elem)
        assert (seen == 1).all(), (addr, n, elem)
        # As few steps as one thread per unit can take: the shift costs no step.
        assert steps == -(-(last - first + 1) // WARP)
        assert base % LINE == 0 and base <= addr


def test_wrap_only_when_the_tail_fits_the_idle_head():
    # With n = 32q + m units and `first` idle head lanes, the tail wraps iff first + m > 32.
    # 2052-byte rows (PyTorch-Direct paper, Fig. 4.7; m = 1) never need it: the plain shift is enough.
    for off in range(0, 128, 4):
        assert aligned_geometry(off, 2052, 4, WARP, LINE)[4] == 0
    # 400-byte rows (ogbn-products) 120 bytes into a line: 30 idle lanes take the 2-unit tail.
    base, first, last, steps, wrap = aligned_geometry(120, 400, 4, WARP, LINE)
    assert (first, last, wrap, steps) == (30, 129, 2, 4)
    # 112 bytes in, 28 idle lanes + m = 4 is not over 32: no wrap, still 4 steps.
    assert aligned_geometry(112, 400, 4, WARP, LINE)[3:] == (4, 0)


def test_naive_element_is_row_major():
    assert naive_element(0, 11) == (0, 0)
    assert naive_element(23, 11) == (2, 1)


def test_launch_grid_covers_work_and_caps():
    assert launch_grid(1) == 1
    assert launch_grid(257, 256) == 2
    assert launch_grid(10**12, 256) == 65535


@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_cuda_c_mirror_matches_python(elem, rng):
    """gather.cu's dl_aligned_geometry/dl_aligned_span, input by input."""
    for _ in range(2000):
        warp, line = [(32, 128), (4, 16), (16, 64)][int(rng.integers(0, 3))]
        n = int(rng.integers(1, 700))
        addr = int(rng.integers(0, 1 << 40)) * elem
        g = aligned_geometry(addr, n * elem, elem, warp, line)
        lane = int(rng.integers(0, warp))
        step = int(rng.integers(0, g[3]))
        want = (*g, *aligned_span(lane, step, addr, n * elem, elem, warp, *g))
        assert host_emu.aligned_mirror(lane, step, addr, n * elem, elem, warp, line) == want

"""The PCIe transaction model: the paper's toy example and the aligned kernel's optimality."""

import numpy as np
import pytest

from directload.kernels.pcie_model import count_requests, row_min_lines, thread_map


def test_paper_toy_example_figures_4_4_and_4_5():
    # Warp of 4, 16-byte lines, 4-byte features, 11 features per node, nodes 0, 2, 4.
    # The figures count node 2's requests: 7 with PyTorch's kernel, 5 with the shift.
    kw = dict(warp=4, line=16)
    naive = count_requests([0, 2, 4], 44, 4, kernel="naive", **kw)
    paper = count_requests([0, 2, 4], 44, 4, kernel="paper", **kw)
    ours = count_requests([0, 2, 4], 44, 4, kernel="aligned", **kw)
    assert naive.per_row[1] == 7
    assert paper.per_row[1] == 5
    # Node 2 spans 4 lines; our whole-window shift reaches that minimum.
    assert ours.per_row[1] == ours.min_lines[1] == 4
    assert ours.total < paper.total < naive.total


def test_aligned_reaches_minimum_for_every_row_size_and_offset_fp32():
    """4 B to 16 KiB rows, every 4-byte start offset in a line: requests == lines spanned."""
    sizes = np.arange(4, 16 * 1024 + 1, 4)
    bad = []
    for off in range(0, 128, 4):
        for rb in sizes:
            r = count_requests([0], int(rb), 4, src_addr=off)
            if r.per_row[0] != r.min_lines[0]:
                bad.append((off, int(rb)))
    assert not bad, bad[:10]


@pytest.mark.parametrize("elem", [1, 2, 8])
def test_aligned_reaches_minimum_other_element_sizes(elem, rng):
    for _ in range(1500):
        rb = int(rng.integers(1, 16 * 1024 // elem + 1)) * elem
        off = int(rng.integers(0, 128 // elem)) * elem
        r = count_requests([0, 1, 5], rb, elem, src_addr=off)
        assert (r.per_row == r.min_lines).all(), (rb, off)


def test_naive_exceeds_minimum_on_misaligned_rows(rng):
    # The model can tell kernels apart: scattered 2052-byte rows (Fig. 4.7) cost naive more.
    idx = rng.choice(1 << 20, 64, replace=False)
    naive = count_requests(idx, 2052, 4, kernel="naive")
    aligned = count_requests(idx, 2052, 4, kernel="aligned")
    assert naive.total > aligned.total == aligned.min_lines.sum()


def test_row_min_lines():
    assert row_min_lines(0, 128, 128) == 1
    assert row_min_lines(4, 128, 128) == 2
    assert row_min_lines(124, 8, 128) == 2


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="kernel must be"):
        count_requests([0], 8, 4, kernel="fast")
    with pytest.raises(ValueError, match="multiple of elem"):
        count_requests([0], 6, 4)


def test_thread_map_covers_every_output_once():
    tid, step = thread_map([3, 1, 3], 37, 4, aligned=True, grid=1, block=64, src_addr=12)
    assert (tid >= 0).all() and (step >= 0).all()
    # Rows 0 and 1 land on warps 0 and 1; row 2 wraps to warp 0 again.
    assert set(tid[:37] // 32) == {0} and set(tid[37:74] // 32) == {1} and set(tid[74:] // 32) == {0}


def test_16_byte_units_reach_the_minimum_in_a_quarter_of_the_steps(rng):
    """Vector units: 16-byte-aligned rows still cost exactly the lines they span, and a warp
    needs ceil(units / 32) steps, a quarter of the 4-byte kernel's for fp32 rows."""
    for _ in range(600):
        rb = int(rng.integers(1, 1024 + 1)) * 16
        off = int(rng.integers(0, 8)) * 16
        r = count_requests([0, 3, 7], rb, 16, src_addr=off)
        assert (r.per_row == r.min_lines).all(), (rb, off)
        _, steps16 = thread_map([0], rb // 16, 16, aligned=True, grid=1, block=32, src_addr=off)
        _, steps4 = thread_map([0], rb // 4, 4, aligned=True, grid=1, block=32, src_addr=off)
        assert steps16.max() + 1 == -(-(rb // 16) // 32)
        assert steps4.max() + 1 == -(-(rb // 4) // 32)

"""The memory-traffic model: SM-to-L2 requests (the paper's toy example, the aligned kernel's optimality),
and the sectors and pages a gather touches (exact counts on small cases, the sorting gain)."""

import numpy as np
import pytest

from directload.kernels.pcie_model import (
    PAGE_2M,
    count_requests,
    footprint,
    row_min_lines,
    sorting_gain,
    thread_map,
)


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


# Rows 0, 1, 0 of 48 bytes: row 0 spans sectors 0-1 (bytes 0-47), row 1 sectors 1-2 (bytes 48-95).
@pytest.mark.parametrize(("window", "sort", "sectors"), [
    (1, False, 6),  # every row alone: 2 + 2 + 2
    (2, False, 5),  # [0, 1] share sector 1: 3; [0]: 2
    (2, True, 4),   # sorted [0, 0] merge: 2; [1]: 2
    (3, False, 3),  # all together: sectors 0, 1, 2
])
def test_sector_bytes_count_each_sector_once_per_window(window, sort, sectors):
    f = footprint([0, 1, 0], 48, window=window, sort=sort)
    assert f.sector_bytes == 32 * sectors
    assert f.rows == 3 and f.window == window


def test_pages_4k_and_2m_by_order():
    # 1 KiB rows: rows 0-3 in 4 KiB page 0, rows 8-11 in page 2; all in 2 MiB page 0.
    unsorted = footprint([0, 8, 1, 9], 1024, window=2)
    ordered = footprint([0, 8, 1, 9], 1024, window=2, sort=True)
    assert (unsorted.pages_4k, ordered.pages_4k) == (4, 2)
    assert (unsorted.pages_2m, ordered.pages_2m) == (2, 2)
    assert unsorted.sector_bytes == ordered.sector_bytes == 4 * 1024  # 32-byte-aligned rows: no shared sectors
    assert sorting_gain([0, 8, 1, 9], 1024, window=2) == {"sector_bytes": 1.0, "pages_4k": 2.0, "pages_2m": 1.0}


def test_a_row_across_a_page_boundary_touches_both_pages_and_its_offset_counts():
    assert footprint([1], 3000).pages_4k == 2  # bytes 3000-5999: pages 0 and 1
    assert footprint([1], 3000, src_addr=1096).pages_4k == 1  # bytes 4096-7095: page 1 only
    assert footprint([1], 3000, src_addr=PAGE_2M + 1096).pages_4k == 1  # only the offset in a huge page counts
    assert footprint([0], 40, src_addr=24).sector_bytes == 64  # bytes 24-63: sectors 0 and 1
    assert footprint([], 40).sector_bytes == 0


def test_the_table_size_drives_the_pages_and_what_sorting_saves():
    """The same number of random ids over a larger table: more pages to translate, and sparser ids, so
    sorting them merges fewer touches (the model's prediction for the table-size sweep)."""
    rng = np.random.default_rng(0)
    n, row = 4096, 1024
    small = rng.integers(0, (64 << 20) // row, n)   # 64 MiB: 32 huge pages
    large = rng.integers(0, (16 << 30) // row, n)  # 16 GiB: 8192 huge pages
    assert footprint(small, row, window=n).pages_2m == 32  # every huge page of the small table is touched
    assert footprint(small, row, window=512).pages_2m < footprint(large, row, window=512).pages_2m
    assert sorting_gain(small, row, window=512)["pages_2m"] > sorting_gain(large, row, window=512)["pages_2m"] > 1.0
    # Sorted, the windows cover disjoint stretches of the table: a page counts twice only at a seam.
    ordered = footprint(large, row, window=512, sort=True)
    assert ordered.pages_2m <= footprint(large, row, window=n).pages_2m + n // 512


def test_sectors_do_not_depend_on_the_kernel_but_requests_do(rng):
    """The naive kernel issues more SM-to-L2 requests on 2052-byte rows; the sectors read are the rows' own."""
    idx = rng.choice(1 << 20, 64, replace=False)
    naive = count_requests(idx, 2052, 4, kernel="naive").total
    aligned = count_requests(idx, 2052, 4, kernel="aligned").total
    f = footprint(idx, 2052)
    assert naive > aligned
    assert f.sector_bytes == sum(32 * ((int(i) * 2052 + 2051) // 32 - int(i) * 2052 // 32 + 1) for i in idx)


def test_footprint_rejects_bad_arguments():
    with pytest.raises(ValueError, match="window must be at least 1"):
        footprint([0], 8, window=0)
    with pytest.raises(ValueError, match="row_bytes must be positive"):
        footprint([0], 0)

"""gather.cu's whole-row vector kernel (rowvec) and check_clamp under the host emulation, against torch.

The emulation's loads and stores count any access that is misaligned for its width (a GPU faults on one,
x86 silently allows it) or that falls outside the launch's table or output; every test here asserts none.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directload.kernels import host_emu
from directload.kernels.variants import VECTOR_WIDTHS

LANES = (1, 2, 4, 8, 16, 32)
#: Bit carriers by element size (signed: torch 2.2 has no uint16/32/64).
CARRIERS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
POISONS = (0xA5, 0x5A)
CLEAN = host_emu.AccessCounts(0, 0, 0)


def placed(rows, row_bytes, elem, shift, rng):
    """A ``[rows, row_bytes / elem]`` array of random bits, ``shift`` elements past a 64-byte boundary of a
    larger buffer (kept alive by the view)."""
    buf = rng.integers(0, 256, rows * row_bytes + 128, dtype=np.uint8)
    start = (-buf.ctypes.data) % 64 + shift * elem
    return buf[start:start + rows * row_bytes].view(CARRIERS[elem]).reshape(rows, row_bytes // elem)


def run_rowvec(src, ids, *, width, lanes, sort=False, out_shift=0, grid=2, block=64, rng=None, n_rows=None,
               err=None, stamp=0):
    """rowvec over ``ids`` into outputs poisoned twice; returns the output after asserting both runs agree and
    the accesses were clean."""
    rng = rng or np.random.default_rng(0)
    pos = None
    if sort:
        order, perm = torch.sort(torch.from_numpy(ids))
        ids, pos = order.numpy(), perm.numpy()
    results = []
    for poison in POISONS:
        out = placed(ids.shape[0], src.shape[1] * src.itemsize, src.itemsize, out_shift, rng)
        out.view(np.uint8)[...] = poison
        host_emu.reset_counters()
        host_emu.launch_rowvec(src, ids, out, width=width, lanes=lanes, grid=grid, block=block, pos=pos,
                               n_rows=n_rows, err=err, stamp=stamp)
        assert host_emu.counters() == CLEAN
        results.append(out.copy())
    np.testing.assert_array_equal(results[0], results[1])
    return results[0]


def oracle(src, ids):
    return torch.index_select(torch.from_numpy(src), 0, torch.from_numpy(ids).long()).numpy()


@st.composite
def cases(draw):
    elem = draw(st.sampled_from((1, 2, 4, 8)))
    row_bytes = elem * draw(st.integers(1, 4100 // elem))
    rows = draw(st.integers(1, 9))
    ids = draw(st.lists(st.integers(0, rows - 1), max_size=12))  # empty, duplicates
    return dict(elem=elem, row_bytes=row_bytes, rows=rows, ids=ids,
                index_dtype=draw(st.sampled_from((np.int32, np.int64))),
                src_shift=draw(st.integers(0, 16 // elem)), out_shift=draw(st.integers(0, 16 // elem)),
                width=draw(st.sampled_from(VECTOR_WIDTHS)), lanes=draw(st.sampled_from(LANES)),
                sort=draw(st.booleans()), grid=draw(st.integers(1, 3)), block=draw(st.sampled_from((32, 64))),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_rowvec_equals_index_select(case):
    """Row bytes 1-4100, element sizes 1/2/4/8, tables and outputs at every element offset in 16 bytes, empty and
    duplicate int32/int64 ids, sorted or not, every width and sub-warp size."""
    rng = np.random.default_rng(case["seed"])
    src = placed(case["rows"], case["row_bytes"], case["elem"], case["src_shift"], rng)
    ids = np.array(case["ids"], dtype=case["index_dtype"])
    got = run_rowvec(src, ids, width=case["width"], lanes=case["lanes"], sort=case["sort"],
                     out_shift=case["out_shift"], grid=case["grid"], block=case["block"], rng=rng)
    np.testing.assert_array_equal(got, oracle(src, ids))


@pytest.mark.parametrize("width", VECTOR_WIDTHS)
@pytest.mark.parametrize("row_bytes", [1, 3, 4, 15, 16, 17, 31, 33, 400, 404, 2052])
def test_every_source_and_output_byte_offset(row_bytes, width, rng):
    """Byte tables at each of the 16 offsets in a vector, outputs at 6 offsets: heads, tails and narrower stores."""
    ids = rng.integers(0, 5, 6).astype(np.int32)
    for src_shift in range(16):
        src = placed(5, row_bytes, 1, src_shift, rng)
        want = oracle(src, ids)
        for out_shift in (0, 1, 2, 4, 8, 12):
            for lanes in (1, 4, 32):
                got = run_rowvec(src, ids, width=width, lanes=lanes, out_shift=out_shift, grid=1, block=32, rng=rng)
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("row_bytes", [2048, 2064, 4096 + 16])
def test_large_rows_take_several_batches_per_lane(row_bytes, rng):
    """Rows of more vectors than a warp's lanes x 4 loop over batches; many rows per thread group."""
    src = placed(40, row_bytes, 4, 1, rng)
    ids = rng.integers(0, 40, 70)
    for width, lanes in ((16, 32), (16, 8), (8, 32), (4, 2)):
        got = run_rowvec(src, ids, width=width, lanes=lanes, grid=1, block=64, rng=rng)
        np.testing.assert_array_equal(got, oracle(src, ids))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
def test_bad_ids_flag_the_stamp_and_are_clamped_inside_the_table(sort, index_dtype, rng):
    src = placed(6, 52, 4, 3, rng)
    big = np.iinfo(index_dtype).max
    ids = np.array([2, -1, 6, big, 5, np.iinfo(index_dtype).min, 0], index_dtype)
    err = np.array([7], np.uint64)
    got = run_rowvec(src, ids, width=16, lanes=4, sort=sort, rng=rng, err=err, stamp=0xDEAD_BEEF_0000_0001)
    assert int(err[0]) == 0xDEAD_BEEF_0000_0001
    np.testing.assert_array_equal(got, oracle(src, np.clip(ids.astype(np.int64), 0, 5)))


def test_a_good_launch_leaves_the_error_word_alone(rng):
    src = placed(6, 52, 4, 0, rng)
    ids = np.array([5, 0, 3], np.int64)
    err = np.array([12345], np.uint64)
    got = run_rowvec(src, ids, width=8, lanes=8, rng=rng, err=err, stamp=99)
    assert int(err[0]) == 12345
    np.testing.assert_array_equal(got, oracle(src, ids))
    run_rowvec(src, ids, width=8, lanes=8, rng=rng, stamp=99)  # no error word at all: nothing to flag


def test_the_counters_catch_a_read_past_the_table(rng):
    """The stray-load check is live: told the table has more rows than it does, a clamped id reads past it."""
    src = placed(4, 40, 4, 0, rng)
    out = np.zeros((1, 10), np.int32)
    host_emu.reset_counters()
    host_emu.launch_rowvec(src, np.array([9]), out, width=16, lanes=4, grid=1, block=32, n_rows=6)
    assert host_emu.counters().stray_loads > 0 and host_emu.counters().misaligned == 0


@pytest.mark.parametrize("width", [2, 4, 8, 16])
@pytest.mark.parametrize("store", [False, True], ids=["load", "store"])
def test_a_misaligned_access_is_caught(width, store):
    buf = np.zeros(64, np.uint8)
    base = (-buf.ctypes.data) % 16
    host_emu.reset_counters()
    host_emu.probe(buf, base, width, store=store)
    assert host_emu.counters() == CLEAN
    for offset in range(1, width):
        host_emu.probe(buf, base + offset, width, store=store)
    assert host_emu.counters() == host_emu.AccessCounts(width - 1, 0, 0)


def test_lanes_must_be_a_power_of_two_dividing_the_block():
    src = np.zeros((2, 4), np.int32)
    out = np.zeros((1, 4), np.int32)
    for lanes, block in ((3, 32), (64, 64), (0, 32), (16, 8)):
        with pytest.raises(ValueError, match="lanes must be a power of two"):
            host_emu.launch_rowvec(src, np.array([0]), out, width=4, lanes=lanes, grid=1, block=block)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_check_clamp(index_dtype, rng):
    ids = rng.integers(-50, 150, 300).astype(index_dtype)
    ids[[0, -1]] = np.iinfo(index_dtype).min, np.iinfo(index_dtype).max
    clamped = np.full_like(ids, -7)
    err = np.array([0], np.uint64)
    host_emu.launch_check_clamp(ids, clamped, 100, grid=2, block=64, err=err, stamp=41)
    np.testing.assert_array_equal(clamped, np.clip(ids, 0, 99))
    assert int(err[0]) == 41
    good = rng.integers(0, 100, 300).astype(index_dtype)
    err[0] = 5
    host_emu.launch_check_clamp(good, clamped, 100, grid=1, block=32, err=err, stamp=41)
    np.testing.assert_array_equal(clamped, good)
    assert int(err[0]) == 5
    host_emu.launch_check_clamp(good[:0], clamped[:0], 100, err=err, stamp=41)  # no ids

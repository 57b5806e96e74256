"""The tiered gather: cache rows and flat-tier rows (mapped staging) in one fused kernel, checked against an oracle."""

import numpy as np
import pytest
import torch

from directload.kernels import gather, host_emu
from directload.kernels.indexing import LINE, tier_row
from directload.kernels.pcie_model import count_tiered
from directload.kernels.tiered import check_where, fill_slots, flat_where, gather_tiered

DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)
ROW_ELEMS = (1, 11, 37, 100, 513)


def _case(rng, dtype, row_elems, n=120, slots=40, flat_rows=70, cache_shift=0, flat_shift=0):
    """Tiers (in buffers shifted ``*_shift`` elements off a line), a random ``where`` and the expected rows."""
    size = np.dtype(dtype).itemsize

    def shifted(elems, shift):
        buf = np.zeros(elems + LINE, dtype)
        start = (-buf.ctypes.data % LINE) // size + shift
        a = buf[start:start + elems]
        a[:] = rng.integers(0, np.iinfo(dtype).max, elems, dtype=dtype, endpoint=True)
        return a

    cache = shifted(slots * row_elems, cache_shift)
    flat = shifted(flat_rows * row_elems + 5, flat_shift)
    from_cache = rng.random(n) < 0.5
    slot = rng.integers(0, slots, n)
    offset = rng.integers(0, flat.shape[0] - row_elems + 1, n)  # any element offset, not only whole rows
    where = np.where(from_cache, slot, flat_where(offset)).astype(np.int64)
    want = np.stack([cache[s * row_elems:(s + 1) * row_elems] if c else flat[o:o + row_elems]
                     for c, s, o in zip(from_cache, slot, offset)])
    return cache, flat, where, want


def _t(a):
    """A numpy carrier array as a tensor (torch 2.2 takes no uint16/32/64 arrays: the signed twin, same bits)."""
    return torch.from_numpy(a if a.dtype == np.uint8 else a.view(f"int{8 * a.itemsize}"))


def test_the_c_mirror_of_tier_row_agrees_input_by_input(rng):
    for _ in range(300):
        args = (int(rng.integers(-10**6, 10**6)), int(rng.integers(1, 700)), int(rng.choice([1, 2, 4, 8])),
                int(rng.integers(0, LINE)), int(rng.integers(0, LINE)))
        assert host_emu.tier_row_mirror(*args) == tier_row(*args)
    assert tier_row(3, 10, 4, 0, 64) == (0, 30, 120) and tier_row(-1, 10, 4, 0, 64) == (1, 0, 64)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_cuda_c_tiered_kernels_under_host_emulation(rng, dtype, row_elems, aligned):
    shift = int(rng.integers(0, 16))
    cache, flat, where, want = _case(rng, dtype, row_elems, cache_shift=shift, flat_shift=(shift * 7) % 16)
    for poison in (0xA5, 0x5A):
        out = np.full(want.shape, poison, np.uint8).view(dtype).reshape(want.shape) if dtype is np.uint8 else \
            np.full(want.shape, np.iinfo(dtype).max - poison, dtype)
        host_emu.launch_tiered(cache, flat, where, out, aligned=aligned, grid=3, block=64)
        assert (out == want).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64])
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_cpu_tiered_gather_equals_the_oracle(rng, dtype, row_elems):
    carrier = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[torch.empty(0, dtype=dtype).element_size()]
    cache, flat, where, want = _case(rng, carrier, row_elems)
    cache_t = _t(cache.copy()).view(dtype).reshape(-1, row_elems)
    flat_t = _t(flat.copy()).view(dtype)
    out = _t(np.full(want.shape, 77, carrier)).view(dtype)
    got = gather_tiered(cache_t, flat_t, torch.from_numpy(where), out=out)
    assert got is out and got.dtype == dtype and got.device.type == "cpu"
    assert torch.equal(got.view(torch.uint8), _t(want).view(torch.uint8))
    fresh = gather_tiered(cache_t, flat_t, torch.from_numpy(where))
    assert torch.equal(fresh.view(torch.uint8), out.view(torch.uint8)) and fresh.shape == (len(where), row_elems)


def test_an_empty_cache_serves_everything_from_the_flat_tier(rng):
    flat = torch.from_numpy(rng.standard_normal(1000).astype(np.float32))
    offsets = np.array([0, 17, 990, 3])
    got = gather_tiered(torch.empty(0, 10), flat, torch.from_numpy(flat_where(offsets)))
    assert torch.equal(got, torch.stack([flat[o:o + 10] for o in offsets]))


@pytest.mark.parametrize("where, match", [
    ([0, 40], r"cache slot 40 is out of range for 40 slots \(valid 0..39\)"),
    ([-1, -(70 * 11 + 5 - 11 + 1) - 1], "ends past the tier's"),
])
def test_where_outside_a_tier_raises_before_anything_is_written(rng, where, match):
    cache, flat, _, _ = _case(rng, np.uint32, 11)
    out = torch.full((2, 11), 7, dtype=torch.int32)
    with pytest.raises(IndexError, match=match):
        gather_tiered(_t(cache).reshape(40, 11), _t(flat), torch.tensor(where), out=out)
    assert (out == 7).all()
    check_where(np.array([39, -(70 * 11 + 5 - 11) - 1]), 40, 70 * 11 + 5, 11)  # the last valid values pass


def test_bad_arguments_are_typed_errors():
    cache, flat = torch.zeros(4, 3), torch.zeros(30)
    with pytest.raises(TypeError, match="int64"):
        gather_tiered(cache, flat, torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="one dtype"):
        gather_tiered(cache, flat.double(), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"^out has shape \(2, 3\), expected \(1, 3\)$"):
        gather_tiered(cache, flat, torch.tensor([0]), out=torch.zeros(2, 3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        gather_tiered(cache, flat.numpy(), torch.tensor([0]))
    flat = torch.arange(30.0)
    with pytest.raises(ValueError, match="out shares memory with flat"):
        gather_tiered(cache, flat, torch.tensor([-1]), out=flat[10:13].view(1, 3))
    assert torch.equal(flat, torch.arange(30.0))


def test_the_tiered_gather_refuses_what_the_plain_gather_refuses_in_its_words():
    """One home for the checks (kernels.operands): the tiered gather's arguments get the plain gather's errors,
    and memory no kernel can address is refused before any work (a meta cache used to reach the kernel)."""
    cache, flat, where = torch.zeros(4, 3), torch.zeros(30), torch.tensor([0, -1])
    with pytest.raises(ValueError, match="^cache is on the meta device, which holds no data"):
        gather_tiered(torch.zeros(4, 3, device="meta"), flat, where)
    with pytest.raises(TypeError, match="^flat must be a dense tensor"):
        gather_tiered(cache, flat.to_sparse(), where)
    with pytest.raises(TypeError, match=r"^cache elements must be 1, 2, 4 or 8 bytes, got torch.complex128 \(16 B\)$"):
        gather_tiered(cache.to(torch.complex128), flat.to(torch.complex128), where)
    with pytest.raises(TypeError, match="^out must be a torch.Tensor, got ndarray$"):
        gather_tiered(cache, flat, where, out=np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="^out has dtype torch.float64, expected torch.float32$"):
        gather_tiered(cache, flat, where, out=torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="^out must be contiguous$"):
        gather_tiered(cache, flat, where, out=torch.zeros(3, 2).t())
    with pytest.raises(ValueError, match="^out shares memory with cache: a gather cannot write where it reads"):
        gather_tiered(cache, flat, where, out=cache[:2])
    with pytest.raises(TypeError, match="^out must be a torch.Tensor, got ndarray$"):  # the plain gather's words
        gather(cache, torch.tensor([0, 1]), out=np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("row_bytes, elem", [(4, 4), (44, 4), (400, 4), (1024, 2), (602, 1), (4096, 8)])
def test_the_model_counts_each_tiers_lines_and_the_aligned_kernel_reads_no_spare_line(rng, row_bytes, elem):
    cache, flat, where, _ = _case(rng, {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[elem],
                                  row_bytes // elem)
    counts = count_tiered(where, row_bytes, elem, cache_addr=cache.ctypes.data, flat_addr=flat.ctypes.data)
    n_cache = int((where >= 0).sum())
    assert len(counts["cache"].per_row) == n_cache and len(counts["flat"].per_row) == len(where) - n_cache
    for tier in counts.values():  # every request is a line the row touches, and no line is read twice
        assert tier.total == tier.per_row.sum() == tier.min_lines.sum()


def test_a_strided_where_is_read_as_the_values_checked(rng):
    cache = torch.arange(40.0).reshape(20, 2)
    flat = torch.arange(100.0) + 1000
    where = torch.tensor([3, 10**12, -1, 10**12, 19, 10**12])[::2]  # the skipped values would be out of range
    got = gather_tiered(cache, flat, where)
    assert torch.equal(got, torch.stack([cache[3], flat[0:2], cache[19]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float64, torch.bfloat16])
def test_fill_slots_writes_each_flat_row_into_its_slot_and_nothing_else(rng, dtype):
    table = torch.empty((40, 3, 5), dtype=dtype)
    table.view(torch.uint8).fill_(0xA5)
    flat = torch.from_numpy(rng.integers(0, 256, 900 * table.element_size(), dtype=np.uint8)).view(dtype)
    slots = rng.choice(40, 17, replace=False)
    offsets = rng.integers(0, 900 - 15, 17)  # any element offset, as in a disk store's staging
    before = table.clone()
    fill_slots(table, slots, flat, offsets)
    for s, o in zip(slots.tolist(), offsets.tolist()):
        assert torch.equal(table[s].reshape(-1).view(torch.uint8), flat[o:o + 15].view(torch.uint8))
    untouched = np.setdiff1d(np.arange(40), slots)
    assert torch.equal(table[untouched].view(torch.uint8), before[untouched].view(torch.uint8))


def test_fill_slots_refuses_bad_slots_and_offsets_before_writing():
    table = torch.zeros(4, 2)
    flat = torch.arange(10.0)
    for slots, offs, err in (([0, 0], [0, 2], ValueError), ([4], [0], IndexError), ([-1], [0], IndexError),
                             ([1], [9], IndexError), ([1, 2], [0], ValueError)):
        with pytest.raises(err):
            fill_slots(table, np.array(slots), flat, np.array(offs))
        assert not table.any()
    with pytest.raises(ValueError, match="dtype"):
        fill_slots(table, np.array([0]), flat.double(), np.array([0]))


@pytest.mark.parametrize("where,match", [
    ([0, 3, -1], "cache slot 3 is out of range for 3 slots"),
    ([-1, -(9 * 4 + 1) - 1], "ends past the tier's 40 elements"),
    ([2, -(2**63)], "ends past the tier's 40 elements"),
])
def test_a_device_where_is_clamped_and_its_error_raised_at_the_next_gather(where, match):
    """A CUDA where is checked on its device by torch's ops, reading nothing back (kernels.bounds): the same ops
    run here on CPU tensors.  A bad value is clamped to a valid one before any read, the error word takes the
    launch's stamp, and the next gather (raise_pending) raises in the host check's words."""
    from directload.kernels.bounds import DeviceBounds, check_where_on_device

    bounds = DeviceBounds(torch.zeros(1, dtype=torch.int64))
    good = check_where_on_device(torch.tensor([2, -1, -(8 * 4) - 1]), 3, 40, 4, bounds.word, bounds)
    assert good.tolist() == [2, -1, -33] and int(bounds.word) == 0
    bounds.raise_pending()  # nothing pending
    clamped = check_where_on_device(torch.tensor(where), 3, 40, 4, bounds.word, bounds)
    assert int(bounds.word) == 2  # the second launch's stamp
    ok = (clamped >= 0) & (clamped < 3) | (clamped < 0) & (-clamped - 1 <= 40 - 4)
    assert bool(ok.all()) and clamped.dtype == torch.int64
    with pytest.raises(IndexError, match=match):
        bounds.raise_pending()
    bounds.raise_pending()  # reported once
    no_slots = check_where_on_device(torch.tensor([5, -1]), 0, 40, 4, bounds.word, bounds)
    assert no_slots.tolist() == [-1, -1]  # clamped into the flat tier, the only one
    with pytest.raises(IndexError, match="every where value is out of range"):
        check_where_on_device(torch.tensor([0]), 0, 3, 4, bounds.word, bounds)


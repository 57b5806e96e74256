"""launch_variant and launch_check_clamp on the CUDA simulator: every Numba kernel against torch.index_select
into poisoned outputs, sorted ids written through their permutation, and the bounds contract (a bad id stores
the launch's stamp in the error word and is clamped before the load; a good launch leaves the word)."""

import numpy as np
import pytest
import torch
from numba import cuda

from directload.kernels import numba_cuda
from directload.kernels.variants import Variant

# Elements of 1, 2, 4 and 8 bytes (float rows hold random bits, NaNs included: compared as bytes).
DTYPES = (torch.uint8, torch.int16, torch.float32, torch.float64)
KERNELS = (Variant("naive"), Variant("aligned"), Variant("rowvec", 16, 4), Variant("rowvec", 8, 32),
           Variant("rowvec", 4, 1), Variant("rowvec", 1, 8))
POISONS = (0xA5, 0x5A)


def _table(rng, rows, row_elems, dtype, offset=0):
    """A ``rows x row_elems`` table starting ``offset`` elements into its buffer (rows and tables that are not
    16-byte aligned take a narrower legal width)."""
    size = torch.empty((), dtype=dtype).element_size()
    n = (rows * row_elems + offset) * size
    buf = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    return buf.view(dtype)[offset:].view(rows, row_elems)


def _launch(variant, src, ids, out, *, positions=None, err=None, stamp=0):
    numba_cuda.launch_variant(variant, device_id=0, src_ptr=src.data_ptr(), n_rows=src.shape[0],
                              row_bytes=src.shape[1] * src.element_size(), elem_bytes=src.element_size(),
                              index=ids, positions=positions, out_ptr=out.data_ptr(),
                              err_ptr=0 if err is None else err.data_ptr(), stamp=stamp, stream_ptr=0)


def _poisoned(n, row_elems, dtype, byte):
    size = torch.empty((), dtype=dtype).element_size()
    return torch.full((n, row_elems * size), byte, dtype=torch.uint8).view(dtype)


def _word(err):
    return int(err.numpy().view(np.uint64)[0])


def _sorted(variant):
    return Variant(variant.kernel, variant.width, variant.lanes, True)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("variant", KERNELS, ids=lambda v: v.name)
def test_every_kernel_matches_index_select_sorted_or_not(variant, dtype, index_dtype, rng):
    size = torch.empty((), dtype=dtype).element_size()
    for row_elems, offset in ((1, 0), (11, 1), (37, 3), (48 // size, 0)):
        src = _table(rng, 9, row_elems, dtype, offset)
        index = torch.from_numpy(rng.integers(0, 9, 6)).to(index_dtype)
        index[-1] = index[0]  # a duplicate
        want = torch.index_select(src, 0, index).view(torch.uint8)
        for chosen, (ids, pos) in ((variant, (index, None)), (_sorted(variant), torch.sort(index))):
            for byte in POISONS:
                out = _poisoned(6, row_elems, dtype, byte)
                _launch(chosen, src, ids, out, positions=pos)
                assert torch.equal(out.view(torch.uint8), want), (chosen.name, row_elems, offset, byte)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("variant", KERNELS + tuple(_sorted(v) for v in KERNELS[:3]), ids=lambda v: v.name)
def test_bad_ids_stamp_the_error_word_and_read_clamped_rows(variant, index_dtype, rng):
    src = _table(rng, 6, 11, torch.int32)
    index = torch.tensor([2, -1, 5, 6, 100, -7, 0], dtype=index_dtype)
    ids, pos = torch.sort(index) if variant.sorted else (index, None)
    want = src[index.clamp(0, 5)].view(torch.uint8)
    stamp = 2**63 + 12345  # a full unsigned 64-bit word
    err = torch.zeros(1, dtype=torch.int64)
    out = _poisoned(7, 11, torch.int32, 0xA5)
    _launch(variant, src, ids, out, positions=pos, err=err, stamp=stamp)
    assert _word(err) == stamp
    assert torch.equal(out.view(torch.uint8), want)
    # No error word: still clamped, nothing stored anywhere.
    out = _poisoned(7, 11, torch.int32, 0x5A)
    _launch(variant, src, ids, out, positions=pos)
    assert torch.equal(out.view(torch.uint8), want)
    # A good launch leaves the word as it was.
    err.fill_(77)
    good = torch.tensor([5, 0, 3], dtype=index_dtype)
    ids, pos = torch.sort(good) if variant.sorted else (good, None)
    out = _poisoned(3, 11, torch.int32, 0x5A)
    _launch(variant, src, ids, out, positions=pos, err=err, stamp=99)
    assert _word(err) == 77
    assert torch.equal(out, src[good])


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_check_clamp_clamps_and_flags(index_dtype):
    index = torch.tensor([3, -1, 9, 0, 10, -100, 4], dtype=index_dtype)
    err = torch.zeros(1, dtype=torch.int64)
    clamped = torch.full_like(index, -55)
    numba_cuda.launch_check_clamp(device_id=0, index=index, clamped=clamped, n_rows=10, err_ptr=err.data_ptr(),
                                  stamp=31, stream_ptr=0)
    assert torch.equal(clamped, index.clamp(0, 9)) and _word(err) == 31
    err.fill_(5)
    good = torch.tensor([0, 9, 4], dtype=index_dtype)
    clamped = torch.full_like(good, -55)
    numba_cuda.launch_check_clamp(device_id=0, index=good, clamped=clamped, n_rows=10, err_ptr=err.data_ptr(),
                                  stamp=32, stream_ptr=0)
    assert torch.equal(clamped, good) and _word(err) == 5


def test_check_clamp_wants_one_dtype():
    index = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(TypeError, match="clamped must have the index's dtype"):
        numba_cuda.launch_check_clamp(device_id=0, index=index, clamped=torch.zeros(3, dtype=torch.int32),
                                      n_rows=10, err_ptr=0, stamp=1, stream_ptr=0)


def test_empty_ids_launch_nothing_and_zero_byte_rows_still_check_the_ids(rng):
    src = _table(rng, 4, 5, torch.float32)
    err = torch.zeros(1, dtype=torch.int64)
    _launch(Variant("aligned"), src, torch.zeros(0, dtype=torch.int64), torch.empty(0, 5), err=err, stamp=3)
    assert _word(err) == 0
    empty_rows = torch.empty(4, 0)
    _launch(Variant("rowvec", 16, 1), empty_rows, torch.tensor([1, 4]), torch.empty(2, 0), err=err, stamp=4)
    assert _word(err) == 4


def test_index_select_is_not_a_numba_kernel(rng):
    src = _table(rng, 4, 5, torch.float32)
    with pytest.raises(ValueError, match="Numba backend launches"):
        _launch(Variant("index_select"), src, torch.tensor([1]), torch.empty(1, 5))


_ALLOCATORS = ("device_array", "device_array_like", "to_device", "mapped_array", "pinned_array")


def test_production_launches_allocate_nothing(rng, monkeypatch):
    """No scratch (trace) arrays per launch: the untraced kernels get cached empty descriptors."""
    src = _table(rng, 8, 7, torch.int16)
    index = torch.tensor([7, 1, 1, 0])
    err = torch.zeros(1, dtype=torch.int64)
    out = torch.empty(4, 7, dtype=torch.int16)

    def run_all():
        for variant in KERNELS:
            _launch(variant, src, index, out, err=err, stamp=1)
            ids, pos = torch.sort(index)
            _launch(_sorted(variant), src, ids, out, positions=pos, err=err, stamp=1)
        numba_cuda.launch(src, index, out, aligned=True)
        numba_cuda.launch(src, index, out, aligned=False)
        numba_cuda.launch_tiered(src.reshape(-1), src.reshape(-1), torch.tensor([0, -3]), out[:2], aligned=True)
        numba_cuda.launch_check_clamp(device_id=0, index=index, clamped=torch.empty_like(index), n_rows=8,
                                      err_ptr=err.data_ptr(), stamp=1, stream_ptr=0)
        numba_cuda.gather_rows(src.numpy(), index.numpy(), out.numpy())

    run_all()  # the first use fills the caches
    cached = dict(numba_cuda._SimLaunches._empty)
    for name in _ALLOCATORS:
        monkeypatch.setattr(cuda, name, _refuse(name))
    run_all()
    assert numba_cuda._SimLaunches._empty == cached
    with pytest.raises(AssertionError, match="cuda.to_device called"):  # the refusal bites: tracing allocates
        numba_cuda.gather_rows(src.numpy(), index.numpy(), out.numpy(), trace=True)
    assert torch.equal(out, src[index]) and _word(err) == 0


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"cuda.{name} called on a production launch")
    return refuse

"""CUDA ids are checked on the GPU path as on the CPU, in the same words: rows of 0 bytes (nothing to move, the ids
still checked by the kernels' ``check_clamp``), and ``x[idx]`` ids below ``-n`` (shifted on the device, reported as
given).  Without a GPU, ``kernels.gpu_path``'s own launch path runs over a table whose kernels are gather.cu's, emulated
on the CPU by g++ (:mod:`kernels.host_emu`), and whose error word is plain memory; the GPU tests run the real
thing where a device is present."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import directload
from directload import unified
from directload.kernels import bounds, gather, gather_async, gpu_path, host_emu
from directload.kernels.variants import Variant


class _Stream:
    cuda_stream = 0  # the default stream's handle: the emulation runs at once, in order


def _emulated_table(src, word):
    """What ``kernels.gpu_path`` reads of a :class:`~kernels.gpu_path.GpuTable` over ``src`` (a CPU tensor), its two
    launches gather.cu's kernels under host emulation, stamping ``word`` (a DeviceBounds)."""
    err = word.word.numpy().view(np.uint64)
    table = src.numpy()
    row_bytes = src.element_size() * int(np.prod(src.shape[1:], dtype=np.int64))

    def check_clamp(*, device_id, index, clamped, n_rows, err_ptr, stamp, stream_ptr):
        assert err_ptr == word.ptr and clamped.shape == index.shape
        host_emu.launch_check_clamp(index.numpy(), clamped.numpy(), n_rows, err=err, stamp=stamp)

    def rows(variant, *, device_id, src_ptr, n_rows, row_bytes, elem_bytes, index, positions, out_ptr, err_ptr, stamp,
             stream_ptr):
        assert variant.kernel == "rowvec" and err_ptr == word.ptr and n_rows == table.shape[0]
        out = np.ctypeslib.as_array((ctypes.c_uint8 * (index.shape[0] * row_bytes)).from_address(out_ptr))
        host_emu.launch_rowvec(table.view(np.uint8).reshape(n_rows, row_bytes), index.numpy(),
                               out.reshape(index.shape[0], row_bytes), width=variant.width, lanes=variant.lanes,
                               grid=1, err=err, stamp=stamp, pos=None if positions is None else positions.numpy())

    def unused(*args, **kwargs):
        raise AssertionError("a row kernel was chosen for rows of 0 bytes")

    return SimpleNamespace(n_rows=src.shape[0], row_bytes=row_bytes, row_shape=tuple(src.shape[1:]), ptr=src.data_ptr(),
                           elem=src.element_size(), dtype=src.dtype, bounds=word, device=torch.device("cuda", 0),
                           device_index=0, launch_check_clamp=check_clamp,
                           launch_variant=rows if row_bytes else unused, variant_for=unused)


@pytest.fixture
def emulated(monkeypatch):
    """``kernels.gpu_path``'s GPU launch over emulated tables: the current stream and device are the fake ones."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    word = bounds.DeviceBounds(torch.zeros(1, dtype=torch.int64))  # plain memory stands in for the pinned word
    return lambda src: _emulated_table(src, word)


def _error(run):
    with pytest.raises(IndexError) as caught:
        run()
    return str(caught.value)


@pytest.mark.parametrize("row_shape", [(0,), (3, 0)], ids=["(n, 0)", "(n, 3, 0)"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_zero_byte_rows_check_their_ids_on_the_gpu_path_as_on_the_cpu(emulated, row_shape, index_dtype):
    src = torch.empty((10, *row_shape))
    table = emulated(src)
    good = torch.tensor([9, 0, 9], dtype=index_dtype)
    out = torch.empty((3, *row_shape))
    future = gpu_path.start(table, good, out, None)
    assert future.wait() is out and out.shape == (3, *row_shape) and out.dtype == src.dtype
    assert int(table.bounds.word[0]) == 0  # a good launch leaves the word alone
    for bad in ([0, 10, 3], [-1], [2, 2, 11, -4]):
        ids = torch.tensor(bad, dtype=index_dtype)
        on_cpu = _error(lambda ids=ids: gather(src, ids))
        out = torch.empty((len(bad), *row_shape))
        future = gpu_path.start(table, ids, out, None)  # what gather runs for CUDA ids: stamped, not raised yet
        assert _error(future.wait) == on_cpu  # the same words, position and value
        position = next(i for i, v in enumerate(bad) if not 0 <= v < 10)
        assert on_cpu == f"index {bad[position]} is out of range for 10 rows (valid 0..9) (at position {position})"


def test_zero_byte_rows_of_a_gpu_path_are_reported_by_the_next_gather_too(emulated):
    """As for any CUDA gather: the error word holds the stamp until someone reports it."""
    src = torch.empty(4, 0)
    table = emulated(src)
    gpu_path.start(table, torch.tensor([1, 4]), torch.empty(2, 0), None)  # not waited for
    assert _error(lambda: gpu_path.start(table, torch.tensor([0]), torch.empty(1, 0), None)) == \
        "index 4 is out of range for 4 rows (valid 0..3) (at position 1)"
    gpu_path.start(table, torch.tensor([3]), torch.empty(1, 0), None).wait()  # reported once


@pytest.mark.parametrize("given", [[0, -3, -13, 12], [-11], [4, 10, -10], [-21, -1]], ids=str)
def test_ids_below_minus_n_on_the_gpu_path_are_reported_as_given_in_the_cpu_words(emulated, given, rng):
    """``x[idx]``'s CUDA branch: the ids shifted from the end on the device (its own function), the launch made
    inside ``ids_from_end`` (as the branch makes it), the emulated kernel stamping the word; the error names the id
    the user gave, in the CPU path's message."""
    src = torch.from_numpy(rng.standard_normal((10, 4)).astype(np.float32))
    ids = torch.tensor(given)
    on_cpu = _error(lambda: directload.to_unified(src, copy=True)[ids])
    first = next(v for v in given if not -10 <= v < 10)
    assert on_cpu == (f"index {first} is out of range for 10 rows (valid -10..9) "
                      f"(at position {given.index(first)})")
    table = emulated(src)
    out = torch.full((len(given), 4), float("nan"))
    with bounds.ids_from_end():
        future = gpu_path.start(table, unified._shift_from_end(ids, 10), out, Variant("rowvec", 16, 4))
    assert _error(future.wait) == on_cpu
    good = [i for i, v in enumerate(given) if -10 <= v < 10]
    assert torch.equal(out[good], src[ids[good]])  # the good ids read their rows, counted from the end


def test_ids_of_other_launches_keep_the_plain_message(emulated):
    """Outside ``ids_from_end`` a negative id is out of range (``valid 0..n-1``), as gather's contract says."""
    table = emulated(torch.zeros(10, 4))
    future = gpu_path.start(table, torch.tensor([-1]), torch.empty(1, 4), Variant("rowvec", 16, 4))
    assert _error(future.wait) == "index -1 is out of range for 10 rows (valid 0..9) (at position 0)"


def test_the_shift_from_the_end_reads_nothing_back_and_widens_int32_where_needed():
    ids = torch.tensor([-1, 0, -12, 5], dtype=torch.int32)
    assert unified._shift_from_end(ids, 10).tolist() == [9, 0, -2, 5]
    assert unified._shift_from_end(ids, 10).dtype == torch.int32
    wide = unified._shift_from_end(ids, 2**31 + 5)
    assert wide.dtype == torch.int64 and wide.tolist() == [2**31 + 4, 0, 2**31 - 7, 5]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_on_a_gpu_ids_below_minus_n_are_reported_as_given():
    x = directload.to_unified(torch.randn(10, 4), copy=True)
    ids = torch.tensor([0, -13, 2])
    on_cpu = _error(lambda: x[ids])

    def on_gpu():
        x[ids.cuda()]  # raises here if the kernel is done, else the next gather on the device does
        torch.cuda.synchronize()
        x[torch.zeros(1, dtype=torch.int64, device="cuda")]

    assert _error(on_gpu) == on_cpu


@cuda
def test_on_a_gpu_zero_byte_rows_check_their_ids():
    src = torch.empty(10, 0).pin_memory()
    ids = torch.tensor([0, 10])
    on_cpu = _error(lambda: gather(src, ids))
    assert _error(lambda: gather_async(src, ids.cuda()).check()) == on_cpu

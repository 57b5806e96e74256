"""The gather's hot path: no host sync on the GPU path (read from the code), a bounded number of calls per
cached gather (counted with sys.setprofile), and the error word's protocol (kernels.bounds) on the CPU."""

import ast
import inspect
import sys
import textwrap

import pytest
import torch

from directload import unified
from directload.kernels import api, bounds, futures, gather, gather_async, gpu_path, operands
from directload.stores import tensor as tensor_store

# Every function a CUDA gather runs through on the way to its launch, and the future's wait/done.
HOT = [
    api.gather, api.gather_async, gpu_path.gather_fast, gpu_path.start, gpu_path._start_on, gpu_path._check_ids,
    gpu_path._auto_backend, operands.as_index,
    futures.GatherFuture.wait, futures.GatherFuture.wait_in_order, futures.GatherFuture.done,
    gpu_path.cached_table, gpu_path.table_for, gpu_path.launch, gpu_path.as_variant, gpu_path.GpuTable.matches,
    gpu_path.GpuTable.variant_for,
    bounds.bounds_for, bounds.DeviceBounds.stamp, bounds.DeviceBounds.raise_pending, bounds.DeviceBounds.raise_for,
    bounds.ids_from_end, unified._gather, unified._shift_from_end, tensor_store.TensorStore._read_async,
    tensor_store.TensorStore._bounds_on_device,
]
# What reads a device value on the host (a device-to-host sync).
SYNCS = {"int", "item", "tolist", "cpu", "synchronize", "numpy", "float", "bool", "nonzero", "any", "all"}


def _calls(fn):
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            yield name, node.lineno


@pytest.mark.parametrize("fn", HOT, ids=lambda f: f.__qualname__)
def test_the_hot_path_reads_nothing_back_from_the_device(fn):
    found = [(name, line) for name, line in _calls(fn) if name in SYNCS]
    assert found == [], f"{fn.__qualname__} calls {found}: a host read of a device value is a sync"


def test_the_static_check_can_fail():
    def synced(index):
        return int(index.max()) + index.sum().item()

    assert sorted(name for name, _ in _calls(synced) if name in SYNCS) == ["int", "item"]


def _count_calls(fn):
    """Python and C calls made by ``fn()`` (sys.setprofile's call and c_call events)."""
    n = 0

    def profile(frame, event, arg):
        nonlocal n
        if event in ("call", "c_call"):
            n += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_a_cached_cpu_gather_makes_a_bounded_number_of_calls():
    table = torch.arange(4000.0).reshape(1000, 4)
    ids = torch.randint(0, 1000, (256,))
    for _ in range(3):  # the table's view is cached, the kernel loaded (or its fallback chosen)
        gather(table, ids)
    n = _count_calls(lambda: gather(table, ids))
    assert 0 < n <= 90, n  # 78 when written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cached_gpu_gather_makes_a_bounded_number_of_calls():
    table = torch.arange(4000.0).reshape(1000, 4).pin_memory()
    ids = torch.randint(0, 1000, (256,), device="cuda")
    for _ in range(3):
        gather(table, ids)
    n = _count_calls(lambda: gather(table, ids))
    assert 0 < n <= 80, n


def _bounds():
    return bounds.DeviceBounds(torch.zeros(1, dtype=torch.int64))  # plain memory stands in for the pinned word


def test_a_stamp_in_the_word_names_the_launch_position_and_value():
    b = _bounds()
    good = b.stamp(torch.tensor([0, 1, 2]), 10)
    bad = b.stamp(torch.tensor([3, 12, -1]), 10)
    b.raise_for(good)  # the word is clean
    b.word[0] = bad  # what the kernel stores on a bad id
    b.raise_for(good)  # not this launch's stamp, and its own ids are fine
    with pytest.raises(IndexError, match=r"index 12 is out of range for 10 rows \(valid 0..9\) \(at position 1\)"):
        b.raise_for(bad)
    b.raise_pending()  # reported once


def test_the_next_call_raises_what_no_one_has_seen():
    b = _bounds()
    s = b.stamp(torch.tensor([5, 7]), 6)
    b.word[0] = s
    with pytest.raises(IndexError, match=r"index 7 .*at position 1\)"):
        b.raise_pending()
    b.raise_pending()  # already reported: quiet
    s2 = b.stamp(torch.tensor([0]), 6)
    b.raise_for(s2)


def test_an_overwritten_stamp_still_finds_the_earlier_bad_launch():
    b = _bounds()
    first = b.stamp(torch.tensor([9]), 4)
    second = b.stamp(torch.tensor([0, 4]), 4)
    b.word[0] = second  # both were bad; the later store won
    with pytest.raises(IndexError, match="index 9 is out of range for 4 rows"):
        b.raise_for(first)
    with pytest.raises(IndexError, match=r"index 4 .*at position 1\)"):
        b.raise_pending()


def test_a_launch_older_than_the_record_is_still_reported():
    b = _bounds()
    stamps = [b.stamp(torch.tensor([3]), 1) for _ in range(bounds.RECENT + 5)]
    b.word[0] = stamps[0]  # its record has gone: the error says so, with no position
    with pytest.raises(IndexError, match=f"more than {bounds.RECENT} launches ago"):
        b.raise_pending()
    b.word[0] = stamps[-1]
    with pytest.raises(IndexError, match="index 3 is out of range for 1 rows"):
        b.raise_pending()


def test_ids_changed_after_the_launch_give_a_position_free_error():
    b = _bounds()
    ids = torch.tensor([1, 8])
    s = b.stamp(ids, 4)
    ids[1] = 0  # the caller reused its buffer before the report
    b.word[0] = s
    with pytest.raises(IndexError, match="position is unknown"):
        b.raise_pending()


def test_variant_needs_cuda_ids_and_a_known_name():
    table = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="needs CUDA ids"):
        gather(table, torch.tensor([1]), variant="rowvec16x2")
    with pytest.raises(ValueError, match="unknown variant"):
        gather_async(table, torch.tensor([1]), variant="rowvec")
    with pytest.raises(ValueError, match="kernel must be one of"):
        gather(table, torch.tensor([1]), variant="warp_magic")
    with pytest.raises(TypeError, match="variant name is a str"):
        gather(table, torch.tensor([1]), variant=3)


def test_strict_and_variant_leave_cpu_results_alone():
    table = torch.arange(8.0).reshape(4, 2)
    ids = torch.tensor([3, 0])
    assert torch.equal(gather(table, ids, strict=True), table[ids])
    with pytest.raises(IndexError, match="index 4"):
        gather(table, torch.tensor([4]), strict=True)


@pytest.mark.parametrize("sort", [False, True])
def test_the_emulated_kernel_stamps_the_word_and_the_host_names_the_id(sort):
    """End to end on the CPU: gather.cu's rowvec kernel (g++ host emulation) clamps a bad id and stores the
    launch's stamp; DeviceBounds then names the id and its position in the caller's ids."""
    import numpy as np

    from directload.kernels import host_emu

    b = _bounds()
    err = b.word.numpy().view(np.uint64)
    src = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = torch.tensor([3, 11, 0, 9])
    run, pos = (torch.sort(ids) if sort else (ids, None))
    out = np.full((4, 4), np.nan, np.float32)
    good = b.stamp(torch.tensor([1]), 10)
    host_emu.launch_rowvec(src, np.array([1]), np.zeros((1, 4), np.float32), width=16, lanes=4, grid=1,
                           err=err, stamp=good)
    b.raise_for(good)  # a good launch leaves the word alone
    stamp = b.stamp(ids, 10)
    host_emu.launch_rowvec(src, run.numpy(), out, width=16, lanes=4, grid=1, err=err, stamp=stamp,
                           pos=None if pos is None else pos.numpy())
    assert int(b.word[0]) == stamp
    assert np.array_equal(out[[0, 2, 3]], src[[3, 0, 9]]) and np.array_equal(out[1], src[9])  # clamped
    assert host_emu.counters().misaligned == 0
    with pytest.raises(IndexError, match=r"index 11 is out of range for 10 rows .*at position 1\)"):
        b.raise_for(stamp)


GPU_VARIANTS = [None, "index_select", "index_select+sort", "rowvec16x4", "rowvec8x4+sort", "naive", "aligned+sort"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_a_repeated_gpu_gather_makes_no_host_sync(variant):
    table = torch.randn(1000, 25).pin_memory()
    ids = torch.randint(0, 1000, (300,), device="cuda")
    gather(table, ids, variant=variant)  # the first call caches the table, compiles and tunes
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host sync now raises
    try:
        out = gather(table, ids, variant=variant)
        future = gather_async(table, ids, variant=variant)
        future.done()
        again = future.wait()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.device == ids.device and out.dtype == table.dtype
    assert torch.equal(out.cpu(), table[ids.cpu()]) and torch.equal(again.cpu(), table[ids.cpu()])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_a_bad_cuda_id_is_reported_by_check_and_the_next_call(variant):
    table = torch.randn(100, 7).pin_memory()
    bad = torch.tensor([5, 100, 2], device="cuda")
    with pytest.raises(IndexError, match=r"index 100 is out of range for 100 rows .*at position 1\)"):
        gather_async(table, bad, variant=variant).check()
    gather_async(table, torch.tensor([-1], device="cuda"), variant=variant)
    torch.cuda.synchronize()
    with pytest.raises(IndexError, match="index -1 is out of range"):
        gather(table, torch.tensor([0], device="cuda"), variant=variant)
    with pytest.raises(IndexError, match="index 100"):
        gather(table, bad, variant=variant, strict=True)

"""The FeatureStore contract, through TensorStore: placement, out, errors before work, close."""

import numpy as np
import pytest
import torch
from conftest import DTYPES, ROW_ELEMS, assert_gathers, bits, random_table, within

import directload
from directload.stores import ClosedError, FeatureStore, ReadFuture, TensorStore, read_devices

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.mark.parametrize("index_dev, requested, memory, want", [
    (CPU, None, "host", (CPU, CPU)),          # host table, CPU ids: the CPU kernel, a CPU result
    (CPU, None, "mapped", (CPU, CPU)),
    (CPU, GPU0, "mapped", (GPU0, GPU0)),      # asked for a GPU result: zero-copy from mapped host memory
    (CPU, GPU0, "host", (CPU, GPU0)),         # pageable rows: no GPU can read them, the CPU gathers, then a copy
    (GPU0, None, "host", (CPU, GPU0)),
    (GPU0, None, "mapped", (GPU0, GPU0)),     # ids on a GPU: the result follows them
    (GPU0, CPU, "mapped", (CPU, CPU)),        # asked for a CPU result from a host table
    (CPU, None, GPU1, (GPU1, CPU)),           # a table in GPU memory is read there, then copied out
    (GPU1, None, GPU1, (GPU1, GPU1)),
    (GPU0, None, GPU1, (GPU1, GPU0)),
    (CPU, "cuda:1", "mapped", (GPU1, GPU1)),
])
def test_one_pure_rule_decides_where_a_read_runs_and_where_its_result_lives(index_dev, requested, memory, want):
    assert read_devices(index_dev, requested, memory) == want


def test_what_holds_a_table_is_said_one_way():
    from directload.kernels.devices import memory_of

    assert memory_of(torch.zeros(3), has_cuda=False) == "host"
    assert memory_of(directload.to_unified(torch.zeros(3)), has_cuda=False) == "mapped"
    assert TensorStore(torch.zeros(3)).memory == "host" and directload.stores.DiskStore.memory == "host"
    assert read_devices(CPU, GPU0, CPU) == (CPU, GPU0)  # a bare CPU device: pageable, read by the CPU
    with pytest.raises(ValueError, match="'host', 'mapped' or a CUDA device"):
        read_devices(CPU, None, "meta")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", ROW_ELEMS[::2])
def test_tensor_store_reads_equal_indexing(rng, dtype, row):
    table = random_table(rng, 300, row, dtype)
    store = TensorStore(table)
    ids = torch.from_numpy(rng.integers(0, 300, 77))
    assert store.shape == (300, row) and store.dtype == dtype and store.row_nbytes == row * table.element_size()
    assert_gathers(lambda out: store.read(ids, out=out), table, ids)
    got = store.read(ids)
    assert got.device == CPU and got.dtype == dtype and torch.equal(bits(got), bits(table[ids]))


def test_read_is_read_async_then_wait_and_wait_repeats(rng):
    table = random_table(rng, 50, 7, torch.float32)
    store = TensorStore(table)
    future = store.read_async([3, 1, 3])
    assert isinstance(future, ReadFuture)
    first = future.wait()
    assert future.done() and future.wait() is first
    assert torch.equal(first, table[[3, 1, 3]]) and torch.equal(store.read([3, 1, 3]), first)


def test_ids_may_be_numpy_lists_or_int32_and_empty(rng):
    table = random_table(rng, 20, 3, torch.int64)
    store = TensorStore(table.numpy())  # a numpy table is shared, not copied
    for ids in (np.array([4, 2], np.uint32), [4, 2], torch.tensor([4, 2], dtype=torch.int32), range(4, 1, -2)):
        assert torch.equal(store.read(ids), table[[4, 2]])
    empty = store.read([])
    assert empty.shape == (0, 3) and empty.dtype == torch.int64


def test_writes_to_the_table_in_place_are_seen():
    table = torch.zeros(10, 4)
    store = TensorStore(table)
    assert store.read([2]).sum() == 0
    table[2] = 5
    assert torch.equal(store.read([2]), torch.full((1, 4), 5.0))


def test_tables_the_kernels_do_not_take_are_read_by_torch():
    base = torch.arange(60.0).view(10, 6)
    strided = base[:, ::2]
    grad = torch.randn(8, 3, requires_grad=True)
    assert torch.equal(TensorStore(strided).read([7, 1]), strided[[7, 1]])
    got = TensorStore(grad).read([2])
    assert torch.equal(got, grad.detach()[[2]])


def test_unified_tables_are_read_through_the_kernels(rng):
    table = random_table(rng, 64, 37, torch.float16)
    unified = directload.to_unified(table, pin="auto")
    got = TensorStore(unified).read(torch.tensor([63, 0, 5]))
    assert type(got) is torch.Tensor and torch.equal(bits(got), bits(table[[63, 0, 5]]))


@pytest.mark.parametrize("ids, error, match", [
    ([0, 10], IndexError, "row id 10 is out of range"),
    ([-1], IndexError, "row id -1"),
    (torch.tensor([True, False]), TypeError, "integer row ids"),
    (torch.tensor([1.0]), TypeError, "integer row ids"),
    (np.array([0.5]), TypeError, "must be integers"),
    ([1, 2.5], TypeError, "must be integers"),
    (torch.zeros(2, 2, dtype=torch.int64), ValueError, "1-D"),
    ("0", TypeError, "not str"),
    (np.array([2 ** 63], np.uint64), IndexError, "out of range"),
])
def test_bad_ids_raise_typed_errors_before_any_read(ids, error, match):
    table = torch.zeros(10, 2)
    with pytest.raises(error, match=match):
        TensorStore(table).read_async(ids)


@pytest.mark.parametrize("out, match", [
    (torch.zeros(2, 3), "shape"),
    (torch.zeros(3, 2, dtype=torch.float64), "float64"),
    (torch.zeros(2, 3).t(), "non-contiguous"),
])
def test_a_wrong_out_is_refused_and_left_untouched(out, match):
    store = TensorStore(torch.ones(10, 2))
    before = out.clone()
    with pytest.raises(ValueError, match=match):
        store.read([1, 2, 3], out=out)
    assert torch.equal(out, before)


def test_out_is_filled_and_returned_and_may_be_reused():
    table = torch.arange(20.0).view(10, 2)
    store = TensorStore(table)
    out = torch.full((2, 2), -1.0)
    assert store.read([9, 0], out=out) is out and torch.equal(out, table[[9, 0]])
    assert store.read([1, 1], out=out) is out and torch.equal(out, table[[1, 1]])


def test_close_is_idempotent_and_reads_after_it_raise_closed_error():
    with TensorStore(torch.ones(4, 1)) as store:
        future = store.read_async([0])
    assert store.closed and "closed" in repr(store)
    assert torch.equal(future.wait(), torch.ones(1, 1))  # a read started before close still gives its rows
    store.close()
    with pytest.raises(ClosedError):
        store.read([0])
    assert issubclass(ClosedError, RuntimeError) and ClosedError is directload.ClosedError


def test_a_read_and_the_base_hooks():
    store = TensorStore(torch.arange(6).view(3, 2))
    assert torch.equal(store.read(torch.tensor([2])), torch.tensor([[4, 5]]))
    assert store.prefetch([0, 1]) is None and len(store) == 3

    class Bare(FeatureStore):
        pass

    with pytest.raises(NotImplementedError):
        _ = Bare().num_rows


def test_a_failure_on_a_background_read_reaches_wait():
    from concurrent.futures import ThreadPoolExecutor

    def boom():
        raise OSError(5, "injected")

    with ThreadPoolExecutor(1) as pool:
        future = ReadFuture(future=pool.submit(boom))
        for _ in range(2):  # the same error each time
            with pytest.raises(OSError, match="injected"):
                future.wait()


def test_polling_done_ends_for_a_read_that_runs_on_the_callers_thread():
    future = TensorStore(torch.arange(10.0).view(5, 2)).read_async([4])
    assert within(10, future.done) is True and torch.equal(future.wait(), torch.tensor([[8.0, 9.0]]))
    bad = ReadFuture(lambda: 1 / 0)
    assert bad.done() is True
    with pytest.raises(ZeroDivisionError):
        bad.wait()


def test_an_interrupt_while_waiting_is_not_kept_as_the_reads_outcome():
    class Interrupted:
        calls = 0

        def result(self):
            Interrupted.calls += 1
            if Interrupted.calls == 1:
                raise KeyboardInterrupt
            return "rows"

        def done(self):
            return True

    future = ReadFuture(future=Interrupted())
    with pytest.raises(KeyboardInterrupt):
        future.wait()
    assert future.wait() == "rows" and future.wait() == "rows"


def test_huge_ids_and_missing_devices_are_refused_before_any_read():
    from directload.capabilities import NoDeviceError

    store = TensorStore(torch.zeros(4, 2))
    with pytest.raises(IndexError, match="out of range"):
        store.read([2 ** 64])
    with pytest.raises(IndexError, match="out of range"):
        store.read([-(2 ** 63) - 1])
    if not torch.cuda.is_available():
        with pytest.raises(NoDeviceError):
            store.read([1], device="cuda")
    with pytest.raises(ValueError):
        store.read([1], device="meta")
    if hasattr(torch, "uint64"):
        with pytest.raises(IndexError, match="out of range"):
            store.read(torch.tensor([2 ** 63], dtype=torch.uint64))

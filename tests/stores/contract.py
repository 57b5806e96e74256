"""The ``FeatureStore`` contract as a class of tests that every store's tests subclass (zarr's ``StoreTests``).

A subclass says how to build its store over a table (:meth:`StoreContract.make`); every test here then runs
against it: shape and dtype, reads equal to indexing (duplicates, every id type, empty), ``out``,
``read_async``, errors before any work (the ``out`` untouched), prefetch hints, stats, and close.
"""

import numpy as np
import pytest
import torch

from directload.stores import ClosedError, FeatureStore, ReadFuture

ROWS, ROW = 300, 5


class StoreContract:
    """Subclass, and implement :meth:`make`; pytest collects the subclass (``Test...``), not this class."""

    #: The table's dtype (a subclass may read another).
    dtype = torch.float32

    def make(self, table, tmp_path):
        """A store whose rows are ``table``'s (the caller closes it)."""
        raise NotImplementedError

    @pytest.fixture
    def table(self):
        g = torch.Generator().manual_seed(7)
        return (torch.randn(ROWS, ROW, generator=g) * 100).to(self.dtype)

    @pytest.fixture
    def store(self, table, tmp_path):
        store = self.make(table, tmp_path)
        yield store
        store.close()

    # ---------------------------------------------------------------- shape
    def test_is_a_feature_store_of_the_tables_shape(self, store, table):
        assert isinstance(store, FeatureStore)
        assert store.shape == tuple(table.shape) and store.num_rows == ROWS and len(store) == ROWS
        assert tuple(store.row_shape) == (ROW,) and store.dtype == table.dtype
        assert store.row_nbytes == ROW * table.element_size()

    # ---------------------------------------------------------------- reads
    def test_reads_equal_indexing_with_duplicates(self, store, table):
        ids = torch.tensor([5, 0, 299, 5, 17, 17, 150])
        got = store.read(ids)
        assert got.device.type == "cpu" and got.dtype == table.dtype and got.shape == (7, ROW)
        assert torch.equal(got, table[ids])

    @pytest.mark.parametrize("kind", ["int32", "int64", "numpy", "list"])
    def test_ids_of_every_kind(self, store, table, kind):
        ids = [3, 1, 4, 1, 5, 9, 2, 6]
        given = {"int32": torch.tensor(ids, dtype=torch.int32), "int64": torch.tensor(ids),
                 "numpy": np.array(ids), "list": ids}[kind]
        assert torch.equal(store.read(given), table[ids])

    def test_no_ids_give_no_rows(self, store, table):
        got = store.read(torch.empty(0, dtype=torch.int64))
        assert got.shape == (0, ROW) and got.dtype == table.dtype

    def test_many_reads_in_a_row_stay_exact(self, store, table):
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            ids = torch.randint(0, ROWS, (64,), generator=g)
            store.prefetch(ids)
            assert torch.equal(store.read(ids), table[ids])

    def test_out_is_filled_and_returned(self, store, table):
        out = torch.full((3, ROW), -1).to(table.dtype)
        got = store.read([7, 8, 7], out=out)
        assert got is out and torch.equal(out, table[[7, 8, 7]])

    def test_read_is_read_async_then_wait(self, store, table):
        future = store.read_async([2, 4])
        assert isinstance(future, ReadFuture)
        first = future.wait()
        assert future.done() and future.wait() is first and torch.equal(first, table[[2, 4]])

    # --------------------------------------------------------------- errors
    @pytest.mark.parametrize("ids,error", [([ROWS], IndexError), ([-1], IndexError),
                                           ([[1, 2]], (TypeError, ValueError)),
                                           (torch.tensor([1.5]), (TypeError, ValueError))])
    def test_bad_ids_raise_before_any_read_and_leave_out_alone(self, store, table, ids, error):
        out = torch.full((len(ids), ROW), -3).to(table.dtype)
        with pytest.raises(error):
            store.read(ids, out=out)
        assert bool((out == -3).all())
        with pytest.raises(error):
            store.prefetch(ids)

    def test_a_wrong_out_is_refused(self, store, table):
        with pytest.raises(ValueError):
            store.read([1, 2], out=torch.empty(3, ROW, dtype=table.dtype))
        with pytest.raises(ValueError):
            store.read([1, 2], out=torch.empty(2, ROW, dtype=torch.float64 if table.dtype != torch.float64
                                                     else torch.float32))

    # ---------------------------------------------------------- stats, close
    def test_stats_are_a_mapping_that_resets(self, store):
        store.read([1, 2, 3])
        stats = store.stats()
        assert hasattr(stats, "keys")
        store.reset_stats()

    def test_close_is_idempotent_and_later_reads_raise(self, table, tmp_path):
        store = self.make(table, tmp_path)
        assert not store.closed
        store.close()
        store.close()
        assert store.closed
        with pytest.raises(ClosedError):
            store.read([1])

"""``directload.testing``: the :class:`~directload.stores.FeatureStore` contract as a suite of tests that any
store's tests subclass (zarr's ``StoreTests``), directload's own stores and a plug-in's alike.

A subclass says how to build its store over a table (:meth:`StoreContract.make`); every test of the suite
then runs against it: shape and dtype; reads equal to indexing (duplicates, every kind of id, none), ``out``
and ``read_async``; errors before any work; the tier contract (:meth:`~directload.stores.FeatureStore.stage`,
a cache over the store); declared capabilities; stats composed one way and reset; close, close racing reads,
and a forked child.  A plug-in author's store runs it in three lines::

    from directload.testing import StoreContract

    class TestMyStore(StoreContract):
        def make(self, table, directory): return MyStore(table)

The suite is a :class:`unittest.TestCase`, so ``pytest`` and ``python -m unittest`` both run it and
importing it needs no pytest.  It is test machinery: production code never imports it.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from directload.buffers import StagingBuffer
from directload.stores import CAPABILITIES, ClosedError, FeatureStore, HostCache, ReadFuture, Staged, Stats, TieredStats

__all__ = ["StoreContract", "ROWS", "ROW", "race_close", "in_child"]

#: The table every test reads: ``ROWS`` rows of ``ROW`` elements.
ROWS, ROW = 300, 5


class StoreContract(unittest.TestCase):
    """The contract's tests.  Subclass it and implement :meth:`make`; ``pytest`` and ``unittest`` collect
    the subclasses (the suite itself is skipped).

    Each test has ``self.table`` (``[ROWS, ROW]`` of :attr:`dtype`), ``self.rows`` (what reads must give back:
    :meth:`expected` of the table), ``self.directory`` (a fresh temporary directory, removed after the test) and
    ``self.store``, made by :meth:`make` and closed after the test.

    Examples
    --------
    >>> import io
    >>> from directload.stores import TensorStore
    >>> class TestTensorStore(StoreContract):
    ...     def make(self, table, directory):
    ...         return TensorStore(table)
    >>> tests = unittest.TestSuite([TestTensorStore("test_reads_equal_indexing_with_duplicates"),
    ...                             TestTensorStore("test_stats_are_the_stores_own_counters_and_its_childrens")])
    >>> unittest.TextTestRunner(stream=io.StringIO()).run(tests).wasSuccessful()
    True
    """

    __test__ = False  # the suite itself: pytest collects its subclasses only

    #: The table's dtype (a subclass may read another).
    dtype: ClassVar[torch.dtype] = torch.float32
    #: What a forked child's reads raise where the store refuses to read there (a row exchange's group
    #: stays with the parent: :class:`~directload.stores.ExchangeError`); None: the child reads its rows.
    forked_child_error: ClassVar[type[BaseException] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__test__" not in cls.__dict__:
            cls.__test__ = True

    def make(self, table: torch.Tensor, directory: Path) -> FeatureStore:
        """A store whose rows are ``table``'s (the suite closes it); ``directory`` is the test's own, for
        files the store needs."""
        raise NotImplementedError(f"{type(self).__name__} must implement make(table, directory)")

    def expected(self, table: torch.Tensor) -> torch.Tensor:
        """The rows a store made over ``table`` must read back, exactly: ``table`` itself, unless the store keeps
        them changed (a lossy codec: ``codec.decode(codec.encode(table))``).  The tests compare with it."""
        return table

    @classmethod
    def setUpClass(cls) -> None:
        if cls is StoreContract:
            raise unittest.SkipTest("the contract itself: subclass it and implement make(table, directory)")
        super().setUpClass()

    def setUp(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.table = (torch.randn(ROWS, ROW, generator=g) * 100).to(self.dtype)
        self.rows = self.expected(self.table)  # what reads must give back
        where = tempfile.TemporaryDirectory(prefix="directload-contract-")
        self.addCleanup(where.cleanup)
        self.directory = Path(where.name)
        self.store = self.open()

    def open(self) -> FeatureStore:
        """Another store from :meth:`make`, closed after the test."""
        store = self.make(self.table, self.directory)
        self.addCleanup(store.close)
        return store

    def assertRows(self, got: torch.Tensor, ids: object) -> None:  # noqa: N802 - unittest's naming
        """``got`` is the table's rows at ``ids``: the same values, dtype and shape, on the CPU."""
        want = self.rows[torch.as_tensor(np.asarray(ids, dtype=np.int64))]
        self.assertEqual((got.device.type, got.dtype, tuple(got.shape)), ("cpu", want.dtype, tuple(want.shape)))
        self.assertTrue(torch.equal(got, want), "the rows read differ from the table's")

    # ---------------------------------------------------------------- shape
    def test_is_a_feature_store_of_the_tables_shape(self) -> None:
        store, table = self.store, self.table
        self.assertIsInstance(store, FeatureStore)
        self.assertEqual((store.shape, store.num_rows, len(store)), (tuple(table.shape), ROWS, ROWS))
        self.assertEqual((tuple(store.row_shape), store.dtype), ((ROW,), table.dtype))
        self.assertEqual(store.row_nbytes, ROW * table.element_size())

    # ---------------------------------------------------------------- reads
    def test_reads_equal_indexing_with_duplicates(self) -> None:
        ids = [5, 0, 299, 5, 17, 17, 150]
        self.assertRows(self.store.read(torch.tensor(ids)), ids)

    def test_ids_of_every_kind(self) -> None:
        ids = [3, 1, 4, 1, 5, 9, 2, 6]
        for kind, given in (("int32", torch.tensor(ids, dtype=torch.int32)), ("int64", torch.tensor(ids)),
                            ("numpy", np.array(ids)), ("list", ids)):
            with self.subTest(kind=kind):
                self.assertRows(self.store.read(given), ids)

    def test_no_ids_give_no_rows(self) -> None:
        got = self.store.read(torch.empty(0, dtype=torch.int64))
        self.assertEqual((tuple(got.shape), got.dtype), ((0, ROW), self.table.dtype))

    def test_many_reads_in_a_row_stay_exact(self) -> None:
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, ROWS, (64,), generator=g) for _ in range(8)]
        self.store.prefetch(batches[0])
        for k, ids in enumerate(batches):
            if k + 1 < len(batches):
                self.store.prefetch(batches[k + 1])  # the loaders' hint: the next batch, ahead
            self.assertRows(self.store.read(ids), ids)

    def test_out_is_filled_and_returned(self) -> None:
        out = torch.full((3, ROW), -1).to(self.table.dtype)
        got = self.store.read([7, 8, 7], out=out)
        self.assertIs(got, out)
        self.assertRows(out, [7, 8, 7])

    def test_read_is_read_async_then_wait(self) -> None:
        future = self.store.read_async([2, 4])
        self.assertIsInstance(future, ReadFuture)
        first = future.wait()
        self.assertTrue(future.done())
        self.assertIs(future.wait(), first)
        self.assertRows(first, [2, 4])

    # --------------------------------------------------------------- errors
    def test_bad_ids_raise_before_any_read_and_leave_out_alone(self) -> None:
        ids: Any  # some are not ids at all, on purpose
        for ids, error in (([ROWS], IndexError), ([-1], IndexError), ([[1, 2]], (TypeError, ValueError)),
                           (torch.tensor([1.5]), (TypeError, ValueError))):
            with self.subTest(ids=ids):
                out = torch.full((len(ids), ROW), -3).to(self.table.dtype)
                with self.assertRaises(error):
                    self.store.read(ids, out=out)
                self.assertTrue(bool((out == -3).all()), "a refused read wrote into out")
                with self.assertRaises(error):
                    self.store.prefetch(ids)

    def test_a_wrong_out_is_refused(self) -> None:
        other = torch.float64 if self.table.dtype != torch.float64 else torch.float32
        for out in (torch.empty(3, ROW, dtype=self.table.dtype), torch.empty(2, ROW, dtype=other)):
            with self.subTest(shape=tuple(out.shape), dtype=out.dtype), self.assertRaises(ValueError):
                self.store.read([1, 2], out=out)

    # ---------------------------------------------------------- tier contract
    def test_capabilities_are_declared_and_true(self) -> None:
        caps = self.store.capabilities
        self.assertIsInstance(caps, frozenset)
        self.assertLessEqual(set(caps), set(CAPABILITIES))
        self.assertEqual("resize" in caps, callable(getattr(self.store, "resize", None)),
                         "a store declares 'resize' exactly when it has a resize method")
        ids = list(range(0, ROWS, 7))
        if "warm" in caps:
            self.assertIsInstance(self.store.warm(ids), (int, dict))
            self.assertRows(self.store.read(ids), ids)
        else:
            with self.assertRaisesRegex(TypeError, "does not declare 'warm'"):
                self.store.warm(ids)

    def test_stage_gives_each_asked_row_at_its_offset(self) -> None:
        ids = np.array([7, 0, 299, 7, 150], np.int64)
        into = StagingBuffer(pin="never")
        if "stage" not in self.store.capabilities:
            with self.assertRaisesRegex(TypeError, "does not declare 'stage'"):
                self.store.stage(ids, into)
            self.assertEqual(into.nbytes, 0)
            return
        staged = self.store.stage(ids, into)
        self.assertIsInstance(staged, Staged)
        flat = staged.flat
        self.assertEqual((flat.dim(), flat.dtype, flat.device.type), (1, self.table.dtype, "cpu"))
        self.assertEqual((staged.offsets.dtype, staged.offsets.shape), (np.dtype(np.int64), (5,)))
        rows = torch.stack([flat[o:o + ROW] for o in staged.offsets.tolist()])
        self.assertRows(rows, ids)
        self.assertEqual(self.store.stage(np.zeros(0, np.int64), into).offsets.shape, (0,))

    def test_stage_checks_ids_before_any_work(self) -> None:
        into = StagingBuffer(pin="never")
        bad = (([1, ROWS], IndexError), (np.array([1.0]), TypeError), (np.array(3), ValueError))
        want = (TypeError,) if "stage" not in self.store.capabilities else ()
        for ids, error in bad:
            with self.subTest(ids=ids), self.assertRaises((error, *want)):
                self.store.stage(ids, into)
        self.assertEqual(into.nbytes, 0, "a refused stage staged rows")

    def test_a_store_that_stages_sits_under_a_cache(self) -> None:
        rnb = self.store.row_nbytes
        if "stage" not in self.store.capabilities:
            with self.assertRaisesRegex(TypeError, "does not declare 'stage'"):
                HostCache(self.store, 50 * rnb)
            return
        cache = HostCache(self.store, 60 * rnb, "lru", staging_bytes=30 * rnb)
        self.addCleanup(cache.close)
        g = torch.Generator().manual_seed(3)
        batches = [torch.randint(0, ROWS, (40,), generator=g) for _ in range(6)]
        for k, ids in enumerate(batches):
            if k + 1 < len(batches):
                cache.prefetch(batches[k + 1])
            self.assertRows(cache.read(ids), ids)
        tiers = [t.tier for t in cache.stats().tiers]
        self.assertEqual(tiers[0], "host")
        self.assertLessEqual(set(tiers[1:]), {t.tier for t in self.store.stats().tiers})
        cache.close()
        self.assertFalse(self.store.closed, "a cache closed the store it does not own")
        self.assertRows(self.store.read([1, 2]), [1, 2])

    # ---------------------------------------------------------- stats, reset
    def test_stats_are_the_stores_own_counters_and_its_childrens(self) -> None:
        store = self.store
        store.read([1, 2, 3])
        s = store.stats()
        self.assertIsInstance(s, Stats)
        self.assertTrue(all(isinstance(t, Stats) for t in s.tiers))
        children = store.children()
        if not children:
            self.assertEqual((s.tier, [t.tier for t in s.tiers]), (store.tier, [store.tier]))
        else:
            self.assertIsInstance(s, TieredStats)
            own = [store.tier] if s.tiers and s.tiers[0].tier == store.tier else []
            below = [t.tier for child in children for t in child.stats().tiers]
            names = list(dict.fromkeys(own + below))  # each tier name once, the nearest the top
            self.assertEqual(([t.tier for t in s.tiers], list(s)), (names, names))
        with self.assertRaises(TypeError):
            s["new"] = 1  # type: ignore[index]  # a record is read-only

    def test_reset_stats_zeroes_every_tiers_counters(self) -> None:
        self.store.read([1, 2, 3, 1])
        self.store.reset_stats()
        counts = ("rows", "reads", "requests", "hit_rows", "miss_rows", "bytes_read", "rounds", "local_rows",
                  "remote_rows", "bytes")
        for t in self.store.stats().tiers:
            for key in counts:
                if key in t:
                    self.assertEqual(t[key], 0, f"{t.tier}'s {key} after reset_stats()")

    # ------------------------------------------------------------- lifetime
    def test_close_is_idempotent_and_later_calls_raise(self) -> None:
        store = self.open()
        self.assertFalse(store.closed)
        store.close()
        store.close()
        self.assertTrue(store.closed)
        for call in (lambda: store.read([1]), lambda: store.read_async([1]), lambda: store.prefetch([1]),
                     lambda: store.stage([1], StagingBuffer(pin="never"))):
            with self.assertRaises(ClosedError):
                call()

    def test_a_read_started_before_close_gives_its_rows(self) -> None:
        store = self.open()
        future = store.read_async([4, 9, 4])
        store.close()
        self.assertRows(future.wait(), [4, 9, 4])

    def test_close_racing_reads_gives_them_closed_error_or_their_rows(self) -> None:
        for delay in (0.0, 0.005):
            with self.subTest(delay=delay):
                errors, wrong, hung = race_close(self.open(), self.rows, delay)
                self.assertEqual((errors, wrong, hung), ([], 0, 0), "errors, reads of wrong rows, readers hung")

    @unittest.skipUnless(hasattr(os, "fork"), "needs os.fork")
    def test_a_forked_child_reads_right_or_refuses_in_one_typed_error(self) -> None:
        store = self.store
        self.assertRows(store.read([3, 1, 3]), [3, 1, 3])
        store.prefetch(torch.arange(0, ROWS, 2))  # reads ahead may be in flight at the fork
        ids = torch.arange(ROWS).flip(0)
        error = self.forked_child_error

        def child() -> None:
            try:
                got = store.read(ids)
            except BaseException as exc:  # noqa: BLE001 - the exit code tells the parent
                if error is not None and isinstance(exc, error):
                    return
                raise
            if error is not None or not torch.equal(got, self.rows[ids]):
                raise AssertionError("the child read wrong rows, or read where it should have refused")

        gc.collect()  # nothing left for the child to collect (a process group's destructor there would abort)
        self.assertEqual(in_child(child), 0, "the forked child read wrong rows or failed (its stderr says)")
        self.assertRows(store.read(ids), ids)  # and the parent reads on


def race_close(store: FeatureStore, table: torch.Tensor, delay: float, *, reads: int = 100, batch: int = 64,
               join_s: float = 60.0) -> tuple[list[str], int, int]:
    """Three threads each read ``store`` (with hints) ``reads`` times, ``batch`` random rows of ``table`` at a
    time, while this one closes it after ``delay`` seconds: the errors other than
    :class:`~directload.stores.ClosedError` they met, their reads of wrong rows, and how many of them still ran
    ``join_s`` seconds after the close."""
    errors: list[str] = []
    wrong = [0]
    start = threading.Barrier(4)

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        for _ in range(reads):
            ids = torch.from_numpy(rng.integers(0, table.shape[0], batch))
            try:
                store.prefetch(ids)
                got = store.read(ids)
            except ClosedError:
                return
            except Exception as exc:  # noqa: BLE001 - every other error is a failure, reported by the caller
                errors.append(repr(exc))
                return
            if not torch.equal(got, table[ids]):
                wrong[0] += 1

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(delay)
    store.close()
    for t in threads:
        t.join(join_s)
    return errors, wrong[0], sum(t.is_alive() for t in threads)


def in_child(body: Callable[[], object], timeout: float = 60.0) -> int:
    """Run ``body()`` in a forked child: its exit code, 0 where it returned (whatever it returned) and 4 where it
    raised, after printing why; a child killed by a signal, or hung past ``timeout`` seconds (then killed), raises
    ``AssertionError``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        code = 3
        try:
            body()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - the code tells the parent
            print(f"the forked child failed: {exc!r}", file=sys.stderr, flush=True)
            code = 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if not os.WIFEXITED(status):
                raise AssertionError(f"the forked child died of signal {os.WTERMSIG(status)}")
            return os.WEXITSTATUS(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child hung for {timeout:g} s")

"""``RowExchange``: a table split across real gloo ranks (processes on 127.0.0.1) reads exactly ``table[ids]``
through a ``PartitionedStore``, counts what moved, refuses bad input before any collective, and turns a dead
or silent peer into a typed error within its timeout, never a hang."""

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import within

from directload.stores import ClosedError, PartitionedStore, TensorStore
from directload.stores.exchange import ExchangeError, RowExchange
from directload.stores.partitioned import partition_bounds

RANK = Path(__file__).with_name("exchange_rank.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(world, scenario, work):
    port = _free_port()
    return [subprocess.Popen([sys.executable, str(RANK), str(r), str(world), str(port), scenario, str(work)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1")) for r in range(world)]


def _finish(procs, timeout=90):
    """Every rank's JSON report; a rank still running after ``timeout`` seconds fails the test (and is killed)."""
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return reports


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_reads_exactly_the_table_rows_and_counts_them(world, tmp_path):
    reports = _finish(_start(world, "reads", tmp_path))
    for rank, report in enumerate(reports):
        assert report["failures"] == [], f"rank {rank}"
    # every row one rank received, another sent
    for case in range(len(reports[0]["stats"])):
        stats = [r["stats"][case] for r in reports]
        assert sum(s["rows_received"] for s in stats) == sum(s["rows_sent"] for s in stats) > 0
        assert sum(s["bytes_received"] for s in stats) == sum(s["bytes_sent"] for s in stats)
        assert sum(s["duplicates_saved"] for s in stats) > 0


def test_a_killed_peer_raises_exchange_error_on_the_survivor_within_the_timeout(tmp_path):
    procs = _start(2, "kill", tmp_path)
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=10)
        procs[0].stdin.write("go\n")
        procs[0].stdin.flush()
        (report,) = _finish(procs[:1], timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert report["failures"] == []
    # the rank ended by itself (_finish's bound is a hang guard); refused again with the latched error (a new
    # step would name another round), and closed
    assert report["error"].startswith("rank 0 of 2: exchange round 4 failed at its ") and "\n" not in report["error"]
    assert report["again"] == report["error"]


def test_a_peer_that_refused_its_ids_leaves_the_other_waiting_until_the_timeout(tmp_path):
    rank0, rank1 = _finish(_start(2, "silent", tmp_path), timeout=60)
    assert rank0["failures"] == rank1["failures"] == []
    assert rank0["seconds"] > 1.5  # it waited for its timeout, 2 s, and then ended (_finish's bound is a hang guard)
    assert "exchange round 4 failed at its counts step" in rank0["error"] and "timeout 2 s" in rank0["error"]


@pytest.mark.parametrize("rows,parts,want", [(10, 3, [0, 4, 7, 10]), (2, 4, [0, 1, 2, 2, 2]), (0, 2, [0, 0, 0]),
                                             (6, 1, [0, 6])])
def test_partition_bounds_are_contiguous_and_even(rows, parts, want):
    got = partition_bounds(rows, parts)
    assert got.dtype == np.int64 and got.tolist() == want


@pytest.mark.parametrize("rows,parts,match", [(10, 0, "parts must be a positive integer"),
                                              (-1, 2, "num_rows must be an integer >= 0"),
                                              (5, 2.0, "parts must be a positive integer"),
                                              (True, 2, "num_rows must be")])
def test_partition_bounds_refuse_bad_input(rows, parts, match):
    with pytest.raises(ValueError, match=match):
        partition_bounds(rows, parts)


@pytest.fixture
def one_rank():
    """A one-rank gloo job in this process."""
    with tempfile.TemporaryDirectory() as where:
        dist.init_process_group("gloo", init_method=f"file://{where}/rendezvous", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
            # free the groups' C++ objects here, now: one left for a later collection could be collected in a
            # child a later test forks, whose destructor then joins gloo threads that only this process has
            # (std::system_error, abort; seen once in CI in test_fork_and_close.py)
            gc.collect()


def test_without_torch_distributed_it_says_to_initialise_it():
    with pytest.raises(ExchangeError, match="torch.distributed is not initialised"):
        RowExchange(TensorStore(torch.zeros(4, 2)), [0, 4])


def test_bad_construction_is_refused_in_one_line(one_rank):
    local = TensorStore(torch.zeros(4, 2))
    for kwargs, error, match in (
            (dict(local=torch.zeros(4, 2), bounds=[0, 4]), TypeError, "local must be a directload FeatureStore"),
            (dict(local=local, bounds=[0, 2, 4]), ValueError, "bounds give 2 partitions, but the group has 1 ranks"),
            (dict(local=local, bounds=[0, 5]), ValueError, r"rank 0 owns 5 rows \(0:5\), but the local store has 4"),
            (dict(local=local, bounds=[0, 4], timeout=0), ValueError, "timeout must be a positive number"),
            (dict(local=local, bounds=[0, 4], timeout="1"), ValueError, "timeout must be a positive number"),
            (dict(local=local, bounds=[0, 4], backend="mpi"), ValueError, "backend must be 'gloo' or 'nccl'"),
            (dict(local=local, bounds=[0, 4], backend="gloo", group=dist.group.WORLD), ValueError, "not both"),
            (dict(local=local, bounds=[4, 0]), ValueError, "partition bounds must start at 0")):
        with pytest.raises(error, match=match):
            RowExchange(**kwargs)


@pytest.mark.parametrize("dtype,shape", [(torch.float16, (37,)), (torch.int8, (1,)), (torch.bfloat16, (3, 4))])
def test_one_rank_reads_its_own_rows_here_onto_the_index_device(one_rank, rng, dtype, shape):
    table = torch.from_numpy(rng.integers(-100, 100, (50, *shape))).to(dtype)
    with RowExchange(TensorStore(table), [0, 50], timeout=timedelta(seconds=10), own=True) as ex:
        ids = torch.tensor([3, 3, 49, 0, 3], dtype=torch.int32)
        got = ex.read(ids)
        assert torch.equal(got, table[ids.long()]) and got.device == ids.device
        assert torch.equal(ex.read([]), table[:0])
        out = torch.empty((2, *shape), dtype=dtype)
        assert ex.read([1, 2], out=out) is out and torch.equal(out, table[[1, 2]])
        s = ex.stats()["exchange"]
        counted = (s["rounds"], s["local_rows"], s["duplicates_saved"], s["rows_asked"], s["bytes_sent"])
        assert counted == (3, 5, 2, 0, 0)
        assert [t.tier for t in ex.stats().tiers] == ["exchange", "tensor"]
        ex.reset_stats()
        assert ex.stats()["exchange"]["rounds"] == 0
    assert ex.closed and ex.group is None and ex.local.closed
    with pytest.raises(ClosedError, match="is closed"):
        ex.read([0])


def test_it_is_the_remote_of_a_partitioned_store_with_a_given_group(one_rank):
    table = torch.arange(24.0).view(12, 2)
    group = dist.new_group(backend="gloo")
    ex = RowExchange(TensorStore(table), [0, 12], group=group)
    store = PartitionedStore(TensorStore(table), ex, [0, 12], part=0)
    assert torch.equal(store.read([11, 0, 11]), table[[11, 0, 11]])
    assert store.stats()["exchange"]["rounds"] == 1  # asked with no ids: every rank steps every read
    ex.close()
    assert ex.group is None  # the caller's group is the caller's to destroy
    dist.destroy_process_group(group)


def test_a_failed_round_refuses_every_later_read_with_the_same_error(one_rank, monkeypatch):
    ex = RowExchange(TensorStore(torch.zeros(6, 3)), [0, 6], timeout=5)
    ex.read([0])  # round 1: the ranks agree on the table

    def broken(*args, **kwargs):
        raise RuntimeError("Connection reset by peer\nmore detail")

    monkeypatch.setattr(dist, "all_to_all_single", broken)
    with pytest.raises(ExchangeError, match=r"^rank 0 of 1: exchange round 2 failed at its counts step "
                                            r"\(Connection reset by peer\): a peer died") as first:
        ex.read([1])
    assert "more detail" not in str(first.value) and isinstance(first.value.__cause__, RuntimeError)
    with pytest.raises(ExchangeError, match="exchange round 2 failed") as again:
        ex.read_async([2])  # refused at once, on the caller
    assert str(again.value) == str(first.value)
    assert "failed" in repr(ex)
    within(60, ex.close)  # a hang guard: a failed exchange closes without another step


def test_the_first_round_checks_the_table_and_a_failed_check_is_latched(one_rank, monkeypatch):
    ex = RowExchange(TensorStore(torch.zeros(6, 3)), [0, 6], timeout=5)

    def broken(*args, **kwargs):
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(dist, "all_to_all_single", broken)
    with pytest.raises(ExchangeError, match=r"^rank 0 of 1: exchange round 1 failed at its check step "):
        ex.read([])
    with pytest.raises(ExchangeError, match="exchange round 1 failed at its check step"):
        ex.read([1])
    ex.close()


def test_many_ranks_and_long_bounds_and_shapes_are_said_in_one_short_line():
    from directload.stores.exchange_check import describe_table, disagreement

    bounds = partition_bounds(100, 12)
    same = describe_table(torch.float16, (2,) * 20, bounds)
    described = np.stack([same] + [describe_table(torch.float16, (2,) * 19, bounds)] * 10 + [same])
    said = disagreement(described)
    assert said.startswith("ranks 1, 2, 3, 4, 5, 6, 7, 8 ... (10 ranks) have float16 rows of (2, 2, ")
    assert ", ... 19 dims), ranks 0, 11 float16 rows of (" in said and ", ... 20 dims); give every" in said
    other = partition_bounds(100, 12)[::-1].copy()
    described = np.stack([same] * 11 + [describe_table(torch.float16, (2,) * 20, other)])
    assert disagreement(described) == ("rank 11 has bounds [100, 92, 84, 76, ..., 9, 0], ranks 0, 1, 2, 3, 4, 5, 6, "
                                       "7 ... (11 ranks) bounds [0, 9, 18, 27, ..., 92, 100]; give every rank the "
                                       "same bounds")
    assert disagreement(np.stack([same] * 12)) is None


def test_a_forked_child_refuses_to_read_instead_of_hanging(one_rank):
    ex = RowExchange(TensorStore(torch.zeros(6, 3)), [0, 6], timeout=5)
    ex.read([1])
    pid = os.fork()
    if pid == 0:  # the child: the group and the round thread stayed with the parent
        try:
            ex.read([1])
        except ExchangeError as exc:
            os._exit(0 if "made before the process forked" in str(exc) else 2)
        os._exit(1)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
    assert torch.equal(ex.read([2]), torch.zeros(1, 3))  # the parent reads on
    ex.close()


ADVICE = {"rows": "give every rank's store the same dtype and row shape", "bounds": "give every rank the same bounds"}


@pytest.mark.parametrize("scenario,world,detail,advice", [
    ("dtype", 2, "rank 1 has int32 rows of (100,), rank 0 float32 rows of (100,)", "rows"),
    ("width", 2, "rank 1 has float64 rows of (100,), rank 0 float32 rows of (100,)", "rows"),
    ("shape", 2, "rank 1 has float32 rows of (10, 10), rank 0 float32 rows of (100,)", "rows"),
    ("length", 2, "rank 1 has float32 rows of (99,), rank 0 float32 rows of (100,)", "rows"),
    ("empty", 2, "rank 1 has float32 rows of (100, 0), rank 0 float32 rows of (100,)", "rows"),
    ("bounds", 2, "rank 1 has bounds [0, 4, 10], rank 0 bounds [0, 5, 10]", "bounds"),
    ("third", 3, "rank 2 has float64 rows of (100,), ranks 0, 1 float32 rows of (100,)", "rows"),
    ("several", 4, "ranks 1, 2 have int32 rows of (100,), rank 3 float32 rows of (2, 50), rank 0 float32 rows of "
                   "(100,)", "rows")])
@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_ranks_holding_different_tables_each_raise_one_error_naming_them(tmp_path, scenario, world, detail, advice):
    """Not bytes of one dtype read as another, nor gloo aborting on sizes that differ: the first read checks
    that every rank holds the same table, and every rank raises the same error, then and on every later read."""
    reports = _finish(_start(world, scenario, tmp_path))
    for rank, report in enumerate(reports):
        assert report["failures"] == [], f"rank {rank}"
        assert report["error"] == f"rank {rank} of {world}: the ranks' tables differ: {detail}; {ADVICE[advice]}"
        assert report["again"] == report["error"]


@pytest.mark.parametrize("world", [2, 3])
def test_rows_of_zero_bytes_read_as_empty_rows_of_their_shape(tmp_path, world):
    """As a TensorStore reads them: ``[len(ids), *row_shape]`` of the dtype, nothing exchanged."""
    reports = _finish(_start(world, "zero", tmp_path))
    assert [r["failures"] for r in reports] == [[]] * world

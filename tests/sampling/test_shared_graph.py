"""CSCGraph.shared: keys as shared_table takes them, another graph under a taken key refused, and readers that
wait for the writer's whole publication under one deadline, with real processes."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import torch

import directload.graph.sharing as graph_module
from directload.graph import CSCGraph, SharedGraphMismatch
from directload.shared import PREFIX, SharedTableError, SharedTableTimeout, shared_table, sweep

#: Generous: the machine may be loaded; no test waits this long unless something is broken.
SLOW = 120.0


@pytest.fixture
def key():
    return f"graph-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _graph(seed=0, n=50, edges=400):
    gen = torch.Generator().manual_seed(seed)
    return CSCGraph.from_edge_index(torch.randint(0, n, (2, edges), generator=gen), n,
                                    edge_weight=torch.rand(edges, generator=gen))


def _ours(directory, key):
    return [name for name in os.listdir(directory) if name.startswith(PREFIX + key + ".")]


def _same(a, b):
    return all((x is None and y is None) or torch.equal(torch.from_numpy(x), torch.from_numpy(y))
               for x, y in zip(a.numpy(), b.numpy()))


@pytest.mark.parametrize("bad,error", [(None, TypeError), (5, TypeError), (b"g", TypeError), ("", ValueError),
                                       ("../g", ValueError), ("g.partial", ValueError), ("x" * 193, ValueError)])
def test_a_key_shared_table_would_refuse_is_refused_before_anything_is_made(shm, bad, error):
    with pytest.raises(error, match="key must be"):
        CSCGraph.shared(bad, _graph(), affinity="host", directory=shm)
    with pytest.raises(error, match="key must be"):
        CSCGraph.shared(bad, affinity="host", directory=shm, timeout=0)
    assert os.listdir(shm) == []


@pytest.mark.parametrize("kw,error,match", [
    ({"timeout": -1}, ValueError, "timeout must be"), ({"timeout": True}, ValueError, "timeout must be"),
    ({"ranks": 0}, ValueError, "ranks must be"), ({"source": "graph"}, TypeError, "source must be a CSCGraph"),
])
def test_bad_options_are_refused_before_anything_is_made(shm, key, kw, error, match):
    with pytest.raises(error, match=match):
        CSCGraph.shared(key, **{"source": _graph(), "affinity": "host", "directory": shm, **kw})
    assert os.listdir(shm) == []


def test_another_graph_under_a_taken_key_is_refused_naming_both(shm, key):
    g, other = _graph(0), _graph(1)
    mine = CSCGraph.shared(key, g, affinity="host", directory=shm)
    with pytest.raises(SharedGraphMismatch, match=f"shared graph '{key}' on this node is another graph") as info:
        CSCGraph.shared(key, other, affinity="host", directory=shm)
    assert g.digest() in str(info.value) and other.digest() in str(info.value)
    assert "50 nodes, 400 edges" in str(info.value)
    assert isinstance(info.value, SharedTableError)
    same = CSCGraph.shared(key, _graph(0), affinity="host", directory=shm)  # the same graph, built again: fine
    assert _same(same, g) and same.digest() == mine.digest() == g.digest()
    built = []
    lazy = CSCGraph.shared(key, lambda: built.append(1) or other, affinity="host", directory=shm)
    assert built == [] and _same(lazy, g)  # a function is called only to write: the graph there is taken


def test_the_description_is_published_after_every_part(shm, key, monkeypatch):
    seen = []
    real = graph_module.shared_table
    meta = os.path.join(shm, PREFIX + key + ".meta")

    def watching(name, *args, **kwargs):
        seen.append((name.rsplit(".", 1)[1], os.path.exists(meta)))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(graph_module, "shared_table", watching)
    g = CSCGraph.shared(key, _graph(), affinity="host", directory=shm)
    assert seen == [("meta", False), ("indptr", False), ("indices", False), ("eids", False), ("weights", False)]
    assert g.weights is not None and g.weights.dtype == torch.float32 and g.indices.dtype == torch.int32


def test_a_description_that_does_not_match_its_parts_is_refused(shm, key):
    g = _graph()
    parts = {name: shared_table(f"{key}.{name}", t, affinity="host", directory=shm)
             for name, t in zip(("indptr", "indices", "eids", "weights"), g.numpy())}
    desc = graph_module.Layout.of(g)
    wrong = graph_module.Layout(desc.num_nodes, desc.num_src_nodes, desc.num_edges, "0badc0de", desc.dtypes)
    meta = shared_table(f"{key}.meta", wrong.table(), affinity="host", directory=shm)
    with pytest.raises(SharedGraphMismatch, match="another graph than the one its parts hold"):
        CSCGraph.shared(key, affinity="host", directory=shm, timeout=5)
    del parts, meta


@pytest.mark.parametrize("table", [torch.zeros(9), torch.zeros(3, dtype=torch.int64),
                                   torch.tensor([2, 50, 50, 400, 1, 0, 0, 3, -1])])
def test_a_description_that_is_not_one_is_refused(shm, key, table):
    meta = shared_table(f"{key}.meta", table, affinity="host", directory=shm)
    with pytest.raises(SharedTableError, match=f"'{key}.meta' .*shared graph"):
        CSCGraph.shared(key, affinity="host", directory=shm, timeout=5)
    del meta


# Real processes.  A writer runs this script; PAUSE_BEFORE names the part it stops before (sleeping PAUSE_S), and
# the marker file tells the test where it is.

WRITER = """
import os, sys, time, torch
import directload.graph.sharing as m
from directload.graph import CSCGraph
key, where, marker, pause_before, pause_s = sys.argv[1:6]
real = m.shared_table

def slowly(name, *args, **kwargs):
    part = name.rsplit(".", 1)[1]
    if part == pause_before or pause_before == "every":
        open(marker + "." + part, "w").close()
        time.sleep(float(pause_s))
    return real(name, *args, **kwargs)

m.shared_table = slowly
gen = torch.Generator().manual_seed(0)
g = CSCGraph.from_edge_index(torch.randint(0, 50, (2, 400), generator=gen), 50,
                             edge_weight=torch.rand(400, generator=gen))
mine = CSCGraph.shared(key, g, affinity="host", directory=where, timeout=120)
open(marker + ".done", "w").close()
sys.stdin.read()  # holds the graph until the test closes stdin
"""

READER = """
import sys, time
from directload.graph import CSCGraph
key, where, marker, timeout = sys.argv[1:5]
open(marker + ".reader", "w").close()
g = CSCGraph.shared(key, affinity="host", directory=where, timeout=float(timeout))
print(g.digest(), g.num_edges, g.indices.sum().item())
"""


def _start(script, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, proc):
    end = time.monotonic() + SLOW
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"the process ended first: {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=SLOW)


@pytest.fixture
def procs():
    started = []
    yield started
    for proc in started:
        _stop(proc)


def test_a_reader_started_before_the_writer_waits_for_it(shm, key, tmp_path, procs):
    marker = str(tmp_path / "mark")
    reader = _start(READER, key, shm, marker, SLOW)
    procs.append(reader)
    _wait_for(marker + ".reader", reader)
    time.sleep(0.5)  # the reader is looking for the graph, which no process has started to write
    g = _graph()
    mine = CSCGraph.shared(key, g, affinity="host", directory=shm)
    out, err = reader.communicate(timeout=SLOW)
    assert reader.returncode == 0, err[-2000:]
    assert out.split() == [g.digest(), "400", str(int(g.indices.sum()))]
    del mine
    assert _ours(shm, key) == []  # both processes let go: no name of this key is left


def test_a_reader_arriving_between_parts_waits_for_the_whole_graph(shm, key, tmp_path, procs):
    marker = str(tmp_path / "mark")
    writer = _start(WRITER, key, shm, marker, "every", 0.3)
    procs.append(writer)
    _wait_for(marker + ".indices", writer)  # indptr is out, the other parts are still to come
    g = CSCGraph.shared(key, affinity="host", directory=shm, timeout=SLOW)
    assert _same(g, _graph()) and g.digest() == _graph().digest()
    assert g.weights is not None and g.eids is not None


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_one_deadline_covers_every_part(shm, key, tmp_path, procs):
    # each part takes the writer 1 s, less than the timeout; the whole graph takes 4 s, more than it
    marker = str(tmp_path / "mark")
    writer = _start(WRITER, key, shm, marker, "every", 1.0)
    procs.append(writer)
    _wait_for(marker + ".indptr", writer)
    timeout = 2.0
    start = time.monotonic()
    with pytest.raises(SharedTableTimeout, match=f"shared graph '{key}' is not whole after 2 s") as info:
        CSCGraph.shared(key, affinity="host", directory=shm, timeout=timeout)
    elapsed = time.monotonic() - start
    assert f"pid {writer.pid}" in str(info.value)
    assert timeout * 0.9 <= elapsed < SLOW  # it waited out its deadline (an upper bound only against a hang)
    assert not os.path.exists(marker + ".done")  # one deadline: it gave up while the writer was still writing


def test_a_frozen_writer_is_a_timeout_naming_its_pid(shm, key, tmp_path, procs):
    marker = str(tmp_path / "mark")
    writer = _start(WRITER, key, shm, marker, "indices", SLOW)
    procs.append(writer)
    _wait_for(marker + ".indices", writer)
    os.kill(writer.pid, signal.SIGSTOP)  # it keeps its locks
    try:
        timeout = 1.5
        start = time.monotonic()
        with pytest.raises(SharedTableTimeout, match=f"pid {writer.pid}"):
            CSCGraph.shared(key, affinity="host", directory=shm, timeout=timeout)
        assert timeout * 0.9 <= time.monotonic() - start < SLOW  # an upper bound only against a hang
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.communicate(timeout=SLOW)
    sweep(shm)  # what the killed writer left: no process holds it
    assert _ours(shm, key) == []


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_a_writer_killed_before_publishing_is_a_timeout_naming_its_pid(shm, key, tmp_path, procs):
    marker = str(tmp_path / "mark")
    writer = _start(WRITER, key, shm, marker, "eids", SLOW)
    procs.append(writer)
    _wait_for(marker + ".eids", writer)
    killer = threading.Timer(0.5, os.kill, (writer.pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(SharedTableTimeout, match=f"its writer, pid {writer.pid}, stopped before publishing it"):
            CSCGraph.shared(key, affinity="host", directory=shm, timeout=3.0)
    finally:
        killer.join()
    writer.communicate(timeout=SLOW)
    sweep(shm)
    assert _ours(shm, key) == []


def test_a_reader_with_no_writer_at_all_times_out(shm, key):
    with pytest.raises(SharedTableTimeout, match="no process started writing it"):
        CSCGraph.shared(key, affinity="host", directory=shm, timeout=0.3)
    assert _ours(shm, key) == []


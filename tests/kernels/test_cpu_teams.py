"""The CPU kernels on each way of running them: serial, torch's OpenMP team, Numba's team."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import assert_gathers, random_table

from directload.kernels import cpu, cpu_launch, gather
from directload.kernels.cpu_path import _views

TEAMS = ["torch", "numba"] if cpu_launch._torch_openmp() is not None else ["numba"]


@pytest.fixture(params=TEAMS)
def team(request):
    before = cpu.team()
    cpu.set_team(request.param)
    yield request.param
    cpu.set_team(before)


def test_torch_team_is_the_default_on_linux_with_openmp_torch():
    assert "OpenMP" in torch.__config__.parallel_info()
    assert cpu_launch._torch_openmp() is not None  # the stack we pin always has it
    assert cpu.team() == "torch"
    assert cpu.get_num_threads() == torch.get_num_threads()


def test_set_team_rejects_unknown_names():
    with pytest.raises(ValueError, match="team must be 'torch' or 'numba'"):
        cpu.set_team("tbb")


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.float64], ids=str)
def test_parallel_gathers_match_torch_indexing(team, dtype, index_dtype, aligned, rng):
    row_elems = int(rng.integers(1, 700))
    rows = 3000
    src = random_table(rng, rows, row_elems, dtype)
    n = max(3, cpu.SERIAL_BYTES // (row_elems * src.element_size()) * 2)  # well past the serial size
    idx = torch.from_numpy(rng.integers(0, rows, n)).to(index_dtype)
    assert_gathers(lambda out: gather(src, idx, out=out, aligned=aligned), src, idx)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_fewer_rows_than_threads_and_uneven_shares(team, n, rng):
    src = random_table(rng, 50, 40000, torch.float32)  # 160 KB rows: parallel from 2 rows
    idx = torch.from_numpy(rng.integers(0, 50, n))
    assert_gathers(lambda out: gather(src, idx, out=out), src, idx)


@pytest.mark.parametrize("where", [0, "middle", -1])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
def test_out_of_range_anywhere_writes_nothing(team, where, aligned, rng):
    src = random_table(rng, 1000, 64, torch.float32)
    n = 4 * cpu.SERIAL_BYTES // 256
    idx = torch.from_numpy(rng.integers(0, 1000, n))
    pos = {0: 0, "middle": n // 2 + 7, -1: n - 1}[where]
    idx[pos] = 1000
    out = torch.full((n, 64), 3.0)
    with pytest.raises(IndexError, match=rf"index 1000 is out of range for 1000 rows .*position {pos}\)"):
        gather(src, idx, out=out, aligned=aligned)
    assert (out == 3.0).all()
    idx[pos] = -2
    with pytest.raises(IndexError,
                       match=rf"index -2 is out of range for 1000 rows \(valid 0..999\) \(at position {pos}\)"):
        gather(src, idx, out=out, aligned=aligned)
    assert (out == 3.0).all()


def test_first_invalid():
    assert cpu.first_invalid(np.array([0, 4, 2]), 5) == -1
    assert cpu.first_invalid(np.array([0, 5, -1]), 5) == 1
    assert cpu.first_invalid(np.array([0, 1, -1], np.int32), 5) == 2
    assert cpu.first_invalid(np.zeros(0, np.int64), 0) == -1


def test_gathers_from_two_python_threads_at_once(team, rng):
    src = random_table(rng, 20000, 64, torch.float32)
    idx = [torch.from_numpy(rng.integers(0, 20000, 30000)) for _ in range(2)]
    results, errors = [None, None], []

    def work(k):
        try:
            for _ in range(20):
                results[k] = gather(src, idx[k])
                assert torch.equal(results[k], src[idx[k]])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and all(not t.is_alive() for t in threads)


def test_table_changed_in_place_is_seen(rng):
    """The per-table view cache must notice set_() and resize_() on the same tensor object."""
    src = random_table(rng, 100, 8, torch.float32)
    idx = torch.tensor([99, 3, 50])
    assert torch.equal(gather(src, idx), src[idx])
    other = random_table(rng, 200, 8, torch.float32)
    src.set_(other)
    assert torch.equal(gather(src, idx), other[idx])
    src.resize_(60, 8)
    with pytest.raises(IndexError, match="index 99 is out of range for 60 rows"):
        gather(src, idx)
    src.resize_(100, 4)
    assert torch.equal(gather(src, idx), src[idx])


def test_out_buffer_reused_and_changed(rng):
    src = random_table(rng, 100, 8, torch.float32)
    out = torch.empty(3, 8)
    for _ in range(3):
        idx = torch.from_numpy(rng.integers(0, 100, 3))
        assert gather(src, idx, out=out) is out and torch.equal(out, src[idx])
    with pytest.raises(ValueError, match="out has shape"):
        gather(src, torch.tensor([1, 2]), out=out)
    with pytest.raises(TypeError, match="out has dtype"):
        gather(src, torch.tensor([1, 2, 3]), out=out.double())


def test_cache_entry_dies_with_the_table(rng):
    src = random_table(rng, 100, 8, torch.float32)
    gather(src, torch.tensor([1]))
    key = id(src)
    assert key in _views
    del src
    assert key not in _views


def test_table_that_requires_grad(rng):
    src = random_table(rng, 100, 8, torch.float32).requires_grad_()
    idx = torch.tensor([5, 5, 0])
    got = gather(src, idx)
    assert torch.equal(got, src.detach()[idx]) and not got.requires_grad


def _gather_in_child(src, idx, queue):
    got = gather(src, idx).numpy()  # the oracle below is numpy: torch's own ops hang here
    queue.put((cpu.get_num_threads(), bool((got == src.numpy()[idx.numpy()]).all())))


@pytest.mark.parametrize("team_name", TEAMS)
def test_gather_in_a_forked_child_runs_serially_instead_of_hanging(team_name, rng):
    import multiprocessing

    before = cpu.team()
    cpu.set_team(team_name)
    try:
        src = random_table(rng, 20000, 64, torch.float32)
        idx = torch.from_numpy(rng.integers(0, 20000, 30000))
        assert torch.equal(gather(src, idx), src[idx])  # the parent's team is started
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_gather_in_child, args=(src, idx, queue))
        child.start()
        try:
            threads, ok = queue.get(timeout=60)
        finally:
            child.join(5)
            if child.is_alive():
                child.kill()
        assert threads == 1 and ok
    finally:
        cpu.set_team(before)


def test_team_from_the_environment(monkeypatch):
    before = cpu.team()
    try:
        monkeypatch.setattr(cpu_launch, "_team", None)
        monkeypatch.setenv("DIRECTLOAD_CPU_TEAM", "numba")
        assert cpu.team() == "numba" and cpu.get_num_threads() == __import__("numba").get_num_threads()
        monkeypatch.setattr(cpu_launch, "_team", None)
        monkeypatch.setenv("DIRECTLOAD_CPU_TEAM", "openmp")
        with pytest.raises(ValueError, match="team must be"):
            cpu.team()
    finally:
        cpu.set_team(before)


def test_launch_direct_call_with_strided_numpy_index(team, rng):
    src = rng.integers(0, 1 << 30, (5000, 64)).astype(np.int32)
    idx = rng.integers(0, 5000, 2 * 4096)[::2]  # strided view
    out = np.full((idx.shape[0], 64), 7, np.int32)
    assert cpu.launch(src, idx, out) == -1
    assert (out == src[idx]).all()


@pytest.mark.skipif("torch" not in TEAMS, reason="torch has no OpenMP runtime here")
def test_torch_team_direct_call_refuses_strided_output(rng):
    before = cpu.team()
    cpu.set_team("torch")
    try:
        src = rng.integers(0, 1 << 30, (5000, 64)).astype(np.int32)
        out = np.empty((64, 4096), np.int32).T
        with pytest.raises(ValueError, match="C-contiguous"):
            cpu.launch(src, np.zeros(4096, np.int64), out)
    finally:
        cpu.set_team(before)


_SHARED_TEAM_PROBE = r"""
import os, torch
torch.set_num_threads(2)
t = torch.randn(1 << 20, 64)
i = torch.randint(0, 1 << 20, (1 << 19,))
torch.index_select(t, 0, i)  # torch's team exists from here on
def cpu_ticks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out
from directload.kernels import cpu, gather
out = torch.empty(1 << 19, 64)
gather(t, i, out=out)
before = cpu_ticks()
for _ in range(40):
    gather(t, i, out=out)
after = cpu_ticks()
from numba.np.ufunc import parallel
busy = sorted(tid for tid, ticks in after.items() if ticks > before.get(tid, 0))
print(cpu.team(), len(busy), all(tid in before for tid in busy), parallel._is_initialized)
"""


@pytest.mark.skipif("torch" not in TEAMS, reason="torch has no OpenMP runtime here")
def test_torch_team_gathers_run_on_torchs_own_threads():
    """In a fresh process: 40 parallel gathers keep two threads busy, both of which ran torch's
    own op before, and Numba's threading layer never starts (no second team of threads)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _SHARED_TEAM_PROBE], capture_output=True,
                         encoding="utf-8", errors="replace", timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["torch", "2", "True", "False"]


_FORK_WHILE_COMPILING = """
import os, sys, threading, time
import torch
from numba.core.compiler_lock import global_compiler_lock
from directload.kernels import gather, gather_async

held = threading.Event()

def compiling():  # a thread in the middle of its first gather's compile
    with global_compiler_lock:
        held.set()
        time.sleep(1.0)

{warm}
t = threading.Thread(target=compiling)
t.start()
held.wait()
pid = os.fork()
if pid == 0:
    src = torch.arange(4000.0).reshape(1000, 4)
    ok = torch.equal(gather(src, torch.tensor([3, 999])), src[[3, 999]])
    ok = ok and torch.equal(gather_async(src, torch.tensor([7]), background=True).wait(), src[[7]])
    os._exit(0 if ok else 3)
t.join()
deadline = time.time() + 120
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status))
        break
    if time.time() > deadline:
        os.kill(pid, 9)
        print("child hung")
        break
    time.sleep(0.1)
"""


@pytest.mark.parametrize("warm", [False, True], ids=["first-gather-in-child", "parent-gathered-before"])
def test_fork_while_another_thread_compiles_does_not_hang_the_child(tmp_path, warm):
    # Before: the child blocked forever on Numba's compiler lock, held at fork() by the other thread.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))  # nothing cached: the child must compile
    warm_code = ("gather_async(torch.zeros(10, 2), torch.tensor([1]), background=True).wait()\n"
                 "gather(torch.zeros(10, 2), torch.tensor([1]))") if warm else ""
    proc = subprocess.run([sys.executable, "-c", _FORK_WHILE_COMPILING.format(warm=warm_code)], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=300, env=env)
    assert proc.returncode == 0 and "child 0" in proc.stdout, (proc.stdout, proc.stderr[-2000:])


@pytest.mark.parametrize("env,want", [
    ({}, "spin 300000"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "passive"), ({"OMP_WAIT_POLICY": "active"}, "active"),
    ({"GOMP_SPINCOUNT": "10000"}, "spin 10000"),
    ({"GOMP_SPINCOUNT": "10k", "OMP_WAIT_POLICY": "passive"}, "spin 10000"),
    ({"GOMP_SPINCOUNT": "0"}, "passive"), ({"GOMP_SPINCOUNT": "infinite"}, "active"),
    ({"OMP_WAIT_POLICY": "sometimes"}, "spin 300000")])
def test_the_wait_policy_is_read_as_libgomp_reads_it(monkeypatch, env, want):
    from directload.kernels.cpu import wait_policy

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert wait_policy() == want

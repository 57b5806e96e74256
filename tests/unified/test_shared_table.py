"""One copy of a table per node (directload.shared_table): real processes, real /dev/shm-style tmpfs files,
kills at the awkward moments, and the memory counted by the kernel (Pss_Shmem of /proc/PID/smaps_rollup)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

import directload
from directload.shared import PREFIX, SharedTableError, shared_table, sweep


def _ours(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(PREFIX))


def test_a_table_maps_read_only_with_its_rows_and_leaves_no_name_once_every_rank_mapped_it(shm, rng):
    table = torch.from_numpy(rng.standard_normal((300, 7)).astype(np.float32))
    t = shared_table("feat", table, ranks=2, directory=shm)
    assert directload.is_unified(t) and t.dtype == torch.float32 and tuple(t.shape) == (300, 7)
    assert _ours(shm) == [PREFIX + "feat"]  # one rank of two so far
    u = shared_table("feat", directory=shm)  # the second rank needs no source
    assert _ours(shm) == []  # both mapped: the name is gone, the mappings stay
    idx = torch.from_numpy(rng.integers(0, 300, 50))
    assert torch.equal(t[idx], table[idx]) and torch.equal(u[idx], table[idx])
    with pytest.raises(PermissionError):
        t[0] = 1.0
    u.host[1, 1] = 99.0  # through .host: a page of this mapping's own, never the other ranks' table
    assert t.host[1, 1] == table[1, 1] and u.host[1, 1] == 99.0


def test_without_ranks_the_last_process_to_let_go_removes_the_name(shm):
    t = shared_table("lab", torch.arange(10), directory=shm)
    u = shared_table("lab", torch.arange(10), directory=shm)
    del t
    assert _ours(shm) == [PREFIX + "lab"]  # u still maps it
    del u
    assert _ours(shm) == []


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.uint8, np.float64])
def test_sources_of_every_kind_give_the_same_rows(shm, rng, dtype, tmp_path):
    data = (rng.standard_normal((64, 3)) * 100).astype(dtype)
    path = tmp_path / "x.npy"
    np.save(path, data)
    for i, source in enumerate([data, torch.from_numpy(data), str(path), path, lambda: data]):
        t = shared_table(f"k{i}", source, ranks=1, directory=shm)
        assert np.array_equal(t.host.numpy(), data) and t.host.numpy().dtype == dtype


def test_an_empty_table_and_a_one_dimensional_one_work(shm):
    assert tuple(shared_table("e", torch.zeros(0, 4), ranks=1, directory=shm).shape) == (0, 4)
    assert shared_table("v", torch.arange(5), ranks=1, directory=shm)[torch.tensor([4])].tolist() == [4]
    assert _ours(shm) == []


@pytest.mark.parametrize("key, error", [("", ValueError), ("../x", ValueError), ("a/b", ValueError),
                                        (".hidden", ValueError), ("x.partial", ValueError), ("x" * 201, ValueError),
                                        (5, TypeError), (None, TypeError), (b"x", TypeError)])
def test_bad_keys_are_refused_before_anything_is_made(shm, key, error):
    with pytest.raises(error, match="key must be"):
        shared_table(key, torch.zeros(2), directory=shm)
    assert os.listdir(shm) == [] or os.listdir(shm) == ["lost+found"]


@pytest.mark.parametrize("kwargs, error", [
    ({"ranks": 0}, ValueError), ({"ranks": "2"}, ValueError), ({"ranks": True}, ValueError),
    ({"timeout": -1}, ValueError), ({"timeout": "5"}, ValueError), ({"source": object()}, TypeError),
    ({"source": "rows.csv"}, ValueError), ({"source": np.array([object()])}, TypeError)])
def test_bad_arguments_are_typed_errors_and_leave_nothing(shm, kwargs, error):
    kwargs = {"source": torch.zeros(2), **kwargs}
    with pytest.raises(error):
        shared_table("bad", directory=shm, **kwargs)
    assert _ours(shm) == []


def test_a_rank_without_a_source_is_told_to_pass_one(shm):
    with pytest.raises(SharedTableError, match="no source"):
        shared_table("nothing", directory=shm)
    assert _ours(shm) == []


def test_a_table_of_another_shape_under_the_key_is_refused(shm):
    keep = shared_table("same", torch.zeros(4, 2), directory=shm)
    with pytest.raises(SharedTableError, match=r"holds float32 \(4, 2\), not the float32 \(5, 2\)"):
        shared_table("same", torch.zeros(5, 2), directory=shm)
    assert _ours(shm) == [PREFIX + "same"] and keep.shape[0] == 4


def test_files_that_are_not_ours_are_never_touched(shm):
    theirs = os.path.join(shm, PREFIX + "theirs")
    with open(theirs, "wb") as f:
        f.write(b"someone else's bytes")
    other = os.path.join(shm, "unrelated")
    open(other, "w").close()
    assert sweep(shm) == []
    with pytest.raises(SharedTableError, match="not a shared table directload wrote"):
        shared_table("theirs", torch.zeros(2), directory=shm)
    assert os.path.exists(theirs) and os.path.exists(other)


def test_a_shared_memory_too_small_is_one_clear_error_before_any_copy(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        # units that fit the sizes (1 MiB less the writer's first page free, 4 MiB and its 4 KiB header needed)
        with pytest.raises(SharedTableError, match=r"small has 1020.00 KiB free and shared table 'big' needs "
                                                   r"4.00 MiB") as info:
            shared_table("big", torch.zeros(1 << 20), directory=str(small))  # 4 MiB into 1 MiB
        assert "--shm-size" in str(info.value)
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


_RANK = textwrap.dedent("""
    import json, os, sys
    import torch
    from directload.shared import shared_table

    directory, key, mode, rows, cols = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    loads = []

    def pss():
        return {name: int(rest.split()[0]) * 1024 for name, _, rest in
                (line.partition(":") for line in open("/proc/self/smaps_rollup"))
                if name in ("Pss", "Pss_Shmem", "Pss_Anon")}

    def load():  # row i holds i * cols + 0..cols-1, exact in float32 below 2**24
        loads.append(os.getpid())
        return torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)

    idx = torch.randperm(rows)[:256]
    want = (idx[:, None] * cols + torch.arange(cols)).float()
    torch.equal(torch.zeros(rows, cols)[idx], want)  # the gather's first-use costs, before the baseline
    before = pss()
    table = shared_table(key, load, directory=directory) if mode == "shared" else load()
    ok = torch.equal(table[idx], want)
    table.sum()  # every page touched by this process
    print(json.dumps({"ok": ok, "loaded": bool(loads)}), flush=True)
    sys.stdin.readline()  # measure once every rank has touched every page
    after = pss()
    print(json.dumps({"Pss_Shmem": after["Pss_Shmem"], "grew": after["Pss"] - before["Pss"],
                      "grew_anon": after.get("Pss_Anon", 0) - before.get("Pss_Anon", 0)}), flush=True)
    sys.stdin.read()  # hold the table until every rank has measured
""")


def _ranks(n, mode, directory, key, rows=8192, cols=2048):
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(n))
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, directory, key, mode, str(rows), str(cols)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]
    try:
        reports = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write("measure\n")
            p.stdin.flush()
        for p, report in zip(procs, reports):
            report.update(json.loads(p.stdout.readline()))
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(60)
    assert all(p.returncode == 0 for p in procs)
    return reports


@pytest.mark.parametrize("n", [2, 4])
def test_every_rank_reads_the_same_rows_and_the_table_counts_once_on_the_node(shm, n):
    nbytes = 8192 * 2048 * 4  # 64 MiB
    shared = _ranks(n, "shared", shm, f"pss{n}")
    assert all(r["ok"] for r in shared)
    assert sum(r["loaded"] for r in shared) == 1  # one process loaded the table, the others only mapped it
    total_shmem = sum(r["Pss_Shmem"] for r in shared)
    assert 0.95 * nbytes <= total_shmem <= 1.05 * nbytes  # the table's pages, counted once over all ranks
    assert all(r["Pss_Shmem"] <= 1.1 * nbytes / n for r in shared)
    assert sum(r["grew"] for r in shared) <= 1.25 * nbytes  # the processes grew by one table in all ...
    private = _ranks(n, "private", shm, f"private{n}")
    assert all(r["ok"] for r in private) and sum(r["loaded"] for r in private) == n
    # ... and by n tables with a copy each.  Counted in private (anonymous) memory alone: a process's whole Pss
    # also falls while it runs, as other processes map the libraries it shares (0.87 x 2 tables seen under CI's
    # other lane), which a copy's growth cannot be told from
    assert sum(r["grew_anon"] for r in private) >= 0.95 * n * nbytes
    assert _ours(shm) == []


_WRITER = textwrap.dedent("""
    import sys, time, torch
    from directload.shared import shared_table

    def slow():
        print("loading", flush=True)
        time.sleep(60)
        return torch.zeros(4)

    t = shared_table(sys.argv[2], slow if sys.argv[3] == "slow" else torch.arange(8.0), directory=sys.argv[1])
    print("mapped", flush=True)
    time.sleep(60)
""")


def _start(shm, key, how):
    p = subprocess.Popen([sys.executable, "-c", _WRITER, shm, key, how], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() in ("loading", "mapped")
    return p


def test_a_writer_killed_mid_write_leaves_no_torn_table_and_the_next_caller_writes_it(shm):
    writer = _start(shm, "torn", "slow")
    assert _ours(shm) == [PREFIX + "torn.partial"]  # a partial name only: nothing maps it
    with pytest.raises(TimeoutError, match="another process has been writing it"):
        shared_table("torn", torch.arange(8.0), timeout=0.3, directory=shm)  # it lives: we wait for it
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    # at once: with the writer dead nothing waits (a wait for it would end in TimeoutError)
    t = shared_table("torn", torch.arange(8.0), ranks=1, timeout=60, directory=shm)
    assert t.tolist() == list(range(8))
    assert _ours(shm) == []


def test_ranks_killed_before_all_were_counted_leave_a_table_the_next_call_sweeps(shm):
    holder = _start(shm, "left", "fast")
    assert _ours(shm) == [PREFIX + "left"]
    assert sweep(shm) == []  # in use: kept
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    shared_table("other", torch.zeros(2), ranks=1, directory=shm)  # any call on the node sweeps
    assert _ours(shm) == []


def test_a_forked_child_that_exits_does_not_let_go_of_its_parents_table(shm):
    t = shared_table("fork", torch.arange(6.0), directory=shm)
    pid = os.fork()
    if pid == 0:
        code = 0 if t.tolist() == list(range(6)) else 3
        del t
        import gc

        gc.collect()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sweep(shm) == [] and _ours(shm) == [PREFIX + "fork"]  # still held by this process
    del t
    assert _ours(shm) == []


def test_the_default_directory_is_dev_shm_and_nothing_is_left_there():
    before = set(_ours("/dev/shm"))
    key = f"test-{os.getpid()}"
    t = shared_table(key, torch.arange(3), ranks=1)
    assert t.tolist() == [0, 1, 2] and set(_ours("/dev/shm")) == before


def test_a_plain_directory_works_too():
    with tempfile.TemporaryDirectory() as d:
        assert shared_table("plain", torch.arange(3), ranks=1, directory=d).tolist() == [0, 1, 2]
        assert os.listdir(d) == []
    with pytest.raises(SharedTableError, match="is not a directory"):
        shared_table("x", torch.arange(3), directory=os.path.join(d, "gone"))


_TORCHRUN = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from directload.shared import shared_table

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    key = "trun-" + os.environ["TORCHELASTIC_RUN_ID"]
    table = shared_table(key, lambda: torch.arange(4000.0).view(1000, 4), directory=sys.argv[1])
    idx = torch.arange(rank, 1000, dist.get_world_size())
    ok = torch.tensor([int(torch.equal(table[idx], torch.arange(4000.0).view(1000, 4)[idx]))])
    dist.all_reduce(ok)
    left = [n for n in os.listdir(sys.argv[1]) if n.startswith("directload-shared-")]
    dist.barrier()
    if rank == 0:
        print("ok", int(ok), left, flush=True)
    dist.destroy_process_group()
""")


def test_ranks_started_by_torchrun_share_one_table_named_by_their_run(shm, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_TORCHRUN)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), shm], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok 2 []" in proc.stdout  # both ranks read the right rows; LOCAL_WORLD_SIZE=2 removed the name
    assert _ours(shm) == []


def _spawned(rank, directory, queue):
    table = shared_table("spawned", lambda: torch.arange(30).view(10, 3), ranks=2, directory=directory)
    queue.put((rank, table[torch.tensor([9, rank])].tolist()))


def test_ranks_started_by_spawn_share_one_table(shm):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(shm, queue), nprocs=2, start_method="spawn", join=True)
    got = sorted(queue.get() for _ in range(2))
    assert got == [(0, [[27, 28, 29], [0, 1, 2]]), (1, [[27, 28, 29], [3, 4, 5]])]
    assert _ours(shm) == []


def test_threads_of_one_process_are_each_counted(shm):
    import threading

    tables, errors = [], []

    def attach():
        try:
            tables.append(shared_table("threads", lambda: torch.arange(64.0), ranks=8, directory=shm))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=attach) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(tables) == 8 and all(t.tolist() == list(range(64)) for t in tables)
    assert _ours(shm) == []  # the eighth count removed the name

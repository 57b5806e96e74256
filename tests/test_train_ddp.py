"""``directload train`` with DDP: ranks started with --nproc (torchrun's launcher) or by torchrun itself (real
processes, gloo), one report from rank 0 with every rank's epochs, and a rank that dies ends the run with an
error naming it, the other ranks stopped."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from directload.datasets import synthesize

FRAMEWORK = "dgl" if os.environ.get("DIRECTLOAD_LANE", "dgl") == "dgl" else "pyg"
TRAIN = ["train", "--dataset", "synth-tiny", "--framework", FRAMEWORK, "--seeds", "1", "--epochs", "2",
         "--fanouts", "5", "5", "--batch-size", "256", "--hidden", "16", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    where = tmp_path_factory.mktemp("data")
    synthesize(where, "synth-tiny", progress=False)
    return where


def _report(out):
    (path,) = Path(out).glob("*.json")  # exactly one report: rank 0's
    return json.loads(path.read_text())


_TEXT = {"encoding": "utf-8", "errors": "replace"}  # progress bars are UTF-8 whatever the locale (CI's is ASCII)


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")


#: A job none of whose main threads computed for IDLE_CPU_S seconds in IDLE_S seconds, with no process started
#: or ended, is stuck, not slow: a loaded machine slows every process, but one that works still gets the
#: CPU.  (Main threads: a rank's trains; a deadlocked rank's is blocked, while its other threads still wake
#: up, gloo's loop every 10 ms, a thread that waits for the GIL every 5 ms.)  No test here gives a job a
#: fixed time.
IDLE_S, IDLE_CPU_S = 120, 0.5


def _main_thread_cpu(pid):
    """CPU seconds the main thread of ``pid`` has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class _Progress:
    """Whether the job of process ``pid`` (it and its descendants) still makes progress (:data:`IDLE_S`).
    The launcher's own main thread counts only until it has started ranks: then it only polls them."""

    def __init__(self, pid):
        self.pid, self.procs, self.used, self.mark, self.since = pid, set(), {}, 0.0, time.monotonic()

    def stalled(self):
        kids = _descendants(self.pid)
        for p in kids or [self.pid]:
            self.used[p] = max(self.used.get(p, 0.0), _main_thread_cpu(p))
        procs, used = {self.pid, *kids}, sum(self.used.values())
        if procs != self.procs or used - self.mark >= IDLE_CPU_S:
            self.procs, self.mark, self.since = procs, used, time.monotonic()
        return time.monotonic() - self.since > IDLE_S

    def left(self):
        return {p: _rank_of(p) for p in [self.pid, *_descendants(self.pid)]}


def _wait(proc):
    """``(returncode, stdout, stderr)`` of ``proc`` (started with pipes) once it ends; the test fails when its
    job stops making progress (:class:`_Progress`)."""
    progress = _Progress(proc.pid)
    while True:
        try:
            out, err = proc.communicate(timeout=5)
            return proc.returncode, out, err
        except subprocess.TimeoutExpired:
            pass
        if progress.stalled():
            pytest.fail(f"the job stopped making progress for {IDLE_S} s; left (pid: rank): {progress.left()}")


def _run(argv, env=None):
    """``python -m argv`` run to its end (:func:`_wait`); whatever is left of it is killed."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env or _env(), **_TEXT)
    try:
        return _wait(proc)
    finally:
        _kill(proc)


def _kill(proc):
    """Kill what is left of the job of ``proc`` (the launcher and its ranks; only this test's processes)."""
    if proc.poll() is None:
        for p in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.communicate()


def _check_two_ranks(report):
    assert report["meta"]["nproc"] == 2
    for run in report["runs"]:
        assert run["config"]["nproc"] == 2 and len(run["ranks"]) == 2
        assert all(len(epochs) == 2 for epochs in run["ranks"])
        assert run["ranks"][0] == run["epochs"]  # rank 0's are the row's own
        assert 0.0 <= run["test_acc"] <= 1.0 and run["epochs"][-1]["batches"] > 0
        # each rank trained on its half of the seeds: about half the batches of one process
        assert all(epochs[0]["batches"] == run["epochs"][0]["batches"] for epochs in run["ranks"])


def test_nproc_two_trains_on_two_ranks_and_reports_each(root, tmp_path):
    code, out, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(tmp_path), "--nproc", "2",
                           "--loader", "both"])
    assert code == 0, err[-3000:]
    report = _report(tmp_path)
    _check_two_ranks(report)
    ours = next(r for r in report["summary"] if r["loader"] == "directload")
    assert [k["rank"] for k in ours["ranks"]] == [0, 1]
    assert "directload rank 1 of 2: epoch" in out


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_each_rank_ends_with_its_work_whatever_its_teardown_would_do(root, tmp_path):
    """Once rank 0 has written the report the ranks leave together and end: a rank whose interpreter teardown
    would block (an exit handler that waits for ever here, as torch's C++ teardown at exit sometimes does)
    does not keep the job, and the launcher waiting for it, alive."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import atexit, os, threading\n"
                                           "if 'RANK' in os.environ:\n"
                                           "    atexit.register(threading.Event().wait)\n")
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    code, _, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(tmp_path / "out"), "--nproc", "2",
                         "--loader", "directload"], env)
    assert code == 0, err[-3000:]
    _check_two_ranks(_report(tmp_path / "out"))


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_torchrun_ranks_join_its_job_and_rank_zero_reports(root, tmp_path):
    code, _, err = _run(["torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "directload", *TRAIN,
                         "--root", str(root), "--out", str(tmp_path), "--loader", "directload"])
    assert code == 0, err[-3000:]
    _check_two_ranks(_report(tmp_path))


def test_nproc_under_torchrun_is_refused_in_one_line(root, tmp_path):
    env = dict(_env(), RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    code, _, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(tmp_path), "--nproc", "2"], env)
    assert code == 1
    assert err.strip() == ("directload: error: this process is rank 0 of 2 that torchrun started: leave --nproc "
                           "out (torchrun's --nproc-per-node starts the ranks)")


def _descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _rank_of(pid):
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)


def _wait_for_ranks(proc, n=2):
    """``{rank: pid}`` of the launcher ``proc``'s ranks, once all ``n`` have started."""
    progress, ranks = _Progress(proc.pid), {}
    while len(ranks) < n:
        assert proc.poll() is None, "the launcher ended before its ranks started"
        if progress.stalled():
            pytest.fail(f"the launcher stopped making progress for {IDLE_S} s before its ranks started")
        ranks = {_rank_of(p): p for p in _descendants(proc.pid) if _rank_of(p) is not None}
        time.sleep(0.2)
    return ranks


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_a_rank_killed_mid_training_ends_the_run_with_an_error_naming_it(root, tmp_path):
    argv = [a if a != "2" or i != TRAIN.index("--epochs") + 1 else "200" for i, a in enumerate(TRAIN)]
    proc = subprocess.Popen([sys.executable, "-m", "directload", *argv, "--root", str(root), "--out", str(tmp_path),
                             "--nproc", "2", "--loader", "directload"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **_TEXT, env=_env())
    try:
        ranks = _wait_for_ranks(proc)
        time.sleep(5)  # training
        os.kill(ranks[1], signal.SIGKILL)
        code, _, err = _wait(proc)  # never hangs: the other rank is stopped
    finally:
        _kill(proc)
    assert code == 1
    assert err.strip().splitlines()[-1] == ("directload: error: rank 1 of 2 was killed by signal SIGKILL; the other "
                                            "ranks were stopped")
    assert "Traceback" not in err
    assert not any(_alive(p) for p in ranks.values())  # nothing left running


#: Imported by every rank of a job (a sitecustomize): destroying the group waits for ever, as the exit handler's
#: did when it deadlocked against a gloo worker waiting for the GIL, and rank 1 raises at its third step.
_FAILING_RANK = """\
import os
if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
    import threading
    import torch
    import torch.distributed as dist
    dist.destroy_process_group = lambda *args, **kwargs: threading.Event().wait()
    if os.environ["RANK"] == "1":
        step, calls = torch.optim.Adam.step, []
        def failing(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("rank 1 failed on purpose at its third step")
            return step(self, *args, **kwargs)
        torch.optim.Adam.step = failing
"""


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_a_rank_that_raises_mid_training_ends_and_the_run_names_it(root, tmp_path):
    """The failure path ends: the rank that raised exits at once (status 1) however its teardown would go
    (destroying the group never returns here), the launcher stops the other rank, blocked in the step the
    failed rank never joins, and names the failed one.  No fixed time: the job must keep making progress
    until it ends (:func:`_wait`)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_FAILING_RANK)
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    code, _, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(tmp_path / "out"), "--nproc", "2",
                         "--loader", "directload"], env)
    lines = err.strip().splitlines()
    assert code == 1, err[-3000:]
    assert "directload: error: rank 1 failed on purpose at its third step" in lines, err[-3000:]
    assert lines[-1] == ("directload: error: rank 1 of 2 exited with status 1; the other ranks were stopped"), \
        err[-3000:]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))  # no report


def test_launch_checks_its_own_count_of_ranks_before_starting_any(monkeypatch):
    from directload.harness import ddp

    started = []
    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch", lambda *a, **k: started.append(a))
    for nproc, error, match in ((0, ValueError, "--nproc must be at least 1 rank, got 0"),
                                (-2, ValueError, "at least 1 rank, got -2"),
                                (2.0, TypeError, "nproc must be an integer number of ranks, got float 2.0"),
                                (True, TypeError, "got bool True"), ("2", TypeError, "got str '2'"),
                                (ddp.MAX_NPROC + 1, ValueError, "more ranks than this node can run: at most")):
        with pytest.raises(error, match=match):
            ddp.launch(nproc, [sys.executable, "-c", "pass"])
    with pytest.raises(ValueError, match="argv must be a non-empty sequence"):
        ddp.launch(1, [])
    assert started == []


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_ranks_die_with_the_launcher(root, tmp_path):
    argv = [a if a != "2" or i != TRAIN.index("--epochs") + 1 else "200" for i, a in enumerate(TRAIN)]
    proc = subprocess.Popen([sys.executable, "-m", "directload", *argv, "--root", str(root), "--out", str(tmp_path),
                             "--nproc", "2", "--loader", "directload"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env())
    try:
        ranks = _wait_for_ranks(proc)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in ranks.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in ranks.values())


def _alive(pid):
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("features", ["tiered"])  # memory: tests/loaders/pyg_loader/test_partitioned_pyg.py
def test_partitioned_features_train_as_the_whole_table_does(root, tmp_path, features):
    """Each rank holds half the rows (in memory, or on disk behind a host cache) and fetches the rest from the
    other by all-to-all: the same batches read the same rows, so the accuracy is that of the whole table."""
    accs = {}
    for split in (False, True):
        out = tmp_path / str(split)
        code, _, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(out), "--nproc", "2",
                             "--loader", "directload", "--features", features, "--host-cache", "100K", "--seeds", "1",
                             *(["--partition-features"] if split else [])])
        assert code == 0, err[-3000:]
        run = _report(out)["runs"][0]
        accs[split] = run["test_acc"]
    tiers = run["epochs"][-1]["tiers"]
    assert tiers["partitioned"]["remote_rows"] > 0 and tiers["partitioned"]["local_rows"] > 0
    assert tiers["exchange"]["bytes_received"] > 0
    assert run["config"]["store"]["partition"] == {"timeout": 60.0}  # the report records the run's spec
    assert abs(accs[True] - accs[False]) < 0.08, accs


@pytest.mark.parametrize("extra, says", [
    (["--nproc", "2", "--loader", "both"], "splits the rows among the ranks of directload's loader"),
    (["--loader", "directload"], "splits the rows among the ranks of a DDP job: give --nproc N"),
])
def test_partition_features_are_checked_before_any_work(root, tmp_path, extra, says):
    code, _, err = _run(["directload", *TRAIN, "--root", str(root), "--out", str(tmp_path), "--partition-features",
                         *extra])
    assert code == 1
    assert err.startswith("directload: error: --partition-features ") and says in err, err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


GiB = 1 << 30


@pytest.mark.parametrize("facts, most", [
    (dict(cores=2, available_bytes=64 * GiB), 8),  # the cores bind
    (dict(cores=128, available_bytes=4 * GiB), 8),  # the memory binds
    (dict(cores=128, available_bytes=1024 * GiB), 256),  # the ceiling binds
    (dict(cores=64, available_bytes=64 * GiB, gpus=2), 2),  # one rank per GPU
    (dict(cores=1, available_bytes=100 << 20), 1),  # never below one
])
def test_the_ranks_a_node_runs_are_the_least_of_its_cores_memory_gpus_and_a_ceiling(facts, most):
    from directload.harness.ddp import nproc_ceiling

    assert nproc_ceiling(**facts)[0] == most


def test_check_nproc_reads_this_node_and_says_every_bound(monkeypatch):
    import collections

    import psutil

    from directload.harness import ddp

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    memory = collections.namedtuple("svmem", "available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(64 * GiB))
    ddp.check_nproc(8)
    with pytest.raises(ValueError, match=r"^--nproc 9 is more ranks than this node can run: at most 8 \(4 ranks per "
                                         r"CPU core on 2 cores: 8; 64\.0 GiB of available memory at 512 MiB a rank: "
                                         r"128; 256 on any node\)$"):
        ddp.check_nproc(9)

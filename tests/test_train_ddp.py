"""``directload train`` with DDP: ranks started with --nproc (torchrun's launcher) or by torchrun itself (real
processes, gloo), one report from rank 0 with every rank's epochs, and a rank that dies ends the run with an
error naming it, the other ranks stopped."""

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
    proc = subprocess.run([sys.executable, "-m", "directload", *TRAIN, "--root", str(root), "--out", str(tmp_path),
                           "--nproc", "2", "--loader", "both"], capture_output=True, **_TEXT, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _report(tmp_path)
    _check_two_ranks(report)
    ours = next(r for r in report["summary"] if r["loader"] == "directload")
    assert [k["rank"] for k in ours["ranks"]] == [0, 1]
    assert "directload rank 1 of 2: epoch" in proc.stdout


def test_torchrun_ranks_join_its_job_and_rank_zero_reports(root, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "directload", *TRAIN, "--root", str(root), "--out", str(tmp_path),
                           "--loader", "directload"], capture_output=True, **_TEXT, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_two_ranks(_report(tmp_path))


def test_nproc_under_torchrun_is_refused_in_one_line(root, tmp_path):
    env = dict(_env(), RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = subprocess.run([sys.executable, "-m", "directload", *TRAIN, "--root", str(root), "--out", str(tmp_path),
                           "--nproc", "2"], capture_output=True, **_TEXT, timeout=120, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("directload: error: this process is rank 0 of 2 that torchrun started: leave "
                                   "--nproc out (torchrun's --nproc-per-node starts the ranks)")


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
    deadline = time.monotonic() + 120
    ranks = {}
    while len(ranks) < n:
        assert time.monotonic() < deadline and proc.poll() is None
        ranks = {_rank_of(p): p for p in _descendants(proc.pid) if _rank_of(p) is not None}
        time.sleep(0.2)
    return ranks


def test_a_rank_killed_mid_training_ends_the_run_with_an_error_naming_it(root, tmp_path):
    argv = [a if a != "2" or i != TRAIN.index("--epochs") + 1 else "200" for i, a in enumerate(TRAIN)]
    proc = subprocess.Popen([sys.executable, "-m", "directload", *argv, "--root", str(root), "--out", str(tmp_path),
                             "--nproc", "2", "--loader", "directload"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **_TEXT, env=_env())
    try:
        ranks = _wait_for_ranks(proc)
        time.sleep(5)  # training
        os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)  # never hangs: the other rank is stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == ("directload: error: rank 1 of 2 was killed by signal SIGKILL; the other "
                                            "ranks were stopped")
    assert "Traceback" not in err
    assert not any(_alive(p) for p in ranks.values())  # nothing left running


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
        proc = subprocess.run([sys.executable, "-m", "directload", *TRAIN, "--root", str(root), "--out", str(out),
                               "--nproc", "2", "--loader", "directload", "--features", features, "--host-cache",
                               "100K", "--seeds", "1", *(["--partition-features"] if split else [])],
                              capture_output=True, **_TEXT, timeout=300, env=_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        run = _report(out)["runs"][0]
        accs[split] = run["test_acc"]
    tiers = run["epochs"][-1]["tiers"]
    assert tiers["partitioned"]["remote_rows"] > 0 and tiers["partitioned"]["local_rows"] > 0
    assert tiers["exchange"]["bytes_received"] > 0
    assert run["config"]["partitioned"] is True
    assert abs(accs[True] - accs[False]) < 0.08, accs


@pytest.mark.parametrize("extra, says", [
    (["--nproc", "2", "--loader", "both"], "splits the rows among the ranks of directload's loader"),
    (["--loader", "directload"], "splits the rows among the ranks of a DDP job: give --nproc N"),
])
def test_partition_features_are_checked_before_any_work(root, tmp_path, extra, says):
    proc = subprocess.run([sys.executable, "-m", "directload", *TRAIN, "--root", str(root), "--out", str(tmp_path),
                           "--partition-features", *extra], capture_output=True, **_TEXT, timeout=120, env=_env())
    assert proc.returncode == 1
    assert proc.stderr.startswith("directload: error: --partition-features ") and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())

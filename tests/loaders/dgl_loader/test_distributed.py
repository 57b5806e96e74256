"""directload under DistDGL: partitions with a disk store per part, and 2 machines emulated on this host (each in
its own network namespace with its own /dev/shm), one server and one trainer each, training with features read
through directload: rows and sampled edges exact against the dataset, accuracy that of one process, a killed
server ending the run in one line with nothing left behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from directload.datasets import load, synthesize
from directload.harness.cli import main, partition_dir
from directload.harness.dist import DistLaunchError, check_host
from directload.stores import DiskStore

dgl = pytest.importorskip("dgl")
from directload.loaders.dgl import distributed as dd  # noqa: E402

try:
    check_host()
    HOST_OK = True
except DistLaunchError:
    HOST_OK = False
needs_host = pytest.mark.skipif(not HOST_OK, reason="emulating machines needs root, unshare and ip")
_TEXT = {"encoding": "utf-8", "errors": "replace"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    where = tmp_path_factory.mktemp("data")
    synthesize(where, "synth-tiny", progress=False)
    return where


def _partition(root, features):
    config = partition_dir(root, "synth-tiny", 2, features) / "synth-tiny.json"
    if not config.exists():
        assert main(["dataset", "partition", "--root", str(root), "--name", "synth-tiny", "--parts", "2",
                     "--features", features, "--no-progress"]) == 0
    return config


def test_partition_writes_each_parts_rows_in_dgls_order(root):
    config = _partition(root, "disk")
    meta = dd.read_partitions(config)
    assert meta["parts"] == 2 and meta["features"] == "disk" and meta["bounds"][0] == 0
    assert meta["bounds"][-1] == 3000 and meta["num_feats"] == 32
    orig = np.load(config.parent / "orig_nids.npy")
    assert sorted(orig.tolist()) == list(range(3000))
    feat = load(root, "synth-tiny").feat
    host = feat.host if getattr(feat, "is_unified", False) else feat
    for p in range(2):
        lo, hi = meta["bounds"][p], meta["bounds"][p + 1]
        with DiskStore(dd.store_path(config, p)) as store:
            got = store.read(torch.arange(hi - lo))
        assert got.dtype == host.dtype and torch.equal(got, host[torch.from_numpy(orig[lo:hi])])
    # the servers never hold out-of-core features: DGL's partitions have no feat
    part = json.loads(config.read_text())["part-0"]
    assert "feat" not in {k.split("/")[-1] for k in dgl.data.utils.load_tensors(
        str(config.parent / part["node_feats"]))}


@pytest.mark.parametrize("parts, features, method, match", [
    (0, "memory", "metis", "parts must be a positive integer"),
    (2, "ssd", "metis", "features must be 'memory' or 'disk'"),
    (2, "memory", "magic", "method must be 'metis' or 'random'"),
    (5000, "memory", "metis", "at most one partition per node"),
])
def test_partition_refuses_bad_input(root, tmp_path, parts, features, method, match):
    with pytest.raises(ValueError, match=match):
        dd.partition(load(root, "synth-tiny"), parts, tmp_path, features=features, method=method, progress=False)
    assert not list(tmp_path.iterdir())


def test_partitions_directload_did_not_write_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="partition with `directload dataset partition`"):
        dd.read_partitions(tmp_path / "g.json")


def test_the_rpc_service_id_is_checked_against_dgls():
    from dgl.distributed import rpc

    saved = dict(rpc.SERVICE_ID_TO_PROPERTY)
    try:
        rpc.SERVICE_ID_TO_PROPERTY[dd.SERVICE_ID] = (dict, None)  # someone else's service on our id
        with pytest.raises(dd.ServiceIdError, match=f"service id {dd.SERVICE_ID} is taken by dict"):
            dd.register_service()
        with pytest.raises(dd.ServiceIdError, match="taken over"):
            dd.check_service()
        del rpc.SERVICE_ID_TO_PROPERTY[dd.SERVICE_ID]
        dd.register_service()
        dd.register_service()  # twice is fine: it is ours
        dd.check_service()
        assert dd.SERVICE_ID not in {6657, 6658, 6659, 6660, 6661, 6662} | set(range(901231, 901242))
    finally:
        rpc.SERVICE_ID_TO_PROPERTY.clear()
        rpc.SERVICE_ID_TO_PROPERTY.update(saved)


def _shm():
    return set(os.listdir("/dev/shm"))


def _bridges():
    out = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines() if ":" in line}


@needs_host
@pytest.mark.slow
def test_two_machines_train_on_exact_rows_and_edges_as_well_as_one_process(root, tmp_path):
    from directload.harness.train_dist import run

    config = _partition(root, "memory")
    shm, bridges = _shm(), _bridges()
    trainers = run(config, root=root, dataset="synth-tiny", epochs=4, fanouts=(4, 4), batch_size=128, hidden=64,
                   verify=True, timeout=300)
    assert [t["machine"] for t in trainers] == [0, 1] and [t["part"] for t in trainers] == [0, 1]
    for t in trainers:
        assert t["verified"] and t["features"] == "memory"  # every batch's rows and last block's edges checked
        assert t["local_rows"] > t["remote_rows"] > 0  # each machine reads its own partition locally
        assert len(t["epochs"]) == 4 and t["epochs"][0]["batches"] >= 2
    assert trainers[0]["test_acc"] == trainers[1]["test_acc"]  # one all-reduced accuracy
    # one process, the same global batch and model
    assert main(["train", "--dataset", "synth-tiny", "--root", str(root), "--loader", "directload", "--epochs", "4",
                 "--fanouts", "4", "4", "--batch-size", "256", "--hidden", "64", "--no-progress",
                 "--out", str(tmp_path)]) == 0
    one = json.loads(next(tmp_path.glob("*.json")).read_text())["runs"][0]["test_acc"]
    assert abs(trainers[0]["test_acc"] - one) < 0.1, (trainers[0]["test_acc"], one)
    assert _shm() <= shm and _bridges() == bridges  # the machines' /dev/shm and network went with them


@needs_host
@pytest.mark.slow
def test_out_of_core_partitions_read_through_tiers_and_the_rpc_service(root):
    from directload.harness.train_dist import run

    config = _partition(root, "disk")
    trainers = run(config, root=root, dataset="synth-tiny", epochs=1, fanouts=(4, 4), batch_size=128,
                   host_bytes=64 << 10, verify=True, timeout=300)
    for t in trainers:
        assert t["verified"] and t["features"] == "disk" and t["remote_rows"] > 0


@needs_host
@pytest.mark.slow
def test_a_server_killed_mid_epoch_ends_the_run_in_one_line(root, tmp_path):
    _partition(root, "memory")
    shm, bridges = _shm(), _bridges()
    cmd = [sys.executable, "-m", "directload", "train", "--dist", "2", "--dataset", "synth-tiny", "--root", str(root),
           "--loader", "directload", "--epochs", "200", "--fanouts", "4", "4", "--batch-size", "64", "--no-progress",
           "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **_TEXT)
    killed = threading.Event()

    started = time.time()

    def kill_when_training():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            for log in Path(tempfile.gettempdir()).glob("directload-dist-*/machine1-trainer.log"):
                if log.parent.stat().st_mtime < started - 1:
                    continue  # another run's (a failed run keeps its logs)
                if "connect to server successfuly" in log.read_text(errors="replace"):
                    time.sleep(3)  # into the epochs
                    for pid in _pids(log.parent, "server", 1):
                        os.kill(pid, signal.SIGKILL)
                        killed.set()
                    return
            time.sleep(0.2)

    threading.Thread(target=kill_when_training, daemon=True).start()
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert killed.is_set()
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("directload: error: the server of machine 1 ended (SIGKILL)"), err
    assert _shm() <= shm and _bridges() == bridges
    logs = Path(lines[0].rsplit("logs are in ", 1)[1].rstrip(")"))
    assert (logs / "machine1-server.log").is_file()  # kept for the person who reads the error
    shutil.rmtree(logs)


def _pids(run_dir, role, machine):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            if str(run_dir / "settings.json").encode() in argv and argv[-2:] == [str(machine).encode(), role.encode()]:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("extra, match", [
    (["--framework", "pyg"], "--dist trains with DistDGL: it needs --framework dgl"),
    (["--packed", "--features", "disk"], "--dist does not take --packed"),
    (["--features", "disk", "--loader", "both"], "--loader dgl \\(or both\\) needs --features memory"),
    (["--model", "gat"], "--dist trains GraphSAGE"),
])
def test_dist_arguments_are_checked_in_one_line(root, capsys, extra, match):
    import re

    assert main(["train", "--dist", "2", "--dataset", "synth-tiny", "--root", str(root), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


@needs_host
def test_dist_without_partitions_says_how_to_make_them(tmp_path, capsys):
    synthesize(tmp_path, "synth-tiny", progress=False)
    assert main(["train", "--dist", "3", "--dataset", "synth-tiny", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "directload dataset partition --name synth-tiny --parts 3 --features memory" in err


def test_a_host_that_cannot_emulate_machines_is_named_in_one_line(monkeypatch):
    from directload.harness import dist

    monkeypatch.setattr(dist.shutil, "which", lambda tool: None if tool == "ip" else f"/usr/bin/{tool}")
    monkeypatch.setattr(dist.os, "geteuid", lambda: 0)
    with pytest.raises(DistLaunchError, match="`ip` is not installed"):
        dist.check_host()
    monkeypatch.setattr(dist.os, "geteuid", lambda: 1000)
    with pytest.raises(DistLaunchError, match="needs root"):
        dist.check_host()

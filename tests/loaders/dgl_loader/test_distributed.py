"""directload under DistDGL: partitions with a disk store per part, and 2 machines emulated on this host (each in
its own network namespace with its own /dev/shm), one server and one trainer each, training with features read
through directload: rows and sampled edges exact against the dataset, accuracy that of one process, a killed
server or a stopped launcher ending the run with nothing left behind, a later launch removing what a dead
launcher left.  Each test counts only what its own launcher made (the links named with its pid, the shared
memory of its graph), and waits for events, bounded by the launcher's own timeout, not for fixed times."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from directload.codecs import encode
from directload.datasets import load, synthesize
from directload.harness.cli import main
from directload.harness.commands.partition import partition_dir
from directload.harness.dist import DistLaunchError, check_host
from directload.stores import DiskStore

dgl = pytest.importorskip("dgl")
from directload.loaders.dgl import distributed as dd  # noqa: E402
from directload.loaders.dgl.partitions_read import CODEC_VERSION  # noqa: E402

try:
    check_host()
    HOST_OK = True
except DistLaunchError:
    HOST_OK = False
needs_host = pytest.mark.skipif(not HOST_OK, reason="emulating machines needs root, unshare and ip")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    where = tmp_path_factory.mktemp("data")
    synthesize(where, "synth-tiny", progress=False)
    return where


def _partition(root, features, codec=None):
    config = partition_dir(root, "synth-tiny", 2, features, codec) / "synth-tiny.json"
    if not config.exists():
        assert main(["dataset", "partition", "--root", str(root), "--name", "synth-tiny", "--parts", "2",
                     "--features", features, "--no-progress", *(["--codec", codec] if codec else [])]) == 0
    return config


def test_partition_writes_each_parts_rows_in_dgls_order(root):
    config = _partition(root, "disk")
    assert os.readlink(config.parent) == f"{config.parent.name}.g1"  # published as one generation
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


@pytest.mark.parametrize("features", ["disk", "memory"])
def test_partitions_of_codes_hold_each_parts_code_rows_and_name_their_codec(root, features):
    config = _partition(root, features, "int8")
    meta = dd.read_partitions(config)
    assert meta["codec"] == "int8" and meta["version"] == CODEC_VERSION and meta["features"] == features
    assert dd.read_partitions(_partition(root, "disk"))["codec"] is None  # plain partitions: version 2, no codec
    orig = np.load(config.parent / "orig_nids.npy")
    host = load(root, "synth-tiny").feat
    host = host.host if getattr(host, "is_unified", False) else host
    for p in range(2):
        lo, hi = meta["bounds"][p], meta["bounds"][p + 1]
        want = encode(host[torch.from_numpy(orig[lo:hi])], "int8").codes  # 32 codes, scale and offset per row
        if features == "disk":
            with DiskStore(dd.store_path(config, p)) as store:
                assert store.codec == "int8"
                got = store.read(torch.arange(hi - lo))
        else:  # in DGL's own partitions, which its servers hold
            part = json.loads(config.read_text())[f"part-{p}"]
            got = dgl.data.utils.load_tensors(str(config.parent / part["node_feats"]))["_N/feat"]
        assert got.dtype == torch.uint8 and got.shape == (hi - lo, 40) and torch.equal(got, want)


def test_a_record_of_codes_that_does_not_name_them_is_refused(root, tmp_path):
    config = _partition(root, "memory", "int8")
    copy = tmp_path / "parts"
    shutil.copytree(config.parent, copy)
    record = copy / dd.META
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({**meta, "codec": None}))  # version 3 without its codec: codes read as features
    with pytest.raises(dd.PartitionMismatchError, match="version 3 with codec None"):
        dd.read_partitions(copy / config.name)
    record.write_text(json.dumps({**meta, "codec": "int4"}))
    with pytest.raises(dd.PartitionMismatchError, match="codec 'int4'"):
        dd.read_partitions(copy / config.name)


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


def test_a_missing_partition_config_says_how_to_make_one(tmp_path):
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


def _graphs_shm(before):
    """What appeared in the host's /dev/shm under DGL's names for this graph's objects since ``before``."""
    return {n for n in _shm() - before if "synth-tiny" in n or n.startswith(("node~", "edge~"))}


def _links_of(pid):
    """The host's links named after launcher ``pid``: its bridge ``dlb<pid>`` and machines' ``dlh<pid>m<i>``."""
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=60).stdout
    return sorted(link["ifname"] for link in json.loads(out or "[]")
                  if re.fullmatch(rf"dl[bh]{pid}(m[0-9]+)?", link["ifname"]))


@needs_host
@pytest.mark.slow
def test_two_machines_train_on_exact_rows_and_edges_as_well_as_one_process(root, tmp_path):
    from directload.harness.train_dist import run

    config = _partition(root, "memory")
    shm = _shm()
    trainers = run(config, root=root, dataset="synth-tiny", epochs=4, fanouts=(4, 4), batch_size=128, hidden=64,
                   verify=True, timeout=1200)  # the launcher's own bound, far above a loaded run
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
    # the machines' /dev/shm and network went with them (this process launched them)
    assert not _graphs_shm(shm) and _links_of(os.getpid()) == []


@needs_host
@pytest.mark.slow
def test_out_of_core_partitions_read_through_tiers_and_the_rpc_service(root):
    from directload.harness.train_dist import run
    from directload.stores import StoreSpec

    config = _partition(root, "disk")
    trainers = run(config, root=root, dataset="synth-tiny", epochs=1, fanouts=(4, 4), batch_size=128,
                   store=StoreSpec(host_bytes=64 << 10), verify=True, timeout=1200)
    for t in trainers:
        assert t["verified"] and t["features"] == "disk" and t["remote_rows"] > 0
        # each machine's rows through the stack open_store opened from the spec, over its partition's store
        assert t["local"] == ["StoreHandle", "TieredStore", "HostCache", "DiskStore"]
    assert _links_of(os.getpid()) == []


@needs_host
@pytest.mark.slow
@pytest.mark.parametrize("features", ["disk", "memory"])
def test_machines_hold_read_and_send_codes_and_the_trainer_decodes_them(root, features):
    from directload.harness.train_dist import run
    from directload.stores import StoreSpec

    config = _partition(root, features, "int8")
    # a host cache of 64 KiB in front of the disk store holds 1,638 code rows of 40 bytes (512 float32 rows)
    store = StoreSpec(host_bytes=64 << 10) if features == "disk" else None
    trainers = run(config, root=root, dataset="synth-tiny", epochs=1, fanouts=(4, 4), batch_size=128, store=store,
                   verify=True, timeout=1200)
    for t in trainers:
        # every batch's rows are exactly the dataset's as their int8 codes decode
        assert t["verified"] and t["codec"] == "int8" and t["features"] == features
        assert t["remote_rows"] > 0 and t["remote_bytes"] == 40 * t["remote_rows"]  # codes, not 128-byte rows
        if features == "disk":
            assert t["local"] == ["StoreHandle", "TieredStore", "HostCache", "DiskStore"]
    assert _links_of(os.getpid()) == []


@needs_host
@pytest.mark.slow
def test_two_machines_train_on_partitions_dgl_wrote_alone(root, tmp_path):
    # DGL's DistDGL example partitions with dgl.distributed.partition_graph alone: no directload record
    import contextlib
    import io

    from directload.harness.train_dist import run

    ds = load(root, "synth-tiny")
    g = dgl.graph((ds.edge_index[0], ds.edge_index[1]), num_nodes=ds.num_nodes)
    g.ndata["feat"], g.ndata["label"] = ds.feat.host if getattr(ds.feat, "is_unified", False) else ds.feat, ds.labels
    for name, ids in ds.split.items():
        g.ndata[f"{name}_mask"] = torch.zeros(ds.num_nodes, dtype=torch.bool).index_fill_(0, ids, True)
    with contextlib.redirect_stdout(io.StringIO()):
        orig, _ = dgl.distributed.partition_graph(g, "synth-tiny", 2, str(tmp_path), part_method="metis",
                                                  return_mapping=True, num_hops=1)
    np.save(tmp_path / "orig_nids.npy", orig.numpy())  # for the check of every row, not read by directload
    assert not (tmp_path / dd.META).exists()
    trainers = run(tmp_path / "synth-tiny.json", root=root, dataset="synth-tiny", epochs=1, fanouts=(4, 4),
                   batch_size=128, verify=True, timeout=1200)
    for t in trainers:
        assert t["verified"] and t["features"] == "memory" and t["local_rows"] > t["remote_rows"] > 0
    assert _links_of(os.getpid()) == []


def _launch(root, tmp_path, env=None):
    """``directload train --dist 2`` as its own process (the launcher), long enough to be stopped in training;
    its stdout and stderr go to files in ``tmp_path``."""
    cmd = [sys.executable, "-m", "directload", "train", "--dist", "2", "--dataset", "synth-tiny", "--root", str(root),
           "--loader", "directload", "--epochs", "200", "--fanouts", "4", "4", "--batch-size", "64", "--no-progress",
           "--out", str(tmp_path / "out")]
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=_default_signals, env=env)


def _default_signals():
    """The launcher's signals at their defaults, as a terminal's foreground job has them: a test run in the
    background (``pytest &``, ``nohup``) has SIGINT ignored, which the launcher would inherit and keep."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _proc_of(pid):
    """``(parent pid, argv)`` of process ``pid``, or None."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1]), argv


def _pids(run_dir, role, machine):
    """The processes of ``run_dir``'s run that play ``role`` on machine ``machine``."""
    want = [str(run_dir / "settings.json").encode(), str(machine).encode(), role.encode()]
    found = []
    for entry in Path("/proc").iterdir():
        argv = (_proc_of(entry.name) or (0, []))[1] if entry.name.isdigit() else []
        if argv[-3:] == want:
            found.append(int(entry.name))
    return found


def _run_dir_of(launcher):
    """The run directory of ``launcher``'s machines (their working directory), once one runs; else None."""
    for entry in Path("/proc").iterdir():
        found = _proc_of(entry.name) if entry.name.isdigit() else None
        if found and found[0] == launcher and b"directload.harness.dist" in found[1]:
            try:
                return Path(os.readlink(entry / "cwd"))
            except OSError:
                continue
    return None


def _when_training(proc, act):
    """``act(run_dir)`` once machine 1's trainer has reached the servers; its result, or None if the launcher
    ended first.  Waits while the launcher runs: its own timeout bounds the wait, not a budget of ours."""
    while proc.poll() is None:
        run = _run_dir_of(proc.pid)
        log = run / "machine1-trainer.log" if run else None
        if log is not None and log.is_file() and "connect to server successfuly" in log.read_text(errors="replace"):
            return act(run)
        time.sleep(0.2)
    return None


def _hold_netns(run_dir, machine):
    """An open handle on machine ``machine``'s network namespace (through its server): the namespace, and the
    machine's link with it, outlive the machine's processes as long as it is open, as they do while its
    sockets are still closing."""
    (pid,) = _pids(run_dir, "server", machine)
    return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)


def _gone(run_dir):
    """Whether none of the run's servers and trainers is left (they die with their machine, at once)."""
    for _ in range(600):  # a SIGKILLed process exits in milliseconds; this only keeps the loop finite
        if not any(_pids(run_dir, role, m) for role in ("server", "trainer") for m in (0, 1)):
            return True
        time.sleep(0.1)
    return False


@needs_host
@pytest.mark.slow
def test_a_server_killed_in_training_ends_the_run_in_one_line_and_removes_every_link(root, tmp_path):
    _partition(root, "memory")
    shm = _shm()
    proc = _launch(root, tmp_path)
    held = []

    def kill_server(run):
        held.append(_hold_netns(run, 0))  # machine 0's namespace outlives its processes, as it does in 2 runs of 3
        for pid in _pids(run, "server", 1):
            os.kill(pid, signal.SIGKILL)
        return run

    try:
        run = _when_training(proc, kill_server)
        proc.wait(timeout=1800)  # a hang guard only: the launcher's own timeout is 600 s
        err = (tmp_path / "stderr").read_text(errors="replace")
        assert run is not None, err
        assert proc.returncode == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("directload: error: the server of machine 1 ended (SIGKILL)"), err
        assert _links_of(proc.pid) == []  # machine 0's link too, though its namespace is still there
        assert not _graphs_shm(shm)
        assert _gone(run)
        logs = Path(lines[0].rsplit("logs are in ", 1)[1].rstrip(")"))
        assert logs == run and (logs / "machine1-server.log").is_file()  # kept for the person who reads the error
        shutil.rmtree(logs)
    finally:
        for fd in held:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _reaped(pid):
    """Whether process ``pid`` is gone from /proc: reaped by its parent (a machine records a process's death
    before it reaps it)."""
    for _ in range(600000):  # a SIGKILLed process is reaped in milliseconds; this only keeps the loop finite
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.001)
    return False


@needs_host
@pytest.mark.slow
def test_a_killed_server_is_named_though_the_trainers_abort_because_of_it(root, tmp_path):
    """As outside runs saw: the server of machine 1 dies, then the trainers abort (SIGABRT) with faulthandler's
    dump in their logs, machine 0's too.  The launcher names the server of machine 1, the first to die, never a
    trainer, nor a line of a crash dump, whichever machine tells first."""
    _partition(root, "memory")
    proc = _launch(root, tmp_path, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    aborted = []

    def kill_then_abort(run):
        (server,) = _pids(run, "server", 1)
        os.kill(server, signal.SIGKILL)
        assert _reaped(server)  # its machine has recorded its death
        for machine in (1, 0):
            for pid in _pids(run, "trainer", machine):
                with contextlib.suppress(ProcessLookupError):  # machine 1 may have stopped its trainer already
                    os.kill(pid, signal.SIGABRT)
                    aborted.append(machine)
        return run

    try:
        run = _when_training(proc, kill_then_abort)
        proc.wait(timeout=1800)  # a hang guard only: the launcher's own timeout is 600 s
        err = (tmp_path / "stderr").read_text(errors="replace")
        assert run is not None, err
        assert proc.returncode == 1 and 0 in aborted, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("directload: error: the server of machine 1 ended (SIGKILL) before its trainer "
                                   "finished; the run was stopped (the machines' logs are in "), err
        assert "Fatal Python error: Aborted" in (run / "machine0-trainer.log").read_text(errors="replace")
        shutil.rmtree(run)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_host
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_launcher_stopped_by_a_signal_removes_everything_it_made(root, tmp_path, sig):
    _partition(root, "memory")
    proc = _launch(root, tmp_path)
    held = []

    def stop(run):
        held.append(_hold_netns(run, 0))
        proc.send_signal(sig)
        return run

    try:
        run = _when_training(proc, stop)
        proc.wait(timeout=1800)  # a hang guard only
        assert run is not None, (tmp_path / "stderr").read_text(errors="replace")
        assert proc.returncode == (128 + sig if sig == signal.SIGTERM else 130)
        assert _links_of(proc.pid) == []
        assert _gone(run) and not run.exists()  # the machines and the run's directory went with it
    finally:
        for fd in held:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _link(name, *, peer=None, alias=None):
    kind = ["type", "veth", "peer", "name", peer] if peer else ["type", "bridge"]
    subprocess.run(["ip", "link", "add", name, *kind], check=True, capture_output=True, timeout=60)
    if alias:
        subprocess.run(["ip", "link", "set", name, "alias", alias], check=True, capture_output=True, timeout=60)


@needs_host
def test_a_later_launch_removes_a_dead_launchers_bridge_and_links_and_nothing_else(tmp_path):
    from directload.harness.dist import launch_machines

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a launcher that is no longer running
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    made = [f"dlb{dead.pid}", f"dlh{dead.pid}m0", f"dlh{dead.pid}m1", f"dlh{os.getpid()}m9", f"dlh{alive.pid}m0",
            f"dlb{alive.pid}"]
    try:
        _link(f"dlb{dead.pid}")  # as an older directload left them: no label
        _link(f"dlh{dead.pid}m0", peer=f"dln{dead.pid}m0")
        _link(f"dlh{dead.pid}m1", peer=f"dln{dead.pid}m1", alias=f"directload-dist launcher {dead.pid} 1")
        # this process's pid, labelled with another start time: a launcher that died, its pid since reused
        _link(f"dlh{os.getpid()}m9", peer=f"dln{os.getpid()}m9", alias=f"directload-dist launcher {os.getpid()} 1")
        _link(f"dlh{alive.pid}m0", peer=f"dln{alive.pid}m0")  # a launcher that runs: not ours to touch
        _link(f"dlb{alive.pid}", alias="someone else's bridge")  # our name, someone else's label
        # a launch of one machine whose server and trainer end at once
        assert launch_machines(1, [sys.executable, "-c", "pass"], workdir=tmp_path, timeout=600) == [0]
        assert _links_of(dead.pid) == [] and _links_of(os.getpid()) == []
        assert _links_of(alive.pid) == sorted([f"dlb{alive.pid}", f"dlh{alive.pid}m0"])
    finally:
        alive.kill()
        alive.wait()
        for name in made:
            subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=60)


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
    # with a codec, directload's loader reads partitions of code rows, DGL's own the plain ones
    assert main(["train", "--dist", "3", "--dataset", "synth-tiny", "--root", str(tmp_path), "--codec", "int8",
                 "--loader", "directload"]) == 1
    err = capsys.readouterr().err
    assert "partitions-3-memory-int8" in err and "--parts 3 --features memory --codec int8`" in err


@pytest.mark.parametrize("host, says", [
    ("not root", "emulating several DistDGL machines on one host needs root "),
    ("root without namespaces", "needs CAP_SYS_ADMIN and CAP_NET_ADMIN to make network and mount namespaces"),
])
def test_a_host_that_cannot_run_machines_says_so_before_any_advice_about_partitions(tmp_path, capsys, monkeypatch,
                                                                                     host, says):
    """The real command and its real host check, for a user who is not root (``os.geteuid`` says so: the
    interpreter lives in root's home, which no other user may enter here) or a root process without the
    capabilities to make namespaces (a container's): no partition exists, but the one line is the host's
    refusal, not "partition first", which would send the user to partition in vain."""
    from directload.harness import dist

    monkeypatch.setattr(dist.os, "geteuid", lambda: 0 if host.startswith("root") else 65534)
    if host.startswith("root"):
        monkeypatch.setattr(dist, "_effective_capabilities", lambda: 1 << 0)  # CAP_CHOWN alone
    assert main(["train", "--dist", "2", "--dataset", "synth-tiny", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("directload: error: emulating several DistDGL machines")
    assert says in err and "partition" not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_host_that_cannot_emulate_machines_is_named_in_one_line(monkeypatch):
    from directload.harness import dist

    monkeypatch.setattr(dist.shutil, "which", lambda tool: None if tool == "ip" else f"/usr/bin/{tool}")
    monkeypatch.setattr(dist.os, "geteuid", lambda: 0)
    with pytest.raises(DistLaunchError, match="`ip` is not installed"):
        dist.check_host()
    monkeypatch.setattr(dist.os, "geteuid", lambda: 1000)
    with pytest.raises(DistLaunchError, match="needs root"):
        dist.check_host()

"""What the DistDGL launcher (directload.harness.dist) says when machines fail: the process that failed first in time,
never one that failed because of it, and a line of its log that says why, never a line of a crash dump.  Real
processes stand in for servers, trainers and machines (no namespaces: no root needed); each test waits for events
(a process reaped, a process ended), never for a fixed time."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from directload.harness import dist

#: What the outside runs saw at the end of a trainer that aborted after its server died: DGL's C++ error, then
#: faulthandler's dump.
DUMP = """\
Machine (0) group (0) client (0) connect to server successfuly!
terminate called after throwing an instance of 'dmlc::Error'
  what():  [04:34:57] /opt/dgl/src/rpc/network/socket_communicator.cc:283: Check failed: recv: connection reset
Fatal Python error: Aborted

Thread 0x00007f7d2affd640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  <no Python frame>

Current thread 0x00007f7d3b6b1740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/dgl/distributed/rpc.py", line 1003 in recv_responses

Extension modules: numpy.core._multiarray_umath, numpy.core._multiarray_tests, torch._C (total: 26)
"""


@pytest.mark.parametrize("log, said", [
    (DUMP, "[04:34:57] /opt/dgl/src/rpc/network/socket_communicator.cc:283: Check failed: recv: connection reset"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nRuntimeError: boom\n"
     "directload: error: trainer of machine 1: RuntimeError: boom\n", "trainer of machine 1: RuntimeError: boom"),
    ("load synth-tiny\nTraceback (most recent call last):\n  File \"t.py\", line 9, in f\n"
     "dgl._ffi.base.DGLError: partition 1 is missing\n", "dgl._ffi.base.DGLError: partition 1 is missing"),
    ("Server is waiting for connections on [10.200.0.2:30050]...\n" + DUMP.split("\n", 3)[3], None),
    ("", None),
], ids=["C++ error then a dump", "our line", "a traceback", "a dump alone", "empty"])
def test_the_error_line_of_a_log_is_never_a_line_of_a_crash_dump(log, said):
    assert dist.error_line(log) == said


def _python(code, log):
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], stdout=log, stderr=subprocess.STDOUT)


_TRAINER = ("import sys, time\nimport numpy  # an extension module, for the dump's list\n"
            "print('Machine (1) group (0) client (1) connect to server successfuly!', flush=True)\n"
            "time.sleep(600)\n")


def _reaped(pid):
    """Whether ``pid`` (a child of this process) has been reaped: its /proc entry is gone."""
    for _ in range(100000):  # a dead child is reaped by the watch's thread at once; this only bounds the loop
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.001)
    return False


def _said(log, words):
    """Whether ``log`` comes to hold ``words`` (its process started and says so)."""
    for _ in range(600000):  # a process starts in well under a second; this only bounds the loop
        if words in log.read_text():
            return True
        time.sleep(0.001)
    return False


def _watched(index, server, trainer):
    """``dist.watch`` on a thread of its own; a list that gets its result."""
    got = []
    thread = threading.Thread(target=lambda: got.append(dist.watch(index, server, trainer)), daemon=True)
    thread.start()
    return got, thread


def test_a_trainer_that_aborts_after_its_server_died_is_not_the_cause(tmp_path, monkeypatch):
    """The server is killed; once its death is recorded (it is reaped), its trainer aborts with faulthandler's
    dump, within the machine's settling time: the machine names its server, the first to die."""
    monkeypatch.chdir(tmp_path)
    with open("machine1-server.log", "w") as slog, open("machine1-trainer.log", "w") as tlog:
        server = _python("import time; print('Server is waiting for connections', flush=True); time.sleep(600)", slog)
        trainer = _python(_TRAINER, tlog)
        try:
            got, thread = _watched(1, server, trainer)
            assert _said(tmp_path / "machine1-trainer.log", "connect to server")  # training, faulthandler on
            server.send_signal(signal.SIGKILL)
            assert _reaped(server.pid)
            trainer.send_signal(signal.SIGABRT)  # as DGL aborts a trainer whose server went away
            thread.join()
        finally:
            for p in (server, trainer):
                if p.poll() is None:
                    p.kill()
                p.wait()
    assert "Extension modules: numpy" in (tmp_path / "machine1-trainer.log").read_text()  # the dump is there
    ((died, message),) = got
    assert message == "the server of machine 1 ended (SIGKILL) before its trainer finished; the run was stopped"
    assert isinstance(died, int) and died <= time.monotonic_ns()


def test_a_trainer_that_failed_first_is_named_with_its_error_not_its_dump(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    crash = ("import os, sys\nimport numpy  # an extension module, for the dump's list\n"
             "sys.stdout.write(\"terminate called after throwing an instance of 'dmlc::Error'\\n"
             "  what():  [04:34:57] /opt/dgl/src/rpc/rpc.cc:42: Check failed: recv: connection reset\\n\")\n"
             "sys.stdout.flush()\n"
             "os.abort()\n")
    with open("machine0-server.log", "w") as slog, open("machine0-trainer.log", "w") as tlog:
        server = _python("import time; time.sleep(600)", slog)
        trainer = _python(crash, tlog)
        try:
            message = dist.watch(0, server, trainer, settle=0.0)[1]  # the server lives on: no settling
        finally:
            for p in (server, trainer):
                if p.poll() is None:
                    p.kill()
                p.wait()
    assert "Extension modules: numpy" in (tmp_path / "machine0-trainer.log").read_text()
    assert message == ("the trainer of machine 0 failed (SIGABRT): [04:34:57] /opt/dgl/src/rpc/rpc.cc:42: Check "
                       "failed: recv: connection reset")


def test_both_ending_well_is_no_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("machine0-server.log", "w") as slog, open("machine0-trainer.log", "w") as tlog:
        server, trainer = _python("pass", slog), _python("pass", tlog)
        assert dist.watch(0, server, trainer) is None


def _machine(said, *, after=None):
    """A machine's process: it prints ``said`` (its report, or any last words) once the file ``after`` exists
    (the test creates it), then exits with status 1."""
    wait = f"import os, time\nwhile not os.path.exists({str(after)!r}): time.sleep(0.01)\n" if after else ""
    code = f"{wait}print('ready'); print({said!r}, flush=True); raise SystemExit(1)"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_the_launcher_names_the_earliest_death_not_the_first_machine_seen_to_fail(tmp_path):
    """Machine 1's server died first, but machine 0, whose trainer aborted 5 ms later because of it, reports
    first (and comes first in machine order): the launcher names machine 1's server."""
    now = time.monotonic_ns()
    cause = json.dumps({"died": now, "message": "the server of machine 1 ended (SIGKILL) before its trainer "
                                               "finished; the run was stopped"})
    consequence = json.dumps({"died": now + 5_000_000, "message": "the trainer of machine 0 failed (SIGABRT): "
                                                                 "Check failed: recv: connection reset"})
    gate = tmp_path / "machine 0 has ended"
    procs = [_machine(consequence), _machine(cause, after=gate)]
    procs[0].wait()
    gate.touch()
    try:
        with pytest.raises(dist.MachineFailed) as failed:
            dist._wait_all(procs, timeout=600, settle=600)  # the settling bound is never reached: both end
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert str(failed.value) == ("the server of machine 1 ended (SIGKILL) before its trainer finished; the run was "
                                 "stopped")


def test_a_machine_that_could_not_report_is_named_by_when_it_ended(tmp_path):
    gate = tmp_path / "machine 1 has ended"
    late = json.dumps({"died": time.monotonic_ns() + 10**12, "message": "a failure long after"})
    procs = [_machine(late, after=gate), subprocess.Popen([sys.executable, "-c", "print('ready'); import os; "
                                                           "os.kill(os.getpid(), 9)"], stdout=subprocess.PIPE,
                                                          text=True)]
    procs[1].wait()
    gate.touch()
    try:
        with pytest.raises(dist.MachineFailed, match=r"^machine 1 exited with SIGKILL$"):
            dist._wait_all(procs, timeout=600, settle=600)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_failure_with_the_others_still_running_is_reported_after_settling(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    failed = _machine(json.dumps({"died": time.monotonic_ns(), "message": "the trainer of machine 1 failed (exit 1): "
                                                                          "RuntimeError: boom"}))
    try:
        with pytest.raises(dist.MachineFailed, match=r"^the trainer of machine 1 failed \(exit 1\): RuntimeError"):
            dist._wait_all([alive, failed], timeout=600, settle=0.1)
    finally:
        for p in (alive, failed):
            p.kill()
            p.wait()

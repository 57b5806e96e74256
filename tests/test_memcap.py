"""The memory cap: a real cgroup that the guardian removes however the run ends (exit, OOM kill, SIGTERM,
SIGINT), a cap too small to start refused before anything moves, bad values refused by the parser, an OOM
kill told in one line, and the cgroups of killed guardians swept by the next run."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from directload.harness.cli import main
from directload.harness.memcap import (
    MemoryCapExceeded,
    _anonymous_rss,
    _controller,
    check_limit,
    parse_limit,
    run_capped,
)

needs_cgroup = pytest.mark.skipif(os.geteuid() != 0 or _controller()[0] is None,
                                  reason="needs root and a memory cgroup controller")


def ours(guardian):
    """The cgroups of runs that the process ``guardian`` (a pid this test started, or the test's own) made:
    their names carry it, so other jobs' runs on the machine do not count."""
    root = _controller()[0]
    return sorted(g.name for g in root.glob(f"directload-{guardian}-*")) if root else []


@pytest.mark.parametrize("bad", ["", "0", "-1G", "lots", "1.5X", " "])
def test_bad_limits_are_refused_by_the_parser_before_any_work(tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--root", str(tmp_path), "--memory-limit", bad, "--no-progress"])
    assert info.value.code == 2 and "--memory-limit" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError):
        parse_limit(bad)


def test_a_cap_too_small_to_start_is_refused_before_anything_moves(tmp_path, capsys):
    assert main(["train", "--root", str(tmp_path), "--memory-limit", "1M", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("directload: error: a memory limit of 1 MiB is below what the run needs to start")
    assert err.count("\n") == 1 and not list(tmp_path.iterdir()) and ours(os.getpid()) == []
    with pytest.raises(ValueError, match="give at least"):
        check_limit(_anonymous_rss())


def _default_signals():
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _ignore_sigint():
    _default_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def guarded(limit, child, grace_s=None, preexec=_default_signals):
    """A guardian process running ``child`` (Python code) capped at ``limit``; it starts with the signal
    dispositions ``preexec`` sets (default ones: a test run in the background would have SIGINT ignored)."""
    code = textwrap.dedent(f"""
        import sys
        import directload.harness.memcap as memcap
        from directload.harness.memcap import MemoryCapExceeded, run_capped
        if {grace_s!r} is not None:
            memcap._GRACE_S = {grace_s!r}
        try:
            sys.exit(run_capped({limit}, [sys.executable, "-c", {child!r}]))
        except MemoryCapExceeded as exc:
            print(exc)
            sys.exit(99)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            encoding="utf-8", preexec_fn=preexec)


def limit_for_tests():
    return _anonymous_rss() + (256 << 20)


@needs_cgroup
def test_the_cap_is_real_and_its_cgroup_goes_when_the_run_ends():
    limit = limit_for_tests()
    assert run_capped(limit, [sys.executable, "-c", "import numpy; print(numpy.ones(32 << 20).sum())"]) == 0
    assert run_capped(limit, [sys.executable, "-c", "raise SystemExit(7)"]) == 7
    with pytest.raises(MemoryCapExceeded, match="OOM killer ended the run at the memory limit of .* raise"):
        run_capped(limit, [sys.executable, "-c", f"import numpy; a = numpy.ones({limit * 2}, numpy.uint8)"])
    assert ours(os.getpid()) == []


@needs_cgroup
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_guardian_ends_the_run_and_removes_its_cgroup(sig):
    proc = guarded(limit_for_tests(), "import time; print('started', flush=True); time.sleep(120)")
    line = proc.stdout.readline()  # the child runs, inside its cgroup
    assert line.strip() == "started", proc.stderr.read()
    assert len(ours(proc.pid)) == 1
    proc.send_signal(sig)
    assert proc.wait(timeout=90) == 128 + sig  # long before the child's 120 s sleep ends
    assert ours(proc.pid) == []


@needs_cgroup
def test_a_command_that_ignores_the_signal_is_killed_after_the_grace_period():
    child = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('started', flush=True); "
             "time.sleep(120)")
    proc = guarded(limit_for_tests(), child, grace_s=1.0)
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 128 + signal.SIGTERM  # long before the child's 120 s sleep ends
    assert time.monotonic() - t0 >= 1.0  # ... but not before the grace period
    assert ours(proc.pid) == []


@needs_cgroup
def test_a_signal_the_guardian_was_started_ignoring_stays_ignored():
    proc = guarded(limit_for_tests(), "import time; print('started', flush=True); time.sleep(120)",
                   preexec=_ignore_sigint)
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    proc.send_signal(signal.SIGINT)  # as a background job's Ctrl-C: neither the guardian nor its command ends
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 128 + signal.SIGTERM
    assert ours(proc.pid) == []


@needs_cgroup
def test_the_cgroup_of_a_killed_guardian_is_swept_by_the_next_run():
    child = ("from directload.harness.memcap import enter_capped_child; enter_capped_child(); import os, time; "
             "print(os.getpid(), flush=True); time.sleep(120)")
    proc = guarded(limit_for_tests(), child)
    pid = int(proc.stdout.readline())
    assert len(ours(proc.pid)) == 1
    proc.kill()  # SIGKILL: the guardian cleans nothing up
    proc.wait(timeout=30)
    for _ in range(100):  # the child dies with its guardian
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the capped child outlived its guardian")
    assert run_capped(limit_for_tests(), [sys.executable, "-c", "pass"]) == 0  # the next run sweeps
    assert ours(proc.pid) == []

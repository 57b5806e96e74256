"""The memory cap: a real cgroup that the guardian removes however the run ends (exit, OOM kill, SIGTERM,
SIGINT), a cap too small to start refused before anything moves, bad values refused by the parser, an OOM
kill told in one line, and the cgroups of killed guardians swept by the next run."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from directload.harness.cli import main
from directload.harness.commands.runs import check_args
from directload.harness.memcap import (
    HEADROOM,
    PEAK_LINE,
    MemoryCapExceeded,
    MemoryLimitError,
    _anonymous_rss,
    _controller,
    check_limit,
    parse_limit,
    run_capped,
)
from directload.harness.parser import build_parser
from directload.harness.train_inputs import TableShape, check_memory_limit, run_memory

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
    assert main(["train", "--root", str(tmp_path), "--memory-limit", "1M", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("directload: error: a memory limit of 1 MiB is below what the run will hold: about ")
    assert err.count("\n") == 1 and not list(tmp_path.iterdir()) and ours(os.getpid()) == []
    with pytest.raises(ValueError, match="give at least"):
        check_limit(_anonymous_rss())


# synth-ooc (not made: its preset's sizes), 4 KiB rows: a tiered stack of a 1 GiB host cache with 256 MiB of
# read-ahead slots, batches of 256 seeds over fanouts 10 and 5 (evaluated 512 at a time on 1000 nodes)
OOC = ["--dataset", "synth-ooc", "--loader", "directload", "--features", "tiered", "--host-cache", "1G",
       "--staging", "256M", "--fanouts", "10", "5", "--batch-size", "256", "--eval-batch-size", "512",
       "--eval-nodes", "1000"]


def ooc_options(*extra):
    args = build_parser().parse_args(["train", *OOC, *extra])
    return check_args(args, [args.model], [args.loader])


def test_a_limit_below_what_the_stack_and_the_run_will_hold_is_refused_naming_both(tmp_path):
    options = ooc_options()
    holds = run_memory(options, TableShape(1_000_000, 10_000_000, 4096))
    stack, run = sum(holds["stack"].values()), sum(holds["run"].values())
    assert holds["stack"]["host cache"] == (1 << 30) + (256 << 20)  # the cache and its read-ahead slots
    assert holds["run"]["graph"] == 10_000_000 * 40 + 1_000_000 * 16
    assert holds["run"]["batches"] == 3 * 512 * 61 * 4096  # the loader's batches, an evaluation batch's rows
    needed = _anonymous_rss() + HEADROOM + stack + run
    limit = needed - (64 << 20)  # above the interpreter and the cache, below the whole
    with pytest.raises(MemoryLimitError, match=r"^a memory limit of (\d+\.\d+) GiB is below what the run will "
                                               r"hold: about (\d+\.\d+) GiB \(its feature store .* GiB: host cache "
                                               r"1\.25 GiB, read buffers .*; the run .*: the interpreter, torch, the "
                                               r"framework and the model .*, graph 397 MiB, batches 366 MiB\); give "
                                               r"at least \d+M$") as info:
        check_memory_limit(limit, options, root=tmp_path, dataset="synth-ooc", loaders=["directload"])
    said_limit, said_total = (float(x) for x in re.match(r"a memory limit of (\S+) GiB .* about (\S+) GiB",
                                                           str(info.value)).groups())
    assert said_limit == round(limit / 2**30, 2) and abs(said_total - needed / 2**30) < 0.02  # the limit first
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)
    check_memory_limit(needed + (64 << 20), options, root=tmp_path, dataset="synth-ooc", loaders=["directload"])
    assert not list(tmp_path.iterdir())  # nothing made, not even the dataset


def test_a_stack_only_the_directload_loader_reads_is_counted_for_it_alone(tmp_path):
    options = ooc_options("--framework", "dgl", "--loader", "dgl", "--features", "disk")
    holds = run_memory(options, TableShape(1_000_000, 10_000_000, 4096), loaders=("dgl",))
    assert holds["stack"] == {} and holds["run"]["graph"] > 0  # DGL reads the mapped file: no stack
    two = run_memory({**options, "nproc": 2}, TableShape(1_000_000, 10_000_000, 4096))
    assert two["run"]["graph"] == 2 * holds["run"]["graph"]  # every rank holds the graph


def test_train_refuses_a_limit_below_its_stack_before_any_work_with_exit_status_2(tmp_path, capsys):
    # 2G is above what the run needs to start, below its 1 GiB cache, read-ahead, graph and batches.  The root is
    # a file: a run that went on to make the dataset would fail at once, not write gigabytes.
    root = tmp_path / "not-a-directory"
    root.write_text("")
    code = main(["train", "--root", str(root), *OOC, "--memory-limit", "2G", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("directload: error: a memory limit of 2.00 GiB is below what the run will hold: about ")
    assert "its feature store" in err and "host cache 1.25 GiB" in err and err.count("\n") == 1
    assert ours(os.getpid()) == []


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


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
@needs_cgroup
def test_the_cap_is_real_and_its_cgroup_goes_when_the_run_ends(capsys):
    limit = limit_for_tests()
    assert run_capped(limit, [sys.executable, "-c", "import numpy; print(numpy.ones(32 << 20).sum())"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith(PEAK_LINE)]
    peak, cap = (int(x) for x in said[-1].split()[3:6:2])
    assert cap == limit and (32 << 20) * 8 <= peak <= limit  # the child's 256 MiB of ones, within the cap
    assert run_capped(limit, [sys.executable, "-c", "raise SystemExit(7)"]) == 7
    with pytest.raises(MemoryCapExceeded, match="OOM killer ended the run at the memory limit of .* raise"):
        run_capped(limit, [sys.executable, "-c", f"import numpy; a = numpy.ones({limit * 2}, numpy.uint8)"])
    assert ours(os.getpid()) == []


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
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


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
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


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
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


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
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

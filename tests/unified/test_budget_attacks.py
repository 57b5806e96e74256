"""directload.budget against what outside testers threw at it: links named like a budget (and a budget whose
own directory is a link), another user's directory, a loader stopped with SIGSTOP while it holds the registry
lock, loaders killed at every crash point, and member files that are garbage.  Nothing is followed, nothing
that is not ours is removed, every wait ends by the budget's timeout, and every leftover of ours is swept."""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from directload.budget import PREFIX, BudgetError, BudgetTimeout, NodeBudget, Resources, sweep


@pytest.fixture
def where(tmp_path):
    path = tmp_path / "shm"
    path.mkdir()
    return str(path)


def _left(where):
    return sorted(e for e in os.listdir(where) if e.startswith(PREFIX))


def _bounded(call, seconds=60):
    """``call()`` in a thread: (its result, its exception).  A call still blocked after ``seconds`` fails
    the test (the thread, a daemon, is released when the test's peer is killed)."""
    box = []

    def run():
        try:
            box.append((call(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append((None, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return box[0]


def _until(check, seconds=60):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the condition never came"
        time.sleep(0.01)


def _stopped(pid):
    def stopped():
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    _until(stopped)


@pytest.fixture
def peers():
    """Processes a test starts; they are killed (SIGKILL, then SIGCONT for a stopped one) when it ends."""
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.send_signal(signal.SIGCONT)
            p.wait(60)


def _victim(tmp_path):
    """A directory of someone else's that holds the names a budget uses."""
    victim = tmp_path / "victim"
    victim.mkdir()
    files = {"lock": "", "limits.json": json.dumps({"limits": [100, 0, 0]}), "notes.txt": "keep me",
             "member-1-0123456789abcdef.json": "{}"}
    for name, text in files.items():
        (victim / name).write_text(text)
    return victim, files


def _intact(victim, files):
    return {p.name: p.read_text() for p in victim.iterdir()} == files


# ---------------------------------------------------------------- links and what is not ours


def test_a_sweep_never_follows_a_link_named_like_a_budget(where, tmp_path):
    victim, files = _victim(tmp_path)
    os.symlink(victim, os.path.join(where, PREFIX + "evil"))
    assert sweep(where) == []
    with NodeBudget("other", host_bytes=10, directory=where).join(Resources(5)):  # every join sweeps
        pass
    assert _intact(victim, files) and os.path.islink(os.path.join(where, PREFIX + "evil"))


def test_a_budget_whose_own_directory_is_a_link_is_refused_and_its_target_untouched(where, tmp_path):
    victim, files = _victim(tmp_path)
    os.symlink(victim, os.path.join(where, PREFIX + "linked"))
    budget = NodeBudget("linked", host_bytes=100, directory=where)
    with pytest.raises(BudgetError, match=r"directload-budget-linked is a symbolic link, so not a budget's"):
        budget.join(Resources(5))
    assert _intact(victim, files)


def test_another_users_budget_directory_is_neither_swept_nor_joined(where):
    path = os.path.join(where, PREFIX + "theirs")
    os.mkdir(path)
    open(os.path.join(path, "lock"), "w").close()
    os.chown(path, 65534, 65534)
    assert sweep(where) == [] and os.listdir(path) == ["lock"]
    with pytest.raises(BudgetError, match="is owned by uid 65534, not by this user"):
        NodeBudget("theirs", host_bytes=10, directory=where).join(Resources(5))
    assert os.listdir(path) == ["lock"]


def test_a_budget_directory_holding_what_is_not_ours_is_left_whole(where):
    path = os.path.join(where, PREFIX + "mixed")
    os.mkdir(path)
    for name in ("lock", "limits.json", "notes.txt"):
        open(os.path.join(path, name), "w").close()
    assert sweep(where) == [] and sorted(os.listdir(path)) == ["limits.json", "lock", "notes.txt"]


@pytest.mark.parametrize("name", ["limits.json", "member-1-0123456789abcdef.json", "lock"])
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_fifo_or_link_under_a_budget_files_name_is_a_typed_error_never_a_blocked_open(where, tmp_path, name,
                                                                                         kind):
    budget = NodeBudget("odd", host_bytes=10, directory=where)
    os.mkdir(budget.path)
    target = os.path.join(budget.path, name)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_text(json.dumps({"limits": [10, 0, 0]}))
        os.symlink(elsewhere, target)
    _, error = _bounded(lambda: budget.join(Resources(5)))
    with pytest.raises(BudgetError, match=rf"odd/{name} (is [pl]|cannot be opened)"):
        raise error
    assert os.path.lexists(target)
    if kind == "link":
        assert elsewhere.read_text() == json.dumps({"limits": [10, 0, 0]})


# ---------------------------------------------------------------- a loader stopped under the registry lock

_STOP_UNDER_THE_LOCK = textwrap.dedent("""
    import os, signal, sys
    from directload.budget import NodeBudget, Resources

    budget = NodeBudget("frozen", host_bytes=1000, directory=sys.argv[1])
    print("joining", flush=True)
    budget.join(Resources(500), on_change=lambda r: os.kill(os.getpid(), signal.SIGSTOP))  # under the lock
""")


def test_a_loader_stopped_under_the_registry_lock_is_named_and_the_others_keep_their_shares(where, peers):
    budget = NodeBudget("frozen", host_bytes=1000, directory=where, poll=0.05, timeout=1)
    a = budget.join(Resources(600))
    w = budget.join(Resources(1000), on_change=lambda r: None)  # a watcher: grows only as far as a gives back
    assert (a.current.host_bytes, w.current.host_bytes) == (600, 400)
    child = subprocess.Popen([sys.executable, "-c", _STOP_UNDER_THE_LOCK, where], stdout=subprocess.PIPE, text=True)
    peers.append(child)
    assert child.stdout.readline().strip() == "joining"
    _stopped(child.pid)
    named = rf"pid {child.pid} has held its registry lock \(.*/lock\) for more than 1 s"

    _, error = _bounded(a.refresh)
    with pytest.raises(BudgetTimeout, match=named):
        raise error
    assert isinstance(error, TimeoutError) and "\n" not in str(error)
    assert a.current.host_bytes == 600  # kept

    _, error = _bounded(lambda: budget.join(Resources(100)))
    with pytest.raises(BudgetTimeout, match=named):
        raise error
    mine = [e for e in os.listdir(budget.path) if e.startswith(f"member-{os.getpid()}-")]
    assert len(mine) == 2  # a's and w's: the refused join left nothing

    _until(lambda: w.stalled is not None)
    assert re.search(named, w.stalled) and w.current.host_bytes == 400  # the watcher keeps its share, looks again

    _, error = _bounded(a.leave)
    with pytest.raises(BudgetTimeout, match=rf"{named}.*given back all the same"):
        raise error
    assert len([e for e in os.listdir(budget.path) if e.startswith(f"member-{os.getpid()}-")]) == 1

    child.send_signal(signal.SIGKILL)  # its locks go with it: the watcher's next look takes a's share back
    child.wait(60)
    _until(lambda: w.current.host_bytes == 1000 and w.stalled is None)
    w.leave()
    assert _left(where) == []


# ---------------------------------------------------------------- every crash point is swept

_KILLED_AT = textwrap.dedent("""
    import os, signal, sys
    import directload.budget as budget

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(os, sys.argv[2], die)  # killed where it would rename a .tmp into place
    budget.NodeBudget("crash", host_bytes=100, directory=sys.argv[1]).join(budget.Resources(50))
""")


@pytest.mark.parametrize("at", ["replace", "rename"])  # the limits' .tmp, the member's .tmp
def test_a_loader_killed_between_a_tmp_write_and_its_rename_leaves_nothing_the_next_sweep_keeps(where, at):
    proc = subprocess.run([sys.executable, "-c", _KILLED_AT, where, at], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    path = os.path.join(where, PREFIX + "crash")
    assert any(e.endswith(".tmp") for e in os.listdir(path))  # the crash left its .tmp behind
    assert sweep(where) == ["crash"]
    assert _left(where) == []


@pytest.mark.parametrize("entries", [
    [],  # killed between making the directory and its lock
    ["lock"],
    ["limits.json.4242.tmp"],  # what an earlier version left: its sweep removed the lock, not the .tmp
    ["lock", "limits.json", ".0123456789abcdef.tmp"],
    ["lock", "limits.json", "member-999999-0123456789abcdef.json"],  # its loader was killed
])
def test_a_half_made_or_half_removed_budget_is_swept(where, entries):
    path = os.path.join(where, PREFIX + "half")
    os.mkdir(path)
    for name in entries:
        with open(os.path.join(path, name), "w") as f:
            f.write(json.dumps({"limits": [100, 0, 0]}) if name == "limits.json" else "{}")
    assert sweep(where) == ["half"]
    assert _left(where) == []


def test_a_crashed_budget_can_be_joined_again_under_its_name(where):
    path = os.path.join(where, PREFIX + "again")
    os.mkdir(path)
    open(os.path.join(path, ".0123456789abcdef.tmp"), "w").close()
    with NodeBudget("again", host_bytes=100, directory=where).join(Resources(60)) as share:
        assert share.current.host_bytes == 60
        assert not any(e.endswith(".tmp") for e in os.listdir(path))
    assert _left(where) == []


# ---------------------------------------------------------------- garbage member files

_RECORD = {"pid": 1, "joined": 0, "want": [10, 0, 0], "least": [0, 0, 0], "held": [0, 0, 0]}


@pytest.mark.parametrize("data", [
    b"{not json", b"[]", b"\xff\xfe", json.dumps({"pid": 1}).encode(),
    json.dumps({**_RECORD, "want": "x"}).encode(), json.dumps({**_RECORD, "want": [10, 0]}).encode(),
    json.dumps({**_RECORD, "held": [-5, 0, 0]}).encode(), json.dumps({**_RECORD, "joined": "x"}).encode(),
    json.dumps({**_RECORD, "least": [True, 0, 0]}).encode(),
])
def test_a_garbage_member_file_its_owner_holds_is_one_typed_error_naming_it(where, data):
    budget = NodeBudget("garbage", host_bytes=100, directory=where)
    with budget.join(Resources(10)):
        name = "member-4242-0123456789abcdef.json"
        path = os.path.join(budget.path, name)
        with open(path, "wb") as f:
            f.write(data)
        held = os.open(path, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)  # a live process holds it
        try:
            with pytest.raises(BudgetError, match=rf"member file .*{name}, held by pid {os.getpid()}, is not a member "
                                                  r"record") as info:
                budget.join(Resources(10))
            assert "\n" not in str(info.value)
            assert os.path.exists(path)
            assert sweep(where) == []  # a sweep of another budget's join is not stopped by it
        finally:
            os.close(held)
    assert _left(where) == []  # unheld now: swept with the rest when the last loader left


def test_a_garbage_member_file_no_process_holds_is_removed(where):
    budget = NodeBudget("stale", host_bytes=100, directory=where)
    with budget.join(Resources(60)) as share:
        path = os.path.join(budget.path, "member-4242-0123456789abcdef.json")
        with open(path, "wb") as f:
            f.write(b"{not json")
        assert share.refresh().host_bytes == 60
        assert not os.path.exists(path)
    assert _left(where) == []


@pytest.mark.parametrize("timeout", [0, -1, "1", True, float("inf"), float("nan")])
def test_a_bad_timeout_is_refused(where, timeout):
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        NodeBudget("t", host_bytes=10, directory=where, timeout=timeout)

"""directload.shm, the one home of the shared-memory registries' machinery: our names, opening only regular files
of this user's, removing a name only while it is the file opened, and sweeping what dead processes left (real
files in a temporary directory, real processes where liveness matters)."""

import fcntl
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from conftest import within

from directload import shm
from directload.shm import NotOursError

P = "directload-test-"

#: A member: holds a lock on its file, says so, and lives until its stdin closes (or it is killed).
_MEMBER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    print("holding", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def where(tmp_path):
    return str(tmp_path)


@pytest.fixture
def members():
    """Start member processes; every one still running at the end is killed and reaped."""
    started = []

    def start(path):
        proc = subprocess.Popen([sys.executable, "-c", _MEMBER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        started.append(proc)
        assert proc.stdout.readline().strip() == "holding"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)


def _file(where, name, data=b""):
    path = os.path.join(where, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _end(proc):
    proc.stdin.close()
    assert proc.wait(60) == 0


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("name, longest, ok", [
    ("node", 200, True), ("ogbn-papers100M_v2.1", 200, True), ("a" * 100, 100, True), ("a" * 101, 100, False),
    ("", 200, False), (".hidden", 200, False), ("-flag", 200, False), ("..", 200, False), ("a/b", 200, False),
    ("../x", 200, False), ("a b", 200, False), ("caf\u00e9", 200, False), (None, 200, False), (b"node", 200, False),
])
def test_a_name_is_letters_digits_and_three_marks(name, longest, ok):
    assert shm.valid_name(name, longest) is ok


def test_the_prefixes_of_the_budget_and_the_tables_are_ours():
    from directload import budget, shared
    assert shm.PREFIX == "directload-"
    assert (budget.PREFIX, shared.PREFIX) == ("directload-budget-", "directload-shared-")
    assert shared.SHM_DIR == shm.SHM_DIR == "/dev/shm"


def test_listing_keeps_our_prefix_only_sorted(where):
    for name in (P + "b", P + "a", "directload-other-a", "x" + P):
        _file(where, name)
    os.mkdir(os.path.join(where, P + "dir"))
    assert shm.listing(where, P) == [P + "a", P + "b", P + "dir"]
    assert shm.listing(os.path.join(where, "missing"), P) == []
    assert shm.listing(_file(where, "plain"), P) == []  # not a directory


# ---------------------------------------------------------------- is it ours

def test_why_not_ours_names_the_kind_or_the_owner(where):
    path = _file(where, "f")
    os.chmod(path, 0o600)
    os.mkfifo(os.path.join(where, "fifo"), 0o600)
    assert shm.why_not_ours(os.stat(path)) is None
    assert shm.why_not_ours(os.stat(where), stat.S_ISDIR) is None
    assert shm.why_not_ours(os.stat(path), stat.S_ISDIR) == "not a directory (-rw-------)"
    assert shm.why_not_ours(os.lstat(os.path.join(where, "fifo"))) == "not a regular file (prw-------)"
    assert shm.why_not_ours(os.stat(path), stat.S_ISDIR, wrong_kind="{mode}, not a {kind}") == \
        "-rw-------, not a directory"


def test_check_ours_raises_the_callers_error_with_the_callers_words(where):
    path = _file(where, "f")
    shm.check_ours(os.stat(path), path)  # ours: nothing raised
    with pytest.raises(NotOursError, match=r"^it is not a directory \(-"):
        shm.check_ours(os.stat(path), "it", kind=stat.S_ISDIR)
    with pytest.raises(KeyError, match="it is -"):
        shm.check_ours(os.stat(path), "it", kind=stat.S_ISDIR, refuse=KeyError, wrong_kind="{mode}, not a {kind}")
    assert issubclass(NotOursError, RuntimeError)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_is_not_ours(where):
    path = _file(where, P + "theirs", b"x")
    os.chown(path, 65534, 65534)
    assert shm.why_not_ours(os.stat(path)) == "owned by uid 65534, not by this user"
    with pytest.raises(NotOursError, match=r"theirs is owned by uid 65534, not by this user"):
        shm.open_ours(path)
    assert shm.sweep(where, P) == []
    assert os.path.exists(path)


# ---------------------------------------------------------------- opening

def test_open_ours_opens_a_regular_file_and_nothing_else(where):
    path = _file(where, P + "f", b"abc")
    fd = shm.open_ours(path, os.O_RDWR)
    try:
        assert os.pread(fd, 3, 0) == b"abc"
        os.pwrite(fd, b"X", 0)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"Xbc"
    assert shm.open_ours(os.path.join(where, P + "missing")) is None


def test_open_ours_never_follows_a_link(where):
    target = _file(where, "target", b"secret")
    os.symlink(target, os.path.join(where, P + "link"))
    with pytest.raises(NotOursError, match=rf"{P}link is not a regular file \(lrwx"):
        shm.open_ours(os.path.join(where, P + "link"), os.O_RDWR)
    with open(target, "rb") as f:
        assert f.read() == b"secret"


def test_open_ours_never_blocks_on_a_fifo(where):
    fifo = os.path.join(where, P + "fifo")
    os.mkfifo(fifo)
    with pytest.raises(NotOursError, match=r"is not a regular file \(prw"):
        within(10, lambda: shm.open_ours(fifo))


def test_open_ours_relative_to_a_directory_names_where(where):
    _file(where, "member", b"m")
    dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = shm.open_ours("member", dir_fd=dfd, where="the member")
        assert os.pread(fd, 1, 0) == b"m"
        os.close(fd)
        os.mkdir(os.path.join(where, "sub"))
        with pytest.raises(ValueError, match=r"^the sub is drwx.*, not a regular file$"):
            shm.open_ours("sub", dir_fd=dfd, where="the sub", refuse=ValueError, wrong_kind="{mode}, not a {kind}")
    finally:
        os.close(dfd)


def test_open_ours_gives_none_for_a_path_replaced_between_the_look_and_the_open(where, monkeypatch):
    path = _file(where, P + "f", b"old")
    real_open = os.open

    def replacing_open(p, flags, *args, **kwargs):
        if p == path:
            os.replace(_file(where, "new", b"new"), path)  # another file takes the name after the lstat
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(shm.os, "open", replacing_open)
    assert shm.open_ours(path) is None
    monkeypatch.undo()
    with open(path, "rb") as f:
        assert f.read() == b"new"  # left as it is


def test_has_magic_reads_the_start_only(where):
    fd = os.open(_file(where, "f", b"DLSHARE1rest"), os.O_RDONLY)
    try:
        assert shm.has_magic(fd, b"DLSHARE1") and shm.has_magic(fd, b"DL")
        assert not shm.has_magic(fd, b"rest") and not shm.has_magic(fd, b"DLSHARE1rest-and-more")
    finally:
        os.close(fd)


# ---------------------------------------------------------------- removing only the file opened

def test_a_path_replaced_by_another_file_is_not_unlinked(where):
    path = _file(where, P + "f", b"mine")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert shm.same_file(path, fd)
        os.replace(_file(where, "other", b"theirs"), path)
        assert not shm.same_file(path, fd)
        assert shm.unlink_if_same(path, fd) is False
        assert shm.drop_unheld(path, fd) is True  # nobody holds the file opened, yet the name is another's
        with open(path, "rb") as f:
            assert f.read() == b"theirs"
    finally:
        os.close(fd)


def test_a_link_to_the_file_opened_is_not_that_file(where):
    path = _file(where, P + "f")
    link = os.path.join(where, P + "link")
    os.symlink(path, link)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not shm.same_file(link, fd)
        assert shm.unlink_if_same(link, fd) is False
        assert sorted(os.listdir(where)) == [P + "f", P + "link"]
    finally:
        os.close(fd)


def test_unlink_if_same_relative_to_a_directory(where):
    _file(where, "entry")
    dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open("entry", os.O_RDONLY, dir_fd=dfd)
    try:
        assert shm.same_file("entry", fd, dir_fd=dfd)
        assert shm.unlink_if_same("entry", fd, dir_fd=dfd) is True
        assert shm.unlink_if_same("entry", fd, dir_fd=dfd) is False  # gone already
        assert not shm.same_file("entry", fd, dir_fd=dfd)
        assert os.listdir(where) == []
    finally:
        os.close(fd)
        os.close(dfd)


# ---------------------------------------------------------------- liveness: locks, then pids

@pytest.mark.parametrize("ending", ["exits", "is killed"])
def test_a_member_process_holds_its_file_until_it_ends(where, members, ending):
    path = os.path.join(where, P + "member")
    member = members(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert shm.lock_if_free(fd) is False
        assert shm.drop_unheld(path, fd) is False
        assert os.path.exists(path)
        if ending == "exits":
            _end(member)
        else:
            member.kill()
            assert member.wait(60) < 0
        assert shm.drop_unheld(path, fd) is True  # its lock went with it
        assert not os.path.exists(path)
        assert shm.lock_if_free(fd) is True  # this process holds it now: taking it again is no conflict
    finally:
        os.close(fd)


def test_alive_follows_a_real_process(members, where):
    member = members(os.path.join(where, "m"))
    assert shm.alive(member.pid) and shm.alive(os.getpid())
    _end(member)  # reaped: its pid names no process
    assert not shm.alive(member.pid)
    assert [shm.alive(p) for p in (0, -1, shm.PID_MAX, shm.PID_MAX + 1)] == [False] * 4


# ---------------------------------------------------------------- sweeping the dead

def test_sweep_removes_an_exited_members_file_and_keeps_a_live_ones(where, members):
    dead, live = members(os.path.join(where, P + "dead")), members(os.path.join(where, P + "live"))
    assert shm.sweep(where, P) == []  # both alive
    _end(dead)
    assert shm.sweep(where, P) == [P + "dead"]
    assert shm.listing(where, P) == [P + "live"]
    live.kill()
    live.wait(60)
    assert shm.sweep(where, P) == [P + "live"]
    assert os.listdir(where) == []


def test_sweep_never_removes_what_is_not_ours(where):
    target = _file(where, "target", b"keep")
    os.symlink(target, os.path.join(where, P + "link"))
    os.mkfifo(os.path.join(where, P + "fifo"))
    os.mkdir(os.path.join(where, P + "dir"))
    _file(where, "other-prefix")
    _file(where, P + "foreign", b"NOTOURS!")
    _file(where, P + "mine", b"DLTEST01")
    ours = lambda fd, name: shm.has_magic(fd, b"DLTEST01")  # noqa: E731
    assert within(30, lambda: shm.sweep(where, P, ours=ours)) == [P + "mine"]
    assert sorted(os.listdir(where)) == sorted([P + "dir", P + "fifo", P + "foreign", P + "link", "other-prefix",
                                                "target"])
    with open(target, "rb") as f:
        assert f.read() == b"keep"


def test_sweep_asks_the_owner_after_taking_the_lock(where):
    for name in ("a", "b"):
        _file(where, P + name, name.encode())
    asked = []

    def owner_alive(fd):
        asked.append(os.pread(fd, 1, 0))
        other = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # a second open file of it
        try:
            assert shm.lock_if_free(other) is False  # the sweep holds the lock while it asks
        finally:
            os.close(other)
        return os.pread(fd, 1, 0) == b"a"  # a's owner lives: kept

    assert shm.sweep(where, P, owner_alive=owner_alive) == [P + "b"]
    assert asked == [b"a", b"b"]
    assert os.listdir(where) == [P + "a"]


def test_the_tables_sweep_removes_a_dead_writers_partial_and_keeps_a_live_ones(where, members):
    from directload.shared import PREFIX, sweep
    live = os.path.join(where, f"{PREFIX}k.partial")
    with open(live, "wb") as f:
        f.write(b"DLSHARE1")
    writer = members(live)
    dead = _file(where, f"{PREFIX}j.partial", b"DLSHARE1")
    assert sweep(where) == [f"{PREFIX}j.partial"]
    assert os.path.exists(live) and not os.path.exists(dead)
    _end(writer)
    assert sweep(where) == [f"{PREFIX}k.partial"]
    assert os.listdir(where) == []

"""directload.publish: a publication killed (SIGKILL) at every one of its steps, or at random instants in a
process of its own, leaves the old generation or the new one, whole, and the next one removes what it left
and nothing that is not ours; another writer is refused at once or waited for (warned, with a timeout)."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import within
from publish_child import MARK, Folder, Notes, publish, read

import directload.publish as publication
from directload.publish import Publication, PublishBusyError, PublishTimeout

CHILD = Path(__file__).with_name("publish_child.py")
MINE = "mine\n"
# A user's things that only look like ours (a generation's name without our mark, partials of another
# pattern or holding a user's file, other names): never touched
LOOKALIKES = {
    "notes": ["notes.g99", "notes.g98.meta", ".notes.mine.partial", ".notes.abcdefgh.txt", "notes.bak"],
    "folder": ["folder.g99/mine.txt", ".folder.abcdefgh.set.partial/mine.txt",
               ".folder.abcdefgh.link.partial/mine.txt", "folder.notes"],
}


def _legacy(path, kind):
    """What directload wrote at ``path`` before generations, holding value 1."""
    if kind == "notes":
        path.write_text(f"{MARK} 1\n")
    else:
        path.mkdir()
        (path / "legacy").write_text(f"{MARK} 1\n")


# (kind, how the old generation is made): each kind of publication over each kind of thing it replaces
SCENARIOS = {
    "files over files": ("notes", lambda p: publish("notes", p, 1)),
    "files over a file from before generations": ("notes", lambda p: _legacy(p, "notes")),
    "a folder over a folder": ("folder", lambda p: publish("folder", p, 1)),
    "a folder over one from before generations": ("folder", lambda p: _legacy(p, "folder")),
    "a folder over an empty one": ("folder", lambda p: p.mkdir()),
}


def _value(kind, path):
    """The whole generation's value at ``path``, or None for the empty folder a publication adopts."""
    if kind == "folder" and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return None
    return read(kind, path)


def _lookalikes(where, kind):
    for name in LOOKALIKES[kind]:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(MINE)


def _published(kind, path, lookalikes=True):
    """The names a clean publication leaves: the link, its generation, and the user's things."""
    gen = os.readlink(path)
    ours = {path.name, gen, gen + ".meta"} if kind == "notes" else {path.name, gen}
    return sorted(ours | ({name.split("/")[0] for name in LOOKALIKES[kind]} if lookalikes else set()))


def _steps(tmp_path, kind, old, monkeypatch):
    """The crash points a whole publication passes, in order (recorded on a rehearsal)."""
    rehearsal = tmp_path / "rehearsal"
    rehearsal.mkdir()
    old(rehearsal / kind)
    seen = []
    with monkeypatch.context() as m:
        m.setattr(publication, "crash_point", seen.append)
        publish(kind, rehearsal / kind, 2)
    return seen


def killed_at(k, fn):
    """Run ``fn()`` in a forked child that SIGKILLs itself at its ``k``-th crash point; its wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            calls = [0]

            def point(step):
                calls[0] += 1
                if calls[0] == k:
                    os.kill(os.getpid(), signal.SIGKILL)

            publication.crash_point = point
            fn()
            code = 0
        except BaseException:  # noqa: BLE001 - reported by the exit code
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_publication_killed_at_every_step_leaves_the_old_generation_or_the_new_one(tmp_path, monkeypatch,
                                                                                   scenario):
    kind, old = SCENARIOS[scenario]
    steps = _steps(tmp_path, kind, old, monkeypatch)
    label = "folder:" if kind == "folder" else ""
    published = steps.index(label + "published")
    assert steps[-1] == label + "swept" and all(s.startswith(label) for s in steps)
    for k in range(1, len(steps) + 1):
        where = tmp_path / f"k{k}"
        where.mkdir()
        path = where / kind
        old(path)
        before = _value(kind, path)
        _lookalikes(where, kind)
        status = killed_at(k, lambda path=path: publish(kind, path, 2))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, steps[k - 1], status)
        # killed after step k: the new generation exactly when the publishing step had happened
        assert _value(kind, path) == (2 if k - 1 >= published else before), (k, steps[k - 1])
        publish(kind, path, 3)  # the next publication recovers and removes what the killed one left
        assert read(kind, path) == 3
        assert sorted(os.listdir(where)) == _published(kind, path), (k, steps[k - 1])
        assert all((where / name).read_text() == MINE for name in LOOKALIKES[kind])


@pytest.mark.parametrize("kind", ["notes", "folder"])
def test_publications_killed_at_random_instants_never_leave_a_mix(tmp_path, kind):
    path = tmp_path / kind
    publish(kind, path, 0)
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    value = 0
    for i in range(1, 25):
        pid = os.fork()
        if pid == 0:  # the child: keeps publishing generation i until killed
            code = 1
            try:
                for _ in range(1000):
                    publish(kind, path, i, contention="wait")
                code = 0
            finally:
                os._exit(code)
        threading.Event().wait(rng.uniform(0.0, 0.02))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = read(kind, path)  # one whole generation: the last one, or the killed child's
        assert got in (value, i), (got, value, i)
        value = got
    publish(kind, path, 99)
    assert read(kind, path) == 99 and sorted(os.listdir(tmp_path)) == _published(kind, path, lookalikes=False)


# ---------------------------------------------------------------- contention, with a real second process

_HOLD = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the lock a publication in that directory takes
    print("locked", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock a publication in ``tmp_path`` takes, until the test lets go."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    proc.stdin.close()
    proc.wait(60)


@pytest.mark.parametrize("kind", ["notes", "folder"])
def test_another_writer_is_refused_at_once_with_contention_raise(tmp_path, holder, kind):
    with pytest.raises(PublishBusyError, match=f"another directload process is writing in {tmp_path}") as info:
        within(60, lambda: publish(kind, tmp_path / kind, 1, contention="raise"))  # a hang guard only
    assert isinstance(info.value, BlockingIOError) and not isinstance(info.value, TimeoutError)
    assert os.listdir(tmp_path) == []  # nothing made, nothing removed


def test_a_waiting_writer_gives_up_at_its_timeout_naming_the_holder(tmp_path, holder):
    with pytest.warns(RuntimeWarning, match="waiting for it to finish"), \
            pytest.raises(PublishTimeout, match=f"pid {holder.pid} kept writing here for more than 0.2 s") as info:
        within(60, lambda: publish("folder", tmp_path / "folder", 1, contention="wait", timeout=0.2))
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, BlockingIOError)
    assert os.listdir(tmp_path) == []


def test_a_waiting_writer_publishes_once_the_other_has_finished(tmp_path, holder):
    path = tmp_path / "notes"
    writer = subprocess.Popen([sys.executable, str(CHILD), "notes", str(path), "7", "wait"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in writer.stderr:  # it said it waits ...
            if "another directload process is writing here; waiting for it to finish" in line:
                break
        assert writer.poll() is None and not os.path.lexists(path)  # ... and it does
        holder.stdin.close()
        out, err = writer.communicate(timeout=120)  # a hang guard only
    finally:
        writer.kill()
    assert writer.returncode == 0 and out.strip() == "published", err
    assert read("notes", path) == 7


def test_contention_and_timeout_are_checked_before_any_work(tmp_path):
    for kwargs, what in (({"contention": "queue"}, "contention must be one of"),
                         ({"timeout": 1.0}, "timeout is seconds > 0 to wait with contention='wait'"),
                         ({"contention": "wait", "timeout": 0}, "timeout is seconds"),
                         ({"contention": "wait", "timeout": True}, "timeout is seconds")):
        with pytest.raises(ValueError, match=what):
            Notes(tmp_path / "notes", **kwargs)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- what is not ours

@pytest.mark.parametrize("kind", ["notes", "folder"])
@pytest.mark.parametrize("what", ["a file", "a folder of other files", "a link elsewhere", "a link like ours"])
def test_what_directload_did_not_make_is_refused_and_left_as_it_is(tmp_path, kind, what):
    path = tmp_path / kind
    if what == "a file":
        path.write_text(MINE)
    elif what == "a folder of other files":
        path.mkdir()
        (path / "thesis.tex").write_text(MINE)
    elif what == "a link elsewhere":
        (tmp_path / "elsewhere").write_text(MINE)
        path.symlink_to("elsewhere")
    else:
        path.symlink_to(f"{kind}.backup")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FileExistsError, match="was not published by directload; not replacing it"):
        publish(kind, path, 1)
    assert sorted(os.listdir(tmp_path)) == before


def test_replace_false_refuses_a_generation_of_ours(tmp_path):
    path = tmp_path / "folder"
    publish("folder", path, 1)
    with pytest.raises(FileExistsError, match="exists; pass replace=True"):
        publish("folder", path, 2, replace=False)
    assert read("folder", path) == 1 and sorted(os.listdir(tmp_path)) == ["folder", "folder.g1"]


def test_a_generation_a_user_deleted_is_published_again_without_replace(tmp_path):
    path = tmp_path / "notes"
    publish("notes", path, 1)
    for name in os.listdir(tmp_path):
        if name.startswith("notes.g"):
            os.unlink(tmp_path / name)  # the link dangles
    publish("notes", path, 2, replace=False)
    assert read("notes", path) == 2


def test_leaving_without_commit_removes_the_partials_and_leaves_the_old_generation(tmp_path):
    path = tmp_path / "folder"
    publish("folder", path, 1)
    with pytest.raises(KeyError):
        with Folder(path) as p:
            (p.build("set") / "rows").write_text("half")
            raise KeyError("the writer failed")
    assert read("folder", path) == 1 and sorted(os.listdir(tmp_path)) == ["folder", "folder.g1"]


def test_a_commit_without_the_entries_a_generation_needs_is_refused(tmp_path):
    with Notes(tmp_path / "notes") as p:
        with p.create("text", "w") as f:
            f.write("x")
        with pytest.raises(publication.PublishError, match="needs its 'meta' before it is published"):
            p.commit()
    assert os.listdir(tmp_path) == []


def test_a_publication_says_what_its_generations_look_like():
    class NoLink(Publication):
        roles = {"data": ".bin"}

    with pytest.raises(TypeError, match="one role with the suffix ''"):
        NoLink("x")

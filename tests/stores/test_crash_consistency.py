"""Crash-consistent writes: a write killed (SIGKILL) at every one of its steps, or at random instants,
leaves the old store or the new one, complete; the next write cleans up after it; a full disk or a
file-size limit leaves the old store as it was; readers racing a writer always read one whole store."""

import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import within

from directload import publish
from directload.codecs import codec
from directload.files import CorruptFileError
from directload.stores import DiskStore, read_layout, renumber, verify, write_disk_store
from directload.stores.disk_format import DATA_ALIGN
from directload.stores.generations import sidecar_path

ROWS, WIDTH = 300, 24  # 28.8 kB of float32 rows: several 4 KiB chunks, so rows are written in steps


def table(value):
    """A table whose rows say which write made them (``value``) and which row they are."""
    t = torch.arange(ROWS * WIDTH, dtype=torch.float32).view(ROWS, WIDTH) % 97
    return t + 1000 * value


def read_all(path):
    """Every row of the store at ``path``, decoded where it holds codes."""
    with DiskStore(path, direct=False) as store:
        rows = store.read(torch.arange(ROWS))
        return rows if store.codec is None else codec(store.codec).decode(rows)


def as_stored(rows, name):
    """``rows`` as a store of ``name``'s codes (None: plain) reads them back."""
    return rows if name is None else codec(name).decode(codec(name).encode(rows))


def which(path, *candidates):
    """The index of the candidate table the store at ``path`` holds, whole, or a failure."""
    got = read_all(path)
    for k, want in enumerate(candidates):
        if torch.equal(got, want) or torch.equal(got, as_stored(want, "int8")):
            return k
    raise AssertionError("the store holds neither the old rows nor the new ones (a mix, or other rows)")


# unmarked "generations", partials of other names or another pattern, a sidecar that is not ours
LOOKALIKES = ("f.npy.g99", "f.npy.g7.dlstore.json", ".f.npy.mine.partial", ".f.npy.abcdefgh.txt", "f.npy.bak")


def store_files(directory, name="f.npy"):
    return sorted(p.name for p in directory.iterdir() if name in p.name)


def expected_files(path):
    data = read_layout(path).path.name
    files = [path.name, data, data + ".dlstore.json"]
    if read_layout(path).sidecar.get("id_map"):
        files.append(data + ".dlmap.npy")
    return sorted(files)


def plain(path, value):
    return write_disk_store(table(value), path, overwrite=True, progress=False, chunk_bytes=4096)


def coded(path, value):
    """A store of ``table(value)`` as int8 codes (format version 3)."""
    return write_disk_store(table(value), path, overwrite=True, progress=False, chunk_bytes=4096, codec="int8")


def source(path, value):
    """A plain store of ``table(value)`` beside ``path``, to renumber from."""
    return write_disk_store(table(value), path.parent / f"src{value}.npy", overwrite=True, progress=False)


def packed(path, value, seed):
    counts = np.random.default_rng(seed).integers(0, 5, ROWS)
    return renumber(path.parent / f"src{value}.npy", path, counts, overwrite=True, progress=False)


def legacy(path, value):
    """A store as directload wrote it before generations: a plain file and a version-1 sidecar."""
    import crc32c

    t = table(value).numpy()
    text = repr({"descr": "<f4", "fortran_order": False, "shape": t.shape})
    head = 10
    total = -(-(head + len(text) + 1) // DATA_ALIGN) * DATA_ALIGN
    text += " " * (total - head - len(text) - 1) + "\n"
    header = b"\x93NUMPY\x01\x00" + (total - head).to_bytes(2, "little") + text.encode("latin1")
    path.write_bytes(header + t.tobytes())
    meta = {"format": "directload-disk-store", "version": 1, "dtype": "float32", "npy_descr": "<f4",
            "shape": list(t.shape), "data_offset": len(header), "file_bytes": len(header) + t.nbytes,
            "chunk_bytes": 1 << 22, "checksum": "crc32c", "chunks": [crc32c.crc32c(t.tobytes())], "source": "test"}
    sidecar_path(path).write_text(json.dumps(meta))
    return path


def old_packed(path):
    source(path, 1)
    source(path, 2)  # what the new write renumbers from
    return packed(path, 1, 0)


def old_plain(path):
    source(path, 2)
    return plain(path, 1)


# (make the old store, write the new one): every kind of store over every kind it replaces
SCENARIOS = {
    "plain over plain": (old_plain, lambda p: plain(p, 2)),
    "packed over packed": (old_packed, lambda p: packed(p, 2, 1)),
    "plain over packed": (old_packed, lambda p: plain(p, 2)),
    "packed over plain": (old_plain, lambda p: packed(p, 2, 1)),
    "plain over a version-1 store": (lambda p: legacy(p, 1), lambda p: plain(p, 2)),
    "int8 codes over plain": (old_plain, lambda p: coded(p, 2)),
    "plain over int8 codes": (lambda p: coded(p, 1), lambda p: plain(p, 2)),
    "int8 codes over packed": (old_packed, lambda p: coded(p, 2)),
}


def steps_of(tmp_path, old, new, monkeypatch):
    """The crash points a whole write passes, in order (recorded on a rehearsal)."""
    rehearsal = tmp_path / "rehearsal"
    rehearsal.mkdir()
    old(rehearsal / "f.npy")
    seen = []
    with monkeypatch.context() as m:
        m.setattr(publish, "crash_point", seen.append)
        new(rehearsal / "f.npy")
    return seen


def killed_at(k, write):
    """Run ``write()`` in a forked child that SIGKILLs itself at its ``k``-th crash point; its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            calls = [0]

            def point(step):
                calls[0] += 1
                if calls[0] == k:
                    os.kill(os.getpid(), signal.SIGKILL)

            publish.crash_point = point
            write()
            code = 0
        except BaseException:  # noqa: BLE001 - reported by the exit code
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_write_killed_at_every_step_leaves_the_old_store_or_the_new_one(tmp_path, monkeypatch, scenario):
    old, new = SCENARIOS[scenario]
    steps = steps_of(tmp_path, old, new, monkeypatch)
    published = steps.index("published")
    assert len(steps) > 8 and "rows" in steps and "renamed:sidecar" in steps
    for k in range(1, len(steps) + 1):
        work = tmp_path / f"k{k}"
        work.mkdir()
        path = work / "f.npy"
        old(path)
        for name in LOOKALIKES:  # a user's files that only look like ours: never touched
            (work / name).write_bytes(b"mine")
        status = killed_at(k, lambda path=path: new(path))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, steps[k - 1], status)
        # killed after step k: the new store exactly when the publishing rename had happened
        assert which(path, table(1), table(2)) == (1 if k - 1 >= published else 0), (k, steps[k - 1])
        assert verify(path, progress=False)["bad_chunks"] == []
        new(path)  # a re-run recovers on its own and removes what the killed write left
        assert which(path, table(1), table(2)) == 1
        assert store_files(work) == sorted([*expected_files(path), *LOOKALIKES]), (k, steps[k - 1])
        assert all((work / name).read_bytes() == b"mine" for name in LOOKALIKES)


def test_writes_killed_at_random_instants_never_leave_a_mix(tmp_path):
    path = tmp_path / "f.npy"
    plain(path, 0)
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    value = 0
    for i in range(1, 25):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for _ in range(1000):  # keep writing generations until killed
                    write_disk_store(table(i), path, overwrite=True, progress=False, chunk_bytes=4096)
                code = 0
            finally:
                os._exit(code)
        threading.Event().wait(rng.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        value = [value, i][which(path, table(value), table(i))]
    plain(path, 99)
    assert store_files(tmp_path) == expected_files(path)


def test_readers_racing_a_writer_always_read_one_whole_store(tmp_path):
    path = tmp_path / "f.npy"
    plain(path, 0)
    stop = threading.Event()
    problems = []

    def reader():
        while not stop.is_set():
            try:
                got = read_all(path)
            except Exception as exc:  # noqa: BLE001 - collected and reported below
                problems.append(repr(exc))
                return
            values = {int(v) for v in got[:, 0] // 1000}
            if len(values) != 1 or not torch.equal(got, table(values.pop())):
                problems.append("a read saw rows of two writes")

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 40):
            write_disk_store(table(i), path, overwrite=True, progress=False)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert problems == []


@contextlib.contextmanager
def small_filesystem(where, size):
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"a full file system is made with a small tmpfs, and mounting one needs root: {exc}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_leaves_the_old_store_as_it_was_and_nothing_else(tmp_path):
    with small_filesystem(tmp_path / "small", "256k") as fs:
        path = plain(fs / "f.npy", 1)
        before = store_files(fs)
        big = torch.ones(4000, 40)  # 640 kB: more than the file system holds
        with pytest.raises(OSError) as info:
            write_disk_store(big, path, overwrite=True, progress=False)
        assert info.value.errno == 28  # ENOSPC
        assert store_files(fs) == before and which(path, table(1)) == 0
        assert sorted(p.name for p in fs.iterdir()) == before  # no partial left


def test_a_file_size_limit_leaves_the_old_store_as_it_was_and_nothing_else(tmp_path):
    path = plain(tmp_path / "f.npy", 1)
    before = store_files(tmp_path)
    big = np.ones((4000, 40), np.float32)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            write_disk_store(big, path, overwrite=True, progress=False)
        except OSError as exc:
            code = 27 if exc.errno == 27 else 2  # EFBIG (Python ignores SIGXFSZ)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 27
    assert sorted(p.name for p in tmp_path.iterdir()) == before and which(path, table(1)) == 0


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_a_killed_cli_conversion_leaves_no_store_or_a_whole_one_and_a_rerun_finishes(tmp_path):
    src = tmp_path / "in.npy"
    np.save(src, np.random.default_rng(0).standard_normal((20000, 256)).astype(np.float32))  # 20 MB
    out = tmp_path / "out.npy"
    cmd = [sys.executable, "-m", "directload", "dataset", "convert", "--to", "disk", "--input", str(src),
           "--out", str(out), "--no-progress", "--overwrite"]
    proc = subprocess.Popen(cmd)
    threading.Event().wait(2.5)  # past the imports, into the write on this machine
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if os.path.lexists(out):  # killed after the publishing rename: the whole store
        assert torch.equal(read_all_rows(out), torch.from_numpy(np.load(src)))
    within(120, lambda: subprocess.run(cmd, check=True))
    assert torch.equal(read_all_rows(out), torch.from_numpy(np.load(src)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.npy", *expected_files(out)])


def read_all_rows(path):
    with DiskStore(path, direct=False) as store:
        return store.read(torch.arange(store.num_rows))


def test_a_store_whose_generation_was_deleted_is_written_again_without_overwrite(tmp_path):
    path = plain(tmp_path / "f.npy", 1)
    for p in tmp_path.iterdir():
        if p.name.startswith("f.npy.g"):
            p.unlink()  # a user removed the generation: the link dangles, no store can be read
    with pytest.raises(CorruptFileError, match="generation .* is missing"):
        read_all(path)
    write_disk_store(table(2), path, progress=False)
    assert which(path, table(1), table(2)) == 1 and store_files(tmp_path) == expected_files(path)

"""directload.shared_table against what outside testers threw at it: sources that disagree with the table,
peers stopped with SIGSTOP while they hold a lock, full and tiny tmpfs mounts, structured dtypes, FIFOs, links
and other users' files under our names, and tampered headers.  Every case ends in one typed error (or is left
alone), within the timeout, and leaves nothing of ours behind."""

import errno
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

from directload.shared import PREFIX, SharedTableError, SharedTableTimeout, shared_table, sweep
from directload.units import format_size

_MAGIC = b"DLSHARE1"
_HEADER = 4096


def _ours(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(PREFIX))


def _bounded(call, seconds=60):
    """``call()`` in a thread; its exception (or None).  A call still blocked after ``seconds`` fails the test
    (the thread, a daemon, is released when the test's peer is killed)."""
    box = []

    def run():
        try:
            call()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    return box[0]


@pytest.fixture
def tiny(tmp_path):
    """A 64 KiB tmpfs of our own (root only), unmounted afterwards."""
    where = tmp_path / "tiny"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(directory):
    """Fill the tmpfs with a file that is not ours until it refuses another byte."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _stopped(pid, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


@pytest.fixture
def peers():
    """Processes a test starts; stopped ones are killed (SIGKILL, then SIGCONT) when it ends."""
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.send_signal(signal.SIGCONT)
            p.wait(60)


# ---------------------------------------------------------------- a path source is checked like an array


@pytest.mark.parametrize("dtype, shape", [(np.float32, (5, 2)), (np.float64, (4, 2)), (np.int32, (4, 2))])
def test_a_npy_path_of_another_dtype_or_shape_is_refused(shm, tmp_path, dtype, shape):
    keep = shared_table("path", torch.zeros(4, 2), directory=shm)
    path = tmp_path / "other.npy"
    np.save(path, np.zeros(shape, dtype))
    want = rf"holds float32 \(4, 2\), not the {np.dtype(dtype)} \({shape[0]}, {shape[1]}\) given"
    with pytest.raises(SharedTableError, match=want):
        shared_table("path", str(path), directory=shm)
    with pytest.raises(SharedTableError, match=want):
        shared_table("path", path, directory=shm)  # an os.PathLike too
    same = tmp_path / "same.npy"
    np.save(same, np.ones((4, 2), np.float32))
    t = shared_table("path", same, directory=shm)  # agrees: the table already there, not the file's ones
    assert t.tolist() == keep.tolist() == [[0.0, 0.0]] * 4


def test_a_path_source_that_is_not_a_readable_npy_is_refused_before_anything_is_made(shm, tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not a table")
    with pytest.raises(ValueError, match="not a valid .npy file"):
        shared_table("badpath", str(bad), directory=shm)
    with pytest.raises(ValueError, match="cannot read it"):
        shared_table("badpath", str(tmp_path / "missing.npy"), directory=shm)
    assert _ours(shm) == []


# ---------------------------------------------------------------- every wait ends by the timeout

_FREEZE_AFTER_PUBLISHING = textwrap.dedent("""
    import os, signal, sys, torch
    import directload.shared as shared

    directory, key = sys.argv[1], sys.argv[2]
    real = os.link

    def link(src, dst, **kw):
        real(src, dst, **kw)
        if dst.endswith(shared.PREFIX + key):  # published, still holding its exclusive lock
            print("published", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    shared.os.link = link
    shared.shared_table(key, torch.arange(8.0), directory=directory)
""")


def test_a_writer_stopped_right_after_publishing_times_out_its_readers_naming_it(shm, peers):
    writer = subprocess.Popen([sys.executable, "-c", _FREEZE_AFTER_PUBLISHING, shm, "frozen"],
                              stdout=subprocess.PIPE, text=True)
    peers.append(writer)
    assert writer.stdout.readline().strip() == "published"
    _stopped(writer.pid)
    error = _bounded(lambda: shared_table("frozen", torch.arange(8.0), timeout=2, directory=shm))
    assert isinstance(error, SharedTableTimeout) and isinstance(error, TimeoutError)
    with pytest.raises(SharedTableTimeout, match=rf"waited 2 s for the lock on .*{PREFIX}frozen, held by pid "
                                                  rf"{writer.pid} \(a process stopped with SIGSTOP"):
        raise error
    assert "\n" not in str(error)
    assert _ours(shm) == [PREFIX + "frozen", PREFIX + "frozen.partial"]  # its writer's: left alone


_FREEZE_COUNTING = textwrap.dedent("""
    import fcntl, os, signal, sys, torch
    from directload.shared import PREFIX, shared_table

    directory, key = sys.argv[1], sys.argv[2]
    t = shared_table(key, torch.arange(8.0), ranks=3, directory=directory)
    fd = os.open(os.path.join(directory, PREFIX + key), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 8, 8)  # the count's lock, as a rank counting itself in holds it
    print("counting", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
""")


def test_a_rank_stopped_while_counting_itself_in_times_out_the_others_naming_it(shm, peers):
    rank = subprocess.Popen([sys.executable, "-c", _FREEZE_COUNTING, shm, "counting"], stdout=subprocess.PIPE,
                            text=True)
    peers.append(rank)
    assert rank.stdout.readline().strip() == "counting"
    _stopped(rank.pid)
    error = _bounded(lambda: shared_table("counting", timeout=1, directory=shm))
    with pytest.raises(SharedTableTimeout, match=rf"held by pid {rank.pid} "):
        raise error


# ---------------------------------------------------------------- full and tiny tmpfs mounts


@pytest.mark.parametrize("source, needs", [
    (torch.zeros(10), "needs 4.04 KiB"),  # its header and 40 bytes of rows
    (lambda: torch.zeros(10), "needs at least 4.00 KiB"),  # not loaded yet: at least its header
])
def test_a_full_tmpfs_is_one_typed_error_naming_the_sizes_and_leaves_no_partial(tiny, source, needs):
    _fill(tiny)
    with pytest.raises(SharedTableError, match=rf"^{tiny} has 0 B free and shared table 'full' {needs}: ") as info:
        shared_table("full", source, directory=tiny)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert "\n" not in str(info.value)
    assert os.listdir(tiny) == ["filler"]  # not even an empty .partial.<pid> of ours


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (1, "1 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (4096 + 40, "4.04 KiB"), (1 << 20, "1.00 MiB"),
    (int(1.5 * (1 << 30)), "1.50 GiB"), (5 << 40, "5.00 TiB"), (1 << 60, "1048576.00 TiB")])
def test_sizes_in_messages_are_in_units_that_fit(nbytes, text):
    assert format_size(nbytes) == text


def test_a_tiny_tmpfs_names_sizes_that_are_not_zero(tiny):
    with pytest.raises(SharedTableError, match=r"has \d+\.\d\d KiB free and shared table 'tiny' needs 132.00 KiB"):
        shared_table("tiny", torch.zeros(128 << 10, dtype=torch.uint8), directory=tiny)  # 128 KiB into 64
    assert os.listdir(tiny) == []


# ---------------------------------------------------------------- structured dtypes

_PAIR = np.dtype([("a", "<f4"), ("b", "<i8")])


@pytest.mark.parametrize("make", ["array", "function", "path"])
def test_a_structured_dtype_is_refused_with_a_type_error_and_nothing_left(shm, tmp_path, make):
    rows = np.zeros(4, _PAIR)
    path = tmp_path / "pairs.npy"
    np.save(path, rows)
    source = {"array": rows, "function": lambda: rows, "path": str(path)}[make]
    with pytest.raises(TypeError, match=r"a shared table holds numbers .*\(no structured"):
        shared_table("pairs", source, directory=shm)
    assert _ours(shm) == []
    t = shared_table("pairs", torch.arange(3), ranks=1, directory=shm)  # the key is free
    assert t.tolist() == [0, 1, 2]


@pytest.mark.parametrize("source", [np.zeros(3, "<U4"), np.zeros(3, ">f4"), torch.zeros(3, dtype=torch.bfloat16)])
def test_other_dtypes_a_table_cannot_hold_are_refused_up_front(shm, source):
    with pytest.raises(TypeError, match="shared table holds numbers"):
        shared_table("odd", source, directory=shm)
    assert _ours(shm) == []


# ---------------------------------------------------------------- what is under our names and is not ours


@pytest.mark.parametrize("suffix", ["", ".partial"])
def test_a_fifo_under_a_tables_name_is_a_typed_error_never_a_blocked_open(shm, suffix):
    fifo = os.path.join(shm, PREFIX + "fifo" + suffix)
    os.mkfifo(fifo)
    error = _bounded(lambda: shared_table("fifo", torch.arange(3), timeout=5, directory=shm))
    with pytest.raises(SharedTableError, match=rf"{PREFIX}fifo{suffix} is not a regular file \(prw"):
        raise error
    assert _ours(shm) == [PREFIX + "fifo" + suffix]  # never removed


def test_a_link_under_a_tables_name_is_refused_and_neither_it_nor_its_target_touched(shm, tmp_path):
    t = shared_table("real", torch.arange(4.0), directory=shm)  # a genuine table, held
    target = os.path.join(shm, PREFIX + "real")
    os.symlink(target, os.path.join(shm, PREFIX + "linked"))
    with pytest.raises(SharedTableError, match=r"linked is not a regular file \(l"):
        shared_table("linked", torch.arange(4.0), directory=shm)
    assert sweep(shm) == []
    assert os.path.islink(os.path.join(shm, PREFIX + "linked")) and os.path.exists(target)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


def _table_file(path, meta, data=b"", count=0, length=None):
    body = json.dumps(meta).encode() if not isinstance(meta, bytes) else meta
    head = _MAGIC + struct.pack("<q", count) + struct.pack("<q", len(body) if length is None else length) + body
    with open(path, "wb") as f:
        f.write(head.ljust(_HEADER, b" ") + data)


def _meta(**change):
    meta = {"key": "tam", "dtype": "<f4", "shape": [2, 2], "nbytes": 16, "creator": 1, "ranks": None}
    return {**meta, **change}


def test_another_users_file_with_our_magic_is_never_swept_nor_mapped(shm):
    path = os.path.join(shm, PREFIX + "theirs")
    _table_file(path, _meta(key="theirs", creator=(1 << 22) - 1), bytes(16))  # no such pid: its writer "died"
    os.chown(path, 65534, 65534)
    assert sweep(shm) == [] and os.path.exists(path)
    with pytest.raises(SharedTableError, match="is owned by uid 65534, not by this user"):
        shared_table("theirs", torch.zeros(2, 2), directory=shm)
    assert os.path.exists(path)


def test_an_empty_file_under_a_tables_name_is_not_taken_for_ours(shm):
    path = os.path.join(shm, PREFIX + "empty")
    open(path, "wb").close()
    assert sweep(shm) == [] and os.path.exists(path)  # only a writer's first name may be empty


@pytest.mark.parametrize("meta, data, count, length", [
    (_meta(dtype="|O"), bytes(16), 0, None),
    (_meta(dtype="|V4"), bytes(16), 0, None),
    (_meta(dtype=[["a", "<f4"]]), bytes(16), 0, None),
    (_meta(dtype="<U1"), bytes(16), 0, None),
    (_meta(dtype="no such dtype"), bytes(16), 0, None),
    (_meta(shape=[-2, -2]), bytes(16), 0, None),
    (_meta(shape=[2.0, 2]), bytes(16), 0, None),
    (_meta(shape="ab"), bytes(16), 0, None),
    (_meta(shape=[True, 4]), bytes(16), 0, None),
    (_meta(nbytes=16), bytes(8), 0, None),  # the file is shorter than the header says
    (_meta(nbytes=1 << 70, shape=[1 << 68]), bytes(16), 0, None),
    (_meta(ranks="x"), bytes(16), 0, None),
    (_meta(ranks=0), bytes(16), 0, None),
    (_meta(creator=1 << 80), bytes(16), 0, None),
    (_meta(key="another"), bytes(16), 0, None),
    ([1, 2], bytes(16), 0, None),
    (b"{not json", bytes(16), 0, None),
    (b"\xff\xfe", bytes(16), 0, None),
    (b"[" * 3000 + b"]" * 1000, bytes(16), 0, None),
    (_meta(), bytes(16), 0, -5),
    (_meta(), bytes(16), 0, 1 << 40),
    (_meta(), bytes(16), -7, None),  # the count of processes
])
def test_a_tampered_header_is_one_typed_error_and_the_file_is_left_alone(shm, meta, data, count, length):
    path = os.path.join(shm, PREFIX + "tam")
    _table_file(path, meta, data, count, length)
    held = os.open(path, os.O_RDONLY)  # a live rank holds it: the sweep keeps it, the call must read it
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        with pytest.raises(SharedTableError, match=rf"{PREFIX}tam(: its count| is not a shared table directload "
                                                   r"wrote)") as info:
            shared_table("tam", timeout=5, directory=shm)
        assert "\n" not in str(info.value)
        assert os.path.exists(path)
    finally:
        os.close(held)


def test_a_sweep_removes_an_unheld_table_with_a_tampered_creator(shm):
    path = os.path.join(shm, PREFIX + "tam")
    _table_file(path, _meta(creator=1 << 80), bytes(16))  # ours (owner, type, magic), unheld: a leftover
    assert sweep(shm) == [PREFIX + "tam"]
    assert _ours(shm) == []

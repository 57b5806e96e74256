"""Files written whole or not at all, by one process or by several at once."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from directload.atomic import PARTIAL_SUFFIX, write_atomically

_WRITER = textwrap.dedent("""
    import sys, time
    from directload.atomic import write_atomically

    def write(f):
        print("writing", flush=True)
        if sys.argv[3] == "stdin":  # hold the partial open until the test says go on
            sys.stdin.readline()
        for _ in range(20):
            f.write(sys.argv[2].encode() * 4096)
            if sys.argv[3] != "stdin":
                time.sleep(float(sys.argv[3]))

    write_atomically(sys.argv[1], write)
""")


def _partials(where):
    return [e for e in os.listdir(where) if e.endswith(PARTIAL_SUFFIX)]


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_two_processes_writing_one_file_at_once_both_finish(tmp_path):
    path = tmp_path / "graph.npz"
    slow = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "a", "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert slow.stdout.readline().strip() == "writing"  # its partial is open, and stays so until told
    fast = subprocess.run([sys.executable, "-c", _WRITER, str(path), "b", "0"], capture_output=True, text=True)
    assert fast.returncode == 0, fast.stderr  # its sweep left the slow writer's partial alone ...
    slow.stdin.write("go on\n")
    slow.stdin.flush()
    assert slow.wait(timeout=60) == 0  # ... which then renamed it, whole (before the lock: FileNotFoundError)
    assert path.read_bytes() == b"a" * 4096 * 20
    assert _partials(tmp_path) == []


def test_a_killed_writers_partial_goes_with_the_next_write(tmp_path):
    path = tmp_path / "x.bin"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "a", "1"], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert len(_partials(tmp_path)) == 1 and not path.exists()
    write_atomically(path, lambda f: f.write(b"whole"))
    assert path.read_bytes() == b"whole" and _partials(tmp_path) == []

"""The benchmarks' CPU hog: N busy processes while its block runs, none after it."""

import importlib
import signal
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def common():
    sys.path.insert(0, str(BENCH))
    yield importlib.import_module("_common")
    sys.path.remove(str(BENCH))


def _cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_the_hog_keeps_its_processes_busy_and_reaps_them(common):
    with common.cpu_hog(2) as procs:
        assert len(procs) == 2
        deadline = time.monotonic() + 60  # a hang guard, not a budget: a loaded machine only takes longer
        while not all(_cpu_ticks(p.pid) > 0 for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(_cpu_ticks(p.pid) > 0 and p.poll() is None for p in procs)  # busy, and running
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2  # killed and reaped: nothing left running


def test_a_hog_of_none_starts_nothing(common):
    with common.cpu_hog(0) as procs:
        assert procs == []

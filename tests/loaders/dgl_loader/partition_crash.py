"""Kill a re-partition at its crash points, for tests/loaders/dgl_loader/test_partitions.py.

``python partition_crash.py ROOT TEMPLATE WORK FEATURES K1 K2 ...``: for each ``K``, copies the folder
``TEMPLATE`` (the old partitions, ``parts``, and what lies beside them) to ``WORK/k<K>`` and, in a forked child,
partitions synth-tiny again into ``WORK/k<K>/parts`` (METIS) with the child killed (SIGKILL) at its ``K``-th
crash point.  Prints one JSON line: ``{K: the child's wait status}`` (``"hung"`` for a child stopped after
:data:`CHILD_TIMEOUT` seconds).

The children are forked from this process, not from pytest's: before it has partitioned anything (so before
any OpenMP team exists), with the CPU kernels loaded up front and other threads (ogb's version check) finished,
so that no thread holds a lock (tempfile's, an import's) that a child would wait for forever.
"""

import json
import os
import shutil
import signal
import sys
import threading
import time

from directload import publish
from directload.datasets import load
from directload.kernels import cpu
from directload.loaders.dgl.distributed import partition

CHILD_TIMEOUT = 600  # seconds; a partition of synth-tiny takes about one


def killed_at(k, write):
    for thread in threading.enumerate():  # ogb's version check runs on threads of its own, briefly
        if thread is not threading.main_thread():
            thread.join(timeout=60)
    if threading.active_count() != 1:
        raise RuntimeError(f"threads {threading.enumerate()} run: a forked child could wait for their locks forever")
    pid = os.fork()
    if pid == 0:  # the child: never returns
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
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def main(root, template, work, features, *ks):
    for aligned in (True, False):  # now, not on a thread of their own later
        cpu.prepare(aligned=aligned, background=False)
    ds = load(root, "synth-tiny")
    statuses = {}
    for k in map(int, ks):
        where = os.path.join(work, f"k{k}")
        shutil.copytree(template, where, symlinks=True)
        statuses[k] = killed_at(k, lambda where=where: partition(ds, 2, os.path.join(where, "parts"),
                                                                  features=features, method="metis",
                                                                  progress=False))
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

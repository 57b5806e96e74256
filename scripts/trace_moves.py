"""Count the moves between the package's files that one batch makes, from a trace of calls (sys.setprofile).

A move is a step of the trace (a call or a return) that leaves one of the package's files for another; a
move *back* enters a file the trip had already left.  Every thread the trip runs on is traced (the caller's
and the threads the trip started, such as a cache's readers), each thread's path counted on its own and
the counts added.  Two trips, each traced after a warm-up, so that first-use work (imports, kernel loads,
thread starts) is not counted:

* ``dgl``: one batch from DGL's sampler through directload's DataLoader to the CPU gather (DGL lane);
* ``tiered``: one read through a TieredStore (device cache -> host cache -> TensorStore).

Prints each trip's moves, moves back and files, and with ``--path`` the files in the order visited.  A
move counts returns as well as calls; ``calls`` counts only the real edges, a call from a function in one
of the package's files to one in another (the caller being the nearest frame of the package's own), and
``back`` of those the calls into a file still on the caller's stack (a lower layer calling up into a file
that called it: a corridor back through a seam).
"""

import argparse
import sys
import threading
from collections import defaultdict
from pathlib import Path

import torch

ROOTS = ("directload", "kernels", "loaders")


def _ours(filename):
    """The file's path inside the package (``directload/stores/cache.py``), or None for anyone else's."""
    parts = Path(filename).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ROOTS and "site-packages" not in parts[:i]:
            return "/".join(parts[i:])
    return None


class Tracer:
    """A profiler on this thread and on every thread started while it is installed (``with Tracer()``), that
    records the package files each thread stands in, one per step, only inside :meth:`record`."""

    def __init__(self):
        self.steps = defaultdict(list)  # thread ident -> files
        self.calls = defaultdict(list)  # thread ident -> (caller file, callee file, callee on the stack)
        self._on = False

    def _profile(self, frame, event, arg):
        if self._on and event in ("call", "return"):
            name = _ours(frame.f_code.co_filename)
            if name is not None:
                self.steps[threading.get_ident()].append(name)
                if event == "call":
                    self._call(frame, name)

    def _call(self, frame, callee):
        stack = []  # the package's files on the caller's stack, nearest first
        f = frame.f_back
        while f is not None:
            name = _ours(f.f_code.co_filename)
            if name is not None:
                stack.append(name)
            f = f.f_back
        if stack and stack[0] != callee:
            self.calls[threading.get_ident()].append((stack[0], callee, callee in stack[1:]))

    def __enter__(self):
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)

    def record(self, fn):
        self._on = True
        try:
            fn()
        finally:
            self._on = False


def trip_moves(steps_by_thread):
    """``(moves, moves back, files, threads, paths)`` of a trip over several threads: each thread's path
    counted on its own, the counts added."""
    total = back = 0
    files, paths = {}, []
    for steps in steps_by_thread.values():
        n, b, f, path = moves(steps)
        total, back = total + n, back + b
        files.update(dict.fromkeys(f))
        paths.append(path)
    return total, back, list(files), len(paths), paths


def call_edges(calls_by_thread):
    """``(calls across files, of them calls back into a file on the stack)`` over every thread.

    Examples
    --------
    >>> call_edges({1: [("a.py", "b.py", False), ("b.py", "a.py", True)], 2: [("c.py", "b.py", False)]})
    (3, 1)
    """
    edges = [c for calls in calls_by_thread.values() for c in calls]
    return len(edges), sum(1 for _, _, back in edges if back)


def moves(steps):
    """``(moves, moves back, files in the order first visited, the path of files)``."""
    path = [f for i, f in enumerate(steps) if i == 0 or f != steps[i - 1]]
    seen, back = set(), 0
    for i, f in enumerate(path):
        if i and f in seen:
            back += 1
        seen.add(f)
    return max(len(path) - 1, 0), back, list(dict.fromkeys(path)), path


# Each trip sets itself up, warms up, and returns (one step to trace, what closes it).


def trip_dgl():
    import dgl

    from directload import to_unified
    from directload.loaders import DataLoader

    torch.manual_seed(0)
    n = 2000
    g = dgl.rand_graph(n, 20000)
    g.ndata["feat"] = to_unified(torch.randn(n, 64))
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = DataLoader(g, torch.arange(n), sampler, batch_size=64, shuffle=False, sample_in_thread=False,
                        overlap=False)
    it = iter(loader)
    next(it)  # warm-up
    return lambda: next(it), it.close


def trip_tiered():
    from directload.stores import TensorStore, TieredStore

    gen = torch.Generator().manual_seed(0)
    table = torch.randn(10_000, 64, generator=gen)
    store = TieredStore(TensorStore(table), gpu_bytes=256 * 256, host_bytes=1024 * 256, policy="lru")
    for _ in range(2):  # warm-up
        store.read(torch.randint(0, 10_000, (512,), generator=gen))
    batch = torch.randint(0, 10_000, (512,), generator=gen)  # the same batch every run: the same trip
    return lambda: store.read(batch), store.close


TRIPS = {"dgl": trip_dgl, "tiered": trip_tiered}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trips", nargs="*", metavar="TRIP",
                   help=f"which trips (of: {', '.join(sorted(TRIPS))}; default all)")
    p.add_argument("--path", action="store_true", help="print each trip's files in the order visited")
    args = p.parse_args(argv)
    unknown = [t for t in args.trips if t not in TRIPS]
    if unknown:
        p.error(f"no trip {unknown[0]!r}: one of {', '.join(sorted(TRIPS))}")
    print(f"{'trip':<8} {'moves':>6} {'back':>6} {'files':>6} {'threads':>8} {'calls':>6} {'back':>6}")
    for name in args.trips or sorted(TRIPS):
        with Tracer() as tracer:  # installed first: threads the trip starts are traced too
            run, close = TRIPS[name]()
            try:
                tracer.record(run)
            finally:
                close()
        n, back, files, threads, paths = trip_moves(tracer.steps)
        calls, calls_back = call_edges(tracer.calls)
        print(f"{name:<8} {n:>6} {back:>6} {len(files):>6} {threads:>8} {calls:>6} {calls_back:>6}")
        if args.path:
            for path in paths:
                print("   " + " -> ".join(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

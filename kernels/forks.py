"""fork(): what it waits for in the parent, and what a forked child resets, so a child forked at any moment
gathers instead of hanging.

A lock that another thread holds at ``fork()`` stays held for ever in the child, where that thread does not
exist; a thread pool that the parent started is a pool of threads the child does not have.  So:

* ``fork()`` waits (up to :data:`IMPORT_WAIT_S`) while another thread imports a module: importlib's
  per-module locks are not reset in a child, and a child importing that module at its first gather (Numba
  imports hundreds lazily at a first compile) waited on its lock for ever;
* then takes Numba's compiler lock and llvmlite's C-API lock (a thread can hold the second outside the
  first), so no thread is compiling or inside LLVM when the process forks; the child starts with both free;
* the child marks itself forked (:func:`forked`): CPU gathers run serially there, since its inherited
  OpenMP runtimes would hang (GNU libgomp) or abort (Numba's "fork() called from a process already using
  GNU OpenMP") at their first parallel region;
* and sets torch's intra-op threads to one, as torch's DataLoader does in its forked workers: torch's own
  ops above their grain size otherwise hang at the child's first one.  A child that knows better may call
  ``torch.set_num_threads`` again;
* and gives the child tqdm locks of its own (:func:`fresh_progress_locks`): tqdm shares one
  ``multiprocessing`` lock (a semaphore) with every forked child, so a child killed while it drew a bar
  (SIGKILL, the OOM killer) left it held, and the parent's next progress bar, and every other child's,
  waited for ever.  The child's bars are no longer kept apart from the parent's on the terminal.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
from numba.core.compiler_lock import global_compiler_lock

__all__ = ["forked", "fresh_progress_locks", "IMPORT_WAIT_S", "TORCH_ON_OPENMP"]

#: The longest fork() waits for another thread's import to end (then it forks anyway).
IMPORT_WAIT_S = 10.0
#: Whether torch runs its intra-op parallel regions on OpenMP (a team that does not survive fork).
TORCH_ON_OPENMP = "OpenMP" in torch.__config__.parallel_info().rsplit("ATen parallel backend:", 1)[-1]
_forked = False


def forked() -> bool:
    """Whether this process was forked from one that had loaded directload's kernels."""
    return _forked


def _llvm_lock():
    """llvmlite's lock around its C API, or None.  llvmlite offers no public handle on it."""
    from llvmlite.binding import ffi

    return getattr(getattr(getattr(ffi, "lib", None), "_lock", None), "_lock", None)


_LLVM_LOCK = _llvm_lock()


def _imports_elsewhere():
    """Whether a thread other than this one holds an importlib module lock (is importing a module).
    importlib keeps them in a private table, read here without changing it."""
    import importlib._bootstrap as bootstrap

    me = threading.get_ident()
    for ref in list(getattr(bootstrap, "_module_locks", {}).values()):
        lock = ref()
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            return True
    return False


def _before():
    deadline = time.monotonic() + IMPORT_WAIT_S
    while _imports_elsewhere() and time.monotonic() < deadline:
        time.sleep(0.001)
    global_compiler_lock.acquire()
    if _LLVM_LOCK is not None:
        _LLVM_LOCK.acquire()


def _release():
    if _LLVM_LOCK is not None:
        _LLVM_LOCK.release()
    global_compiler_lock.release()


def fresh_progress_locks() -> None:
    """Forget tqdm's write locks (its ``multiprocessing`` lock, shared with the parent and its other children,
    its thread lock, and each bar class's lock), so that this process's next bar makes locks of its own."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return
    lock_class = std.TqdmDefaultWriteLock
    if "mp_lock" in vars(lock_class):
        del lock_class.mp_lock
    lock_class.th_lock = std.TRLock()
    classes = [std.tqdm]
    while classes:
        cls = classes.pop()
        if "_lock" in vars(cls):
            delattr(cls, "_lock")
        classes.extend(cls.__subclasses__())


def _after_in_child():
    global _forked
    _forked = True
    _release()
    if TORCH_ON_OPENMP:
        torch.set_num_threads(1)
    fresh_progress_locks()


os.register_at_fork(before=_before, after_in_parent=_release, after_in_child=_after_in_child)

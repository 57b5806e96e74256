"""Loading CPU kernels when it pays: one home for the rule the plain gather and the decoding gather follow.

A Numba kernel loads from the on-disk cache in 0.3-0.75 s, most of it imports that hold the GIL; a gather can run
torch's own path meanwhile, bit for bit the same.  So each kind of kernel keeps, per process, which of its
kernels are loaded and which are loading, and the seconds gathers of that kind have spent on torch's path: once
those reach the kind's threshold (what the load costs over what the kernel saves: ski rental), the load starts on
a daemon thread.  ``prepare`` loads at once, as long jobs and benchmarks do.  A forked child that inherited no
loaded kernel never loads: its gathers are serial, and torch's path does them without the load.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from . import forks

__all__ = ["KernelLoads"]

K = TypeVar("K", bound=Hashable)


class KernelLoads(Generic[K]):
    """The kernels of one kind in this process, each named by a key: loaded, loading, or neither.

    ``load(key)`` loads one kernel (raising if it cannot); ``name`` names the loading thread.

    Examples
    --------
    >>> loads = KernelLoads(lambda key: None, name="demo-load")
    >>> loads.ready("k"), loads.note_fallback(0.4, ["k"], after=1.0), loads.ready("k")
    (False, False, False)
    >>> loads.prepare(["k"], background=False); loads.ready("k")
    True
    """

    def __init__(self, load: Callable[[K], object], *, name: str) -> None:
        self._load, self._name = load, name
        self._loaded: set[K] = set()
        self._loading: dict[K, threading.Thread] = {}  # key -> the thread loading it
        self._lock = threading.Lock()
        self.fallback_s = 0.0  # seconds gathers of this kind have spent on torch's path in this process

    def ready(self, key: K) -> bool:
        """Whether ``key``'s kernel is loaded (a gather runs it at once)."""
        return key in self._loaded

    def loading(self, key: K) -> bool:
        """Whether ``key``'s kernel is being loaded now."""
        return key in self._loading

    def note_fallback(self, seconds: float, keys: Iterable[K], *, after: float) -> bool:
        """A gather ran on torch's path for ``seconds`` because its kernel (of ``keys``) was not loaded: start
        their load in the background once such gathers have taken ``after`` seconds.  Whether it started one."""
        self.fallback_s += seconds
        if self.fallback_s < after:
            return False
        self.prepare(keys)
        return True

    def prepare(self, keys: Iterable[K], *, background: bool = True) -> None:
        """Load the kernels of ``keys`` not loaded or loading yet: on a daemon thread (``background``; a failed
        load is left for the next call, and a gather that needs the kernel keeps torch's path) or now (a failed
        load raises).  Idempotent; not in a forked child."""
        if forks.forked():
            return
        with self._lock:
            todo = [k for k in dict.fromkeys(keys) if k not in self._loaded and k not in self._loading]
            if not todo:
                return
            thread = threading.current_thread() if not background else threading.Thread(
                target=self._load_all, args=(todo,), name=self._name, daemon=True)
            for k in todo:
                self._loading[k] = thread
        if background:
            thread.start()
            return
        for k in todo:
            self._load_one(k)

    def _load_all(self, keys: list[K]) -> None:
        for k in keys:
            with contextlib.suppress(Exception):  # tried again by the next prepare
                self._load_one(k)

    def _load_one(self, key: K) -> None:
        """Load ``key``'s kernel; it is no longer loading afterwards, loaded or failed."""
        try:
            self._load(key)
            with self._lock:
                self._loaded.add(key)
        finally:
            with self._lock:
                self._loading.pop(key, None)

"""The GPU gather's runtime tuner: the first gather of a kind times every candidate and keeps the fastest.

A *kind* is a :class:`~directload.kernels.tune_keys.TuneKey`: the GPU and its driver, torch and its CUDA
runtime, a hash of the kernel sources, the row bytes, the element size, the alignment both tables share,
a power-of-2 bucket of the id count and a power-of-4 bucket of the table's bytes.  On the first gather of
a key, :meth:`Tuner.choose` times each candidate (:func:`directload.kernels.variants.candidates`) with
CUDA events, torch's own ``index_select`` over the mapped view first, within a budget of about 300 ms in
all, and keeps the fastest: so a choice is never slower than torch's path as timed.  Choices are kept in
memory and in a JSON file under ``directload.kernels.sources.cache_dir() / "tuner"``
(:class:`~directload.kernels.tune_store.ChoiceFile`); a new driver, torch or kernel source is a new key,
timed afresh.  ``DIRECTLOAD_TUNE=0`` turns timing off: :func:`directload.kernels.variants.default_variant`
is used instead.

The hot path is one dictionary lookup (``key_for`` from :mod:`directload.kernels.tune_keys`)::

    key = key_for(index.device, row_bytes, elem_bytes, n_ids, n_rows, align=legal_width(...))
    tuner = get_tuner()
    variant = tuner.lookup(key) or tuner.choose(key, candidates(row_bytes, src_addr, out_addr), run)

where ``run(variant)`` launches one gather with ``variant`` on the current stream of the current device
(the timer records its events there).  Timing synchronizes with the device once per measurement, on the
first gather of a key only.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .tune_store import ChoiceFile, TuneRecord, one_line
from .variants import Variant, default_variant

if TYPE_CHECKING:
    from .tune_keys import TuneKey

#: ``timer(fn)``: the milliseconds of one call of ``fn``.
Timer = Callable[[Callable[[], object]], float]

__all__ = ["Tuner", "CudaEventTimer", "get_tuner", "tuning_enabled", "time_candidates", "tuner_state", "ENV_VAR",
           "BUDGET_S", "REPEATS"]

#: ``DIRECTLOAD_TUNE=0`` (or ``off``, ``false``, ``no``) turns timing off.
ENV_VAR = "DIRECTLOAD_TUNE"
#: Seconds of wall time one key's timing may take, warm-ups and synchronizations included.
BUDGET_S = 0.3
#: Timed calls per candidate after its warm-up (fewer where the budget runs out); the median is kept.
REPEATS = 5
_OFF = frozenset({"0", "off", "false", "no"})


def tuning_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the tuner times candidates: yes unless ``DIRECTLOAD_TUNE`` is ``0``, ``off``, ``false`` or ``no``.

    >>> tuning_enabled({}), tuning_enabled({"DIRECTLOAD_TUNE": "0"}), tuning_enabled({"DIRECTLOAD_TUNE": "1"})
    (True, False, True)
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() not in _OFF


class CudaEventTimer:
    """Milliseconds of one call of ``fn``, between two CUDA events on the current stream of the current
    device; one synchronize per measurement.

    Examples
    --------
    >>> timer = CudaEventTimer()  # touches no GPU until called
    >>> timer(lambda: None) >= 0.0 if torch.cuda.is_available() else True
    True
    """

    def __call__(self, fn: Callable[[], object]) -> float:
        stream = torch.cuda.current_stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end)


def _timing_order(candidates):
    """``index_select`` (unsorted) first, added if missing, so torch's path is always timed; the rest as
    given, once each."""
    torch_path = Variant("index_select")
    return [torch_path] + [v for v in dict.fromkeys(candidates) if v != torch_path]


def _median_ms(fn, timer, clock, deadline, repeats):
    """A warm-up call, then up to ``repeats`` timed ones (at least one, the rest only before ``deadline``)."""
    timer(fn)
    samples = []
    while len(samples) < repeats and (not samples or clock() < deadline):
        ms = float(timer(fn))
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"the timer measured {ms} ms")
        samples.append(ms)
    return statistics.median(samples)


def time_candidates(key: TuneKey, candidates: Sequence[Variant], run: Callable[[Variant], object], *, timer: Timer,
                    clock: Callable[[], float] = time.monotonic, budget_s: float = BUDGET_S,
                    repeats: int = REPEATS) -> TuneRecord:
    """Time each candidate and pick the fastest.  ``index_select`` goes first and is always timed (it is
    added where ``candidates`` lack it).

    A candidate is begun only while the budget lasts (from the first call of ``clock``), and a candidate
    begun gets its warm-up and at least one timed call, so the budget is overrun by at most two calls of
    the slowest candidate.  A candidate that raises is recorded as failed.

    Parameters
    ----------
    key : TuneKey
        What the record will hold for.
    candidates : sequence of Variant
        What to time (:func:`directload.kernels.variants.candidates`).
    run : callable
        ``run(variant)`` launches one gather with ``variant``.
    timer : callable
        ``timer(fn)`` calls ``fn`` once and returns its milliseconds (:class:`CudaEventTimer`).
    clock : callable
        Seconds, for the budget.
    budget_s : float
        Seconds of wall time in all.
    repeats : int
        Timed calls per candidate after its warm-up; the median is kept.

    Returns
    -------
    TuneRecord
        The fastest timed candidate (the earlier on a tie); ``index_select`` where every candidate failed.

    Examples
    --------
    >>> ms = {"index_select": 0.5, "naive": 0.3}
    >>> timer = lambda fn: fn()  # run returns its own "milliseconds" here
    >>> from directload.kernels.tune_keys import TuneKey
    >>> key = TuneKey("GPU", "1", "2", "12", "abc", 400, 4, 16, 1024, 1 << 28)
    >>> rec = time_candidates(key, [Variant("index_select"), Variant("naive")], lambda v: ms[v.name], timer=timer)
    >>> rec.chosen, rec.times_ms
    ('naive', (('index_select', 0.5), ('naive', 0.3)))
    """
    if not candidates:
        raise ValueError("the tuner needs at least one candidate")
    order = _timing_order(list(candidates))
    deadline = clock() + budget_s
    times, failed, untimed = {}, {}, []
    for i, variant in enumerate(order):
        if i and clock() >= deadline:
            untimed = [v.name for v in order[i:]]
            break
        try:
            times[variant.name] = _median_ms(functools.partial(run, variant), timer, clock, deadline, repeats)
        except Exception as exc:  # a candidate that cannot run here (compile, launch, resources): skipped
            failed[variant.name] = one_line(exc)
    if times:
        chosen, note = min(times, key=times.__getitem__), ""
    else:
        chosen, note = "index_select", "every candidate failed; fell back to index_select"
    return TuneRecord(key, chosen, tuple(times.items()), tuple(failed.items()), tuple(untimed), note,
                      budget_s * 1e3)


_tuners: weakref.WeakSet[Tuner] = weakref.WeakSet()
_DEFAULT: Any = object()  # Tuner's store when none is passed: the default cache file


class Tuner:
    """Chosen variants, by key: looked up in memory, timed on first use, kept on disk.

    Parameters
    ----------
    timer : callable, optional
        ``timer(fn) -> milliseconds`` of one call (default: :class:`CudaEventTimer`).
    clock : callable
        Seconds, for the budget.
    store : ChoiceFile, str, os.PathLike or None
        The cache file (default: ``cache_dir()/tuner/choices.json``); ``None`` keeps choices in memory only.
    budget_s : float
        Seconds of timing per key (:func:`time_candidates`).
    repeats : int
        Timed calls per candidate.
    enabled : bool, optional
        Whether to time at all (default: :func:`tuning_enabled`, read now).

    Examples
    --------
    >>> ms = {"index_select": 0.5, "rowvec16x16": 0.2}
    >>> tuner = Tuner(timer=lambda fn: fn(), store=None, enabled=True)
    >>> from directload.kernels.tune_keys import TuneKey
    >>> key = TuneKey("GPU", "1", "2", "12", "abc", 400, 4, 16, 1024, 1 << 28)
    >>> tuner.lookup(key) is None
    True
    >>> tuner.choose(key, [Variant("index_select"), Variant("rowvec", 16, 16)], lambda v: ms[v.name]).name
    'rowvec16x16'
    >>> tuner.lookup(key).name
    'rowvec16x16'
    """

    def __init__(self, *, timer: Timer | None = None, clock: Callable[[], float] = time.monotonic,
                 store: ChoiceFile | os.PathLike[str] | str | None = _DEFAULT, budget_s: float = BUDGET_S,
                 repeats: int = REPEATS, enabled: bool | None = None) -> None:
        self.timer = CudaEventTimer() if timer is None else timer
        self.clock = clock
        self.store = ChoiceFile() if store is _DEFAULT else (
            store if store is None or isinstance(store, ChoiceFile) else ChoiceFile(store))
        self.budget_s, self.repeats = budget_s, repeats
        self.enabled = tuning_enabled() if enabled is None else bool(enabled)
        self._choices: dict[TuneKey, Variant] = {}  # the hot path
        self._records: dict[TuneKey, TuneRecord] = {}
        self._loaded = self.store is None or not self.enabled  # timing off: the defaults, not the file's
        self._lock = threading.Lock()  # the two dicts and the load
        self._timing = threading.Lock()  # one key timed at a time (two would disturb each other's times)
        _tuners.add(self)

    def lookup(self, key: TuneKey) -> Variant | None:
        """The chosen :class:`Variant` for ``key``, or ``None`` if it has not been chosen.  A dict lookup
        (the cache file is read on the first call)."""
        if not self._loaded:
            self._load()
        return self._choices.get(key)

    def record(self, key: TuneKey) -> TuneRecord | None:
        """The :class:`TuneRecord` of ``key``, or ``None``."""
        self.lookup(key)
        return self._records.get(key)

    def choose(self, key: TuneKey, candidates: Sequence[Variant], run: Callable[[Variant], object], *,
               timer: Timer | None = None) -> Variant:
        """The variant for ``key``: the one chosen before, else the fastest of ``candidates``, timed now.

        With timing off (``DIRECTLOAD_TUNE=0``), :func:`~directload.kernels.variants.default_variant`.  A
        timing that was cut short by the budget, or where every candidate failed, is kept for this process
        only; a complete one is saved to the cache file too.

        Parameters
        ----------
        key : TuneKey
            The gather's key.
        candidates : sequence of Variant
            What to time.
        run : callable
            ``run(variant)`` launches one gather with ``variant`` on the current stream.
        timer : callable, optional
            For this timing instead of the tuner's.
        """
        found = self.lookup(key)
        if found is not None:
            return found
        with self._timing:
            found = self._choices.get(key)  # another thread may have timed it meanwhile
            if found is not None:
                return found
            if not self.enabled:
                variant = default_variant(key.row_bytes, key.align, key.align)
                with self._lock:
                    self._choices[key] = variant
                return variant
            record = time_candidates(key, candidates, run, timer=timer or self.timer, clock=self.clock,
                                     budget_s=self.budget_s, repeats=self.repeats)
            return self._keep(record)

    def report_failure(self, key: TuneKey, variant: Variant, error: BaseException) -> Variant:
        """``variant``, chosen for ``key``, failed when a gather ran it: mark it failed and return the next
        fastest timed candidate (``index_select`` if none)."""
        with self._timing:
            old = self.record(key)
            times = tuple(t for t in (old.times_ms if old else ()) if t[0] != variant.name)
            failed = (old.failed if old else ()) + ((variant.name, one_line(error)),)
            chosen = min(times, key=lambda t: t[1])[0] if times else "index_select"
            note = "" if times else f"{variant.name} failed; fell back to index_select"
            return self._keep(TuneRecord(key, chosen, times, failed, old.untimed if old else (), note,
                                         old.budget_ms if old else self.budget_s * 1e3))

    def _keep(self, record):
        variant = Variant.parse(record.chosen)
        with self._lock:
            self._records[record.key] = record
            self._choices[record.key] = variant
        if self.store is not None and record.complete and record.times_ms:
            self.store.save([record])
        return variant

    def _load(self):
        with self._lock:
            if self._loaded:
                return
            for record in self.store.load():
                self._records.setdefault(record.key, record)
                self._choices.setdefault(record.key, Variant.parse(record.chosen))
            self._loaded = True

    def table(self) -> list[dict[str, Any]]:
        """Every timed choice, this process's and the cache file's, as :meth:`TuneRecord.row` dicts sorted
        by key (timing off: the defaults in use are not listed)."""
        records = {r.key: r for r in (self.store.load() if self.store is not None else ())}
        with self._lock:
            records.update(self._records)
        return [records[k].row() for k in sorted(records)]

    def clear(self) -> bool:
        """Forget every choice, in memory and in the cache file; whether the file was there."""
        with self._timing, self._lock:
            self._choices.clear()
            self._records.clear()
            self._loaded = self.store is None or not self.enabled
            return self.store.clear() if self.store is not None else False


_default: Tuner | None = None
_default_lock = threading.Lock()


def get_tuner() -> Tuner:
    """This process's :class:`Tuner` (made on first use: the cache file, :class:`CudaEventTimer`, and
    ``DIRECTLOAD_TUNE`` as it is then).

    >>> get_tuner() is get_tuner()
    True
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Tuner()
    return _default


def tuner_state() -> dict[str, bool | str | int]:
    """What ``directload info`` shows: whether timing is on, the cache file, and how many choices it holds.

    >>> sorted(tuner_state())
    ['tuner_cache', 'tuner_choices', 'tuner_enabled']
    """
    store = ChoiceFile()
    return {"tuner_enabled": tuning_enabled(), "tuner_cache": str(store.path), "tuner_choices": len(store.load())}


def _after_fork_in_child():
    # A lock another thread held at fork() stays held in the child for ever: the child gets fresh ones.
    global _default_lock
    _default_lock = threading.Lock()
    for tuner in list(_tuners):
        tuner._lock, tuner._timing = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

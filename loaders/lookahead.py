"""The loaders' pipeline settings: on which thread it samples, whether it gathers on a thread of its own,
and how many batches it samples ahead (fixed, or chosen each epoch from the last one's stage times)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from directload.stores import CacheStats
from directload.units import check_int

if TYPE_CHECKING:
    from directload.stores import FeatureStore

__all__ = ["resolve_sampling", "resolve_overlap", "choose_lookahead", "check_lookahead", "AutoLookahead"]


def resolve_sampling(sample_in_thread: bool | None, num_workers: int) -> bool:
    """Whether stage 1 samples on a background thread.  Pure.

    DGL draws neighbours from a per-thread random stream, so sampling off the
    caller's thread changes which neighbours are drawn.  With worker processes
    (``num_workers > 0``) the draws happen in the workers either way, and a
    background thread only collects them; without, the default keeps sampling
    on the caller's thread so that batches equal DGL's bit for bit.

    Examples
    --------
    >>> resolve_sampling(None, 0), resolve_sampling(None, 4), resolve_sampling(True, 0)
    (False, True, True)
    """
    if sample_in_thread is None:
        return num_workers > 0
    return bool(sample_in_thread)


def resolve_overlap(overlap: bool | None, device: torch.device | str, cpu_count: int, torch_threads: int) -> bool:
    """Whether features are gathered on a background thread.  Pure.

    On a CUDA device the gather is GPU work on its own stream and the host
    thread only launches it, so it always overlaps training.  On the CPU it
    competes with training for cores: overlapping pays only when training
    leaves cores idle (measured on 2 cores with torch on both: training steps
    slowed by 25%, more than the gather saved).

    Examples
    --------
    >>> resolve_overlap(None, "cuda", 2, 2), resolve_overlap(None, "cpu", 2, 2), resolve_overlap(None, "cpu", 16, 8)
    (True, False, True)
    """
    if overlap is not None:
        return bool(overlap)
    return torch.device(device).type == "cuda" or cpu_count > torch_threads


def choose_lookahead(fetch_s: float, compute_s: float, bound: int, low: int = 1) -> int:
    """The look-ahead L that hides a batch's fetch behind compute, by Sentinel's model.  Pure.

    The fetch of batch ``i + L`` (``fetch_s`` seconds: its rows from disk into host slots) runs while
    batches ``i .. i + L - 1`` compute (``compute_s`` seconds each: sampling, gathering from the
    cache, training), so it is hidden when ``fetch_s <= (L - 1) * compute_s``, leaving one batch of
    slack: ``L = ceil(fetch_s / compute_s) + 1``, at least ``low`` and at most ``bound`` (how many
    batches the read-ahead slots hold).

    Examples
    --------
    >>> choose_lookahead(0.05, 0.1, bound=8), choose_lookahead(0.35, 0.1, bound=8), choose_lookahead(5, 0.1, bound=8)
    (2, 5, 8)
    >>> choose_lookahead(0.0, 0.0, bound=8)  # nothing measured yet
    1
    """
    if bound < low:
        return max(1, bound)
    if compute_s <= 0:
        return low if fetch_s <= 0 else bound
    return int(min(bound, max(low, math.ceil(fetch_s / compute_s - 1e-9) + 1)))


def check_lookahead(lookahead: object) -> int | str:
    """``lookahead`` as given when it is a positive integer or ``"auto"``, else ``ValueError``."""
    return check_int("lookahead", lookahead, also=("auto",))


class AutoLookahead:
    """``lookahead="auto"``: L for each epoch from the last one's measured stage times.

    The first epoch runs with ``start``.  At the end of each (:meth:`end`), the fetch time per batch
    comes from the caches behind the loader's stores (read-ahead and demand seconds, ``ahead_s +
    fallback_s``, over the batches they read during the epoch) and the compute time per batch from the
    pipeline (``compute_s``, what the training loop did between batches, plus sampling);
    :func:`choose_lookahead` picks the next epoch's L, bounded by the read-ahead slots
    (``staging_rows`` over the rows read ahead per batch).  ``chosen`` lists the L of every epoch.

    Examples
    --------
    >>> auto = AutoLookahead(start=4)
    >>> auto.begin([]), auto.chosen
    (4, [4])
    """

    def __init__(self, start: int = 4, bound: int = 64) -> None:
        self.start, self.bound = start, bound
        self.chosen: list[int] = []
        self._next = start
        self._before: dict[str, float] | None = None

    def begin(self, stores: Iterable[FeatureStore]) -> int:
        """L for the epoch starting now."""
        self._before = _cache_counters(stores)
        self.chosen.append(self._next)
        return self._next

    def end(self, stores: Iterable[FeatureStore], stats: Mapping[str, float]) -> None:
        """The epoch that began last ended normally, with pipeline ``stats``: choose the next L."""
        if self._before is None or not stats.get("batches"):
            return
        now = _cache_counters(stores)
        d = {k: now[k] - self._before[k] for k in now}
        if min(d["reads"], d["ahead_s"], d["fallback_s"], d["prefetched_rows"]) < 0:
            return  # the counters were reset meanwhile: keep the current L
        batches = stats["batches"]
        fetch = (d["ahead_s"] + d["fallback_s"]) / max(d["reads"], 1)
        compute = (stats["compute_s"] + stats["sample_s"]) / batches
        per_batch = d["prefetched_rows"] / max(d["reads"], 1)
        bound = self.bound if not per_batch else max(1, min(self.bound, int(now["staging_rows"] // per_batch)))
        self._next = choose_lookahead(fetch, compute, bound)
        self._before = None


def _cache_counters(stores):
    """Summed counters of every cache tier behind ``stores`` (a TieredStore's, or a cache's own)."""
    total = dict.fromkeys(("ahead_s", "fallback_s", "reads", "prefetched_rows", "staging_rows"), 0)
    for store in stores:
        for t in store.stats().tiers:
            if isinstance(t, CacheStats):
                for k in total:
                    total[k] += t[k]
    return total

"""The framework-neutral pipeline: every thread reports its failure, a silent death is noticed, nothing hangs."""

import pytest
import torch
from conftest import drain_from_threads, within

from directload.loaders.pipeline import BatchAdapter, Pipeline, PipelineError
from directload.stores import CacheStats, Stats, TieredStats


def _pipeline(overlap, sample_in_thread, device="cpu", batches=None):
    batches = iter(batches if batches is not None else [1, 2, 3])
    return Pipeline(batches, BatchAdapter(), device=device, lookahead=2, sample_in_thread=sample_in_thread,
                    overlap=overlap)


def test_a_gather_thread_that_fails_creating_its_stream_reports_it(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no CUDA stream here")

    monkeypatch.setattr(torch.cuda, "Stream", broken)
    p = _pipeline(overlap=True, sample_in_thread=False, device="cuda")
    with pytest.raises(RuntimeError, match="no CUDA stream here") as info:
        within(10, lambda: next(p))
    assert "feature gather thread" in "".join(getattr(info.value, "__notes__", []))


@pytest.mark.parametrize("role", ["_sample_loop", "_gather_loop"])
def test_each_thread_failing_at_its_first_line_reaches_the_consumer(monkeypatch, role):
    def fail(self):
        raise OSError(f"{role} failed at its first line")

    monkeypatch.setattr(Pipeline, role, fail)
    p = _pipeline(overlap=True, sample_in_thread=True)
    with pytest.raises(OSError, match="failed at its first line"):
        within(10, lambda: next(p))
    p.close()


@pytest.mark.parametrize("role", ["_sample_loop", "_gather_loop"])
def test_a_thread_that_ends_without_a_word_is_noticed(monkeypatch, role):
    monkeypatch.setattr(Pipeline, role, lambda self: None)
    p = _pipeline(overlap=True, sample_in_thread=True)
    with pytest.raises(PipelineError, match="ended without a batch, an end or an error"):
        within(10, lambda: next(p))


def test_a_failing_fetch_on_the_caller_closes_the_pipeline():
    class Failing(BatchAdapter):
        def finish(self, batch):
            raise ValueError("fetch failed")

    p = Pipeline(iter([1, 2]), Failing(), device="cpu", lookahead=1, sample_in_thread=True, overlap=False)
    with pytest.raises(ValueError, match="fetch failed"):
        within(10, lambda: next(p))
    assert p._stop.is_set()


def test_a_pipeline_takes_a_batch_adapter_and_nothing_else():
    with pytest.raises(TypeError, match="BatchAdapter"):
        Pipeline(iter([1]), lambda b: b, device="cpu", lookahead=1, sample_in_thread=False, overlap=False)


def test_choose_lookahead_hides_the_fetch_behind_compute_within_its_bound():
    from directload.loaders.pipeline import choose_lookahead

    assert choose_lookahead(0.05, 0.1, bound=8) == 2  # fits in one batch's compute, plus one of slack
    assert choose_lookahead(0.35, 0.1, bound=8) == 5
    assert choose_lookahead(0.3, 0.1, bound=8) == 4  # exactly three batches: no rounding up past it
    assert choose_lookahead(5.0, 0.1, bound=8) == 8  # the read-ahead slots hold no more
    assert choose_lookahead(0.0, 0.0, bound=8) == 1 and choose_lookahead(1.0, 0.0, bound=6) == 6
    assert choose_lookahead(1.0, 0.1, bound=0) == 1


class _FakeTier:
    """A store whose one cache tier reports the counters AutoLookahead reads."""

    def __init__(self):
        self.s = {"ahead_s": 0.0, "fallback_s": 0.0, "reads": 0, "prefetched_rows": 0, "staging_rows": 1000}

    def stats(self):
        return TieredStats([CacheStats("host", self.s), Stats("disk", {"reads": 1})])


def test_auto_lookahead_picks_each_epochs_l_from_the_last_ones_fetch_and_compute():
    from directload.loaders.pipeline import AutoLookahead

    store, auto = _FakeTier(), AutoLookahead(start=4)
    assert auto.begin([store]) == 4
    store.s.update(ahead_s=2.0, reads=10, prefetched_rows=100)  # 0.2 s of fetch per batch, 10 rows each
    auto.end([store], {"batches": 10, "compute_s": 0.9, "sample_s": 0.1})  # 0.1 s of compute per batch
    assert auto.begin([store]) == 3  # ceil(0.2 / 0.1) + 1
    store.s.update(ahead_s=2.0 + 50.0, reads=20, prefetched_rows=100 + 10 * 250)  # slow, and 250 rows a batch
    auto.end([store], {"batches": 10, "compute_s": 1.0, "sample_s": 0.0})
    assert auto.begin([store]) == 4  # the fetch wants 51, the read-ahead slots hold 1000 // 250 = 4 batches
    store.s.update(ahead_s=0.0, reads=0, prefetched_rows=0)  # the counters were reset meanwhile
    auto.end([store], {"batches": 10, "compute_s": 1.0, "sample_s": 0.0})
    assert auto.begin([store]) == 4 and auto.chosen == [4, 3, 4, 4]


@pytest.mark.parametrize("overlap, in_thread", [(False, False), (True, False), (False, True), (True, True)])
def test_one_epoch_shared_by_two_threads_hands_every_batch_to_exactly_one(overlap, in_thread):
    for _ in range(5):
        p = _pipeline(overlap=overlap, sample_in_thread=in_thread, batches=range(1, 200))
        assert sorted(drain_from_threads(p)) == list(range(1, 200))

"""The framework-neutral pipeline: every thread reports its failure, a silent death is noticed, nothing hangs."""

import pytest
import torch
from conftest import within

from directload.loaders.pipeline import Pipeline, PipelineError


def _pipeline(overlap, sample_in_thread, device="cpu", batches=None):
    batches = iter(batches if batches is not None else [1, 2, 3])
    return Pipeline(batches, start=lambda b: b, finish=lambda b: b, device=device, lookahead=2,
                    sample_in_thread=sample_in_thread, overlap=overlap)


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
    def finish(batch):
        raise ValueError("fetch failed")

    p = Pipeline(iter([1, 2]), start=lambda b: b, finish=finish, device="cpu", lookahead=1, sample_in_thread=True,
                 overlap=False)
    with pytest.raises(ValueError, match="fetch failed"):
        within(10, lambda: next(p))
    assert p._stop.is_set()

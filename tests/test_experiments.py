"""Side-by-side runs under conditions (a CPU hog, say): every (seed, condition) runs each loader in turn, the
conditions interleaved, and the summary compares each loader with the reference under the same condition
and with its own runs under the first condition."""

import contextlib
from dataclasses import dataclass, field

import pytest

from directload.harness import experiments
from directload.harness.train import TrainConfig


@dataclass
class _Epoch:
    epoch_s: float
    sample_s: float = 0.0
    gather_s: float = 0.0
    train_s: float = 0.0
    wait_s: float = 0.0


@dataclass
class _Result:
    epochs: list
    valid_acc: float = 0.5
    test_acc: float = 0.5
    config: dict = field(default_factory=dict)
    warm: dict = None
    ranks: list = None
    budget: dict = None
    stages: dict = field(default_factory=dict)


# epoch seconds by (condition, loader): the hog slows DGL's loader 3x and directload's 2x
_EPOCH = {("quiet", "dgl"): 2.0, ("quiet", "directload"): 1.8, ("hog", "dgl"): 6.0, ("hog", "directload"): 3.6}


@pytest.fixture
def runs(monkeypatch):
    """``train`` replaced by a recorder: each call's (condition, loader, seed) in order."""
    calls, state = [], {"condition": None}

    def fake_train(dataset, cfg, progress=True):
        calls.append((state["condition"], cfg.loader, cfg.seed))
        s = _EPOCH[state["condition"], cfg.loader] * (1 + 0.1 * cfg.seed)
        return _Result([_Epoch(s * 2), _Epoch(s)])  # a first epoch, then a steady one

    monkeypatch.setattr(experiments, "train", fake_train)

    def condition(name):
        @contextlib.contextmanager
        def entered():
            state["condition"] = name
            yield
            state["condition"] = None
        return entered

    return calls, [("quiet", condition("quiet")), ("hog", condition("hog"))]


def test_conditions_interleave_per_seed_and_wrap_each_run(runs):
    calls, conditions = runs
    rows = experiments.compare(None, TrainConfig(), seeds=(0, 1), conditions=conditions, progress=False)
    assert calls == [("quiet", "dgl", 0), ("quiet", "directload", 0), ("hog", "dgl", 0), ("hog", "directload", 0),
                     ("quiet", "dgl", 1), ("quiet", "directload", 1), ("hog", "dgl", 1), ("hog", "directload", 1)]
    assert [r["condition"] for r in rows] == [c for c, _, _ in calls]


def test_the_summary_compares_within_a_condition_and_against_the_first(runs):
    calls, conditions = runs
    rows = experiments.compare(None, TrainConfig(), seeds=(0, 1, 2), conditions=conditions, progress=False)
    summary = {(r["condition"], r["loader"]): r for r in experiments.summarize(rows)}
    assert list(summary) == [("quiet", "dgl"), ("quiet", "directload"), ("hog", "dgl"), ("hog", "directload")]
    assert summary["quiet", "directload"]["epoch_vs_reference"] == pytest.approx(0.9)
    assert summary["hog", "directload"]["epoch_vs_reference"] == pytest.approx(0.6)  # DGL's under the hog
    assert summary["hog", "dgl"]["epoch_vs_baseline"] == pytest.approx(3.0)
    assert summary["hog", "directload"]["epoch_vs_baseline"] == pytest.approx(2.0)
    assert summary["hog", "dgl"]["baseline"] == "quiet"
    assert "epoch_vs_baseline" not in summary["quiet", "dgl"]


def test_runs_without_conditions_keep_their_rows_as_before(runs):
    calls, _ = runs
    with pytest.raises(KeyError):  # the recorder knows no condition None: show that none was entered
        experiments.compare(None, TrainConfig(), seeds=(0,), progress=False)
    assert calls == [(None, "dgl", 0)]


def test_the_table_names_each_condition_and_the_slowdown(runs, capsys):
    _, conditions = runs
    rows = experiments.compare(None, TrainConfig(), seeds=(0,), conditions=conditions, progress=False)
    experiments.print_summary(experiments.summarize(rows), {"dataset": "d", "nodes": 1, "edges": 1, "feats": 1,
                                                             "device": "cpu", "torch_threads": 2,
                                                             "openmp_wait_policy": "passive"})
    out = capsys.readouterr().out
    assert "OpenMP wait policy passive" in out and "epoch vs quiet" in out
    hog_directload = next(line for line in out.splitlines() if " hog " in line and "directload" in line)
    assert "2.000 (2.000-2.000)" in hog_directload and "0.600" in hog_directload


def test_the_report_says_where_each_stage_ran(monkeypatch, capsys):
    from types import SimpleNamespace

    from directload.harness.train_inputs import stage_devices

    def fake_train(dataset, cfg, progress=True):
        where = SimpleNamespace(device="cuda", loader=cfg.loader, sampler="directload", framework="pyg",
                                features="memory")
        return _Result([_Epoch(2.0), _Epoch(1.0)], stages=stage_devices(where))

    monkeypatch.setattr(experiments, "train", fake_train)
    rows = experiments.compare(None, TrainConfig(), seeds=(0,), progress=False)
    summary = experiments.summarize(rows)
    assert {r["loader"]: r["stages"]["sample"] for r in summary} == {"dgl": "cpu", "directload": "cuda"}
    experiments.print_summary(summary, {"dataset": "d", "nodes": 1, "edges": 1, "feats": 1, "device": "cuda",
                                        "torch_threads": 2, "openmp_wait_policy": "passive"})
    out = capsys.readouterr().out
    assert "sage/directload ran: sample on cuda, gather on cuda, train on cuda" in out
    assert "sage/dgl ran: sample on cpu, gather on cpu, train on cuda" in out

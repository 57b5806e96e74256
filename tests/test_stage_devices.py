"""Where each stage of a run's batches runs, as the harness decides it and the report says it: on a GPU,
directload's loader with directload's sampler samples, gathers and trains there; a framework's own loader
samples and gathers on the CPU."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from directload.harness import experiments
from directload.harness.train import TrainConfig
from directload.harness.train_inputs import stage_devices


def _cfg(**kw):
    base = dict(device="cuda", loader="directload", sampler="directload", framework="pyg", features="memory")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("changes,sample,gather", [
    ({}, "cuda", "cuda"),
    ({"framework": "dgl"}, "cuda", "cuda"),
    ({"sampler": "framework"}, "cpu", "cuda"),
    ({"loader": "pyg"}, "cpu", "cpu"),
    ({"loader": "dgl", "framework": "dgl"}, "cpu", "cpu"),
    ({"features": "disk"}, "cpu", "cuda"),  # PyG over a disk store: its reads start on the host
    ({"features": "disk", "framework": "dgl"}, "cuda", "cuda"),
    ({"device": "cpu"}, "cpu", "cpu"),
])
def test_the_stage_devices_of_a_run(changes, sample, gather):
    cfg = _cfg(**changes)
    assert stage_devices(cfg) == {"sample": sample, "gather": gather, "train": cfg.device}


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
    stages: dict
    valid_acc: float = 0.5
    test_acc: float = 0.5
    config: dict = field(default_factory=dict)
    warm: dict = None
    ranks: list = None
    budget: dict = None


def test_the_report_says_where_each_stage_ran(monkeypatch, capsys):
    def fake_train(dataset, cfg, progress=True):
        return _Result([_Epoch(2.0), _Epoch(1.0)], stage_devices(_cfg(loader=cfg.loader)))

    monkeypatch.setattr(experiments, "train", fake_train)
    rows = experiments.compare(None, TrainConfig(), seeds=(0,), progress=False)
    summary = experiments.summarize(rows)
    assert {r["loader"]: r["stages"]["sample"] for r in summary} == {"dgl": "cpu", "directload": "cuda"}
    experiments.print_summary(summary, {"dataset": "d", "nodes": 1, "edges": 1, "feats": 1, "device": "cuda",
                                        "torch_threads": 2, "openmp_wait_policy": "passive"})
    out = capsys.readouterr().out
    assert "sage/directload ran: sample on cuda, gather on cuda, train on cuda" in out
    assert "sage/dgl ran: sample on cpu, gather on cpu, train on cuda" in out

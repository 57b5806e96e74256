"""Where each stage of a run's batches runs, as the harness decides it: on a GPU, directload's loader with
directload's sampler samples, gathers and trains there; a framework's own loader samples and gathers on the
CPU.  (tests/test_experiments.py checks that the report says so.)"""

from types import SimpleNamespace

import pytest

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


"""The training harness finds each framework's side by name in one registry (SIDES); the sides import
directload.harness.train_inputs, never directload.harness.train, so there is no import cycle."""

import subprocess
import sys

import pytest

from directload.harness import train


def test_unknown_frameworks_are_refused_by_name_before_any_import():
    with pytest.raises(ValueError, match="no framework 'mxnet': one of dgl, pyg"):
        train.framework_side("mxnet")
    with pytest.raises(ValueError, match=r"framework must be one of \('dgl', 'pyg'\), got 'mxnet'"):
        train.TrainConfig(framework="mxnet")


def test_a_registered_side_is_what_a_run_gets(monkeypatch):
    monkeypatch.setattr(train, "SIDES", dict(train.SIDES))
    train.register_framework("mine", "directload.harness.train_inputs")  # any importable module
    assert train.framework_side("mine").__name__ == "directload.harness.train_inputs"
    assert train.TrainConfig(framework="mine").framework == "mine"


def test_importing_a_side_first_does_not_import_the_harness():
    side = "directload.harness.train_dgl" if _has("dgl") else "directload.harness.train_pyg"
    code = f"import sys, {side}; print('directload.harness.train' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None

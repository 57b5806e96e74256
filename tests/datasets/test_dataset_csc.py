"""Dataset.csc: a kept graph that CSCGraph.load refuses, for any reason, is rebuilt from edge_index and saved
again, with one warning per dataset directory naming why."""

import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

import directload.datasets.ogb_loader as ogb_loader
from directload.datasets import SynthConfig, load, synthesize
from directload.datasets.ogb_loader import KeptGraphWarning
from directload.graph import CSCGraph

SMALL = SynthConfig(num_nodes=400, avg_degree=4, num_feats=4, num_classes=3, chunk_nodes=150)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    where = tmp_path_factory.mktemp("datasets")
    synthesize(where, "synth-tiny", progress=False, config=SMALL)
    return where


@pytest.fixture
def kept(root, monkeypatch):
    """The dataset with its graph built and kept in csc/, and no warning given yet."""
    monkeypatch.setattr(ogb_loader, "_WARNED", set())
    ds = load(root, "synth-tiny", affinity="host")
    shutil.rmtree(ds.path / "csc", ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none kept yet: built without a word
        want = ds.csc(affinity="host")
    return ds.path / "csc", want


def _csc_of(root):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = load(root, "synth-tiny", affinity="host").csc(affinity="host")
    return g, [w for w in caught if "kept graph" in str(w.message)]


def _damage(where, how):
    if how in ("[]", "null", "1", "{"):
        (where / "graph.json").write_text(how)
    elif how == "format 99":
        meta = json.loads((where / "graph.json").read_text())
        (where / "graph.json").write_text(json.dumps({**meta, "format": 99}))
    elif how == "empty part":
        (where / "indices.npy").write_bytes(b"")
    elif how == "retyped part":
        data = (where / "indptr.npy").read_bytes()
        (where / "indptr.npy").write_bytes(data.replace(b"'<i4'", b"'<f4'", 1))
    elif how == "manifest is a FIFO":
        (where / "graph.json").unlink()
        os.mkfifo(where / "graph.json")  # reading it would wait for ever


@pytest.mark.parametrize("how,why", [
    ("[]", "GraphError: .*graph.json: a JSON array, not an object"),
    ("null", "a JSON null"),
    ("1", "a JSON number"),
    ("{", "not JSON"),
    ("format 99", "field 'format' is 99"),
    ("empty part", "indices.npy: not a valid .npy file"),
    ("retyped part", "indptr.npy: its header says <f4"),
    ("manifest is a FIFO", "graph.json: a FIFO, not a regular file"),
])
def test_a_refused_graph_is_rebuilt_saved_again_and_said_once(root, kept, how, why):
    where, want = kept
    _damage(where, how)
    got, said = _csc_of(root)
    assert len(said) == 1 and said[0].category is KeptGraphWarning and issubclass(KeptGraphWarning, RuntimeWarning)
    assert re.search(why, str(said[0].message)) and "rebuilding it from edge_index" in str(said[0].message)
    assert got.digest() == want.digest() and np.array_equal(got.numpy()[1], want.numpy()[1])
    again, said = _csc_of(root)  # saved again, whole: mapped without a word
    assert said == [] and type(again.indices).__name__ == "UnifiedTensor" and again.digest() == want.digest()
    assert json.loads((where / "graph.json").read_text())["digest"] == want.digest()


def test_a_graph_that_cannot_be_saved_again_is_said_once_per_directory(root, kept, monkeypatch):
    where, want = kept
    _damage(where, "[]")

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(CSCGraph, "save", read_only)
    first, said_first = _csc_of(root)
    second, said_second = _csc_of(root)
    assert len(said_first) == 1 and said_second == []  # the same directory: once
    assert first.digest() == second.digest() == want.digest()
    assert isinstance(first.indices, torch.Tensor) and first.device.type == "cpu"
    assert os.path.isfile(where / "graph.json") and (where / "graph.json").read_text() == "[]"

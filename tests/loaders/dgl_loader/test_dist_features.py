"""The DistDGL feature source on partitions DGL wrote alone, indexed as DGL's ``DistTensor`` is (``x[ids]``,
``shape``, ``dtype``, ``len``), with bad ids refused in one typed line before any read."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from directload.stores import TensorStore

dgl = pytest.importorskip("dgl")
from directload.loaders.dgl import distributed as dd  # noqa: E402

CHILD = Path(__file__).with_name("dist_standalone.py")


def test_dgls_own_partitions_feed_the_feature_source_as_distTensor_does(tmp_path):
    # Before: FileNotFoundError, "directload-partitions.json is missing", on partitions DGL wrote alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGL_")} | {"DGLBACKEND": "pytorch"}
    child = subprocess.run([sys.executable, str(CHILD), str(tmp_path)], capture_output=True, text=True, env=env,
                           timeout=600)  # a hang guard only
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["is_dist_features"]
    assert report["shape"][0] == report["shape"][1] == [300, 4]
    assert report["dtype"][0] == report["dtype"][1] and report["len"] == [300, 300]
    assert report["good"] and all(report["good"].values()), report["good"]
    bad = report["bad"]
    assert bad["floats"].startswith("TypeError") and bad["booleans"].startswith("TypeError"), bad
    assert bad["2-D"].startswith("TypeError: ids must be 1-D") and bad["a string"].startswith("TypeError"), bad
    assert bad["past the end"].startswith("IndexError") and bad["negative"].startswith("IndexError"), bad


@pytest.fixture
def table():
    return torch.arange(24.0).view(12, 2)


@pytest.fixture
def x(table):
    return dd.DistFeatures(TensorStore(table[5:].clone()), TensorStore(table), [0, 5, 12], part=1)


@pytest.mark.parametrize("ids, want", [
    (torch.tensor([11, 0, 5, 5]), [11, 0, 5, 5]),
    (torch.tensor([3, 6], dtype=torch.int32), [3, 6]),
    ([4, 10], [4, 10]), ((1, 2), [1, 2]), (range(2, 8, 3), [2, 5]),
    (np.array([9, 0]), [9, 0]), (np.array([7], dtype=np.int32), [7]),
    (slice(None), list(range(12))), (slice(1, None, 4), [1, 5, 9]), (slice(-2, None), [10, 11]),
    (7, [7]), (np.int64(3), [3]), (torch.tensor(4), [4]), ([], []),
])
def test_indexing_takes_the_ids_a_dist_tensor_takes(table, x, ids, want):
    got = x[ids]
    assert got.shape == (len(want), 2) and torch.equal(got, table[want]) and got.device.type == "cpu"


def test_shape_dtype_and_len_are_a_dist_tensors(x):
    assert x.shape == (12, 2) and x.dtype == torch.float32 and len(x) == 12


@pytest.mark.parametrize("ids, error, match", [
    (torch.tensor([1.0]), TypeError, "integer row ids"),
    ([1.5], TypeError, "ids must be integers"),
    (torch.tensor([True, False]), TypeError, "integer row ids"),
    (np.array([True]), TypeError, "integers"),
    (True, TypeError, "not a bool"),
    (torch.zeros(2, 2, dtype=torch.int64), TypeError, "ids must be 1-D"),
    ("3", TypeError, "not str"),
    (None, TypeError, "not NoneType"),
    (torch.tensor([12]), IndexError, "12"),
    ([-1], IndexError, "-1"),
    (12, IndexError, "12"),
])
def test_bad_ids_raise_one_typed_line_before_any_read(x, ids, error, match):
    with pytest.raises(error, match=match):
        x[ids]
    s = x.stats()["partitioned"]
    assert s["local_rows"] == s["remote_rows"] == 0  # nothing was read

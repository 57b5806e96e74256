"""``directload dataset convert --to disk`` and ``directload store verify``."""

import numpy as np
import pytest
import torch

from directload.harness.cli import main
from directload.stores import DiskStore
from directload.stores.disk_format import DATA_ALIGN


def test_convert_a_npy_file_to_a_disk_store_then_verify_it(tmp_path, capsys):
    table = np.arange(3000, dtype=np.float32).reshape(300, 10)
    src = tmp_path / "feat.npy"
    np.save(src, table)
    assert main(["dataset", "convert", "--to", "disk", "--input", str(src), "--no-progress"]) == 0
    out = tmp_path / "feat.disk.npy"
    assert str(out) in capsys.readouterr().out
    with DiskStore(out) as store:
        assert torch.equal(store.read([299, 0]), torch.from_numpy(table[[299, 0]]))
    assert main(["store", "verify", str(out), "--no-progress"]) == 0
    assert "all match" in capsys.readouterr().out
    with open(out, "r+b") as f:
        f.seek(DATA_ALIGN + 5)
        f.write(b"\xff\xff")
    assert main(["store", "verify", str(out), "--no-progress"]) == 1
    printed = capsys.readouterr().out
    assert "chunk 0" in printed and "1 bad" in printed
    assert main(["dataset", "convert", "--to", "disk", "--input", str(src), "--no-progress"]) == 1  # exists
    assert "overwrite" in capsys.readouterr().err


def test_verify_of_a_plain_npy_says_there_is_nothing_to_check(tmp_path, capsys):
    np.save(tmp_path / "plain.npy", np.zeros((3, 3)))
    assert main(["store", "verify", str(tmp_path / "plain.npy")]) == 1
    assert "no sidecar" in capsys.readouterr().err


@pytest.mark.ogb
def test_convert_a_datasets_features_to_a_disk_store(tmp_path, capsys):
    from directload.datasets import load

    root = str(tmp_path)
    assert main(["dataset", "synth", "--root", root, "--name", "synth-tiny", "--no-progress"]) == 0
    assert main(["dataset", "convert", "--root", root, "--name", "synth-tiny", "--to", "disk", "--no-progress"]) == 0
    path = tmp_path / "synth_tiny" / "disk" / "node-feat.npy"
    if not path.exists():
        path = next(tmp_path.rglob("disk/node-feat.npy"))
    ds = load(root, "synth-tiny", pin="auto")
    with DiskStore(path) as store:
        ids = torch.arange(ds.num_nodes - 1, -1, -7)
        assert torch.equal(store.read(ids), ds.feat[ids])

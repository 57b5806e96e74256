"""The ``directload`` command: datasets and a real (tiny) side-by-side training run."""

import json
import subprocess
import sys


def _cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "directload", *args], capture_output=True, encoding="utf-8",
                          errors="replace", cwd=cwd,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_dataset_synth_and_train_both_loaders(tmp_path):
    out = _cli("dataset", "synth", "--root", str(tmp_path / "data"), "--name", "synth-tiny", "--nodes", "2000")
    assert "synth-tiny" in out and (tmp_path / "data" / "synth_tiny" / "RELEASE_v1.txt").exists()
    out = _cli("train", "--root", str(tmp_path / "data"), "--dataset", "synth-tiny", "--epochs", "2",
               "--hidden", "16", "--batch-size", "128", "--fanouts", "5", "5", "--no-progress",
               "--out", str(tmp_path / "res"))
    assert "epoch_vs_dgl" in out
    report = json.loads((tmp_path / "res" / "train_synth-tiny.json").read_text())
    loaders = {row["loader"] for row in report["summary"]}
    assert loaders == {"dgl", "directload"}
    for row in report["summary"]:
        assert row["epoch_s"] > 0 and 0.0 <= row["test_acc"] <= 1.0
        assert row["sample_s"] > 0 and row["gather_s"] > 0 and row["train_s"] > 0
    assert report["meta"]["nodes"] == 2000
    assert (tmp_path / "res" / "train_synth-tiny.png").stat().st_size > 10_000


def test_bench_rejects_unknown_names():
    proc = subprocess.run([sys.executable, "-m", "directload", "bench", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr

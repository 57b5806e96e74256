"""benchmarks/sample_bench.py on the CPU: its --quick run over synth-tiny writes every field of its JSON, for the
samplers of this lane; --device cuda refuses in one line without a GPU.  No timing is asserted."""

import doctest
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import frameworks

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "sample_bench.py"
SAMPLERS = {
    "pyg": {"sampler": ["PyG torch_sparse", "directload pyg layout"],
            "loader": ["PyG NeighborLoader", "directload NeighborLoader", "PyG loader + directload sampler"]},
    "dgl": {"sampler": ["DGL NeighborSampler", "DGL sample_neighbors+to_block", "directload BlockSampler"]},
}
BATCH, TRAIN = 256, 600  # --quick's batch size; synth-tiny's training seeds (20% of 3000 nodes)


def _run(*args, cwd):
    env = {**os.environ, "DGLBACKEND": "pytorch", "OUTDATED_IGNORE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``(process, json, results directory)`` of one ``--quick`` run at 1 and 2 threads."""
    tmp = tmp_path_factory.mktemp("sample_bench")
    proc = _run("--quick", "--threads", "1", "2", "--root", str(tmp / "data"), "--results", str(tmp / "out"),
                cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = (tmp / "out").glob("sample_synth-tiny_*.json")
    return proc, json.loads(path.read_text()), tmp / "out"


@pytest.mark.slow
def test_quick_run_writes_the_json_the_png_and_the_table(quick):
    proc, result, out = quick
    assert {"system", "args", "dataset", "rows", "skipped"} <= set(result)
    assert result["args"]["quick"] and result["args"]["rounds"] == 2 and result["args"]["batch_size"] == BATCH
    assert result["dataset"] == {"name": "synth-tiny", "num_nodes": 3000, "num_edges": result["dataset"]["num_edges"],
                                 "train_seeds": TRAIN}
    assert list(out.glob("sample_synth-tiny_*.png"))
    assert "epoch s (min-max)" in proc.stdout and "vs ref (min-max)" in proc.stdout


@pytest.mark.slow
def test_every_sampler_of_this_lane_has_a_row_per_thread_count_and_the_others_a_reason(quick):
    _, result, _ = quick
    lanes = frameworks()
    assert lanes, "a lane with neither DGL nor PyG"
    for threads in (1, 2):
        got = [(r["lane"], r["group"], r["sampler"]) for r in result["rows"] if r["threads"] == threads]
        assert got == [(lane, group, name) for lane in ("pyg", "dgl") if lane in lanes
                       for group, names in SAMPLERS[lane].items() for name in names]
    missing = {name for lane in SAMPLERS if lane not in lanes for names in SAMPLERS[lane].values() for name in names}
    assert {s["sampler"] for s in result["skipped"]} == missing
    assert all(s["reason"] for s in result["skipped"])


@pytest.mark.slow
def test_each_row_has_its_rounds_its_ratio_to_the_reference_and_its_edges(quick):
    _, result, _ = quick
    rows = result["rows"]
    for r in rows:
        assert len(r["epoch_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["batches"] == math.ceil(TRAIN / BATCH) and r["edges_per_batch"] > 0 and r["us_per_edge"] > 0
        reference = SAMPLERS[r["lane"]][r["group"]][0]
        assert r["reference"] == reference
        if r["sampler"] == reference:
            assert "vs_reference" not in r
        else:
            ratio = r["vs_reference"]
            assert ratio["min"] <= ratio["median"] <= ratio["max"]
            ref = next(x for x in rows if (x["threads"], x["sampler"]) == (r["threads"], reference))
            # the same seed batches and fanouts: about as many edges as the framework's sampler
            assert abs(r["edges_per_batch"] / ref["edges_per_batch"] - 1) < 0.25
    dgl = [r for r in rows if r["sampler"] == "DGL NeighborSampler"]
    assert [r["note"].startswith("fused") for r in dgl] == [False, True][:len(dgl)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_device_cuda_refuses_in_one_line_without_a_gpu(tmp_path):
    proc = _run("--device", "cuda", "--quick", "--root", str(tmp_path / "data"), "--results", str(tmp_path),
                cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == ("sample_bench: --device cuda needs a CUDA device, and this "
                                                    "machine has none")
    assert not (tmp_path / "data").exists()  # refused before any work


def test_the_scripts_examples_run(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    result = doctest.testmod(importlib.import_module("sample_bench"), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0

"""benchmarks/codec_accuracy.py: its --quick run trains float32 and int8 with the same seeds and writes the
accuracies, their difference, the goal and the rows' reconstruction error to its JSON and PNG; a dataset that is
neither a preset nor under --root is skipped with a note.  No timing is asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "codec_accuracy.py"
pytestmark = pytest.mark.one_lane("pyg")  # whole training processes of directload's own loader


def test_the_quick_run_compares_each_codec_with_float32_beside_its_reconstruction_error(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--root", str(tmp_path / "data"), "--results",
                           str(out), "--datasets", "synth-tiny", "not-here"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OUTDATED_IGNORE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "skipping not-here: not under" in proc.stdout
    (path,) = out.glob("codec_accuracy_*.json")
    result = json.loads(path.read_text())
    assert result["skipped"] == ["not-here"]
    rows = {r["codec"]: r for r in result["rows"]}
    assert set(rows) == {"float32", "int8"} and {r["dataset"] for r in rows.values()} == {"synth-tiny"}
    base, int8 = rows["float32"], rows["int8"]
    assert base["vs_float32_pp"] == 0 and len(base["seeds"]) == len(int8["seeds"]) == 1
    assert 0 <= int8["acc_median"] <= 100 and int8["vs_float32_pp"] == int8["acc_median"] - base["acc_median"]
    assert int8["goal_pp"] == 0.5 and int8["within_goal"] == (abs(int8["vs_float32_pp"]) <= 0.5)
    # int8 keeps 8 bits of each row's range: the relative error per row is under 1%, every error within the bound
    assert 0 < int8["rel_median"] <= int8["rel_p99"] <= int8["rel_max"] < 0.01
    assert 0 < int8["abs_vs_bound_max"] <= 1.0
    assert path.with_suffix(".png").stat().st_size > 10_000

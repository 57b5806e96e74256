"""benchmarks/codecs.py: its --quick run writes every field of its JSON and its PNG; the tiers part's cache holds
the rows its bytes allow for each codec, and int8 rows cost the disk fewer bytes.  No timing is asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "codecs.py"
pytestmark = pytest.mark.one_lane("pyg")  # a whole-process run of directload's own kernels and stores


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("codecs")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--no-progress", "--results", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OUTDATED_IGNORE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out / "codecs.json").read_text()), out


def test_the_gather_part_times_every_codec_and_its_torch_path_beside_float32(quick):
    stdout, result, out = quick
    methods = {"float32", "float16", "bfloat16", "int8", "float16 (torch)", "bfloat16 (torch)", "int8 (torch)"}
    assert {r["method"] for r in result["gather"]} == methods
    assert {r["dim"] for r in result["gather"]} == {16, 64}
    for row in result["gather"]:
        stat = row["vs_float32"]
        assert row["mrows_s"] > 0 and stat["n"] == 3 and stat["p25"] <= stat["median"] <= stat["p75"]
        if row["method"] == "float32":
            assert stat["median"] == 1.0
    int8 = next(r for r in result["gather"] if r["method"] == "int8" and r["dim"] == 64)
    assert int8["row_bytes"] == 72
    assert (out / "codecs.png").stat().st_size > 10_000 and "vs float32" in stdout


def test_the_tiers_part_holds_the_rows_the_bytes_allow(quick):
    _, result, _ = quick
    setup, tiers = result["tiers_setup"], {t["rows"]: t for t in result["tiers"]}
    assert set(tiers) == {"float32", "float16", "bfloat16", "int8"}
    for name, t in tiers.items():
        assert t["cache_rows"] == min(setup["cache_bytes"] // t["row_bytes"], setup["rows"]), name
    assert tiers["int8"]["row_bytes"] == 108 and tiers["float16"]["row_bytes"] == 200
    assert tiers["int8"]["disk_requested_bytes"] < tiers["float16"]["disk_requested_bytes"] < \
        tiers["float32"]["disk_requested_bytes"]
    # the link, by the model: whole 32-byte sectors of each row (a hot row twice in flight read once), so at most
    # two sectors more than the rows' bytes per row; fewer for smaller rows
    for t in tiers.values():
        rows = setup["batches"] * setup["batch_rows"]
        assert 0 < t["pcie_bytes"] <= rows * (t["row_bytes"] + 64) and t["pcie_bytes"] % 32 == 0
    assert tiers["int8"]["pcie_bytes"] < tiers["float16"]["pcie_bytes"] < tiers["float32"]["pcie_bytes"]
    assert tiers["int8"]["pcie_vs_float32"] == tiers["float32"]["pcie_bytes"] / tiers["int8"]["pcie_bytes"]

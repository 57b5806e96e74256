"""scripts/dev.sh: ``test`` prints each stage's time at its end, also when a stage fails; ``main`` compiles the
CPU kernels once, before training, and trains several seeds.  Run against stand-in lanes (each tool a script that
records its call), so no real lane is set up or run."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "scripts" / "dev.sh"

pytestmark = pytest.mark.one_lane("dgl")  # bash and stand-ins: no torch, no numpy

# A stand-in tool: it logs its call; a pytest logs when it starts and ends too, a second apart.
_TOOL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "{log}"
if [ "$(basename "$0")" = pytest ]; then
    echo "start $DIRECTLOAD_LANE $EPOCHREALTIME" >> "{log}"
    sleep 1
    echo "end $DIRECTLOAD_LANE $EPOCHREALTIME" >> "{log}"
fi
case "$* lane=${{DIRECTLOAD_LANE:-}}" in
    *"import numba"*) echo 0.0 ;;
    *"{fail}"*) exit 3 ;;
esac
exit 0
"""


def _stamps(env, venvs):
    """The stamps dev.sh checks, as it computes them (it is sourced: its functions, nothing run)."""
    script = f"source {DEV}; echo \"$(_stamp)\"; _kernels_stamp {venvs['dgl']}"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=env).stdout.split()
    return out[0], out[1]


def _lanes(tmp_path, fail="nothing fails"):
    """Stand-in lanes, set up as dev.sh would have left them; every tool in them records its call in the log."""
    log = tmp_path / "calls.log"
    venvs = {lane: tmp_path / lane for lane in ("dgl", "pyg", "docs")}
    for venv in venvs.values():
        (venv / "bin").mkdir(parents=True)
        for tool in ("python", "pytest", "ruff", "mkdocs", "directload"):
            path = venv / "bin" / tool
            path.write_text(_TOOL.format(log=log, fail=fail))
            path.chmod(path.stat().st_mode | stat.S_IEXEC)
    cache = tmp_path / "numba-cache"  # where the kernels' compiled marks go (not the checkout's __pycache__)
    env = {**os.environ, "DIRECTLOAD_VENV": str(venvs["dgl"]), "DIRECTLOAD_PYG_VENV": str(venvs["pyg"]),
           "DIRECTLOAD_DOCS_VENV": str(venvs["docs"]), "NUMBA_CACHE_DIR": str(cache)}
    setup, kernels = _stamps(env, venvs)
    for lane, venv in venvs.items():
        (venv / ".directload-setup").write_text(f"{lane}-{setup}\n")
    (venvs["pyg"] / ".directload-pyg-sampler").write_text(f"pyg-sampler-{setup}\n")
    return env, log, cache, kernels


def _compiled(cache, kernels):
    """Marks, as dev.sh leaves them, that both lanes' kernels are in the cache."""
    cache.mkdir()
    for lane in ("dgl", "pyg"):
        (cache / f".directload-compiled-{lane}").write_text(kernels + "\n")


def _run(env, *args):
    return subprocess.run(["bash", str(DEV), *args], capture_output=True, text=True, env=env, cwd=ROOT)


def _stage_lines(out):
    return out.split("== time per stage ==\n", 1)[1].splitlines()


def test_every_stage_is_timed_at_the_end(tmp_path):
    env, log, cache, kernels = _lanes(tmp_path)
    _compiled(cache, kernels)
    proc = _run(env, "test", "-k", "x")
    assert proc.returncode == 0, proc.stderr
    lines = _stage_lines(proc.stdout)
    names = [f"setup: {tmp_path / 'dgl'}", f"setup: {tmp_path / 'pyg'}", f"setup: {tmp_path / 'docs'}",
             "setup: directload's CPU kernels", "lint", "layers", "types", "docs", "DGL lane", "PyG lane",
             "Numba CUDA simulator", "in all"]
    assert len(lines) == len(names)
    for line, name in zip(lines, names):
        secs, unit, rest = line.split(maxsplit=2)
        assert float(secs) >= 0 and unit == "s" and rest.startswith(name) and "exit status" not in rest
    assert "pytest --durations=60 -k x" in log.read_text()  # the options reach every lane, which lists its slowest 60


def _times(log, what):
    """``{lane: seconds}`` of the stand-in pytests' starts or ends (the simulator's are the PyG lane's last)."""
    return {line.split()[1]: float(line.split()[2]) for line in log.read_text().splitlines()
            if line.startswith(what + " ")}


def test_the_two_lanes_run_side_by_side(tmp_path):
    env, log, cache, kernels = _lanes(tmp_path)
    _compiled(cache, kernels)
    proc = _run(env, "test")
    assert proc.returncode == 0, proc.stderr
    starts = [line for line in log.read_text().splitlines() if line.startswith("start ")]
    assert [line.split()[1] for line in starts] in (["dgl", "pyg", "pyg"], ["pyg", "dgl", "pyg"])
    first = {line.split()[1]: float(line.split()[2]) for line in reversed(starts)}  # each lane's first pytest
    ends = _times(log, "end")
    assert first["pyg"] < ends["dgl"] and first["dgl"] < ends["pyg"]  # overlapping
    out = proc.stdout
    assert out.index("== DGL lane") < out.index("== PyG lane") < out.index("== Numba CUDA simulator")


def test_a_failed_pyg_lane_fails_the_run_after_the_dgl_lane_ends(tmp_path):
    env, log, cache, kernels = _lanes(tmp_path, fail="lane=pyg")
    _compiled(cache, kernels)
    proc = _run(env, "test")
    assert proc.returncode == 3
    lines = _stage_lines(proc.stdout)
    dgl = next(line for line in lines if "DGL lane" in line)
    pyg = next(line for line in lines if "PyG lane (" in line)
    assert "exit status" not in dgl and pyg.endswith("failed (exit status 3)")
    assert not any("simulator" in line for line in lines)  # it runs after the PyG lane passed only
    assert "cudasim" not in log.read_text()


def test_a_failed_stage_is_named_and_the_stages_before_it_timed(tmp_path):
    env, log, cache, kernels = _lanes(tmp_path, fail="check_types")
    _compiled(cache, kernels)
    proc = _run(env, "test")
    assert proc.returncode == 3
    lines = _stage_lines(proc.stdout)
    assert [line.split(maxsplit=2)[2].split(" (")[0] for line in lines[-3:-1]] == ["layers", "types"]
    assert lines[-2].endswith("failed (exit status 3)")
    assert "exit status" not in "".join(lines[:-2])
    assert lines[-1].split()[2:] == ["in", "all"]
    assert "pytest" not in log.read_text()  # nothing after the failed stage ran


def test_main_compiles_the_kernels_once_then_trains_three_seeds(tmp_path):
    env, log, cache, kernels = _lanes(tmp_path)
    first = _run(env, "main", "--epochs", "2")
    assert first.returncode == 0, first.stderr
    assert "compiling directload's CPU kernels once" in first.stdout
    calls = log.read_text().splitlines()
    warm = calls.index("python -m directload.kernels.warm")
    train = calls.index("directload train --framework dgl --seeds 3 --epochs 2")
    assert warm < train
    assert (cache / ".directload-compiled-dgl").read_text().strip() == kernels
    again = _run(env, "main", "--seeds", "1")
    assert again.returncode == 0, again.stderr
    assert "compiling" not in again.stdout  # compiled already: the cache is current
    assert log.read_text().splitlines()[-1] == "directload train --framework dgl --seeds 3 --seeds 1"  # the last wins

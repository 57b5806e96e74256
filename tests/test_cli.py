"""The ``directload`` command: datasets, a real (tiny) side-by-side training run, and what a new user sees."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import frameworks

from directload.harness.cli import main
from directload.harness.commands.runs import report_name
from directload.harness.parser import build_parser


def _run(*args, cwd=None, input=None):
    return subprocess.run([sys.executable, "-m", "directload", *args], capture_output=True, encoding="utf-8",
                          errors="replace", cwd=cwd, timeout=600, input=input)


def _cli(*args, cwd=None):
    proc = _run(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value


@pytest.mark.parametrize("framework", frameworks() or [pytest.param("none", marks=pytest.mark.skip("no framework"))])
def test_dataset_synth_and_train_both_loaders(tmp_path, framework):
    label = {"dgl": "DGL", "pyg": "PyG"}[framework]
    out = _cli("dataset", "synth", "--root", str(tmp_path / "data"), "--name", "synth-tiny", "--nodes", "2000",
               "--no-progress")
    assert "synth-tiny" in out and (tmp_path / "data" / "synth_tiny" / "RELEASE_v1.txt").exists()
    out = _cli("train", "--framework", framework, "--root", str(tmp_path / "data"), "--dataset", "synth-tiny",
               "--epochs", "2", "--hidden", "16", "--batch-size", "128", "--fanouts", "5", "5", "--no-progress",
               "--device", "cpu", "--out", str(tmp_path / "res"))
    assert f"epoch vs {label} (min-max)" in out and "test acc %" in out and f"test acc vs {label} (pp)" in out
    assert "first epoch left out" in out
    stem = f"train_synth-tiny_sage_{framework}-vs-directload"
    text = (tmp_path / "res" / f"{stem}.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    report = json.loads(text)
    assert {row["loader"] for row in report["summary"]} == {framework, "directload"}
    assert report["meta"]["framework"] == framework
    for row in report["summary"]:
        assert row["epoch_s"] > 0 and 0.0 <= row["test_acc_pct"] <= 100.0
        assert row["sample_s"] > 0 and row["gather_s"] > 0 and row["train_s"] > 0
        assert row["first_epoch_left_out"] is True
    ours = next(r for r in report["summary"] if r["loader"] == "directload")
    assert ours["reference"] == framework
    assert ours["epoch_vs_reference_min"] <= ours["epoch_vs_reference"] <= ours["epoch_vs_reference_max"]
    assert report["meta"]["nodes"] == 2000  # the dataset made with other options is kept
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in _walk(report))
    assert (tmp_path / "res" / f"{stem}.png").stat().st_size > 10_000
    # A second run with another model writes its own files instead of overwriting the first.
    _cli("train", "--framework", framework, "--root", str(tmp_path / "data"), "--dataset", "synth-tiny", "--epochs",
         "1", "--hidden", "8", "--batch-size", "256", "--layers", "1", "--loader", "directload", "--no-progress",
         "--device", "cpu", "--out", str(tmp_path / "res"))
    one = json.loads((tmp_path / "res" / "train_synth-tiny_sage_directload.json").read_text())
    assert one["summary"][0]["first_epoch_left_out"] is False
    assert (tmp_path / "res" / f"{stem}.json").read_text() == text


def test_a_loader_of_another_framework_is_refused(capsys):
    other = {"dgl": "pyg", "pyg": "dgl"}[build_parser().parse_args(["train"]).framework]
    assert main(["train", "--loader", other]) == 1
    assert "own loader" in capsys.readouterr().err


def test_report_names_differ_by_model_loader_and_dataset():
    names = {report_name("train", d, m, lo) for d in ("a", "b") for m in (["sage"], ["gat"], ["sage", "gat"])
             for lo in (["dgl"], ["directload"], ["dgl", "directload"])}
    assert len(names) == 18


def test_bench_rejects_unknown_names():
    proc = _run("bench", "nope")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize("args,match", [
    (["--layers", "3", "--fanouts", "10", "10"], "3 layers but 2 fanouts"),
    (["--device", "cuda"], "no usable CUDA device"),
    (["--device", "tpu"], "not a device|not supported"),
    (["--dataset", "../x"], "one plain path component"),
])
def test_library_errors_are_one_line(tmp_path, args, match, capsys):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    code = main(["train", "--root", str(tmp_path), "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("directload: error: ") and err.count("\n") == 1 and "Traceback" not in err
    import re

    assert re.search(match, err), err


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_debug_shows_the_traceback(tmp_path):
    for argv in (["--debug", "train"], ["train", "--debug"]):
        proc = _run(*argv, "--root", str(tmp_path), "--layers", "2", "--fanouts", "5", "--no-progress")
        assert proc.returncode == 1
        assert "Traceback (most recent call last)" in proc.stderr and "ValueError" in proc.stderr


def test_info_into_a_closed_pipe_ends_quietly():
    proc = subprocess.run(f"{sys.executable} -m directload info | head -n 1", shell=True, capture_output=True,
                          encoding="utf-8", errors="replace", timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1
    assert "BrokenPipeError" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def _actions(parser):
    for action in parser._actions:
        yield parser, action
        for sub in getattr(action, "choices", None) or {}:
            if isinstance(action.choices, dict):
                yield from _actions(action.choices[sub])


def test_every_option_has_help_and_no_markup():
    for parser, action in _actions(build_parser()):
        if action.option_strings or action.dest not in ("command", "action", "help"):
            assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"
        for text in (action.help or "", parser.description or ""):
            assert "``" not in text and ":func:" not in text and "seed 002" not in text, text
    text = subprocess.run([sys.executable, "-m", "directload", "train", "--help"], capture_output=True,
                          encoding="utf-8", errors="replace").stdout
    assert "(default: 1024)" in text and "(default: sage)" in text and "GAT" in text


def test_bad_numbers_are_refused_by_the_parser(capsys):
    for argv in (["train", "--epochs", "0"], ["train", "--lr", "-1"], ["train", "--batch-size", "x"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "must be" in capsys.readouterr().err


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_every_help_of_every_command_prints():
    # in-process: every parser and subparser formats its help (a stray % in a help string crashed argparse)
    for parser, _ in _actions(build_parser()):
        assert parser.format_help()
    seen = {p.prog for p, _ in _actions(build_parser())}
    assert {"directload train", "directload dataset pack", "directload store verify", "directload bench"} <= seen
    for argv in (["--help"], ["dataset", "--help"], ["store", "verify", "--help"], ["train", "--help"]):
        proc = _run(*argv)
        assert proc.returncode == 0 and proc.stdout.startswith("usage:") and not proc.stderr, (argv, proc.stderr)


HELP_OF_EVERY_BENCHMARK = """
import contextlib, io, runpy, sys
from directload.harness.commands.bench import _SOURCE_TREE, BENCH_SCRIPTS
failed = []
for which, script in sorted(BENCH_SCRIPTS.items()):
    sys.argv = [script, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(_SOURCE_TREE / "benchmarks" / script), run_name="__main__")
        failed.append((which, "no exit"))
    except SystemExit as exc:
        if exc.code not in (0, None) or not out.getvalue().startswith("usage:"):
            failed.append((which, exc.code, out.getvalue()[:200]))
    except BaseException as exc:
        failed.append((which, repr(exc)))
print(failed)
sys.exit(1 if failed else 0)
"""


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_every_benchmarks_help_prints():
    proc = subprocess.run([sys.executable, "-c", HELP_OF_EVERY_BENCHMARK], capture_output=True, encoding="utf-8",
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cache = _run("bench", "cache", "--help")  # through the command line (a stray % crashed argparse here)
    assert cache.returncode == 0 and cache.stdout.startswith("usage:") and "Traceback" not in cache.stderr


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_bench_versus_refuses_a_ref_that_names_no_commit_before_any_work():
    proc = _run("bench", "versus", "--ref", "no-such-ref-here", "--", "loader")
    assert proc.returncode == 2 and "'no-such-ref-here' is not a commit of this checkout" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_more_ranks_than_the_node_runs_are_refused_in_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import re

    from directload.harness import ddp, memcap

    started = []
    monkeypatch.setattr(ddp, "launch", lambda nproc, argv: started.append(nproc))
    monkeypatch.setattr(memcap, "guard_children", lambda: None)  # (the old code reached it: keep this process's env)
    code = main(["train", "--root", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--dataset", "synth-tiny",
                 "--device", "cpu", "--no-progress", "--nproc", "100000"])
    err = capsys.readouterr().err
    assert code == 1 and started == []
    assert re.fullmatch(r"directload: error: --nproc 100000 is more ranks than this node can run: at most \d+ \(4 "
                        r"ranks per CPU core on \d+ cores: \d+; \d+\.\d GiB of available memory at 512 MiB a rank: "
                        r"\d+; 256 on any node\)\n", err), err
    assert not list(tmp_path.iterdir())  # no dataset written, no report


@pytest.mark.parametrize("spins,load,says", [(None, 9.0, True), ("10000", 9.0, False), (None, 0.1, False)])
def test_a_busy_machine_with_spinning_openmp_threads_gets_one_line(monkeypatch, capsys, spins, load, says):
    from directload.harness.commands import train

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    if spins:
        monkeypatch.setenv("GOMP_SPINCOUNT", spins)
    monkeypatch.setattr(train.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(train.os, "cpu_count", lambda: 2)
    train._note_busy_machine()
    err = capsys.readouterr().err
    assert (err.count("\n") == 1 and "GOMP_SPINCOUNT=10000" in err and "load 9.0 on 2 cores" in err) if says \
        else err == ""


def _tuned_cache(root):
    """The tuner's cache file with two choices, as a GPU run leaves it."""
    from directload.kernels.tune_keys import TuneKey
    from directload.kernels.tune_store import ChoiceFile, TuneRecord

    env = ("NVIDIA H100 PCIe", "550.54.15", "2.11.0+cu128", "12.8", "0123456789abcdef")
    small = TuneRecord(TuneKey.of(env, 400, 4, 4096, 1 << 20, 16), "rowvec16x16+sort",
                       (("index_select", 0.412), ("rowvec16x16+sort", 0.21)), (("naive", "RuntimeError: no"),),
                       ("aligned",), "", 300.0)
    large = TuneRecord(TuneKey.of(env, 4096, 4, 1 << 17, 1 << 20, 16), "index_select", (("index_select", 9.5),),
                       (), (), "", 300.0)
    ChoiceFile(root / "tuner" / "choices.json").save([small, large])


def test_tune_prints_the_choices_as_a_table_or_json_and_clears_only_its_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIRECTLOAD_CACHE", str(tmp_path))
    monkeypatch.delenv("DIRECTLOAD_TUNE", raising=False)
    assert main(["tune"]) == 0
    assert "nothing tuned yet" in capsys.readouterr().out
    _tuned_cache(tmp_path)
    (tmp_path / "tuner" / "notes.txt").write_text("someone else's")
    assert main(["tune"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tuner: on; cache {tmp_path / 'tuner' / 'choices.json'}: 2 choices")
    assert "NVIDIA H100 PCIe, driver 550.54.15, torch 2.11.0+cu128, CUDA 12.8" in out
    line = next(x for x in out.splitlines() if "rowvec16x16+sort  " in x)
    assert line.split() == ["400", "4", "16", "4096-8191", "256", "MiB-1", "GiB", "rowvec16x16+sort", "0.210", "1.96x"]
    assert "timed (ms): rowvec16x16+sort 0.210, index_select 0.412" in out
    assert "failed: naive (RuntimeError: no)" in out and "not timed (the budget ran out): aligned" in out
    assert main(["tune", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["enabled"] is True and [r["chosen"] for r in report["choices"]] == ["rowvec16x16+sort",
                                                                                      "index_select"]
    assert report["choices"][0]["times_ms"] == {"index_select": 0.412, "rowvec16x16+sort": 0.21}
    monkeypatch.setenv("DIRECTLOAD_TUNE", "0")
    assert main(["tune"]) == 0 and "tuner: off (DIRECTLOAD_TUNE=0" in capsys.readouterr().out
    assert main(["tune", "--clear"]) == 0 and "removed " in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "tuner").iterdir()] == ["notes.txt"]
    assert main(["tune", "--clear"]) == 0 and "no tuner cache at" in capsys.readouterr().out


def test_info_shows_the_tuner(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIRECTLOAD_CACHE", str(tmp_path))
    monkeypatch.setenv("DIRECTLOAD_TUNE", "0")
    _tuned_cache(tmp_path)
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tuner_enabled"] is False and info["tuner_choices"] == 2
    assert info["tuner_cache"] == str(tmp_path / "tuner" / "choices.json")
    monkeypatch.delenv("DIRECTLOAD_TUNE")
    assert main(["info"]) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert lines["tuner_enabled"] == ["True"] and lines["tuner_choices"] == ["2"]
    proc = _run("tune", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: directload tune") and "--clear" in proc.stdout
    assert "DIRECTLOAD_TUNE=0" in proc.stdout and not proc.stderr


@pytest.mark.parametrize("framework", frameworks() or [pytest.param("none", marks=pytest.mark.skip("no framework"))])
def test_train_with_a_codec_reads_code_rows_beside_the_frameworks_loader(tmp_path, framework):
    """``train --codec int8 --loader both``: directload's loader reads the dataset's int8 store (written on first
    use, format version 3), the framework's its own table; ``--features memory`` encodes the table in memory.
    The report records the codec."""
    from directload.stores import read_layout

    data, res = tmp_path / "data", tmp_path / "res"
    _cli("dataset", "synth", "--root", str(data), "--name", "synth-tiny", "--nodes", "1500", "--no-progress")
    common = ("--framework", framework, "--root", str(data), "--dataset", "synth-tiny", "--epochs", "1", "--hidden",
              "8", "--batch-size", "256", "--fanouts", "4", "4", "--no-progress", "--device", "cpu", "--out", str(res))
    _cli("train", *common, "--codec", "int8", "--features", "disk")
    store = data / "synth_tiny" / "disk" / "node-feat.int8.npy"
    assert read_layout(store).codec == "int8" and not (data / "synth_tiny" / "disk" / "node-feat.npy").exists()
    report = json.loads((res / f"train_synth-tiny-disk_sage_{framework}-vs-directload.json").read_text())
    assert {row["loader"] for row in report["summary"]} == {framework, "directload"}
    assert all(0.0 <= row["test_acc_pct"] <= 100.0 for row in report["summary"])
    assert report["meta"]["codec"] == "int8"


@pytest.mark.parametrize("name", ["float16", "bfloat16", "int8"])
def test_a_run_with_a_codec_and_features_in_memory_maps_the_store_of_codes(tmp_path, name):
    """``--codec float16 --features memory``: the run's store is the dataset's store of codes mapped into memory
    (written on first use, so every rank of a node maps one copy and no run encodes the table again), decoded
    inside the gather; without a codec directload's loader reads the table itself."""
    from directload.codecs import codec
    from directload.datasets import load, synthesize
    from directload.harness.commands.runs import feature_files
    from directload.harness.options import RunOptions
    from directload.harness.train_inputs import run_store
    from directload.stores import StoreSpec, TensorStore

    synthesize(tmp_path, "synth-tiny", progress=False)
    dataset = load(tmp_path, "synth-tiny")
    assert run_store(dataset, RunOptions(loader="directload", features="memory")) is None
    assert feature_files(tmp_path, "synth-tiny", "memory", codec=name, progress=False)[-1].name == \
        f"node-feat.{name}.npy"
    handle = run_store(dataset, RunOptions(loader="directload", features="memory", store=StoreSpec(codec=name)))
    try:
        store = handle.store
        assert isinstance(store, TensorStore) and store.encoded.codec.name == name
        # mapped from the file, not a private copy (bfloat16's 16 bits mapped as int16, then viewed)
        codes, path = store.encoded.codes, os.path.realpath(tmp_path / "synth_tiny" / "disk" / f"node-feat.{name}.npy")
        maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
        spans = [tuple(int(a, 16) for a in m[0].split("-")) for m in maps if len(m) > 5 and m[5] == path]
        assert any(lo <= codes.data_ptr() < hi for lo, hi in spans), (path, spans)
        assert store.shape == tuple(dataset.feat.shape)
        ids = [0, 7, 7]
        want = codec(name).decode(codec(name).encode(torch.as_tensor(dataset.feat[ids])))
        assert torch.equal(store.read(ids), want)
    finally:
        handle.close()


def test_a_codec_needs_directloads_loader_and_a_packed_store_of_its_codes(capsys, tmp_path):
    own = build_parser().parse_args(["train"]).framework
    assert main(["train", "--codec", "int8", "--loader", own]) == 1
    assert "--codec compresses the rows directload's loader reads" in capsys.readouterr().err
    from directload.datasets import synthesize

    synthesize(tmp_path, "synth-tiny", progress=False)
    assert main(["train", "--codec", "int8", "--packed", "--features", "disk", "--loader", "directload",
                 "--dataset", "synth-tiny", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err  # the plain packed store is not one of codes: say which to write, and how
    assert "node-feat.int8.packed.npy does not exist" in err and "dataset pack --name synth-tiny --codec int8" in err

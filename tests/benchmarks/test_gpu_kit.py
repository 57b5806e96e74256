"""The GPU kit on the CPU: every changed script's --help, the suite's sections, budgets and report, the
timer's bookkeeping (with a fake clock) and the tables a sweep prints (from fake results).  No GPU number
is made here: the fake clock's times are the host's."""

import doctest
import importlib
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
CHANGED = ["gather_bandwidth.py", "unified_gather.py", "alignment_sweep.py", "gpu_suite.py", "table_size_sweep.py",
           "tuner_check.py", "gpu_epoch.py"]


@pytest.fixture
def bench(monkeypatch):
    """Import a module of benchmarks/ by name."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module


def _python(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


@pytest.mark.one_lane("pyg")  # a whole-process run: torch's version does not change it
@pytest.mark.parametrize("script", CHANGED)
def test_help_of_every_changed_script(script):
    proc = _python(str(BENCH / script), "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.one_lane("pyg")  # a whole-process run: torch's version does not change it
def test_bench_gpu_help_through_the_command_line():
    proc = _python("-m", "directload", "bench", "gpu", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: gpu_suite.py"), proc.stderr[-2000:]
    for option in ("--quick", "--sections", "--budget-s", "--keep-report", "--plan"):
        assert option in proc.stdout


@pytest.mark.one_lane("pyg")  # a whole-process run: torch's version does not change it
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("script", ["gpu_suite.py", "table_size_sweep.py", "tuner_check.py"])
def test_gpu_only_scripts_say_there_is_no_gpu_and_measure_nothing(script):
    proc = _python(str(BENCH / script))
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["_gpu", "_report", "_common", "gpu_suite", "tuner_check", "unified_gather",
                                    "table_size_sweep", "gather_bandwidth"])
def test_the_benchmark_helpers_examples_run(bench, module):
    result = doctest.testmod(bench(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


# The suite: sections, budgets, the plan.

def test_the_sections_run_most_decisive_first_within_twenty_minutes(bench):
    suite = bench("gpu_suite")
    assert [s.key for s in suite.SECTIONS] == ["e2e", "sort", "tablesize", "kernels", "tuner", "sample", "codecs",
                                               "hotpath"]
    full = sum(s.budget_s for s in suite.SECTIONS)
    # A script stops starting points GRACE_S before its share ends; a command that takes no budget (the
    # sampler's bench, pytest) is stopped GRACE_S after it: even then the whole suite fits in 20 minutes.
    unbudgeted = sum(not step.budgeted for s in suite.SECTIONS for step in s.steps)
    assert full + unbudgeted * suite.GRACE_S <= 20 * 60
    # --quick on a fresh machine, its setup included, fits in the 9 minutes a lent GPU gives the kit.
    assert sum(s.quick_s for s in suite.SECTIONS) + suite.SETUP_S <= 9 * 60
    hot = suite.SECTIONS[-1].steps[0]
    assert hot.env == {"DIRECTLOAD_SYNC_DEBUG": "1"}
    assert {"tests/kernels", "tests/unified", "tests/gpu"} <= set(hot.argv)


def test_every_step_names_a_script_and_options_it_has(bench):
    suite = bench("gpu_suite")
    for section in suite.SECTIONS:
        for step in (*section.steps, *section.quick_steps):
            if step.argv[0] == "-m":
                continue
            module = bench(Path(step.argv[0]).stem)
            args = list(step.argv[1:]) + (["--budget-s", "10"] if step.budgeted else [])
            if hasattr(module, "build_parser"):
                module.build_parser().parse_args(args)  # exits 2 on an unknown option


def test_allot_gives_each_section_its_budget_or_what_is_left_or_skips_it(bench):
    suite = bench("gpu_suite")
    s = suite.SECTIONS[2]  # tablesize: 150 s, 50 quick
    assert suite.allot(s, None, False) == 150 and suite.allot(s, None, True) == 50
    assert suite.allot(s, 500.0, False) == 150
    assert suite.allot(s, 100.0, False) == 100  # at least half its budget: it runs, cut short
    assert suite.allot(s, 74.0, False) is None
    assert suite.allot(s, -5.0, False) is None


def test_the_plan_keeps_the_order_skips_what_does_not_fit_and_says_so(bench):
    suite = bench("gpu_suite")
    rows, skipped = suite.plan(suite.SECTIONS, only={"hotpath", "sort"})
    assert [r["section"] for r in rows] == ["sort", "hotpath"] and skipped == []
    rows, skipped = suite.plan(suite.SECTIONS, total_s=400)
    assert [r["section"] for r in rows] == ["e2e", "sort", "tuner"]  # tuner fits in what the sweeps left
    assert len(skipped) == 5 and skipped[0].startswith("3. Table-size") and "60 s left" in skipped[0]
    rows, _ = suite.plan(suite.SECTIONS, quick=True)
    assert rows[0]["section"] == "e2e" and "gpu_epoch.py" in rows[0]["steps"]
    assert all("--quick" in r["steps"] or r["section"] in ("hotpath", "kernels") for r in rows)


def test_step_budgets_share_the_section(bench):
    suite = bench("gpu_suite")
    kernels = suite.SECTIONS[3]
    shares = suite.step_budgets(kernels, 100, True)
    assert [s.argv[0] for s, _ in shares] == [s.argv[0] for s in kernels.quick_steps]
    assert sum(b for _, b in shares) == pytest.approx(100)


@pytest.mark.one_lane("pyg")  # PyG's lane: the script trains PyG's GraphSAGE
def test_the_end_to_end_section_runs_on_the_cpu_through_the_device_seam(tmp_path):
    """gpu_epoch.py's whole flow, every configuration, with dl-gpu on the emulated device (no GPU figure)."""
    name = f"scratch_{tmp_path.name}/epoch_e2e"
    proc = _python(str(BENCH / "gpu_epoch.py"), "--device", "emulated", "--quick", "--datasets", "synth-tiny",
                   "--root", str(tmp_path), "--name", name)
    results = BENCH / "results" / name.split("/")[0]
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        for config in ("dl-cpu", "dl-gpu"):
            assert re.search(rf"^\s*{config}\s+1\s", proc.stdout, re.M), proc.stdout
        assert "goals: not checked" in proc.stdout  # no GPU figure is claimed off a GPU
        import json

        report = json.loads((results / "epoch_e2e.json").read_text())["datasets"]["synth-tiny"]
        gpu = next(r for r in report["summary"] if r["config"] == "dl-gpu")
        assert gpu["reads_per_batch"] == 1.0  # the device path's one host read per batch
        assert (results / "epoch_e2e_synth-tiny.png").stat().st_size > 0
    finally:
        import shutil

        shutil.rmtree(results, ignore_errors=True)


@pytest.mark.one_lane("pyg")  # a whole-process run: torch's version does not change it
def test_plan_prints_through_the_command_line():
    proc = _python(str(BENCH / "gpu_suite.py"), "--plan", "--quick", "--budget-s", "300")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.index("sort") < proc.stdout.index("tablesize")
    assert "skipped" in proc.stdout and "in all" in proc.stdout


# The report, written as the run goes.

def test_the_report_keeps_every_finished_section_and_a_second_call_adds_to_it(bench, tmp_path):
    Report = bench("_report").Report
    path = tmp_path / "gpu_report.md"
    first = Report(path, "# head one")
    first.put("sort", "## 1. Sorted\n\nsort table")
    first.put("tablesize", "## 2. Sizes\n\npartial")
    first.put("tablesize", "## 2. Sizes\n\nwhole")  # a section rewritten after each step: replaced in place
    text = path.read_text()
    assert text.startswith("# head one") and "partial" not in text
    assert text.index("sort table") < text.index("whole")
    second = Report(path, "# head two", keep=True)
    second.put("epoch", "## 5. Epoch\n\nepoch table")
    second.put("sort", "## 1. Sorted\n\nnew sort table")
    text = path.read_text()
    assert text.startswith("# head two")
    assert text.index("new sort table") < text.index("whole") < text.index("epoch table")
    assert "\nsort table" not in text
    assert Report(path, "# fresh").sections == {}  # without keep: a new report
    assert not list(tmp_path.glob("*.tmp"))


def test_section_text_and_clean_output_from_a_fake_run(bench):
    suite = bench("gpu_suite")
    section = suite.SECTIONS[1]
    out = suite.clean_output("table\n 10%|#         | 1/10 [00:01<00:09, 1.0it/s]\rgather: 100%|##| 10/10\nrow 1\n")
    assert out == "table\nrow 1"
    assert suite.clean_output("\n".join(map(str, range(100))), tail=3) == "97\n98\n99"
    text = suite.section_text(section, 100, [(section.steps[0], 0, 42.0, "GB/s table"),
                                             (section.steps[0], None, 130.0, "half a table")])
    assert text.startswith("## 2. Sorted vs unsorted ids\n\nbudget 100 s, took 172 s.")
    assert "(42 s, exit 0)" in text and "(130 s, stopped at its budget)" in text and "```\nGB/s table\n```" in text


def test_a_step_past_its_budget_is_stopped_with_its_children(bench, tmp_path, monkeypatch):
    suite = bench("gpu_suite")
    monkeypatch.setattr(suite, "GRACE_S", 0)
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);" \
            "print('started', flush=True); time.sleep(60)"
    log = tmp_path / "step.log"
    t0 = time.monotonic()
    code, secs = suite.run_step(suite.Step(("-c", child), budgeted=False), 2.0, log)
    assert code is None and time.monotonic() - t0 < 30
    assert "started" in log.read_text()
    done = suite.run_step(suite.Step(("-c", "import sys; print(sys.argv[1:])")), 45.0, tmp_path / "ok.log")
    assert done[0] == 0 and "['--budget-s', '45']" in (tmp_path / "ok.log").read_text()  # no grace here


def test_the_suite_writes_each_section_as_it_ends_and_skips_what_the_budget_leaves_out(bench, tmp_path,
                                                                                        monkeypatch):
    suite = bench("gpu_suite")
    fast = suite.Step(("-c", "print('measured table')"), budgeted=False)
    slow = suite.Step(("-c", "import time; time.sleep(3); print('slow table')"), budgeted=False)
    sections = (suite.Section("a", "1. First", 10, 10, (fast,)), suite.Section("b", "2. Second", 10, 10, (slow,)),
                suite.Section("c", "3. Third", 10, 10, (fast,)))
    monkeypatch.setattr(suite, "SECTIONS", sections)
    monkeypatch.setattr(suite, "RESULTS", tmp_path)
    monkeypatch.setattr(suite, "_head", lambda: "# test report")
    args = suite.build_parser().parse_args(["--report", str(tmp_path / "r.md"), "--budget-s", "7.9"])
    assert suite.run(args, set()) == 0
    text = (tmp_path / "r.md").read_text()
    assert text.index("## 1. First") < text.index("measured table") < text.index("## 2. Second")
    assert "slow table" in text and re.search(r"\(\d+ s, exit 0\)", text)
    assert "## 3. Third\n\nskipped:" in text  # 7.9 s less the two first (3 s and more): under half of its 10 s
    assert (tmp_path / "gpu" / "logs" / "a-0.log").exists()


# The timer, with a fake clock.

class FakeClock:
    """Host clock instead of CUDA events: the bookkeeping of measure() is what is under test."""

    def __init__(self):
        self.calls = []

    def sync(self):
        self.calls.append("sync")

    def hold(self, seconds):
        self.calls.append("hold")

    def mark(self):
        return time.perf_counter()

    def elapsed(self, a, b):
        return b - a


def test_measure_interleaves_rounds_and_takes_every_measure(bench):
    gpu = bench("_gpu")
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    samples = gpu.measure(fns, FakeClock(), reps=4, pipeline=5, pipe_rounds=2, min_seconds=0)
    for name in fns:
        s = samples[name]
        assert len(s["host"]) == len(s["wall"]) == len(s["gpu"]) == 4 and len(s["pipe"]) == 2
        assert s["uncovered"] == 0
    timed = order[4:4 + 16]  # after the warm-ups (2 calls each): rounds of a, a, b, b
    assert timed == ["a", "a", "b", "b"] * 4
    assert order[4 + 16:] == ["a"] * 5 + ["b"] * 5 + ["a"] * 5 + ["b"] * 5  # 5 calls back to back, twice


def test_measure_counts_calls_that_outlast_the_spin_as_uncovered(bench):
    gpu = bench("_gpu")
    calls = {"n": 0}

    def sometimes_slow():  # fast in the warm-up (so the spin is short), then slow: as a call that syncs
        calls["n"] += 1
        if calls["n"] > 2:
            time.sleep(0.002)

    samples = gpu.measure({"x": sometimes_slow}, FakeClock(), reps=3, pipeline=3, pipe_rounds=1, min_seconds=0)
    assert samples["x"]["uncovered"] == 3


def test_point_rows_take_ratios_round_by_round_and_name_the_fastest(bench):
    gpu = bench("_gpu")
    s = lambda gpu_s, pipe_s: {"host": [1e-5] * 3, "wall": [2e-5] * 3, "gpu": gpu_s, "pipe": pipe_s,  # noqa: E731
                               "uncovered": 0}
    samples = {"ideal_copy": s([1.0, 1.0, 1.0], [1.0]), "torch_index_select": s([2.0, 4.0, 2.0], [2.0]),
               "rowvec16x16": s([1.0, 2.0, 3.0], [1.5]), "aligned": s([3.0, 3.0, 3.0], [3.0]),
               "tuner": s([1.0, 2.0, 3.3], [1.5])}
    rows = {r["method"]: r for r in gpu.point_rows(samples, 2e9, row_bytes=256, count=8)}
    assert rows["rowvec16x16"]["vs_torch"]["median"] == pytest.approx(0.5)  # 0.5, 0.5, 1.5 round by round
    assert rows["rowvec16x16"]["gbps"] == pytest.approx(1.0) and rows["aligned"]["gpu_us"]["median"] == 3e6
    assert rows["tuner"]["best"] == "rowvec16x16" and rows["tuner"]["vs_best"]["median"] == pytest.approx(1.0)
    assert rows["tuner"]["vs_best"]["p75"] == pytest.approx(1.05)
    assert rows["aligned"]["row_bytes"] == 256 and "best" not in rows["aligned"]


def test_run_point_plumbing_on_the_cpu(bench):
    """The whole point, with CPU tensors and the fake clock: torch's path and the ideal are timed and
    checked, variants (CUDA ids only) are named as failed, never dropped silently."""
    gpu = bench("_gpu")
    flat = torch.arange(1 << 18, dtype=torch.int32).view(torch.float32)
    table = gpu.HostTable(flat.numel() * 4, "torch", flat, flat, flat)
    rows = gpu.run_point(table, 256, 512, "sorted", np.random.default_rng(0), FakeClock(), device="cpu", reps=2,
                         pipeline=3, kernels=["rowvec", "aligned"])
    by = {r["method"]: r for r in rows}
    assert {"ideal_copy", "torch_index_select"} <= set(by) and "gbps" in by["torch_index_select"]
    assert all(by[m].get("failed") for m in by if m.startswith(("rowvec", "aligned")))
    assert {r["ids"] for r in rows} == {"sorted"} and all("model_sort_gain" in r for r in rows)
    assert all(r["table_gib"] == pytest.approx(1 / 1024) for r in rows)


def test_table_sizes_that_do_not_fit_are_skipped_with_a_line(bench, tmp_path):
    gpu = bench("_gpu")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   20971520 kB\n")
    assert gpu.free_host_bytes(meminfo) == 20 << 30
    fit, skipped = gpu.fit_table_sizes([256 << 20, 16 << 30, 32 << 30], gpu.free_host_bytes(meminfo))
    assert fit == [256 << 20, 16 << 30]
    assert skipped == ["skipped the 32 GiB table: it needs 32 GiB of host memory, 20 GiB is available and 4 GiB "
                       "stays free"]
    meminfo.write_text("MemTotal: 1 kB\n")
    with pytest.raises(RuntimeError, match="no MemAvailable"):
        gpu.free_host_bytes(meminfo)


def test_the_table_size_sweep_starts_with_both_ends(bench):
    sweep = bench("table_size_sweep")
    assert sweep.decisive_order(sweep.SIZES_GIB) == [0.25, 16, 0.5, 1, 2, 4, 8]
    assert sweep.decisive_order([4]) == [4]


# The tables a GPU sweep prints, from a fake result set.

def _stat(m):
    return {"median": m, "p25": 0.9 * m, "p75": 1.1 * m, "n": 7}


def _fake_rows():
    rows = []
    for ids in ("random", "sorted"):
        for method, us in (("ideal_copy", 10.0), ("torch_index_select", 40.0),
                           ("aligned", 50.0 if ids == "random" else 20.0),
                           ("aligned+sort", 25.0 if ids == "random" else 20.0)):
            rows.append({"row_bytes": 256, "count": 1024, "ids": ids, "method": method, "gpu_us": _stat(us),
                         "pipe_us": _stat(us + 5), "host_us": _stat(8.0), "gbps": 262144 / us / 1e3,
                         "vs_torch": _stat(us / 40), "vs_torch_pipe": _stat((us + 5) / 45), "uncovered": 0.0,
                         "model_sort_gain": {"sector_bytes": 1.0, "pages_4k": 1.2, "pages_2m": 3.0}})
        rows.append({"row_bytes": 256, "count": 1024, "ids": ids, "method": "tuner",
                     "failed": "n/a: this checkout has no kernels.tuner"})
    rows.append({"row_bytes": 256, "count": 1024, "ids": "random", "method": "naive", "failed": "RuntimeError: boom",
                 "model_sort_gain": {}})
    rows[1]["uncovered"] = 1.0
    return rows


def test_gpu_tables_from_a_fake_result_set(bench):
    report = bench("_report")
    text = report.gpu_tables(_fake_rows())
    for title in ("GB/s by GPU time, random ids", "GB/s by GPU time, sorted ids", "pipelined us per call",
                  "host us per call", "GPU time over torch's index_select", "sorting's gain"):
        assert title in text
    first = text.split("\n\n")[0].splitlines()
    assert first[1].split() == ["row_bytes", "count", "ideal_copy", "torch_index_select", "aligned", "aligned+sort",
                                "tuner", "naive"]
    assert first[2].split() == ["256", "1024", "26.21", "6.55", "5.24", "10.49", "n/a", "failed"]
    gains = text[text.index("sorting's gain"):].splitlines()
    row = dict(zip(gains[1].split(), gains[3].split()))  # gains[2]: torch_index_select, no +sort variant
    assert row["kernel"] == "aligned" and row["kernel+sort"] == "2.00" and row["presorted"] == "2.50"
    assert row["model_pages_2m"] == "3.00"
    assert "not measured: naive: RuntimeError: boom (1 point)" in text
    assert "not measured: tuner: n/a: this checkout has no kernels.tuner (2 points)" in text
    assert "waits on the GPU (its GPU time includes host work) in 100% of samples: torch_index_select" in text


def test_the_tuner_verdict_says_when_the_tuner_was_not_measured(bench):
    check = bench("tuner_check")
    table, summary = check.verdicts(_fake_rows())
    assert table[0]["tuner pick"].startswith("n/a") and summary == [
        "the tuner was not measured: n/a: this checkout has no kernels.tuner"]
    slow = {"row_bytes": 8, "count": 1, "ids": "random", "method": "tuner", "pick": "naive", "best": "aligned",
            "gpu_us": _stat(12.0), "vs_best": _stat(1.2), "vs_torch": _stat(1.1)}
    table, summary = check.verdicts([slow])
    assert table[0]["within 5%"] == "no" and summary[0].startswith(
        "the tuner within 5% of the fastest candidate (GPU time) at 0 of 1 points; at most the time of torch's "
        "index_select at 0 of 1")


def test_the_unified_goals_from_a_fake_result_set(bench):
    unified = bench("unified_gather")
    rows = [{"row_bytes": 400, "count": c, "ids": "random", "method": "unified_getitem", "vs_torch": _stat(r),
             "vs_torch_pipe": _stat(r), "wall_us": _stat(w), "gpu_us": _stat(10.0)}
            for c, r, w in ((1024, 1.2, 200.0), (131072, 0.8, 40.0))]
    rows.append({"row_bytes": 400, "count": 8, "ids": "random", "method": "unified_getitem", "failed": "x"})
    table, summary = unified.goals(rows)
    assert [t["overhead us"] for t in table] == ["190.0", "30.0"]
    assert summary == ["unified[idx] at most 1.0x index_select: 1 of 2 points by GPU time, 1 of 2 pipelined",
                       "unified[idx] host overhead at most 50 us: 1 of 2 points"]


def test_gather_bandwidth_adds_the_512_mib_point_per_row_size(bench):
    gb = bench("gather_bandwidth")
    assert gb.counts_for(4096, [1024], [512]) == [1024, 131072]
    assert gb.counts_for(1024, [1024], []) == [1024]
    args = gb.build_parser().parse_args(["--quick"])
    gb._preset(args, gb.build_parser(), {**gb.GPU_DEFAULTS, **gb.GPU_QUICK})
    assert args.row_bytes == gb.GPU_QUICK["row_bytes"] and args.table_gib == gb.GPU_QUICK["table_gib"]
    args = gb.build_parser().parse_args(["--row-bytes", "400", "--quick"])
    gb._preset(args, gb.build_parser(), {**gb.GPU_DEFAULTS, **gb.GPU_QUICK})
    assert args.row_bytes == [400]  # what the command line gave stays


# The hot-path section's switch.

def test_sync_debug_is_off_without_the_variable(sync_debug, monkeypatch):
    monkeypatch.delenv("DIRECTLOAD_SYNC_DEBUG", raising=False)
    with sync_debug() as on:
        assert on is False


def test_sync_debug_turns_errors_on_and_restores_the_mode(sync_debug, monkeypatch):
    modes = ["warn"]
    monkeypatch.setenv("DIRECTLOAD_SYNC_DEBUG", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    with pytest.raises(ZeroDivisionError):
        with sync_debug() as on:
            assert on is True and modes[-1] == "error"
            raise ZeroDivisionError  # the mode is restored however the block ends
    assert modes == ["warn", "error", "warn"]

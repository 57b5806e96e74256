"""The reports' plots show what they claim: every line visible, readable axes, nothing drawn over the text."""

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def captured(monkeypatch):
    """Figures that the code under test saves, kept open instead of written."""
    sys.path.insert(0, str(BENCH))
    figures = []
    common = importlib.import_module("_common")
    monkeypatch.setattr(common, "save_figure", lambda fig, path: figures.append(fig))
    yield figures
    sys.path.remove(str(BENCH))


def test_alignment_plot_shows_the_aligned_line_over_the_minimum(captured, monkeypatch):
    sweep = importlib.import_module("alignment_sweep")
    monkeypatch.setattr(sweep, "save_figure", lambda fig, path: captured.append(fig))
    results = [{"row_bytes": b, "l2req_naive": 32.0, "l2req_paper": 18.0, "l2req_aligned": 17.0, "l2req_min": 17.0}
               for b in range(2048, 2080, 4)]
    sweep._plot(results, None, on_gpu=False)
    lines = {line.get_label(): line for line in captured[0].axes[0].get_lines()}
    ours = next(v for k, v in lines.items() if k.startswith("directload aligned"))
    floor = lines["minimum (lines spanned)"]
    assert list(ours.get_ydata()) == list(floor.get_ydata())  # the same values...
    assert ours.get_marker() not in ("None", None, "") and ours.get_linestyle() != floor.get_linestyle()
    assert ours.get_zorder() >= floor.get_zorder() and floor.get_linewidth() > ours.get_linewidth()  # ...both seen


def test_unified_gather_plot_has_a_log_axis(captured):
    unified = importlib.import_module("unified_gather")
    results = [{"count": c, "row_bytes": 400, "unified_gbps": g, "index_select_gbps": g / 3} for c, g in
               ((1024, 0.2), (262144, 20.0))]
    unified._plot(results, None)
    assert captured[0].axes[0].get_yscale() == "log"


def test_training_plot_keeps_its_legend_off_the_bars_and_names_the_accuracy(monkeypatch):
    from directload.harness import experiments

    figures = []
    monkeypatch.setattr(experiments, "save_figure", lambda fig, path: figures.append(fig))
    summary = [{"model": "sage", "loader": name, "sample_s": 0.5, "gather_s": 0.3, "train_s": 1.0, "epoch_s": 1.9,
                "test_acc_pct": 71.5, "first_epoch_left_out": True} for name in ("dgl", "directload")]
    experiments._plot(summary, None, {"dataset": "synth-tiny", "device": "cpu"})
    fig = figures[0]
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    for text in ax.texts:
        assert "test acc" in text.get_text()
        assert not legend.overlaps(text.get_window_extent(renderer))
    assert not legend.overlaps(ax.get_window_extent(renderer))  # below the axes, not over bars or labels
    assert "steady epoch" in ax.get_ylabel()


def test_out_of_core_plot_shows_every_configuration_against_the_ideal(captured, monkeypatch):
    ooc = importlib.import_module("out_of_core")
    monkeypatch.setattr(ooc, "save_figure", lambda fig, path: captured.append(fig))
    rows = [{"config": "in memory", "first s": 2.0, "steady s": 0.6, "% of ideal": 100.0},
            {"config": "DiskStore", "first s": 2.4, "steady s": 1.2, "% of ideal": 50.0},
            {"config": "broken", "first s": "failed"}]
    ooc.plot(rows, None, type("A", (), {"dataset": "synth-ooc", "host_frac": 0.25, "headroom": "1.5G"})())
    ideal, epochs = captured[0].axes[:2]
    assert [p.get_height() for p in ideal.patches] == [100.0, 50.0]  # the failed run is left out, not drawn as 0
    assert [t.get_text() for t in ideal.get_xticklabels()] == ["in memory", "DiskStore"]
    assert epochs.get_yscale() == "log" and len(epochs.patches) == 4


@pytest.mark.parametrize("cuda", [False, True])
def test_out_of_core_caps_hold_what_each_feature_store_holds(captured, cuda, tmp_path):
    ooc = importlib.import_module("out_of_core")
    args = type("A", (), {"root": str(tmp_path), "dataset": "synth-ooc", "epochs": 2, "fanouts": [10, 5],
                          "batch_size": 256, "host_frac": 0.25, "gpu_frac": 0.05, "staging": 256 << 20,
                          "codecs": ["int8"]})()
    table = 10 ** 6 * 4096  # synth-ooc, not made: its preset's sizes
    host, gpu, staging = table // 4, table // 20, 256 << 20
    configs = dict(ooc.configs(args, table, (10 ** 6, 1024)))
    stacks = {name: ooc.stack_bytes(args, extra, cuda) for name, extra in configs.items()}
    assert stacks["DGL + memmap"] == 0 and 0 < stacks["DiskStore"] <= 64 << 20  # no store; a disk store's staging
    for name in ("HostCache lru", "HostCache sieve", "HostCache lookahead"):
        assert stacks[name] > host + staging  # the cache, its read-ahead slots, its buffers and bookkeeping
    tier = stacks["TieredStore"] - stacks["HostCache lookahead"]  # the GPU tier's part in host memory
    assert tier > gpu if not cuda else 0 < tier < gpu  # its slots where CUDA does not run; staging always
    assert stacks["TieredStore packed"] > stacks["TieredStore"]  # the warm's rounds
    # int8 codes: a cache of the float32 cache's bytes, and one of its rows (1,032-byte code rows, not 4,096)
    assert configs["HostCache lookahead int8"][-2:] == ["--codec", "int8"]
    assert stacks["HostCache lookahead int8"] == stacks["HostCache lookahead"]
    same_rows = configs["HostCache lookahead int8 equal rows"]
    assert int(same_rows[same_rows.index("--host-cache") + 1]) == host * 1032 // 4096
    assert not list(tmp_path.iterdir())


def test_node_share_plot_draws_each_mode_against_the_budget_and_the_fairness_goal(captured, monkeypatch):
    share = importlib.import_module("node_share")
    monkeypatch.setattr(share, "save_figure", lambda fig, path: captured.append(fig))
    assert share.jain([3, 3, 3]) == 1.0 and abs(share.jain([1, 0]) - 0.5) < 1e-12 and share.jain([0, 0]) == 0.0
    rows = [{"jobs": j, "mode": m, "agg rows/s": 100.0 * j, "jain": 1.0 if m == "arbiter" else 1 / j,
             "caches held MiB": 488.0 * (1 if m == "arbiter" else j)} for j in (1, 2) for m in ("arbiter", "alone")]
    args = type("A", (), {"dataset": "synth-share", "budget_frac": 0.5})()
    share.plot(rows, None, args, 488 * 2**20)
    rate, fair, memory = captured[0].axes
    assert [line.get_label() for line in rate.get_lines()] == ["arbiter", "alone"]
    assert 0.9 in [line.get_ydata()[0] for line in fair.get_lines()]  # the goal is drawn
    held = {line.get_label(): list(line.get_ydata()) for line in memory.get_lines()}
    assert held["arbiter: caches held"] == [488.0, 488.0] and held["alone: caches held"] == [488.0, 976.0]
    assert list(held["node budget"]) == [488.0, 488.0]

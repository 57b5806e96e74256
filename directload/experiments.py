"""Side-by-side training runs (DGL's loader against directload's): sweep, table, JSON and stacked-bar PNG."""

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from .plotting import pyplot, save_figure
from .train import TrainConfig, train

__all__ = ["compare", "summarize", "write_report"]


def compare(dataset, base, *, models=("sage",), loaders=("dgl", "directload"), seeds=(0,), progress=True):
    """Train every (model, seed, loader), loaders interleaved so they share the machine's state.

    Returns
    -------
    list of dict
        One row per run: the configuration, per-epoch stats and accuracies.
    """
    rows = []
    for model in models:
        for seed in seeds:
            for loader in loaders:
                cfg = TrainConfig(**{**asdict(base), "model": model, "loader": loader, "seed": seed})
                t0 = time.perf_counter()
                res = train(dataset, cfg, progress=progress)
                rows.append({"model": model, "loader": loader, "seed": seed, "wall_s": time.perf_counter() - t0,
                             "valid_acc": res.valid_acc, "test_acc": res.test_acc,
                             "epochs": [asdict(e) for e in res.epochs], "config": res.config})
    return rows


def _steady(epochs, key):
    """Median over epochs, leaving out the first (JIT compiles, cold caches) when there are more."""
    vals = [e[key] for e in (epochs[1:] if len(epochs) > 1 else epochs)]
    return statistics.median(vals)


def summarize(rows):
    """Per (model, loader): median steady-state epoch breakdown and mean accuracies over seeds."""
    out = []
    keys = sorted({(r["model"], r["loader"]) for r in rows}, key=lambda k: (k[0], k[1] != "dgl"))
    for model, loader in keys:
        rs = [r for r in rows if r["model"] == model and r["loader"] == loader]
        row = {"model": model, "loader": loader, "seeds": len(rs)}
        for key in ("epoch_s", "sample_s", "gather_s", "train_s", "wait_s"):
            row[key] = statistics.median(_steady(r["epochs"], key) for r in rs)
        row["valid_acc"] = statistics.mean(r["valid_acc"] for r in rs)
        row["test_acc"] = statistics.mean(r["test_acc"] for r in rs)
        out.append(row)
    for row in out:
        ref = next((r for r in out if r["model"] == row["model"] and r["loader"] == "dgl"), None)
        if ref is not None:
            row["epoch_vs_dgl"] = row["epoch_s"] / ref["epoch_s"]
            row["test_acc_minus_dgl"] = 100 * (row["test_acc"] - ref["test_acc"])
    return out


def write_report(rows, out_dir, name, meta):
    """Write ``<name>.json`` (every run and the summary) and ``<name>.png`` (stacked bars, as Fig. 4.8)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2))
    _plot(summary, out_dir / f"{name}.png", meta)
    return path, summary


def _plot(summary, path, meta):
    plt = pyplot()
    labels = [f"{r['model']}\n{r['loader']}" for r in summary]
    parts = [("sample_s", "sampling"), ("gather_s", "feature gather/copy"), ("train_s", "training")]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(summary)) + 2.5, 4.5))
    bottom = [0.0] * len(summary)
    for key, label in parts:
        vals = [r[key] for r in summary]
        ax.bar(labels, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(labels, [r["epoch_s"] for r in summary], marker="_", s=900, color="black", zorder=3,
               label="epoch wall time")
    for i, r in enumerate(summary):
        ax.annotate(f"acc {100 * r['test_acc']:.1f}%", (i, r["epoch_s"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    ax.set_ylabel("seconds per epoch (median)")
    ax.set_title(f"Epoch breakdown: {meta.get('dataset', '')} on {meta.get('device', 'cpu')}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)

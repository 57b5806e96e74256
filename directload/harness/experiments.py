"""Side-by-side training runs (the framework's own loader against directload's): sweep, table, JSON, PNG."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .plotting import pyplot, save_figure
from .train import TrainConfig, train

if TYPE_CHECKING:
    from directload.datasets import Dataset

__all__ = ["compare", "summarize", "write_report", "print_summary", "json_safe"]

#: The frameworks' own loaders, the reference of every comparison.
STOCK = ("dgl", "pyg")
#: Epoch-time columns of a summary row, in seconds.
TIME_KEYS = ("epoch_s", "sample_s", "gather_s", "train_s", "wait_s")


def compare(dataset: Dataset, base: TrainConfig, *, models: Sequence[str] = ("sage",),
            loaders: Sequence[str] = ("dgl", "directload"), seeds: Sequence[int] = (0,), progress: bool = True,
            conditions: Sequence[tuple[str, Callable[[], AbstractContextManager[Any]]]] | None = None
            ) -> list[dict[str, Any]]:
    """Train every (model, seed, loader), loaders interleaved so they share the machine's state.

    ``conditions``, a list of ``(name, factory)`` where ``factory()`` is a context manager (a CPU hog, say),
    runs every (model, seed) once under each, in turn, so that conditions interleave as loaders do; each row
    then names its ``condition``, and the first is the baseline the others are compared with.

    In a rank of a DDP job (torchrun) each run is that rank's part; the row then has every rank's epochs
    under ``ranks``.

    Returns
    -------
    list of dict
        One row per run: the configuration, per-epoch stats and accuracies.
    """
    rows = []
    for model in models:
        for seed in seeds:
            for name, factory in conditions or [(None, None)]:  # type: ignore[list-item]  # none: one unnamed run
                if factory is None:
                    got = _runs(dataset, base, model, seed, loaders, progress)
                else:
                    with factory():
                        got = _runs(dataset, base, model, seed, loaders, progress)
                rows += [{**row, "condition": name} if name is not None else row for row in got]
    return rows


def _runs(dataset, base, model, seed, loaders, progress):
    """One run of ``model`` with ``seed`` per loader, in turn."""
    rows = []
    for loader in loaders:
        cfg = base.run_of(loader, model=model, seed=seed)
        t0 = time.perf_counter()
        res = train(dataset, cfg, progress=progress)
        rows.append({"model": model, "loader": loader, "sampler": res.config.get("sampler", cfg.sampler), "seed": seed,
                     "wall_s": time.perf_counter() - t0,
                     "valid_acc": res.valid_acc, "test_acc": res.test_acc,
                     "epochs": [asdict(e) for e in res.epochs], "config": res.config, "warm": res.warm,
                     "stages": getattr(res, "stages", None) or {},
                     **({"ranks": res.ranks} if res.ranks else {}),
                     **({"budget": res.budget} if res.budget else {})})
    return rows


def _steady(epochs, key):
    """Median over epochs, leaving out the first (JIT compiles, cold caches) when there are more."""
    vals = [e[key] for e in (epochs[1:] if len(epochs) > 1 else epochs)]
    return statistics.median(vals)


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, loader): median steady-state epoch breakdown over seeds, and mean accuracies.

    Units: times in seconds, accuracies in percent.  Rows of directload's
    loader also compare with the framework's own loader (``reference``:
    ``"dgl"`` or ``"pyg"``) on the same seeds: ``epoch_vs_reference`` is the
    median of the per-seed ratios of epoch times, with ``..._min`` and
    ``..._max`` their range; ``test_acc_vs_reference_pp`` is the mean
    per-seed difference of test accuracy, in percentage points (with its
    ``_min`` and ``_max``); ``first_epoch_vs_reference`` is the ratio of the
    first epochs of the first seed (``first_seed``), where one-time costs
    (imports, kernels loaded or compiled, cold caches) fall, which a median over
    seeds would hide.  With conditions (:func:`compare`), rows are per (model, condition, loader),
    compared with the reference under the same condition, and ``epoch_vs_baseline`` is the median per-seed
    ratio of a loader's epoch under a condition to its own under the first condition (the slowdown it
    causes).
    """
    out = []
    order = list(dict.fromkeys(r.get("condition") for r in rows))  # conditions as run; the first is the baseline
    keys = sorted({(r["model"], r.get("condition"), r["loader"]) for r in rows},
                  key=lambda k: (k[0], order.index(k[1]), k[2] == "directload"))
    for model, condition, loader in keys:
        rs = sorted((r for r in rows if r["model"] == model and r["loader"] == loader
                     and r.get("condition") == condition), key=lambda r: r["seed"])
        row = {"model": model, "loader": loader, "seeds": len(rs),
               **({"condition": condition} if condition is not None else {}),
               "steady_epochs": len(rs[0]["epochs"]) - 1 if len(rs[0]["epochs"]) > 1 else 1,
               "first_epoch_left_out": len(rs[0]["epochs"]) > 1}
        for key in TIME_KEYS:
            row[key] = statistics.median(_steady(r["epochs"], key) for r in rs)
        row["first_epoch_s"] = statistics.median(r["epochs"][0]["epoch_s"] for r in rs)
        if rs[0].get("stages"):
            row["stages"] = rs[0]["stages"]
        if all(r.get("warm") for r in rs):  # packed tiers: the caches filled before the first epoch
            row["warm_s"] = statistics.median(r["warm"]["seconds"] for r in rs)
        ios = [e["io"] for r in rs for e in r["epochs"][1:] or r["epochs"] if e.get("io")]
        if ios:  # the disk store's counters over the steady epochs
            row["disk"] = {key: statistics.median(io[key] for io in ios) for key in ios[0]}
        tiers = [e["tiers"] for r in rs for e in r["epochs"][1:] or r["epochs"] if e.get("tiers")]
        if tiers:  # each cache tier's counters over the steady epochs
            row["tiers"] = {name: {k: statistics.median(float(t[name][k]) for t in tiers) for k in tiers[0][name]}
                            for name in tiers[0] if name != "disk"}
        if all(r.get("ranks") for r in rs):  # DDP: each rank's steady epoch breakdown, median over seeds
            row["ranks"] = [{"rank": i, **{key: statistics.median(_steady(r["ranks"][i], key) for r in rs)
                                           for key in TIME_KEYS}} for i in range(len(rs[0]["ranks"]))]
        if all(r.get("budget") for r in rs):  # a node budget: its limits and this loader's shares (first seed)
            row["budget"] = rs[0]["budget"]
        row["valid_acc_pct"] = 100 * statistics.mean(r["valid_acc"] for r in rs)
        row["test_acc_pct"] = 100 * statistics.mean(r["test_acc"] for r in rs)
        ref = {r["seed"]: r for r in rows
               if r["model"] == model and r["loader"] in STOCK and r.get("condition") == condition}
        pairs = [(r, ref[r["seed"]]) for r in rs if r["seed"] in ref]
        if loader == "directload" and pairs:
            ratios = _spread([_steady(r["epochs"], "epoch_s") / _steady(d["epochs"], "epoch_s") for r, d in pairs])
            diffs = [100 * (r["test_acc"] - d["test_acc"]) for r, d in pairs]
            ours, theirs = (run["epochs"][0]["epoch_s"] for run in pairs[0])  # the first seed's first epochs
            row.update({"reference": pairs[0][1]["loader"], "epoch_vs_reference": ratios["median"],
                        "epoch_vs_reference_min": ratios["min"], "epoch_vs_reference_max": ratios["max"],
                        "test_acc_vs_reference_pp": statistics.mean(diffs),
                        "test_acc_vs_reference_pp_min": min(diffs), "test_acc_vs_reference_pp_max": max(diffs),
                        "first_seed": pairs[0][0]["seed"], "first_seed_first_epoch_s": ours,
                        "first_seed_reference_first_epoch_s": theirs, "first_epoch_vs_reference": ours / theirs})
        base = {r["seed"]: r for r in rows if r["model"] == model and r["loader"] == loader
                and r.get("condition") == order[0]}
        if condition != order[0] and any(r["seed"] in base for r in rs):  # the slowdown a condition causes
            slow = _spread([_steady(r["epochs"], "epoch_s") / _steady(base[r["seed"]]["epochs"], "epoch_s")
                            for r in rs if r["seed"] in base])
            row.update({"baseline": order[0], "epoch_vs_baseline": slow["median"],
                        "epoch_vs_baseline_min": slow["min"], "epoch_vs_baseline_max": slow["max"]})
        out.append(row)
    return out


def json_safe(value: object) -> object:
    """``value`` with every NaN or infinity replaced by None, so the JSON is standard (``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_report(rows: Sequence[Mapping[str, Any]], out_dir: os.PathLike[str] | str, name: str,
                 meta: Mapping[str, Any]) -> tuple[Path, list[dict[str, Any]]]:
    """Write ``<name>.json`` (every run and the summary) and ``<name>.png`` (stacked bars, as Fig. 4.8)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(json_safe({"meta": meta, "summary": summary, "runs": rows}), indent=2,
                               allow_nan=False))
    _plot(summary, out_dir / f"{name}.png", meta)
    return path, summary


def _fmt(value, spec):
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def print_summary(summary: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    """The summary as a table with units in its header."""
    steady = summary[0]["first_epoch_left_out"] if summary else False
    how = "median over seeds of the median steady epoch (first epoch left out)" if steady else \
        "median over seeds (one epoch per run, so it includes compile and cold-cache time)"
    policy = f", OpenMP wait policy {meta['openmp_wait_policy']}" if "openmp_wait_policy" in meta else ""
    codes = f" (directload's loader carries them as {meta['codec']} codes)" if meta.get("codec") else ""
    print(f"\n{meta['dataset']}: {meta['nodes']} nodes, {meta['edges']} edges, {meta['feats']} features{codes}; "
          f"{meta['device']}, {meta['torch_threads']} torch threads{policy}; {how}")
    if meta.get("sampler"):
        # a meta without a framework: .get(None) gives the default (the ignore: mypy wants a str key)
        own = {"dgl": "DGL", "pyg": "PyG"}.get(meta.get("framework"), "the framework")  # type: ignore[arg-type]
        print("sampler: " + "; ".join(f"{loader}'s loader samples with {own if s == 'framework' else 'directload'}'s"
                                      for loader, s in meta["sampler"].items()))
    conditioned = any("condition" in r for r in summary)
    cols = [("model", "model", "s"), *([("condition", "condition", "s")] if conditioned else []),
            ("loader", "loader", "s"), ("seeds", "seeds", "d"),
            ("first_epoch_s", "first epoch s", ".3f"), ("epoch_s", "epoch s", ".3f"),
            ("sample_s", "sample s", ".3f"), ("gather_s", "gather s", ".3f"),
            ("train_s", "train s", ".3f"), ("wait_s", "wait s", ".3f"), ("valid_acc_pct", "valid acc %", ".2f"),
            ("test_acc_pct", "test acc %", ".2f")]
    ref = {"dgl": "DGL", "pyg": "PyG"}.get(next((r["reference"] for r in summary if "reference" in r), ""), "own")
    header = [c[1] for c in cols] + [f"epoch vs {ref} (min-max)", f"test acc vs {ref} (pp)"]
    if conditioned:
        header.append(f"epoch vs {summary[0].get('condition')} (min-max)")
    table = []
    for r in summary:
        cells = [_fmt(r.get(k), spec) for k, _, spec in cols]
        if "epoch_vs_reference" in r:
            cells.append(f"{r['epoch_vs_reference']:.3f} ({r['epoch_vs_reference_min']:.3f}-"
                         f"{r['epoch_vs_reference_max']:.3f})")
            cells.append(f"{r['test_acc_vs_reference_pp']:+.2f}")
        else:
            cells += ["", ""]
        if conditioned:
            cells.append(f"{r['epoch_vs_baseline']:.3f} ({r['epoch_vs_baseline_min']:.3f}-"
                         f"{r['epoch_vs_baseline_max']:.3f})" if "epoch_vs_baseline" in r else "")
        table.append(cells)
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in table:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    for r in summary:
        if r.get("stages"):
            print(f"{r['model']}/{r['loader']} ran: " + ", ".join(f"{k} on {v}" for k, v in r["stages"].items()))
        if "first_epoch_vs_reference" in r:
            print(f"{r['model']}/{r['loader']} first epoch of seed {r['first_seed']}, one-time costs in it (imports, "
                  f"kernels loaded, cold caches): {r['first_seed_first_epoch_s']:.3f} s against "
                  f"{r['first_seed_reference_first_epoch_s']:.3f} s for {ref}'s loader "
                  f"({r['first_epoch_vs_reference']:.3f}x)")
        for k in r.get("ranks") or ():
            print(f"{r['model']}/{r['loader']} rank {k['rank']} of {len(r['ranks'])}: epoch {k['epoch_s']:.3f} s "
                  f"(sample {k['sample_s']:.3f}, gather {k['gather_s']:.3f}, train {k['train_s']:.3f}, "
                  f"wait {k['wait_s']:.3f})")
        if r.get("budget"):
            b = r["budget"]
            shares = ", ".join(f"{e['host_bytes'] / 2**20:.0f}" for e in b["epochs"])
            print(f"{r['model']}/{r['loader']} node budget {b['name']!r} of {b['limits']['host_bytes'] / 2**20:.0f} "
                  f"MiB: this job's share at each epoch's end {shares} MiB (it wants "
                  f"{b['want']['host_bytes'] / 2**20:.0f}, needs {b['least']['host_bytes'] / 2**20:.0f})")
        if r.get("disk"):
            d = r["disk"]
            print(f"{r['model']}/{r['loader']} disk store per steady epoch: {d['reads']:.0f} reads, "
                  f"{d['bytes_read'] / 1e9:.3f} GB read (amplification {d['read_amplification']:.2f}), "
                  f"{d['iops']:.0f} IOPS, {d['gb_per_s']:.3f} GB/s, {d['cpu_us_per_read']:.2f} CPU us/read")
        for name, t in (r.get("tiers") or {}).items():
            if name == "partitioned":  # a table split among the ranks: how much came from the others
                print(f"{r['model']}/{r['loader']} partitioned table per steady epoch: {t['local_rows']:.0f} rows from "
                      f"this rank's own, {t['remote_rows']:.0f} from the other ranks "
                      f"({t['remote_bytes'] / 1e6:.1f} MB)")
                continue
            if name == "exchange":
                print(f"{r['model']}/{r['loader']} all-to-all exchange per steady epoch: "
                      f"{t['bytes_sent'] / 1e6:.1f} MB sent, {t['bytes_received'] / 1e6:.1f} MB received, "
                      f"{t['duplicates_saved']:.0f} duplicate ids not sent, {t['seconds']:.2f} s exchanging")
                continue
            if "hit_rate" not in t:  # a tier that holds rows without caching them (a tensor)
                continue
            if name == "hot":  # rows held once per node: nothing read, nothing evicted
                print(f"{r['model']}/{r['loader']} hot rows shared on the node, per steady epoch: "
                      f"{t['capacity_rows']:.0f} rows, hit rate {t['hit_rate']:.3f}")
                continue
            print(f"{r['model']}/{r['loader']} {name} tier per steady epoch: hit rate {t['hit_rate']:.3f} "
                  f"(with rows read ahead {t['slot_rate']:.3f}), {t['fallback_bytes'] / 1e9:.3f} GB from below, "
                  f"{t['forwarded_bytes'] / 1e9:.3f} GB forwarded, read {t['read_s']:.2f} s (waiting on the tier "
                  f"below {t['fallback_s']:.2f} s, policy {t['policy_s']:.2f} s)")


def _plot(summary, path, meta):
    plt = pyplot()
    labels = ["\n".join(str(r[k]) for k in ("model", "condition", "loader") if k in r) for r in summary]
    parts = [("sample_s", "sampling"), ("gather_s", "feature gather/copy"), ("train_s", "training")]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(summary)) + 1.0, 5.2))
    bottom = [0.0] * len(summary)
    for key, label in parts:
        vals = [r[key] for r in summary]
        ax.bar(labels, vals, bottom=bottom, label=label, width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    epoch = [r["epoch_s"] for r in summary]
    ax.scatter(labels, epoch, marker="_", s=900, color="black", zorder=3, label="epoch wall time")
    for i, r in enumerate(summary):
        ax.annotate(f"test acc\n{r['test_acc_pct']:.1f}%", (i, r["epoch_s"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.3 * max(max(epoch), max(bottom)) if summary else 1)
    steady = "steady epoch, median over seeds" if summary and summary[0]["first_epoch_left_out"] else \
        "one epoch, median over seeds"
    ax.set_ylabel(f"seconds per epoch ({steady})")
    policy = f"\nOpenMP wait policy {meta['openmp_wait_policy']}" if "openmp_wait_policy" in meta else ""
    ax.set_title(f"Epoch breakdown: {meta.get('dataset', '')} on {meta.get('device', 'cpu')}{policy}")
    # Below the axes, where no bar or label can sit under it.
    # The epoch's marker at half size, so its sample stays within the legend's handle, off its label.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False, markerscale=0.5)
    save_figure(fig, path)

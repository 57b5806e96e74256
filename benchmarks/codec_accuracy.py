"""Accuracy with compressed rows: test accuracy of float32 against each codec, and each codec's reconstruction error.

Per dataset, model and codec, one ``directload train --loader directload --features memory [--codec C]`` run of
``--seeds`` seeds (the same seeds, so the same batches and initial weights: only the rows differ).  Reported:

* the median test accuracy over the seeds, its range, and its difference from float32's in points, against the
  goal (within 0.3 points for float16 and bfloat16, 0.5 for int8);
* per codec, the rows' reconstruction error over the whole table: ``|x - decode(encode(x))| / |x|`` per row
  (L2 norms; median, p99 and max), and the largest absolute error as a fraction of the codec's own bound
  (:meth:`directload.codecs.Codec.error_bound`; at most 1).

Datasets: synthetic presets are generated when missing; a real one must be under ``--root`` already
(``directload dataset import tolokers.npz``, the heterophilous-graph benchmark's file with dense features);
one that is neither is skipped with a note.  Writes ``results/codec_accuracy.json`` and ``.png``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, parse_with_quick, print_table, system_facts  # noqa: E402

from directload.codecs import CODECS, codec  # noqa: E402
from directload.datasets import PRESETS, dataset_exists, load, synthesize  # noqa: E402
from directload.harness.parser import HelpFormatter  # noqa: E402
from directload.harness.plotting import pyplot, save_figure  # noqa: E402
from directload.unified import host_of  # noqa: E402

GOAL = {"float16": 0.3, "bfloat16": 0.3, "int8": 0.5}  # points of test accuracy from float32's
QUICK = {"datasets": ["synth-tiny"], "models": ["sage"], "seeds": 1, "epochs": 1, "codecs": ["float32", "int8"]}


def reconstruction(feat, name, chunk=1 << 16):
    """Per-row relative L2 error of ``name``'s round trip over ``feat`` (in chunks), and the largest absolute
    error as a fraction of the codec's bound."""
    c = codec(name)
    rel, worst = [], 0.0
    for s in range(0, feat.shape[0], chunk):
        x = torch.as_tensor(np.asarray(feat[s:s + chunk]), dtype=torch.float32)
        back = c.decode(c.encode(x))
        err = (back - x).float()
        norm = x.norm(dim=1)
        rel.append(torch.where(norm > 0, err.norm(dim=1) / norm.clamp_min(1e-30), err.norm(dim=1)).numpy())
        worst = max(worst, float((err.abs().amax(1) / c.error_bound(x)).max()))
    rel = np.concatenate(rel)
    return {"rel_median": float(np.median(rel)), "rel_p99": float(np.percentile(rel, 99)),
            "rel_max": float(rel.max()), "abs_vs_bound_max": worst}


def train_runs(args, dataset, codec_name, out):
    """Test accuracies per model over the seeds, from one ``directload train`` process."""
    cmd = [sys.executable, "-m", "directload", "train", "--dataset", dataset, "--root", args.root, "--loader",
           "directload", "--features", "memory", "--model", args.models[0] if len(args.models) == 1 else "both",
           "--seeds", str(args.seeds), "--epochs", str(args.epochs), "--no-progress", "--out", str(out)]
    if args.framework:
        cmd += ["--framework", args.framework]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if codec_name != "float32":
        cmd += ["--codec", codec_name]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"codec_accuracy: {' '.join(cmd[2:])} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    (path,) = Path(out).glob("train_*.json")  # one report for the models of the run
    report = json.loads(path.read_text())
    if report["meta"].get("codec") != (None if codec_name == "float32" else codec_name):
        raise SystemExit(f"codec_accuracy: the run of {codec_name} reports codec {report['meta'].get('codec')}")
    accs = {model: [r["test_acc"] * 100 for r in report["runs"] if r["model"] == model] for model in args.models}
    return accs, report["meta"]["framework"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["synth-small", "synth-planted", "tolokers"],
                   help="datasets: presets are generated when missing, others must be under --root")
    p.add_argument("--models", nargs="+", choices=["sage", "gat"], default=["sage", "gat"])
    p.add_argument("--codecs", nargs="+", choices=["float32", *CODECS], default=["float32", *CODECS],
                   help="float32 is the reference every codec is compared with")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per run")
    p.add_argument("--epochs", type=int, default=3, help="epochs per seed")
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--framework", choices=["dgl", "pyg"], default=None, help="default: train's (the installed one)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's choice)")
    p.add_argument("--results", default=str(RESULTS), help="directory for the JSON and PNG")
    p.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK} unless given")
    args = parse_with_quick(p, argv, QUICK)
    if "float32" not in args.codecs:
        p.error("--codecs must include float32, the reference")
    if args.seeds < 1 or args.epochs < 1:
        p.error("--seeds and --epochs must be at least 1")
    datasets, skipped = [], []
    for name in args.datasets:
        if name in PRESETS and not dataset_exists(args.root, name):
            synthesize(args.root, name)
        (datasets if dataset_exists(args.root, name) else skipped).append(name)
    for name in skipped:
        print(f"codec_accuracy: skipping {name}: not under {args.root} (import it: directload dataset import FILE.npz)")
    rows, framework = [], None
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(datasets) * len(args.codecs), desc="codec accuracy runs") as bar:
        for name in datasets:
            feat = host_of(load(args.root, name).feat)
            errors = {c: reconstruction(feat, c) for c in args.codecs if c != "float32"}
            accs = {}
            for c in args.codecs:
                with tempfile.TemporaryDirectory(prefix="directload-codec-acc-") as where:
                    accs[c], framework = train_runs(args, name, c, where)
                bar.update()
            rows += summary(args, name, accs, errors)
            stem = write(out, args, framework, skipped, rows)  # after each dataset: a long run keeps what it did
    print(f"\ntest accuracy %, median over {args.seeds} seeds of {args.epochs} epochs ({framework}), and the "
          "rows' reconstruction error (relative L2 per row; abs error / the codec's bound)")
    shown = [{**r, **{k: f"{r[k]:.2e}" for k in ("rel_median", "rel_p99", "rel_max") if k in r}} for r in rows]
    print_table(shown, ["dataset", "model", "codec", "acc_median", "acc_min", "acc_max", "vs_float32_pp", "goal_pp",
                        "within_goal", "rel_median", "rel_p99", "rel_max", "abs_vs_bound_max"])
    if rows:
        plot(rows, out / f"{stem}.png", framework)
        print(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")


def summary(args, name, accs, errors):
    """The rows of dataset ``name``: per model and codec, the accuracies over the seeds and their difference from
    float32's median, with the codec's reconstruction error and the goal."""
    rows = []
    for model in args.models:
        base = statistics.median(accs["float32"][model])
        for c in args.codecs:
            a = accs[c][model]
            med = statistics.median(a)
            row = {"dataset": name, "model": model, "codec": c, "acc_median": med, "acc_min": min(a),
                   "acc_max": max(a), "vs_float32_pp": med - base, "seeds": a}
            if c != "float32":
                row.update(errors[c], goal_pp=GOAL[c], within_goal=abs(med - base) <= GOAL[c])
            rows.append(row)
    return rows


def write(out, args, framework, skipped, rows):
    """The JSON of the rows so far; its file stem."""
    stem = f"codec_accuracy_{framework}" if framework else "codec_accuracy"
    (out / f"{stem}.json").write_text(json.dumps({"system": system_facts(), "args": vars(args),
                                                  "framework": framework, "skipped": skipped, "rows": rows},
                                                 indent=1))
    return stem


def plot(rows, path, framework):
    plt = pyplot()
    groups = sorted({(r["dataset"], r["model"]) for r in rows}, key=lambda g: (g[0], g[1]))
    codecs = [c for c in dict.fromkeys(r["codec"] for r in rows) if c != "float32"]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4))
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(codecs))
    for i, c in enumerate(codecs):
        pick = {(r["dataset"], r["model"]): r for r in rows if r["codec"] == c}
        ax.bar(x + (i - (len(codecs) - 1) / 2) * width, [pick[g]["vs_float32_pp"] for g in groups], width, label=c)
    for limit in sorted(set(GOAL.values())):
        ax.axhline(limit, color="grey", linestyle=":", linewidth=1)
        ax.axhline(-limit, color="grey", linestyle=":", linewidth=1)
    ax.axhline(0, color="black", linewidth=1)
    ax.set_xticks(x, [f"{d}\n{m}" for d, m in groups])
    ax.set_ylabel("test accuracy vs float32 (points, median over seeds)")
    ax.set_title(f"Compressed rows: accuracy against float32 ({framework}); goals dotted")
    ax.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    main()

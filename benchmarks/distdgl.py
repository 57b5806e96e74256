"""Many machines, DGL lane: DistDGL training with each batch's features fetched by DGL or by directload.

The machines are emulated on this host (``directload train --dist``: each in its own network and mount
namespace, one server and one trainer each; needs root).  Per seed, side by side in one run:

* ``dgl``: DistDGL's own fetch, ``g.ndata["feat"][input_nodes]`` (the KVStore's C++ ``fast_pull``);
* ``memory``: directload's ``PartitionedStore``: the machine's rows from the server's shared memory through a
  ``TensorStore``, other machines' rows through the KVStore, read ``--lookahead`` batches ahead;
* ``disk``: partitions written out of core: the machine's rows from its disk store (io_uring, O_DIRECT),
  other machines' rows read by their servers from their disk stores through directload's DGL RPC service;
* ``tiered``: as ``disk`` with a host cache of ``--cache-frac`` of the partition in front of the disk store;
* ``memory int8``, ``disk int8``, ``tiered int8`` (each codec of ``--codecs``): the same on partitions of code
  rows (``dataset partition --codec``): every machine holds, reads and sends codes, and the trainer decodes
  them; the tiered host cache has the float32 modes' bytes, so it holds more rows.

Reported per mode: the time the training thread spends on one batch's features (median of every batch of
the steady epochs over every machine, with p10/p90), its ratio to ``dgl``'s, the bytes of other machines'
rows a run read (what the network carries), the steady epoch time (slowest machine), and the test accuracy;
plus one process training on the whole graph with the same global batch (``directload train``), the accuracy
reference.  Writes ``results/distdgl.json`` and ``.png``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import RESULTS, print_table, system_facts, write_json
from tqdm import tqdm

from directload.codecs import CODECS
from directload.datasets import dataset_exists, synthesize
from directload.harness.commands.partition import partition_dir
from directload.harness.parser import HelpFormatter
from directload.harness.plotting import pyplot, save_figure

MODES = ("dgl", "memory", "disk", "tiered")


def _partition(args, features, codec=None):
    config = partition_dir(args.root, args.dataset, args.parts, features, codec) / f"{args.dataset}.json"
    if not config.exists():
        subprocess.run([sys.executable, "-m", "directload", "dataset", "partition", "--root", args.root, "--name",
                        args.dataset, "--parts", str(args.parts), "--features", features, "--no-progress",
                        *(["--codec", codec] if codec else [])], check=True, capture_output=True)
    return config


def _mode(mode):
    """``(kind, codec)`` of a mode: ``"tiered int8"`` is ``("tiered", "int8")``."""
    kind, _, codec = mode.partition(" ")
    return kind, codec or None


def _one_process(args):
    """Test accuracy of one process on the whole graph, the same global batch, per seed."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "directload", "train", "--dataset", args.dataset, "--root", args.root,
                        "--loader", "directload", "--epochs", str(args.epochs), "--seeds", str(args.seeds),
                        "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size * args.parts),
                        "--hidden", str(args.hidden), "--no-progress", "--out", out], check=True, capture_output=True)
        report = json.loads(next(Path(out).glob("*.json")).read_text())
    return [r["test_acc"] for r in report["runs"]]


def _summary(mode, runs, base=None):
    fetch = [ms for r in runs for t in r for e in t["epochs"][1:] for ms in e["fetch_ms"]]
    epoch = [max(t["epochs"][k]["seconds"] for t in r) for r in runs for k in range(1, len(r[0]["epochs"]))]
    acc = [r[0]["test_acc"] for r in runs]
    row = {"mode": mode, "fetch_ms": statistics.median(fetch), "fetch_p10": float(np.percentile(fetch, 10)),
           "fetch_p90": float(np.percentile(fetch, 90)), "epoch_s": statistics.median(epoch),
           "epoch_min": min(epoch), "epoch_max": max(epoch), "acc_mean": statistics.mean(acc) * 100,
           "acc_sd": statistics.pstdev(acc) * 100, "batches": len(fetch),
           # the bytes of other machines' rows one run read (its trainers' epochs and evaluation), per seed
           "remote_mib_per_run": sum(t["remote_bytes"] for r in runs for t in r) / len(runs) / 2**20,
           "remote_frac": sum(t["remote_rows"] for r in runs for t in r)
           / max(1, sum(t["remote_rows"] + t["local_rows"] for r in runs for t in r))}
    row["vs_dgl"] = row["fetch_ms"] / base["fetch_ms"] if base else 1.0
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--dataset", default="synth-small", help="dataset (a synthetic preset is generated when missing)")
    p.add_argument("--root", default="data", help="directory that holds the datasets")
    p.add_argument("--parts", type=int, default=2, help="machines (partitions)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is left out of the times")
    p.add_argument("--seeds", type=int, default=3, help="runs per mode, seeds 0..N-1, interleaved")
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5], help="neighbours sampled per layer")
    p.add_argument("--batch-size", type=int, default=512, help="seed nodes per batch per trainer")
    p.add_argument("--hidden", type=int, default=64, help="hidden units")
    p.add_argument("--cache-frac", type=float, default=0.25, help="tiered: host cache, a fraction of a partition")
    p.add_argument("--codecs", nargs="*", choices=list(CODECS), default=["int8"],
                   help="codecs whose partitions of code rows run beside float32's (memory, disk and tiered each)")
    p.add_argument("--modes", nargs="+", default=None,
                   help=f"what to run (default: {' '.join(MODES)}, then each of these but dgl with each codec, as "
                        "'disk int8')")
    args = p.parse_args()
    if args.modes is None:
        args.modes = [*MODES, *(f"{m} {c}" for c in args.codecs for m in MODES[1:])]
    for mode in args.modes:
        kind, codec = _mode(mode)
        if kind not in MODES or (codec is not None and (codec not in CODECS or kind == "dgl")):
            p.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}, alone or (but dgl) with a codec")
    from directload.harness.train_dist import run  # needs DGL: after --help, which works in every lane
    from directload.loaders.dgl.distributed import read_partitions
    from directload.stores import StoreSpec

    if not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset)
    configs = {(kind, codec): _partition(args, kind, codec) for kind in ("memory", "disk")
               for codec in {None, *(_mode(m)[1] for m in args.modes)}}
    meta = read_partitions(configs["disk", None])  # checked: the record belongs to this config
    part_bytes = max(np.diff(meta["bounds"])) * meta["num_feats"] * 4
    results = {m: [] for m in args.modes}
    with tqdm(total=args.seeds * len(args.modes), desc="distdgl runs") as bar:
        for seed in range(args.seeds):
            for mode in args.modes:
                kind, codec = _mode(mode)
                kind = "memory" if kind in ("dgl", "memory") else "disk"
                results[mode].append(run(configs[kind, codec], root=args.root, dataset=args.dataset, epochs=args.epochs,
                                         fanouts=args.fanouts, batch_size=args.batch_size, hidden=args.hidden,
                                         seed=seed, fetch="dgl" if mode == "dgl" else "directload",
                                         store=StoreSpec(host_bytes=int(part_bytes * args.cache_frac))
                                         if _mode(mode)[0] == "tiered" else None))
                bar.update()
    one = _one_process(args)
    base = _summary("dgl", results["dgl"]) if "dgl" in results else None
    rows = [_summary(m, results[m], base) for m in args.modes]
    rows.append({"mode": "1 process", "acc_mean": statistics.mean(one) * 100, "acc_sd": statistics.pstdev(one) * 100})
    print_table(rows, ["mode", "fetch_ms", "fetch_p10", "fetch_p90", "vs_dgl", "remote_mib_per_run", "epoch_s",
                       "epoch_min", "epoch_max", "remote_frac", "acc_mean", "acc_sd", "batches"])
    path = write_json("distdgl", {"system": system_facts(), "args": vars(args), "partition_bytes": int(part_bytes),
                                  "summary": rows, "runs": results, "one_process_acc": one})
    _plot(rows, RESULTS / "distdgl.png", args)
    print(f"wrote {path} and {path.with_suffix('.png')}")


def _plot(rows, path, args):
    plt = pyplot()
    runs = [r for r in rows if "fetch_ms" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(runs))
    med = [r["fetch_ms"] for r in runs]
    spread = [[m - r["fetch_p10"] for m, r in zip(med, runs)], [r["fetch_p90"] - m for m, r in zip(med, runs)]]
    a.bar(x, med, yerr=spread, capsize=4, color="tab:blue")
    a.set_xticks(x, [r["mode"] for r in runs])
    a.set_ylabel("ms per batch on features (median, p10-p90)")
    a.set_title(f"Feature fetch, {args.parts} DistDGL machines, {args.dataset}")
    labels = [r["mode"] for r in rows]
    b.errorbar(np.arange(len(rows)), [r["acc_mean"] for r in rows], yerr=[r["acc_sd"] for r in rows], fmt="o",
               capsize=4)
    b.set_xticks(np.arange(len(rows)), labels)
    b.set_ylabel("test accuracy % (mean, sd over seeds)")
    b.set_title("Accuracy against one process")
    save_figure(fig, path)


if __name__ == "__main__":
    main()

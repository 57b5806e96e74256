"""``directload train --dist N``: N DistDGL machines on this host, one server and one trainer each."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from .partition import partition_dir
from .runs import FLAGS, check_args, default_out, report_name, train_options

__all__ = ["run"]


def run(args: argparse.Namespace, models: Sequence[str], loaders: Sequence[str]) -> int:
    """``train --dist N`` for ``models`` and ``loaders``: its own refusals first (they name --dist), then the
    options' check of every run, then whether this host can emulate machines at all (root, namespaces), and
    only then what the run reads (the partitions): a host that cannot run it is told so before any advice
    about files it would make in vain."""
    from directload.capabilities import require
    from directload.datasets import PRESETS, dataset_exists, synthesize

    if args.framework != "dgl":
        raise ValueError("--dist trains with DistDGL: it needs --framework dgl (PyG has no distributed engine that "
                         "runs on PyG 2.8; use --nproc for DDP on one node)")
    if models != ["sage"]:
        raise ValueError("--dist trains GraphSAGE (DGL's distributed example): leave --model at sage")
    store = train_options(args)["store"]
    for flag, given in ((FLAGS.opt("nproc"), args.nproc != 1), (FLAGS.opt("store.packed"), store.packed),
                        (FLAGS.opt("store.budget.host_bytes"), store.budget.host_bytes),
                        ("--memory-limit", args.memory_limit is not None),
                        (FLAGS.opt("store.gpu_bytes"), store.gpu_bytes)):
        if given:
            raise ValueError(f"--dist does not take {flag}")
    from directload.harness.dist import check_host

    checked = check_args(args, models, loaders)
    fanouts, store = checked["fanouts"], checked["store"]
    kind = "memory" if args.features == "memory" else "disk"
    if "dgl" in loaders and kind != "memory":
        raise ValueError("DGL's own fetch reads the features its servers hold: --loader dgl (or both) needs "
                         "--features memory")
    check_host()  # root, namespaces, unshare and ip: decisive, so before anything about the partitions
    # DGL's own fetch reads plain rows; directload's reads the codec's partitions when --codec names one
    codecs = {loader: None if loader == "dgl" else store.codec for loader in loaders}
    configs = {}
    for loader, codec in codecs.items():
        config = partition_dir(args.root, args.dataset, args.dist, kind, codec) / f"{args.dataset}.json"
        if not config.exists():
            flag = f" --codec {codec}" if codec else ""
            raise FileNotFoundError(f"{config} does not exist: partition first with `directload dataset partition "
                                    f"--name {args.dataset} --parts {args.dist} --features {kind}{flag}`")
        configs[loader] = config
    require("dgl")
    from directload.harness.train_dist import run as run_machines
    from directload.loaders.dgl.distributed import read_partitions

    # before any work: one partitioning each, this generation from here
    configs = {loader: read_partitions(config)["config"] for loader, config in configs.items()}
    if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
        synthesize(args.root, args.dataset, progress=not args.no_progress)
    # each machine's stack over its partition's rows: tiers (its host cache) with --features tiered
    machine = replace(store, tiers=args.features == "tiered" and bool(store.host_bytes), codec=None)
    report = {"dataset": args.dataset, "machines": args.dist, "features": args.features, "codec": store.codec,
              "store": machine.to_dict(), "runs": []}
    for seed in range(args.seeds):
        for loader in loaders:
            print(f"{loader:>10} seed {seed}: {args.dist} DistDGL machines on this host, one server and one trainer "
                  f"each, {args.epochs} epochs ...", flush=True)
            trainers = run_machines(configs[loader], root=args.root, dataset=args.dataset, epochs=args.epochs,
                                    fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden, lr=args.lr,
                                    seed=seed, store=machine, fetch="dgl" if loader == "dgl" else "directload")
            report["runs"].append({"loader": loader, "seed": seed, "test_acc": trainers[0]["test_acc"],
                                   "trainers": trainers})
            last = [t["epochs"][-1] for t in trainers]
            fetch = " / ".join(f"{e['fetch_ms_median']:.1f}" for e in last)
            print(f"{loader:>10} seed {seed}: test {trainers[0]['test_acc'] * 100:.2f} %, last epoch "
                  f"{max(e['seconds'] for e in last):.2f} s, fetch {fetch} ms per batch (median, per machine)")
    out = Path(args.out or default_out())
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{report_name('train-dist', args.dataset, models, loaders)}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0

"""``directload train``: GraphSAGE or GAT with the framework's loader and directload's, side by side."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from . import train_dist
from .runs import check_args, default_out, feature_files, report_name

__all__ = ["run", "run_training"]


def run(args: argparse.Namespace) -> int:
    """``directload train``: every (model, seed, loader) side by side, or on DistDGL machines (``--dist``)."""
    models = ["sage", "gat"] if args.model == "both" else [args.model]
    loaders = [args.framework, "directload"] if args.loader == "both" else [args.loader]
    if args.dist:
        return train_dist.run(args, models, loaders)
    dataset = args.dataset + ("" if args.features == "memory" else f"-{args.features}") + \
        ("-packed" if args.packed else "")
    return run_training(args, models, loaders, range(args.seeds), report_name("train", dataset, models, loaders))


def run_training(args: argparse.Namespace, models: Sequence[str], loaders: Sequence[str], seeds: Sequence[int],
                 name: str, conditions: Sequence[tuple[str, Callable[[], AbstractContextManager[Any]]]] | None = None
                 ) -> int:
    """Load (generating if needed) the dataset, train side by side, print and write the report.

    ``args`` holds the flags that :func:`~directload.harness.parser.add_train_arguments` adds (and the train
    command's ``--partition-features``), checked first (:func:`~directload.harness.commands.runs.check_args`)
    for every run of ``models`` and ``loaders``.

    With ``args.memory_limit`` the training runs in a child inside a memory cgroup: ``args.rerun`` (the
    argv that ran this) is started again there, and this process waits for it.  ``conditions`` (see
    :func:`~directload.harness.experiments.compare`) runs each seed under each, interleaved."""
    import torch

    from directload.capabilities import capabilities, require, usable_device
    from directload.datasets import PRESETS, check_name, dataset_exists, load, synthesize
    from directload.harness import ddp, memcap
    from directload.harness.experiments import compare, print_summary, write_report
    from directload.harness.train import TrainConfig
    from directload.harness.train_inputs import check_memory_limit
    from directload.kernels.cpu import wait_policy as cpu_wait_policy

    # Bad arguments get their own error before any work, a missing framework after them.
    options = check_args(args, models, loaders)
    device = usable_device(args.device)
    nproc = args.nproc
    capped = memcap.capped_group()
    if ddp.torchrun_world()[1] > 1:
        if nproc > 1:
            rank, size = ddp.torchrun_world()
            raise ValueError(f"this process is rank {rank} of {size} that torchrun started: leave --nproc out "
                             "(torchrun's --nproc-per-node starts the ranks)")
        if args.memory_limit is not None and capped is None:
            raise ValueError("--memory-limit under torchrun would cap each rank alone: run torchrun itself in a "
                             "memory cgroup, or start the ranks with --nproc")
    if nproc > 1:
        ddp.check_nproc(nproc, device)  # before any work: no more ranks than this node can run
    check_name(args.dataset)
    limit = args.memory_limit
    require({"dgl": "dgl", "pyg": "torch_geometric"}[args.framework])
    if limit is not None and capped is None:
        # before any work: a cap below what the run's feature store and the run itself will hold
        check_memory_limit(limit, options, root=args.root, dataset=args.dataset, loaders=loaders,
                           cuda=device.type == "cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    _note_busy_machine()
    rank, size = ddp.join_torchrun(device)  # under torchrun: every collective from here has a timeout
    features, packed, codec = options["features"], options["store"].packed, options["store"].codec
    if rank == 0:  # under torchrun one rank writes what is missing, the others wait for it
        if args.dataset in PRESETS and not dataset_exists(args.root, args.dataset):
            synthesize(args.root, args.dataset, progress=not args.no_progress)  # one made with other options is kept
        feature_files(args.root, args.dataset, features, packed=packed, codec=codec, progress=not args.no_progress)
    ddp.barrier()
    files = feature_files(args.root, args.dataset, features, packed=packed, codec=codec,
                          progress=not args.no_progress)
    if limit is not None and capped is None:  # the guardian: this command again, as a child in the cgroup
        for f in files:
            memcap.drop_page_cache(f)
        print(f"host memory capped at {limit / 2**30:.2f} GiB in a memory cgroup; the feature files' cached "
              "pages were dropped", flush=True)
        return memcap.run_capped(limit, args.rerun)
    if nproc > 1:  # the ranks: this command again, nproc times, under torchrun's launcher (in the cgroup if any)
        load(args.root, args.dataset)  # the dataset's caches are written here, once, before any rank reads them
        memcap.guard_children()  # they die with this process
        ddp.launch(nproc, [*args.rerun, "--nproc", "1"], device=device)
        return 0
    if limit is not None:
        from directload.kernels.host_pool import default_pool

        pool = default_pool()  # recycled output blocks count against the cap: keep few
        pool.max_cached_bytes = min(pool.max_cached_bytes, limit // 8)
    dataset = load(args.root, args.dataset)
    base = TrainConfig(**{**options, "nproc": size}, device=str(device), loader="directload")
    rows = compare(dataset, base, models=models, loaders=loaders, seeds=seeds, progress=not args.no_progress,
                   conditions=conditions)
    if rank != 0:
        ddp.finish()  # rank 0 reports for the job: wait for it, then end with it (never returns)
    meta = {"dataset": args.dataset, "framework": args.framework, "device": str(device), "nodes": dataset.num_nodes,
            "edges": dataset.num_edges, "feats": int(dataset.feat.shape[1]), "epochs": args.epochs,
            "torch_threads": torch.get_num_threads(), "capabilities": capabilities().as_dict(),
            "features": features, "codec": codec, "memory_limit": limit, "nproc": size,
            "sampler": {row["loader"]: row["sampler"] for row in rows},
            "feature_file_bytes": sum(os.path.getsize(f) for f in files), "openmp_wait_policy": cpu_wait_policy(),
            **({"conditions": [c for c, _ in conditions]} if conditions else {})}
    path, summary = write_report(rows, args.out or default_out(), name, meta)
    print_summary(summary, meta)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    if size > 1:
        ddp.finish()  # the report is written: every rank ends now, together (never returns)
    return 0


def _note_busy_machine():
    """One line on stderr when the machine is busier than its cores and torch's OpenMP threads spin for
    libgomp's default 3 ms while they wait: the spinning, not either loader, is what slows a busy machine's
    epochs (see :func:`directload.kernels.cpu.wait_policy`)."""
    from directload.kernels import cpu

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if cpu.wait_policy() == f"spin {cpu.LIBGOMP_SPINS}" and load > cores:
        print(f"note: this machine is busy (load {load:.1f} on {cores} cores) and torch's OpenMP threads spin for "
              "about 3 ms while they wait, which slows training 2-6x beside other busy processes; start with "
              "GOMP_SPINCOUNT=10000 (scripts/dev.sh does)", file=sys.stderr, flush=True)

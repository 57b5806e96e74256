"""What the training commands share: their flags as a run's options and the one check, feature files, reports."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from directload.harness.options import OPTIONS, Names, RunOptions, check_options, defaults, options_of

__all__ = ["FLAGS", "train_options", "check_args", "feature_files", "report_name", "default_out"]

#: How a message of :func:`check_options` names an option on the command line: by the flag of ``directload
#: train`` that sets it (:data:`~directload.harness.options.OPTIONS`; heads, dropout and seed have none), and
#: the model and loader by the flags that choose the runs.
FLAGS = Names({"model": "--model", "loader": "--loader", **{path: flag.name for path, flag in OPTIONS.items()}},
              ours="--loader directload (or both)", ranks="--nproc N (N >= 2) or start the ranks with torchrun")


def train_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options the flags that :func:`~directload.harness.parser.add_train_arguments` adds (and the train
    command's ``--partition-features``) give, as :class:`~directload.harness.train.TrainConfig`'s keyword
    arguments (:func:`~directload.harness.options.options_of`).  ``nproc`` is the job's ranks: ``--nproc``, or
    those torchrun started.  The device (``--device auto``) is resolved by the run."""
    from directload.harness import ddp

    options = options_of(args)
    return {**options, "nproc": args.nproc if args.nproc > 1 else ddp.torchrun_world()[1]}


def check_args(args: argparse.Namespace, models: Sequence[str], loaders: Sequence[str]) -> dict[str, Any]:
    """:func:`train_options` of ``args``, refused before any work as :func:`check_options` says, each option
    named by its flag (:data:`FLAGS`), for every run of ``models`` and ``loaders``; returns the options with
    what the check settles (``layers``, ``fanouts``, ``sampler`` and the store's spec, checked)."""
    from directload.harness.train import SIDES

    options = train_options(args)
    settled = check_options(RunOptions(**{**defaults(), **options}), frameworks=tuple(SIDES), models=models,
                            loaders=loaders, names=FLAGS)
    return {**options, **settled}


def feature_files(root: os.PathLike[str] | str, dataset: str, features: str, *, packed: bool = False,
                  codec: str | None = None, progress: bool = True) -> list[Path]:
    """The feature files of ``dataset`` under ``root`` (the .npy, and the disk store with ``features`` disk or
    tiered, or with a ``codec``, of its code rows then, written here on first use, and the packed store with
    ``packed``), or none when its features live inside OGB's archive and are read in memory."""
    from directload.datasets import FEATURE_FILE, convert, dataset_dir
    from directload.harness.train_inputs import disk_file

    base = dataset_dir(root, dataset)
    npy = base / "raw" / FEATURE_FILE
    if features == "memory" and codec is None:
        return [npy] if npy.exists() else []
    packed_file = [base / disk_file(codec, packed=True)] if packed and features != "memory" else []
    if packed_file and not packed_file[0].exists():  # checked first: nothing is written for a run that cannot start
        flag = f" --codec {codec}" if codec else ""
        raise FileNotFoundError(f"{packed_file[0]} does not exist: write it with `directload dataset pack "
                                f"--name {dataset}{flag}`")
    if not npy.exists():
        npy = convert(root, dataset)  # features inside OGB's archive: write the .npy first
    store = base / disk_file(codec)
    if not store.exists():
        from directload.stores import write_disk_store

        write_disk_store(npy, store, progress=progress, codec=codec)
    return [npy, store, *packed_file]


def report_name(prefix: str, dataset: str, models: Sequence[str], loaders: Sequence[str]) -> str:
    """The file stem of a training report, unique per dataset, models and loaders.  Pure.

    Examples
    --------
    >>> report_name("train", "synth-small", ["gat"], ["dgl", "directload"])
    'train_synth-small_gat_dgl-vs-directload'
    """
    return f"{prefix}_{dataset}_{'+'.join(models)}_{'-vs-'.join(loaders)}"


def default_out() -> str:
    """Where reports go without ``--out``: benchmarks/results in a source checkout, else directload-results."""
    bench = Path("benchmarks") / "results"
    return str(bench) if bench.parent.is_dir() else "directload-results"

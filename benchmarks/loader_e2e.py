"""End-to-end GraphSAGE (optionally GAT) training, DGL's loader against directload's (PyTorch-Direct, Fig. 4.8).

Runs every (model, seed, loader), loaders interleaved, on a dataset in OGB's
layout (a synthetic preset is generated when missing).  Prints the per-epoch
breakdown (sampling, feature gather/copy, training) with validation and test
accuracy, and writes JSON and a stacked-bar PNG to benchmarks/results/.

The defaults take about a minute on 2 CPU cores (GraphSAGE, 3 seeds, 2 epochs
each, so one steady epoch per run); ``--models sage gat`` adds GAT, whose
attention makes each CPU epoch several times longer.

``--hog N`` measures CPU contention: each (seed, loader) runs quiet and again while N
processes each keep a core busy (a spinning loop, as other jobs on a shared node),
quiet and contended runs interleaved; the table adds each loader's slowdown.
"""

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_hog  # noqa: E402

from directload.harness.commands.runs import report_name  # noqa: E402
from directload.harness.commands.train import run_training  # noqa: E402
from directload.harness.memcap import enter_capped_child  # noqa: E402
from directload.harness.parser import HelpFormatter, add_train_arguments  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--models", nargs="+", choices=["sage", "gat"], default=["sage"],
                   help="models to train; GAT's CPU epochs are several times GraphSAGE's")
    p.add_argument("--seeds", type=int, default=3, help="runs per (model, loader), seeds 0..N-1")
    p.add_argument("--hog", type=int, default=0, metavar="N",
                   help="also run every (seed, loader) under a CPU hog of N busy processes, interleaved with the "
                        "quiet runs, and report each loader's slowdown")
    add_train_arguments(p)
    p.set_defaults(epochs=2)
    enter_capped_child()  # a capped run (--memory-limit) dies with its guardian
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.rerun = [sys.executable, str(Path(__file__).resolve()), *argv]
    if args.hog < 0:
        p.error(f"--hog must be 0 or more busy processes, got {args.hog}")
    if args.hog and (args.memory_limit is not None or args.nproc != 1):
        p.error("--hog measures one process on its own: leave out --memory-limit and --nproc")
    loaders = [args.framework, "directload"]
    conditions = [("quiet", contextlib.nullcontext), (f"hog {args.hog}", lambda: cpu_hog(args.hog))] \
        if args.hog else None
    name = report_name("loader_e2e", args.dataset, args.models, loaders) + (f"_hog{args.hog}" if args.hog else "")
    return run_training(args, args.models, loaders, range(args.seeds), name, conditions)


if __name__ == "__main__":
    raise SystemExit(main())

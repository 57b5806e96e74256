"""End-to-end GraphSAGE (optionally GAT) training, DGL's loader against directload's (PyTorch-Direct, Fig. 4.8).

Runs every (model, seed, loader), loaders interleaved, on a dataset in OGB's
layout (a synthetic preset is generated when missing).  Prints the per-epoch
breakdown (sampling, feature gather/copy, training) with validation and test
accuracy, and writes JSON and a stacked-bar PNG to benchmarks/results/.

The defaults take about a minute on 2 CPU cores (GraphSAGE, 3 seeds, 2 epochs
each, so one steady epoch per run); ``--models sage gat`` adds GAT, whose
attention makes each CPU epoch several times longer.
"""

import argparse
import sys
from pathlib import Path

from directload.harness.cli import HelpFormatter, add_train_arguments, report_name, run_training
from directload.harness.memcap import enter_capped_child


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    p.add_argument("--models", nargs="+", choices=["sage", "gat"], default=["sage"],
                   help="models to train; GAT's CPU epochs are several times GraphSAGE's")
    p.add_argument("--seeds", type=int, default=3, help="runs per (model, loader), seeds 0..N-1")
    add_train_arguments(p)
    p.set_defaults(epochs=2)
    enter_capped_child()  # a capped run (--memory-limit) dies with its guardian
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.rerun = [sys.executable, str(Path(__file__).resolve()), *argv]
    loaders = [args.framework, "directload"]
    return run_training(args, args.models, loaders, range(args.seeds),
                        report_name("loader_e2e", args.dataset, args.models, loaders))


if __name__ == "__main__":
    raise SystemExit(main())

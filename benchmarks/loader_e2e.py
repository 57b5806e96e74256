"""End-to-end GraphSAGE and GAT training, DGL's loader against directload's (seed 002, Figure 4.8).

Runs every (model, seed, loader), loaders interleaved, on a dataset in OGB's
layout (a synthetic preset is generated when missing).  Prints the per-epoch
breakdown (sampling, feature gather/copy, training) with validation and test
accuracy, and writes JSON and a stacked-bar PNG to benchmarks/results/.
"""

import argparse

from directload.cli import add_train_arguments, run_training


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=["sage", "gat"], default=["sage", "gat"])
    p.add_argument("--seeds", type=int, default=3)
    add_train_arguments(p)
    args = p.parse_args(argv)
    return run_training(args, args.models, ["dgl", "directload"], range(args.seeds), f"loader_e2e_{args.dataset}")


if __name__ == "__main__":
    raise SystemExit(main())

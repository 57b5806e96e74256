"""``directload dataset synth``: a synthetic node-classification dataset in OGB's layout."""

from __future__ import annotations

import argparse
from dataclasses import asdict

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Generate ``args.name`` (a preset's sizes, overridden by the options given) under ``args.root``."""
    from directload.datasets import PRESETS, SynthConfig, check_name, synthesize

    check_name(args.name)
    base = PRESETS.get(args.name, SynthConfig())
    overrides = {k: v for k, v in {"num_nodes": args.nodes, "avg_degree": args.degree, "num_feats": args.feats,
                                   "num_classes": args.classes, "seed": args.seed,
                                   "feat_dtype": args.dtype}.items() if v is not None}
    path = synthesize(args.root, args.name, SynthConfig(**{**asdict(base), **overrides}),
                      inline_features=args.inline_features, overwrite=args.overwrite, progress=not args.no_progress)
    print(f"dataset {args.name} in {path}")
    return 0

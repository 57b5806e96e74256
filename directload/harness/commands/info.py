"""``directload info``: what this machine offers, and the GPU gather's tuner."""

from __future__ import annotations

import argparse
import json

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Print the capabilities, the CPU gathers' thread team and the tuner's state, as a table or JSON."""
    from directload.capabilities import capabilities
    from directload.kernels import cpu
    from directload.kernels.tuner import tuner_state

    caps = capabilities().as_dict()
    # The CPU gathers' thread team is the kernels' own choice (directload.kernels.cpu says why).
    caps.update(cpu_threads=cpu.get_num_threads(), cpu_team=cpu.team(), openmp_wait_policy=cpu.wait_policy())
    caps.update(tuner_state())  # the GPU gather's tuner: on or off, its cache file, the choices it holds
    if args.json:
        print(json.dumps(caps, indent=2))
    else:
        width = max(map(len, caps))
        for k, v in caps.items():
            print(f"{k:<{width}}  {v}")
    return 0

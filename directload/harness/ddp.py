"""Training on several processes of one node with DDP: one rank per process, gloo on the CPU, NCCL on GPUs.

Under ``torchrun`` the ranks are started by torchrun and :func:`join_torchrun` joins its job, with a timeout
on every collective (:data:`TIMEOUT_S`), so a rank that dies makes the others fail instead of waiting for
ever.  ``directload train --nproc N`` starts the ranks itself through torchrun's own launcher
(:func:`launch`, ``torch.distributed.launcher``), which watches them and stops every rank when one fails: a
first version that spawned the ranks with ``torch.multiprocessing`` hung in CI.
"""

import atexit
import os
from datetime import timedelta

import torch

__all__ = ["join_torchrun", "torchrun_world", "world", "barrier", "launch", "RankFailed", "TIMEOUT_S"]

#: Seconds a collective waits for the other ranks before it fails.
TIMEOUT_S = 300


class RankFailed(RuntimeError):
    """A rank of a job :func:`launch` started failed; the other ranks were stopped."""


def launch(nproc, argv):
    """Run ``argv`` (a command, ``argv[0]`` the program) as ``nproc`` ranks of one DDP job on this node, as
    ``torchrun --standalone --nproc-per-node nproc`` would (the ranks read ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` ...), through torchrun's own launcher.  Each rank gets ``cpu_count // nproc`` threads
    unless ``OMP_NUM_THREADS`` is set.  Returns when every rank has ended well; raises :class:`RankFailed`
    naming the first rank that failed (the launcher stops the others: nothing is left running)."""
    import logging
    import signal
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # its warnings and its failure report: our one line says it
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"directload-{uuid.uuid4().hex}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    try:
        elastic_launch(config, argv[0])(*argv[1:])
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode
        try:
            how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        except ValueError:
            how = f"ended with status {code}"
        raise RankFailed(f"rank {rank} of {nproc} {how}; the other ranks were stopped") from None


def world():
    """``(rank, world_size)`` of this process's DDP job, ``(0, 1)`` outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier():
    """Wait for every rank of this process's DDP job (nothing outside one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _backend(device):
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def torchrun_world():
    """``(rank, world_size)`` that torchrun gave this process in its environment, ``(0, 1)`` without."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"]) if size > 1 else 0
    except (KeyError, ValueError):
        return 0, 1
    return (rank, size) if size > 1 else (0, 1)


def join_torchrun(device="cpu"):
    """Join the job torchrun started this process in (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...);
    returns ``(rank, world_size)``, ``(0, 1)`` when not started by torchrun with more than one rank."""
    import torch.distributed as dist

    if torchrun_world()[1] == 1:
        return 0, 1
    if not dist.is_initialized():
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(_backend(device), timeout=timedelta(seconds=TIMEOUT_S))
        # a group left to the interpreter's teardown once aborted a rank at exit ("terminate called without an
        # active exception"), failing torchrun's job: leave it first
        atexit.register(_leave)
    return world()


def _leave():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

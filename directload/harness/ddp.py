"""Training on several processes of one node with DDP: one rank per process, gloo on the CPU, NCCL on GPUs.

Under ``torchrun`` the ranks are started by torchrun and :func:`join_torchrun` joins its job, with a timeout
on every collective (:data:`TIMEOUT_S`), so a rank that dies makes the others fail instead of waiting for
ever.  (Starting the ranks here, ``directload train --nproc N``, was withdrawn: its test hung in CI.)
"""

import atexit
import os
from datetime import timedelta

import torch

__all__ = ["join_torchrun", "torchrun_world", "world", "barrier", "TIMEOUT_S"]

#: Seconds a collective waits for the other ranks before it fails.
TIMEOUT_S = 300


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

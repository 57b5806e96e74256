"""Training on several processes of one node with DDP: one rank per process, gloo on the CPU, NCCL on GPUs.

:func:`run` starts the ranks here (``directload train --nproc N``); under ``torchrun`` the ranks are
started by torchrun and :func:`join_torchrun` joins its job.  Either way every collective has a timeout
(:data:`TIMEOUT_S`), so a rank that dies makes the others fail instead of waiting for ever, and the error
that reaches the user names the rank.
"""

import atexit
import contextlib
import ctypes
import os
import pickle
import signal
import tempfile
from datetime import timedelta

import torch

__all__ = ["run", "join_torchrun", "torchrun_world", "world", "barrier", "RankError", "TIMEOUT_S"]

#: Seconds a collective waits for the other ranks before it fails.
TIMEOUT_S = 300


class RankError(RuntimeError):
    """A rank of a DDP run failed or died; the message names it."""


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


def run(nproc, fn, *args, device="cpu"):
    """``fn(*args)`` in ``nproc`` new processes (spawned), each a rank of one DDP job; returns what rank 0's
    call returned.  A rank that raises or dies ends the run with :class:`RankError` naming it (the other
    ranks are stopped).  Each rank gets ``cpu_count // nproc`` torch threads unless ``OMP_NUM_THREADS``
    says otherwise (torchrun sets it to 1)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="directload-ddp-") as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        result = os.path.join(tmp, "result.pt")  # a file, not a pipe: a large result never blocks rank 0's exit
        try:
            procs = mp.start_processes(_rank_main, args=(os.getpid(), nproc, init, device, fn, args, result),
                                       nprocs=nproc, join=False, start_method="spawn")
            while not procs.join():
                pass
        except mp.ProcessRaisedException as exc:
            raise RankError(f"rank {exc.error_index} of {nproc} failed: {_last_line(str(exc))}") from None
        except mp.ProcessExitedException as exc:
            how = f"was killed by signal {exc.signal_name}" if exc.signal_name else f"exited with {exc.exit_code}"
            raise RankError(f"rank {exc.error_index} of {nproc} {how}; the other ranks were stopped") from None
        if not os.path.exists(result):
            raise RankError("rank 0 ended without a result")
        with open(result, "rb") as f:
            return pickle.load(f)


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _die_with(parent):
    """This rank is killed when the process that started it dies (however it dies): no orphaned rank waits
    for ever on a job that is gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(128 + signal.SIGKILL)


def _rank_main(rank, parent, nproc, init, device, fn, args, result):
    import torch.distributed as dist

    _die_with(parent)
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(rank)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(nproc))
    if "OMP_NUM_THREADS" not in os.environ:  # the node's cores shared out, not each rank taking them all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    dist.init_process_group(_backend(device), init_method=init, rank=rank, world_size=nproc,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        out = fn(*args)
        if rank == 0:
            with open(result + ".partial", "wb") as f:
                pickle.dump(out, f)
            os.replace(result + ".partial", result)
    finally:
        dist.destroy_process_group()

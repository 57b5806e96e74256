"""Training on several processes of one node with DDP: one rank per process, gloo on the CPU, NCCL on GPUs.

Under ``torchrun`` the ranks are started by torchrun and :func:`join_torchrun` joins its job, with a timeout
on every collective (:data:`TIMEOUT_S`), so a rank that dies makes the others fail instead of waiting for
ever.  ``directload train --nproc N`` starts the ranks itself through torchrun's own launcher
(:func:`launch`, ``torch.distributed.launcher``), which watches them and stops every rank when one fails: a
first version that spawned the ranks with ``torch.multiprocessing`` hung in CI.  Its work done, every rank
ends through :func:`finish`, together, not through the interpreter's teardown; a rank that failed ends at its
exit handler, at once, with status 1, and the launcher names it (:class:`RankFailed`).  :func:`check_nproc`
refuses more ranks than the node can run before any starts, for the command line and :func:`launch` alike.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import NoReturn

import numpy as np
import torch

from directload.errors import DirectloadError

__all__ = ["join_torchrun", "torchrun_world", "world", "barrier", "finish", "launch", "RankFailed", "TIMEOUT_S",
           "nproc_ceiling", "check_nproc", "MAX_NPROC", "RANKS_PER_CORE", "RANK_BYTES", "SETTLE_S"]

#: Seconds a collective waits for the other ranks before it fails.
TIMEOUT_S = 300
#: The most ranks :func:`launch` starts on any node (every pair of gloo ranks holds a connection): more
#: ranks than this is a job for several nodes, under torchrun.
MAX_NPROC = 256
#: CPU ranks per usable core: ranks beyond the cores only take turns on them, a few to overlap waits.
RANKS_PER_CORE = 4
#: Host memory one rank holds before any features: the interpreter, torch, the framework, a model and its
#: sampler (a DGL-lane rank training synth-tiny held about 550 MB, measured).
RANK_BYTES = 512 << 20
#: Seconds a failed rank waits before it ends: a rank whose collective failed because another rank died
#: (killed, or ended after its own error) ends after it, so torchrun's launcher, which watches every 0.1 s
#: and dates failures to the second, sees the rank that failed first alone and names it.
SETTLE_S = 1.0


class RankFailed(DirectloadError, RuntimeError):
    """A rank of a job :func:`launch` started failed; the other ranks were stopped."""


def launch(nproc: int, argv: Sequence[str], *, device: torch.device | str = "cpu") -> None:
    """Run ``argv`` (a command, ``argv[0]`` the program) as ``nproc`` ranks of one DDP job on this node, as
    ``torchrun --standalone --nproc-per-node nproc`` would (the ranks read ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` ...), through torchrun's own launcher.  Each rank gets ``cpu_count // nproc`` threads
    unless ``OMP_NUM_THREADS`` is set.  Returns when every rank has ended well; raises :class:`RankFailed`
    naming the first rank that failed (the launcher stops the others: nothing is left running).

    ``nproc`` is checked first, as the command line checks ``--nproc`` (:func:`check_nproc`, for ranks
    that train on ``device``): a bad count raises ``TypeError`` or ``ValueError`` before any rank starts."""
    import logging
    import signal
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_nproc(nproc, device)
    if isinstance(argv, str) or not argv:
        raise ValueError(f"argv must be a non-empty sequence of arguments (a command), got {argv!r}")
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


def nproc_ceiling(*, cores: int, available_bytes: int, gpus: int | None = None) -> tuple[int, str]:
    """``(most, why)``: the most ranks of one job this node can run, and each bound in words.  Pure.

    The least of :data:`RANKS_PER_CORE` ranks per usable core (on GPUs: one rank per GPU, NCCL's rule),
    the available host memory at :data:`RANK_BYTES` a rank, and :data:`MAX_NPROC`; never below 1.

    Parameters
    ----------
    cores : int
        CPU cores this process may run on.
    available_bytes : int
        Host memory available to new processes.
    gpus : int, optional
        GPUs, where the ranks train on GPUs; ``None`` on the CPU.

    Examples
    --------
    >>> nproc_ceiling(cores=2, available_bytes=16 << 30)
    (8, '4 ranks per CPU core on 2 cores: 8; 16.0 GiB of available memory at 512 MiB a rank: 32; 256 on any node')
    >>> nproc_ceiling(cores=64, available_bytes=8 << 30, gpus=8)[0]
    8
    """
    hardware = (f"one rank per GPU on {gpus} GPUs: {gpus}", gpus) if gpus is not None else \
        (f"{RANKS_PER_CORE} ranks per CPU core on {cores} cores: {RANKS_PER_CORE * cores}", RANKS_PER_CORE * cores)
    memory = available_bytes // RANK_BYTES
    bounds = [hardware, (f"{available_bytes / 2**30:.1f} GiB of available memory at {RANK_BYTES >> 20} MiB a rank: "
                         f"{memory}", memory), (f"{MAX_NPROC} on any node", MAX_NPROC)]
    return max(1, min(most for _, most in bounds)), "; ".join(why for why, _ in bounds)


def check_nproc(nproc: int, device: torch.device | str = "cpu") -> None:
    """Refuse, in one line, a count of ranks that is not a positive integer, or more ranks than this node can
    run (:func:`nproc_ceiling`, from this process's usable cores, the host's available memory and, for a
    CUDA ``device``, its GPUs); starts nothing.  The one check of ``--nproc`` and of :func:`launch`.

    Raises
    ------
    TypeError
        ``nproc`` is not an integer (``bool`` included).
    ValueError
        ``nproc`` is below 1 or above the ceiling.

    Examples
    --------
    >>> check_nproc(1)
    >>> check_nproc(MAX_NPROC + 1)
    Traceback (most recent call last):
    ...
    ValueError: --nproc 257 is more ranks than this node can run: at most ...
    """
    import psutil

    if isinstance(nproc, bool) or not isinstance(nproc, (int, np.integer)):
        raise TypeError(f"nproc must be an integer number of ranks, got {type(nproc).__name__} {nproc!r}")
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1 rank, got {nproc}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.device(device).type == "cuda" else None
    most, why = nproc_ceiling(cores=cores, available_bytes=psutil.virtual_memory().available, gpus=gpus)
    if nproc > most:
        raise ValueError(f"--nproc {nproc} is more ranks than this node can run: at most {most} ({why})")


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process's DDP job, ``(0, 1)`` outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Wait for every rank of this process's DDP job (nothing outside one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def finish() -> NoReturn:
    """End this rank of a DDP job, its work done (rank 0's report written): wait for every rank (at most
    :data:`TIMEOUT_S`), flush the output and end the process, status 0, without destroying the group and
    without the interpreter's teardown.  Never returns.

    A rank that ended through the interpreter destroyed its group at exit, and that can deadlock for ever
    (caught under load with torch 2.2): destroying a gloo group joins gloo's worker threads while holding
    the GIL, and a worker still releasing the job's last collective (the epochs' ``all_gather_object``)
    needs the GIL to free its tensors; the launcher, which waits for every rank, then waited with it
    (pytorch/pytorch#179291 describes the race).  After the barrier no rank sends anything, so each ends
    with nothing to tear down: its stores are closed, the kernel closes its sockets and lets go of its
    shared tables (:mod:`directload.shared`).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # bounded by the group's timeout
    _end(0)


def _end(status: int) -> NoReturn:
    """Flush the output and end this process with ``status`` now: no exit handler, no group destroyed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or file: nothing more to say
            stream.flush()
    os._exit(status)


def _backend(device):
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def torchrun_world() -> tuple[int, int]:
    """``(rank, world_size)`` that torchrun gave this process in its environment, ``(0, 1)`` without."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"]) if size > 1 else 0
    except (KeyError, ValueError):
        return 0, 1
    return (rank, size) if size > 1 else (0, 1)


def join_torchrun(device: torch.device | str = "cpu") -> tuple[int, int]:
    """Join the job torchrun started this process in (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...);
    returns ``(rank, world_size)``, ``(0, 1)`` when not started by torchrun with more than one rank."""
    import torch.distributed as dist

    if torchrun_world()[1] == 1:
        return 0, 1
    if not dist.is_initialized():
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(_backend(device), timeout=timedelta(seconds=TIMEOUT_S))
        atexit.register(_leave)
    return world()


def _leave():
    """The exit handler of a rank that joined a job, run only where the rank did not end through
    :func:`finish`: it raised (its one-line error already printed) or was interrupted.  It ends the process
    with status 1 after :data:`SETTLE_S`, so the launcher sees the rank that failed first (this one, or a rank
    whose death made this one's collective fail) end first, and stops the others (:class:`RankFailed`).

    Neither of the other ways out ends: destroying the group deadlocked as :func:`finish` explains (a gloo
    worker that waits for the GIL this handler holds), and a group left to the interpreter's teardown is
    destroyed there the same way, or aborts the rank ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        time.sleep(SETTLE_S)  # releases the GIL: a gloo worker waiting for it goes on
        _end(1)

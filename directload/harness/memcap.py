"""Cap a run's host memory with a real memory cgroup, so an out-of-core run sees a small host.

:func:`run_capped` runs a command as a child inside a new memory cgroup limited to N bytes (its own pages
and the page cache its reads fill, as a machine with N bytes would limit them), and stays outside it as
its guardian:

* a cap too small for the command to start, or below what the run's feature store and the run itself will
  hold, is refused before anything moves (:func:`check_limit`, :class:`MemoryLimitError`);
* SIGTERM, SIGINT and SIGHUP reach the guardian, which passes them on to the child, waits for it (then
  kills what is left in the cgroup) and removes the cgroup: a scheduler's SIGTERM leaves nothing behind;
* a child the kernel's OOM killer ended is reported in one line (:class:`MemoryCapExceeded`), and a run that
  ends says the most memory its cgroup held (:data:`PEAK_LINE`);
* the child dies with its guardian (``PR_SET_PDEATHSIG``, :func:`enter_capped_child`), and a later run
  removes the cgroups of guardians that are gone, ending any process still inside them.

Needs root (or a delegated cgroup) and a cgroup v1 ``memory`` controller or cgroup v2.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from directload.errors import DirectloadError
from directload.units import parse_size

__all__ = ["parse_limit", "check_limit", "run_capped", "enter_capped_child", "guard_children", "drop_page_cache",
           "capped_group", "MemoryCapExceeded", "MemoryLimitError", "CGROUP_ENV", "HEADROOM",
           "PEAK_LINE"]

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")
#: How a capped run's end says the most memory its cgroup held (its pages and the page cache it filled):
#: ``"peak host memory: P of C bytes (...)"``, one line on stdout.
PEAK_LINE = "peak host memory:"
#: Set in a capped child: the cgroup it runs in.
CGROUP_ENV = "DIRECTLOAD_MEMORY_CGROUP"
_GUARDIAN_ENV = "DIRECTLOAD_MEMORY_GUARDIAN"
#: What a capped child needs above what its guardian already uses (the guardian has imported what the
#: child imports) besides its graph, its batches and its feature store, which a training run's check counts
#: apart (:func:`~directload.harness.train_inputs.check_memory_limit`): the model, the optimizer, the threads.
HEADROOM = 128 << 20
_GRACE_S = 10.0  # how long a child has to end after a forwarded signal before the cgroup is killed
_WAIT_SLICE_S = 0.5  # how often the guardian looks at the clock while it waits
_PREFIX = "directload-"


class MemoryCapExceeded(DirectloadError, RuntimeError):
    """The kernel's OOM killer ended the capped command: it needed more memory than the cap."""


class MemoryLimitError(DirectloadError, ValueError):
    """A memory limit below what the run needs, refused before any work (:func:`check_limit`)."""


def parse_limit(text: str) -> int:
    """A memory cap in bytes from ``"1.5G"``, ``"768M"``, ...; ``ValueError`` for anything else (an empty
    string, 0 and negative sizes included).  Pure.

    Examples
    --------
    >>> parse_limit("1.5G")
    1610612736
    """
    return parse_size(text)


def _human(nbytes):
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / 2**20:.0f} MiB"


def _controller():
    if (_V1 / "cgroup.procs").exists() and (_V1 / "memory.limit_in_bytes").exists():
        return _V1, "memory.limit_in_bytes"
    if (_V2 / "cgroup.controllers").exists() and "memory" in (_V2 / "cgroup.controllers").read_text().split():
        return _V2, "memory.max"
    return None, None


def _anonymous_rss():
    """This process's resident anonymous memory (its heap, not the libraries' file pages, which a child
    mostly finds cached already and charged elsewhere), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    with open("/proc/self/statm") as f:  # no RssAnon (Linux < 4.5): resident minus shared
        resident, shared = (int(v) for v in f.read().split()[1:3])
        return (resident - shared) * os.sysconf("SC_PAGE_SIZE")


def check_limit(nbytes: int, *, needed: int | None = None,
                holds: Mapping[str, Mapping[str, int]] | None = None) -> None:
    """:class:`MemoryLimitError` (a ``ValueError``) when a cap of ``nbytes`` cannot hold the run: below what this
    process (which has imported what the run imports) uses now plus :data:`HEADROOM` (or ``needed`` when
    given), plus what ``holds`` says the run will hold besides: ``{"stack": {part: bytes}, "run": {part:
    bytes}}``, its feature store and its own (:func:`~directload.harness.train_inputs.check_memory_limit` gives
    a training run's).  The message names the limit, the total and every part, in one line.

    Examples
    --------
    >>> check_limit(3 << 30, needed=1 << 30, holds={"stack": {"host cache": 1 << 30}, "run": {"graph": 1 << 29}})
    >>> check_limit(2 << 30, needed=1 << 30, holds={"stack": {"host cache": 1 << 30}, "run": {"graph": 1 << 29}})
    Traceback (most recent call last):
    ...
    directload.harness.memcap.MemoryLimitError: a memory limit of 2.00 GiB is below what the run will hold: ...
    """
    base = _anonymous_rss() + HEADROOM if needed is None else needed
    if holds is None:
        if nbytes < base:
            raise MemoryLimitError(f"a memory limit of {_human(nbytes)} is below what the run needs to start (about "
                                   f"{_human(base)}: the interpreter, torch and the framework, and the dataset's "
                                   f"graph): give at least {-(-base // 2**20)}M")
        return
    stack = {k: v for k, v in holds.get("stack", {}).items() if v}
    run = {"the interpreter, torch, the framework and the model": base,
           **{k: v for k, v in holds.get("run", {}).items() if v}}
    total = sum(stack.values()) + sum(run.values())
    if nbytes >= total:
        return
    parts = [f"its feature store {_human(sum(stack.values()))}: {_parts(stack)}"] if stack else []
    parts.append(f"the run {_human(sum(run.values()))}: {_parts(run)}")
    raise MemoryLimitError(f"a memory limit of {_human(nbytes)} is below what the run will hold: about "
                           f"{_human(total)} ({'; '.join(parts)}); give at least {-(-total // 2**20)}M")


def _parts(parts):
    return ", ".join(f"{name} {_human(nbytes)}" for name, nbytes in parts.items())


def _start_time(pid):
    """The start time of process ``pid`` (clock ticks since boot), or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _group_name():
    return f"{_PREFIX}{os.getpid()}-{_start_time(os.getpid())}"


def _owner_alive(name):
    """Whether the guardian a cgroup is named after still runs (its pid, with the same start time)."""
    parts = name.removeprefix(_PREFIX).split("-")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return _start_time(int(parts[0])) == int(parts[1])
    if len(parts) == 1 and parts[0].isdigit():  # named by an older directload: the pid alone
        return os.path.exists(f"/proc/{parts[0]}")
    return True  # not a name we make: leave it alone


def _tasks(group):
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_all(group):
    """End every process in ``group`` and wait (briefly) until it is empty."""
    kill = group / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            kill.write_text("1")
    for _ in range(200):
        pids = _tasks(group)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _remove(group):
    for _ in range(100):
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY while the last task's exit is accounted
            time.sleep(0.02)
    return False


def _sweep(root):
    """Remove the cgroups of runs whose guardian is gone (killed, so nothing cleaned up), ending what is
    still inside them; cgroups of live runs, and any not named by us, are left alone."""
    for group in root.glob(f"{_PREFIX}*"):
        if group.is_dir() and not _owner_alive(group.name):
            _kill_all(group)
            _remove(group)


def _oom_kills(group):
    """How many processes the OOM killer ended in ``group`` (cgroup v2 ``memory.events``, v1
    ``memory.oom_control``), or None where the kernel does not say."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def _peak(group):
    """The most memory ``group`` held at once, in bytes (cgroup v2 ``memory.peak``, v1
    ``memory.max_usage_in_bytes``), or None where the kernel does not say."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        try:
            return int((group / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def capped_group() -> Path | None:
    """The cgroup this process runs in as a capped child, or None."""
    value = os.environ.get(CGROUP_ENV)
    return Path(value) if value else None


def enter_capped_child() -> None:
    """In a capped child (:data:`CGROUP_ENV` set): die with the guardian.  Call first thing."""
    guardian = os.environ.get(_GUARDIAN_ENV)
    if not guardian:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(guardian):  # it died before the line above
        os._exit(128 + signal.SIGKILL)


def guard_children() -> None:
    """Children this process starts from now on die with it (``PR_SET_PDEATHSIG``), as capped children die
    with their guardian: each calls :func:`enter_capped_child` first thing (``directload``'s entry does)."""
    os.environ[_GUARDIAN_ENV] = str(os.getpid())


def run_capped(nbytes: int, cmd: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` (an argv list) as a child in a new memory cgroup of ``nbytes``; its exit status (128 + N
    when a signal N ended it, as a shell says).

    Raises
    ------
    ValueError
        ``nbytes`` is too small for the run to start (see :func:`check_limit`); nothing was created.
    PermissionError
        Creating a cgroup needs root (or a delegated cgroup).
    OSError
        No memory cgroup controller on this machine.
    MemoryCapExceeded
        The OOM killer ended the child: it needed more than ``nbytes``.
    """
    check_limit(nbytes)
    root, knob = _controller()
    if root is None:
        raise OSError("no memory cgroup controller here (neither cgroup v1's memory nor v2's memory.max)")
    _sweep(root)
    group = root / _group_name()
    try:
        group.mkdir()
    except PermissionError:
        raise PermissionError(f"creating {group} needs root (or a delegated cgroup): run as root, or without a "
                              "memory limit") from None
    try:
        (group / knob).write_text(str(int(nbytes)))
        for swap, value in (("memory.memsw.limit_in_bytes", nbytes), ("memory.swap.max", 0)):
            if (group / swap).exists():  # no escape into swap
                with contextlib.suppress(OSError):
                    (group / swap).write_text(str(int(value)))
        return _guard(group, nbytes, cmd, env)
    finally:
        _kill_all(group)
        _remove(group)


def _guard(group, nbytes, cmd, env):
    """Start ``cmd`` inside ``group`` (a shell puts itself there, then becomes the command), pass signals on,
    wait, and tell an OOM kill."""
    child_env = {**(os.environ if env is None else env), CGROUP_ENV: str(group), _GUARDIAN_ENV: str(os.getpid())}
    shim = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    received = []  # (signal, when)

    def forward(signum, frame):
        received.append((signum, time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    # A signal this process was started ignoring (a background job's SIGINT, nohup's SIGHUP) stays ignored,
    # by the guardian and, inherited, by the command, as a shell would have it.
    forwarded = [s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
    # its own process group: a terminal's Ctrl-C reaches the guardian, which passes it on once
    child = subprocess.Popen(["/bin/sh", "-c", shim, str(group), *cmd], env=child_env, start_new_session=True)
    old = {s: signal.signal(s, forward) for s in forwarded}
    try:
        while True:
            try:  # in slices: a wait that began before a signal still ends the grace period on time
                code = child.wait(timeout=_WAIT_SLICE_S)
                break
            except subprocess.TimeoutExpired:
                if received and time.monotonic() - received[0][1] > _GRACE_S:
                    _kill_all(group)  # it did not end after the signal: end everything in the cgroup
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    oom, peak = _oom_kills(group), _peak(group)
    if code == -signal.SIGKILL and oom and not received:
        raise MemoryCapExceeded(f"the kernel's OOM killer ended the run at the memory limit of {_human(nbytes)}: "
                                "it needs more; raise --memory-limit")
    if peak is not None:
        print(f"{PEAK_LINE} {peak} of {int(nbytes)} bytes ({_human(peak)} of the {_human(nbytes)} cap)", flush=True)
    if received:
        return 128 + received[0][0]
    return 128 - code if code < 0 else code


def drop_page_cache(path: os.PathLike[str] | str) -> None:
    """Ask the kernel to drop ``path``'s cached pages (``POSIX_FADV_DONTNEED``), so the next reads are cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

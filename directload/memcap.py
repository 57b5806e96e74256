"""Cap this process's memory with a real memory cgroup, so an out-of-core run sees a small host.

A run that must not use more than N bytes of host memory (its own pages and
the page cache its reads fill) moves itself into a new memory cgroup limited
to N bytes, as a machine with that much memory would limit it.  Needs root (or
a delegated cgroup) and a cgroup v1 ``memory`` controller or cgroup v2.
"""

import atexit
import os
import re
from pathlib import Path

__all__ = ["parse_size", "limit_memory", "drop_page_cache"]

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """Bytes in ``"1.5G"``, ``"768M"``, ``"4096"`` (K, M, G, T are powers of 1024).  Pure.

    Examples
    --------
    >>> parse_size("1.5G"), parse_size("768m"), parse_size("4096")
    (1610612736, 805306368, 4096)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use bytes, or a number with K, M, G or T)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return value


def _controller():
    if (_V1 / "cgroup.procs").exists() and (_V1 / "memory.limit_in_bytes").exists():
        return _V1, "memory.limit_in_bytes"
    if (_V2 / "cgroup.controllers").exists() and "memory" in (_V2 / "cgroup.controllers").read_text().split():
        return _V2, "memory.max"
    return None, None


def limit_memory(nbytes):
    """Move this process into a new memory cgroup limited to ``nbytes``; returns the cgroup's path.

    The cgroup is removed at exit (the process moves back first).  Memory
    already charged elsewhere (pages read before the move) stays charged
    there: call :func:`drop_page_cache` on the files the run reads.

    Raises
    ------
    PermissionError
        Not allowed to create or join a cgroup (not root).
    OSError
        No memory cgroup controller on this machine.
    """
    root, knob = _controller()
    if root is None:
        raise OSError("no memory cgroup controller here (neither cgroup v1's memory nor v2's memory.max)")
    _sweep(root)
    group = root / f"directload-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
    except PermissionError:
        raise PermissionError(f"creating {group} needs root (or a delegated cgroup): run as root, or without "
                              "a memory limit") from None
    try:
        (group / knob).write_text(str(int(nbytes)))
        if knob == "memory.limit_in_bytes" and (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(int(nbytes)))  # no escape into swap
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        group.rmdir()
        raise
    atexit.register(_leave, root, group)
    return group


def _sweep(root):
    """Remove the empty cgroups of our own that earlier runs left when they were killed (no atexit ran)."""
    for group in root.glob("directload-*"):
        pid = group.name.removeprefix("directload-")
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                group.rmdir()  # fails, harmlessly, if anything is still inside
            except OSError:
                pass


def _leave(root, group):
    try:
        (root / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
    except OSError:
        pass  # a child still inside keeps it; the kernel frees it with the last member


def drop_page_cache(path):
    """Ask the kernel to drop ``path``'s cached pages (``POSIX_FADV_DONTNEED``), so the next reads are cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

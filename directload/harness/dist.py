"""Many DistDGL "machines" on one host: each in its own network and mount namespace, with its own /dev/shm.

DistDGL names its shared-memory objects by graph and field only, so two servers on one host overwrite each
other's partitions; and a trainer finds its machine by the first address of ``ip_config`` among its own
interfaces, so on loopback every trainer believes it is on machine 0.  Here each machine gets what a real
one has: a network namespace with one address on a private bridge (``10.200.0.{i+1}``, reachable only from
the other machines of this run) and a mount namespace whose ``/dev/shm`` is a tmpfs of its own.  Both go
away with the machine's processes, so a run, even a killed one, leaves nothing in the host's ``/dev/shm``.

What a run makes on the host is named after its launcher's pid: the bridge ``dlb<pid>`` and each machine's
link, ``dlh<pid>m<i>`` on the host (its peer ``dln<pid>m<i>`` inside the machine), each labelled with the
launcher's pid and start time (the link's alias).  The launcher deletes them itself however the run ends (the
machines done, a machine failed, a timeout, SIGINT, SIGTERM or SIGHUP): a machine's namespace can outlive its
processes by minutes (sockets still closing), and its link with it, so waiting for it to go is not enough.  A
launcher killed outright (SIGKILL) cannot; the next launch removes what a launcher that is no longer running
made, and nothing else.

Needs root, ``unshare`` and ``ip`` (iproute2): :class:`DistLaunchError` says which is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from directload.errors import DirectloadError

__all__ = ["DistLaunchError", "MachineFailed", "check_host", "launch_machines", "machine_main", "SUBNET", "link_names",
           "links_of", "sweep_links"]

SUBNET = "10.200.0"
#: The host's links a launcher makes: its bridge ``dlb<pid>`` and each machine's ``dlh<pid>m<i>``.
_OURS = re.compile(r"dl[bh]([0-9]{1,7})(?:m[0-9]{1,4})?")
_ALIAS = "directload-dist launcher"
_STEP_TIMEOUT = 60.0  # seconds for one `ip` command or one machine to come up: each takes milliseconds
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DistLaunchError(DirectloadError, RuntimeError):
    """This host cannot emulate several machines (not root, no ``unshare`` or ``ip``, namespaces refused)."""


class MachineFailed(DirectloadError, RuntimeError):
    """A machine's server or trainer failed; the message names which and how, and the others were stopped."""


def _run(cmd, what):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_STEP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise DistLaunchError(f"{what} did not finish within {_STEP_TIMEOUT:.0f} s: {' '.join(cmd)}") from exc
    if proc.returncode:
        raise DistLaunchError(f"{what} failed: {' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def check_host() -> None:
    """Raise :class:`DistLaunchError` in one line unless this host can run machines in namespaces."""
    if os.geteuid() != 0:
        raise DistLaunchError("emulating several DistDGL machines on one host needs root (network and mount "
                              "namespaces, a private /dev/shm per machine); run on real machines with DGL's "
                              "launch tool otherwise")
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            raise DistLaunchError(f"`{tool}` is not installed: emulating several machines on one host needs it "
                                  "(util-linux, iproute2)")


def link_names(pid: int, n: int) -> tuple[str, list[str]]:
    """``(bridge, [host end of each machine's link])``: the names launcher ``pid`` gives what it makes on the
    host for ``n`` machines (at most 15 characters, Linux's limit).

    Examples
    --------
    >>> link_names(4194304, 2)
    ('dlb4194304', ['dlh4194304m0', 'dlh4194304m1'])
    """
    return f"dlb{pid}", [f"dlh{pid}m{i}" for i in range(n)]


def _start_time(pid):
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat``), None if none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _label(pid):
    return f"{_ALIAS} {pid} {_start_time(pid)}"


def _host_links():
    """``{name: alias or None}`` of the host's links."""
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=_STEP_TIMEOUT).stdout
    try:
        return {link["ifname"]: link.get("ifalias") for link in json.loads(out or "[]")}
    except (ValueError, KeyError, TypeError):
        return {}


def links_of(pid: int) -> list[str]:
    """The links launcher ``pid`` made that are on the host now (its bridge and machines' links), by name."""
    return sorted(name for name in _host_links() if (m := _OURS.fullmatch(name)) and int(m.group(1)) == pid)


def _launcher_gone(name, alias):
    """Whether the link ``name`` (one of ours by name) was made by a launcher that no longer runs.  The alias
    says which (pid and start time, so a pid reused since is told apart); a link without one (an older
    directload's, or one killed before labelling it) goes by the pid in its name.  A link labelled by
    anything else is not ours."""
    if alias:
        parts = alias.rsplit(" ", 2)
        if parts[0] != _ALIAS or len(parts) != 3 or not parts[1].isdigit():
            return False
        return str(_start_time(int(parts[1]))) != parts[2]
    return _start_time(int(_OURS.fullmatch(name).group(1))) is None


def sweep_links() -> list[str]:
    """Delete the bridges and links of launchers that no longer run; returns their names.  Deleting the host
    end of a machine's link deletes its peer inside the machine too."""
    gone = [name for name, alias in _host_links().items() if _OURS.fullmatch(name) and _launcher_gone(name, alias)]
    for name in gone:
        _delete_link(name)
    return gone


def _delete_link(name):
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=_STEP_TIMEOUT)


def _die_with_parent():
    # the machine dies with its launcher: its namespaces (and the tmpfs /dev/shm) go with it
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch_machines(n: int, command: Sequence[str], *, workdir: os.PathLike[str] | str, timeout: float = 900.0,
                    env: Mapping[str, str] | None = None) -> list[int]:
    """Run ``n`` machines and wait for them; each runs ``command`` (a list; ``{machine}`` in it is the
    machine's index) through :func:`machine_main` inside its namespaces.  Returns the machines' exit codes
    (all 0), or raises :class:`MachineFailed` naming the first machine that failed, after stopping the
    others, or :class:`DistLaunchError` when the host cannot do it.  However it ends, the machines are
    stopped and the bridge and links it made are deleted before it returns or raises; SIGTERM and SIGHUP
    end it as SIGINT does (``SystemExit`` with 128 + the signal's number, after the same clean-up)."""
    check_host()
    sweep_links()
    # the machines share this host's cores: each gets its part, as it would have its own on a real machine
    # (OpenMP teams of every core in every machine's processes spin against each other)
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (2 * n))))
    bridge, host_ends = link_names(os.getpid(), n)
    procs, made = [], []
    with _stopped_by_signals():
        try:
            made.append(bridge)  # before it exists: a signal between the two must not leave it
            _run(["ip", "link", "add", bridge, "type", "bridge"], "making the machines' bridge")
            _run(["ip", "link", "set", bridge, "alias", _label(os.getpid()), "up"], "starting the bridge")
            for i in range(n):
                procs.append(_start_machine(i, command, workdir, env))
                _connect(procs[-1], i, bridge, host_ends[i], made)
            return _wait_all(procs, timeout)
        finally:
            with _signals_held():  # a second signal must not cut the clean-up short
                _stop(procs)
                for name in reversed(made):
                    _delete_link(name)


def _start_machine(i, command, workdir, env):
    argv = [a.replace("{machine}", str(i)) for a in command]
    proc = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", sys.executable, "-m",
                             "directload.harness.dist", str(i), *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=workdir, env=env, preexec_fn=_die_with_parent)
    ready, _, _ = select.select([proc.stdout], [], [], _STEP_TIMEOUT)
    if not ready or proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait()
        raise DistLaunchError(f"machine {i} could not start in its own namespaces (unshare refused?)")
    return proc


def _connect(proc, i, bridge, host_end, made):
    """Give machine ``i`` its link: ``host_end`` on the bridge, its peer moved into the machine."""
    ns_end = "dln" + host_end[3:]
    made.append(host_end)
    _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end], "making a machine's link")
    _run(["ip", "link", "set", host_end, "alias", _label(os.getpid())], "labelling a machine's link")
    _run(["ip", "link", "set", ns_end, "netns", str(proc.pid)], "moving a link into a machine")
    _run(["ip", "link", "set", host_end, "master", bridge], "attaching a machine to the bridge")
    _run(["ip", "link", "set", host_end, "up"], "starting a machine's link")
    proc.stdin.write(f"{ns_end}\n")
    proc.stdin.flush()


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # its server and trainer die with it (PR_SET_PDEATHSIG)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_STEP_TIMEOUT)


def _raise_stop(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM and SIGHUP raise ``SystemExit`` (SIGINT raises ``KeyboardInterrupt``) for the block, so its
    clean-up runs; where this is not the main thread (only it may set handlers) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held():
    """The stop signals wait (blocked) until the block ends, then arrive as they would have."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None:
            why = procs[failed].stdout.read().strip().splitlines()
            raise MachineFailed(why[-1] if why else f"machine {failed} exited with {codes[failed]}")
        if all(c == 0 for c in codes):
            return codes
        if time.monotonic() > deadline:
            raise MachineFailed(f"the machines did not finish within {timeout:.0f} s; they were stopped")
        time.sleep(0.2)


def _signal_name(code):
    return signal.Signals(-code).name if code < 0 else f"exit {code}"


def machine_main(index: int, roles: Sequence[str]) -> int:
    """Inside machine ``index``'s namespaces: a private ``/dev/shm``, the machine's address, then its server
    and trainer (``roles``: the command of each, run with ``role`` appended).  Returns the exit code; the
    last line printed says what failed."""
    print("ready", flush=True)
    link = sys.stdin.readline().strip()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", f"directload-machine{index}", "/dev/shm"], check=True)
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{SUBNET}.{index + 1}/24", "dev", link],
                ["ip", "link", "set", link, "up"]):
        subprocess.run(cmd, check=True, capture_output=True)
    os.environ["GLOO_SOCKET_IFNAME"] = link  # gloo would resolve the host name, which is no address of this machine
    logs = {role: open(f"machine{index}-{role}.log", "w") for role in ("server", "trainer")}  # noqa: SIM115
    # Unbuffered: a machine's log says what its processes have done (DGL's "connect to server" among it) as they
    # do it, not when a buffer fills or the process ends.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server, trainer = (subprocess.Popen([*roles, role], stdout=logs[role], stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=_die_with_parent) for role in ("server", "trainer"))
    try:
        while True:
            s, t = server.poll(), trainer.poll()
            if s not in (None, 0) and t is None:
                print(f"the server of machine {index} ended ({_signal_name(s)}) before its trainer finished; "
                      "the run was stopped", flush=True)
                return 1
            if t is not None and t != 0:
                print(f"the trainer of machine {index} failed ({_signal_name(t)}): {_last_line(index, 'trainer')}",
                      flush=True)
                return 1
            if t == 0 and s is not None:
                return 0 if s == 0 else 1
            time.sleep(0.1)
    finally:
        for proc in (trainer, server):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in logs.values():
            log.close()


def _last_line(index, role):
    lines = Path(f"machine{index}-{role}.log").read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no output"


def write_ip_config(n: int, port: int, directory: os.PathLike[str] | str) -> Path:
    """DGL's ``ip_config.txt`` for ``n`` machines of this run."""
    path = Path(directory) / "ip_config.txt"
    path.write_text("".join(f"{SUBNET}.{i + 1} {port}\n" for i in range(n)))
    return path


def read_results(directory: os.PathLike[str] | str, n: int) -> list[dict[str, Any]]:
    """The trainers' result files (``trainer{i}.json``) of a finished run, in machine order."""
    return [json.loads((Path(directory) / f"trainer{i}.json").read_text()) for i in range(n)]


def run_dir() -> Path:
    """A fresh directory for one run's ip_config and results."""
    return Path(tempfile.mkdtemp(prefix="directload-dist-"))


if __name__ == "__main__":
    sys.exit(machine_main(int(sys.argv[1]), sys.argv[2:]))

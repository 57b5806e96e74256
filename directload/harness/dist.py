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

__all__ = ["DistLaunchError", "MachineFailed", "check_host", "launch_machines", "machine_main", "watch", "error_line",
           "SUBNET", "SETTLE_S", "link_names", "links_of", "sweep_links"]

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


#: The capabilities (bit numbers of ``CapEff``, linux/capability.h) that making the machines' namespaces,
#: mounts and links takes: a root process in a container may lack them.
_CAPABILITIES = {"CAP_SYS_ADMIN": 21, "CAP_NET_ADMIN": 12}


def _effective_capabilities():
    """This process's effective capability bits (``/proc/self/status``), or None where it cannot say."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    return int(found.group(1), 16) if found else None


def check_host() -> None:
    """Raise :class:`DistLaunchError` in one line unless this host can run machines in namespaces: root with
    the capabilities to make namespaces and links (:data:`_CAPABILITIES`), and the tools.  What a launch
    refuses first: no other advice matters on a host that cannot run one."""
    if os.geteuid() != 0:
        raise DistLaunchError("emulating several DistDGL machines on one host needs root (network and mount "
                              "namespaces, a private /dev/shm per machine); run on real machines with DGL's "
                              "launch tool otherwise")
    caps = _effective_capabilities()
    missing = [] if caps is None else [name for name, bit in _CAPABILITIES.items() if not caps >> bit & 1]
    if missing:
        raise DistLaunchError(f"emulating several DistDGL machines on one host needs {' and '.join(missing)} to make "
                              "network and mount namespaces, which this root process lacks (a container started "
                              "without them: add them, or run on real machines with DGL's launch tool)")
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
    (all 0), or raises :class:`MachineFailed` naming the machine and process that failed first in time (not
    the first seen to fail, nor one that failed because of it: :data:`SETTLE_S`), after stopping the others,
    or :class:`DistLaunchError` when the host cannot do it.  However it ends, the machines are
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


def _wait_all(procs: Sequence[subprocess.Popen[str]], timeout: float, settle: float | None = None) -> list[int]:
    """The machines' exit codes once all ended well, or :class:`MachineFailed` naming the failure that came
    first in time: once one machine has failed, the others get ``settle`` seconds (:data:`SETTLE_S`) to
    report what it caused, and the earliest death among the reports is named, whichever machine was seen to
    fail first (each machine's report says when its failed process died: :func:`machine_main`)."""
    settle = SETTLE_S if settle is None else settle
    deadline = time.monotonic() + timeout
    noticed: dict[int, int] = {}  # machine -> when this launcher saw it fail (monotonic ns)
    while True:
        codes = [p.poll() for p in procs]
        for i, code in enumerate(codes):
            if code not in (None, 0):
                noticed.setdefault(i, time.monotonic_ns())
        if noticed and (None not in codes or time.monotonic_ns() - min(noticed.values()) >= settle * 1e9):
            raise MachineFailed(_first_failure(procs, codes, noticed))
        if all(c == 0 for c in codes):
            return [0] * len(codes)
        if time.monotonic() > deadline:
            raise MachineFailed(f"the machines did not finish within {timeout:.0f} s; they were stopped")
        time.sleep(0.05)


def _first_failure(procs, codes, noticed):
    """The message of the failed machine whose failed process died first: its report's time of death, or,
    for a machine that could not report (its own process failed), when the launcher saw it end."""
    found = []
    for i in noticed:
        lines = [line.strip() for line in procs[i].stdout.read().splitlines() if line.strip()]
        report = _report_of(lines[-1]) if lines else None
        if report is None:
            said = lines[-1] if lines and lines[-1] != "ready" else None
            report = (noticed[i], said or f"machine {i} exited with {_signal_name(codes[i])}")
        found.append(report)
    return min(found)[1]


def _report_of(line):
    """``(died, message)`` from a machine's last line (:func:`machine_main`'s report), or None."""
    try:
        report = json.loads(line)
        return int(report["died"]), str(report["message"])
    except (ValueError, TypeError, KeyError):
        return None


def _signal_name(code):
    return signal.Signals(-code).name if code < 0 else f"exit {code}"


#: Seconds a launcher (and a machine) waits, once a process has failed, for the failures that one caused to
#: be reported as well, so that the failure it names is the first to happen, not the first to be seen (a
#: trainer aborts after its server dies, and its machine may tell first).
SETTLE_S = 1.0

#: Lines of a crash dump (faulthandler's on a fatal signal, a traceback's frames): never an error message.
_DUMP = re.compile(r"^(Fatal Python error|Current thread|Thread 0x|Stack \(most recent call first\)|"
                   r"Extension modules:|Traceback \(most recent call last\)|<no Python frame>|\s+File \")")
#: Lines that say what failed: ours, a Python exception's last line, a C++ exception's ``what()``.
_ERROR = re.compile(r"^(directload: error: (?P<ours>.+)|(?P<exc>[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: .*)?)"
                    r"|\s*what\(\):\s+(?P<what>.+))$")


def error_line(log: str) -> str | None:
    r"""The line of a process's ``log`` that says why it failed: the last that is directload's own error
    (without its ``directload: error:`` prefix), a Python exception's last line (``RuntimeError: ...``) or a
    C++ exception's ``what()``, never a line of a crash dump (faulthandler's ``Fatal Python error``,
    ``Current thread``, ``Extension modules: ...``, stack frames); None where there is none.

    Examples
    --------
    >>> dump = 'Fatal Python error: Aborted\n\nCurrent thread 0x01 (most recent call first):\n  File "x.py", line 3'
    >>> error_line("Server is waiting\nRuntimeError: connection reset\n" + dump + "\nExtension modules: numpy")
    'RuntimeError: connection reset'
    >>> error_line(dump + "\nExtension modules: numpy.core._multiarray_umath (total: 1)") is None
    True
    """
    for line in reversed(log.splitlines()):
        if not line.strip() or _DUMP.match(line):
            continue
        found = _ERROR.match(line.rstrip())
        if found:
            return (found["ours"] or found["exc"] or found["what"]).strip()
    return None


class _Deaths:
    """When each of a machine's processes died, as it happens: a thread per process waits for it to end
    (``waitid`` without reaping it), reads the monotonic clock (one clock for every machine of the host:
    they have network and mount namespaces of their own, not time namespaces), then reaps it.  A process
    reaped has its time of death recorded."""

    def __init__(self, procs: Mapping[str, subprocess.Popen[Any]]) -> None:
        self._lock = threading.Lock()
        self._ended: dict[str, tuple[int, int]] = {}  # role -> (died, exit code)
        self.changed = threading.Event()
        for role, proc in procs.items():
            threading.Thread(target=self._watch, args=(role, proc), name=f"directload-{role}-watch",
                             daemon=True).start()

    def _watch(self, role, proc):
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        died = time.monotonic_ns()
        code = proc.wait()
        with self._lock:
            self._ended[role] = (died, code)
        self.changed.set()

    def ended(self):
        """``{role: (died, exit code)}`` of the processes that have ended, so far."""
        with self._lock:
            return dict(self._ended)


def watch(index: int, server: subprocess.Popen[Any], trainer: subprocess.Popen[Any], *,
          settle: float | None = None) -> tuple[int, str] | None:
    """Wait for machine ``index``'s ``server`` and ``trainer``: None when both ended well, else ``(died,
    message)`` of the one that failed first (``died``: when, in monotonic ns).  Once one has failed, the
    other has ``settle`` seconds (:data:`SETTLE_S`) to end too, so that a trainer that aborted because its
    server died is not taken for the cause.  A server that ends before its trainer finished has failed,
    unless with status 0.  The message names the process, how it ended and its log's :func:`error_line`
    (``machine{index}-{role}.log`` in the working directory)."""
    settle = SETTLE_S if settle is None else settle
    deaths = _Deaths({"server": server, "trainer": trainer})
    first = None  # when a failure was first seen (monotonic)
    while True:
        ended = deaths.ended()
        failed = {role: ended[role] for role in ended if ended[role][1] != 0}
        if not failed and len(ended) == 2:
            return None
        left = None  # nothing failed: wait for the next end, however long the run takes
        if failed:
            first = first or time.monotonic()
            left = settle - (time.monotonic() - first)
            if len(ended) == 2 or left <= 0:
                role = min(failed, key=lambda r: failed[r][0])
                return failed[role][0], _failure(index, role, failed[role][1], ended.get("trainer"))
        deaths.changed.wait(left)
        deaths.changed.clear()


def _failure(index, role, code, trainer):
    """What machine ``index``'s failed ``role`` says, in one line (``trainer``: how the trainer ended, if it
    has)."""
    path = Path(f"machine{index}-{role}.log")
    said = error_line(path.read_text(errors="replace")) if path.is_file() else None
    how = _signal_name(code)
    if role == "trainer":
        return f"the trainer of machine {index} failed ({how}): {said or f'no error line in {path.name}'}"
    tail = f": {said}" if said else ""
    if trainer is not None and trainer[1] == 0:
        return f"the server of machine {index} failed ({how}) after its trainer finished{tail}"
    return f"the server of machine {index} ended ({how}) before its trainer finished; the run was stopped{tail}"


def machine_main(index: int, roles: Sequence[str]) -> int:
    """Inside machine ``index``'s namespaces: a private ``/dev/shm``, the machine's address, then its server
    and trainer (``roles``: the command of each, run with ``role`` appended).  Returns the exit code; where
    it is 1, the last line printed is the report of what failed first (:func:`watch`), as JSON:
    ``{"died": monotonic ns, "message": ...}``."""
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
        failed = watch(index, server, trainer)
        if failed is not None:
            print(json.dumps({"died": failed[0], "message": failed[1]}), flush=True)
            return 1
        return 0
    finally:
        for proc in (trainer, server):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in logs.values():
            log.close()



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

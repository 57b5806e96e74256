"""Many DistDGL "machines" on one host: each in its own network and mount namespace, with its own /dev/shm.

DistDGL names its shared-memory objects by graph and field only, so two servers on one host overwrite each
other's partitions; and a trainer finds its machine by the first address of ``ip_config`` among its own
interfaces, so on loopback every trainer believes it is on machine 0.  Here each machine gets what a real
one has: a network namespace with one address on a private bridge (``10.200.0.{i+1}``, reachable only from
the other machines of this run) and a mount namespace whose ``/dev/shm`` is a tmpfs of its own.  Both go
away with the machine's processes, so a run, even a killed one, leaves nothing in the host's ``/dev/shm``;
the bridge is named after the launcher's pid and a later launch removes a dead launcher's.

Needs root, ``unshare`` and ``ip`` (iproute2): :class:`DistLaunchError` says which is missing.
"""

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["DistLaunchError", "MachineFailed", "check_host", "launch_machines", "machine_main", "SUBNET"]

SUBNET = "10.200.0"
_BRIDGE = re.compile(r"^dlb(\d+)$")


class DistLaunchError(RuntimeError):
    """This host cannot emulate several machines (not root, no ``unshare`` or ``ip``, namespaces refused)."""


class MachineFailed(RuntimeError):
    """A machine's server or trainer failed; the message names which and how, and the others were stopped."""


def _run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise DistLaunchError(f"{what} failed: {' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def check_host():
    """Raise :class:`DistLaunchError` in one line unless this host can run machines in namespaces."""
    if os.geteuid() != 0:
        raise DistLaunchError("emulating several DistDGL machines on one host needs root (network and mount "
                              "namespaces, a private /dev/shm per machine); run on real machines with DGL's "
                              "launch tool otherwise")
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            raise DistLaunchError(f"`{tool}` is not installed: emulating several machines on one host needs it "
                                  "(util-linux, iproute2)")


def _sweep_bridges():
    """Remove the bridges of launchers that died (their machines' namespaces died with them)."""
    out = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _BRIDGE.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def _die_with_parent():
    # the machine dies with its launcher: its namespaces (and the tmpfs /dev/shm) go with it
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch_machines(n, command, *, workdir, timeout=900.0, env=None):
    """Run ``n`` machines and wait for them; each runs ``command`` (a list; ``{machine}`` in it is the
    machine's index) through :func:`machine_main` inside its namespaces.  Returns the machines' exit codes
    (all 0), or raises :class:`MachineFailed` naming the first machine that failed, after stopping the
    others, or :class:`DistLaunchError` when the host cannot do it."""
    check_host()
    _sweep_bridges()
    # the machines share this host's cores: each gets its part, as it would have its own on a real machine
    # (OpenMP teams of every core in every machine's processes spin against each other)
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (2 * n))))
    bridge = f"dlb{os.getpid()}"
    _run(["ip", "link", "add", bridge, "type", "bridge"], "making the machines' bridge")
    procs = []
    try:
        _run(["ip", "link", "set", bridge, "up"], "starting the bridge")
        for i in range(n):
            argv = [a.replace("{machine}", str(i)) for a in command]
            proc = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", sys.executable,
                                     "-m", "directload.harness.dist", str(i), *argv],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workdir,
                                    env=env, preexec_fn=_die_with_parent)
            procs.append(proc)
            if proc.stdout.readline().strip() != "ready":
                raise DistLaunchError(f"machine {i} could not start in its own namespaces (unshare refused?)")
            host_end, ns_end = f"dlh{os.getpid() % 100000}m{i}", f"dln{os.getpid() % 100000}m{i}"
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end], "making a machine's link")
            _run(["ip", "link", "set", ns_end, "netns", str(proc.pid)], "moving a link into a machine")
            _run(["ip", "link", "set", host_end, "master", bridge], "attaching a machine to the bridge")
            _run(["ip", "link", "set", host_end, "up"], "starting a machine's link")
            proc.stdin.write(f"{ns_end}\n")
            proc.stdin.flush()
        return _wait_all(procs, timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


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


def machine_main(index, roles):
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
    server, trainer = (subprocess.Popen([*roles, role], stdout=logs[role], stderr=subprocess.STDOUT,
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


def write_ip_config(n, port, directory):
    """DGL's ``ip_config.txt`` for ``n`` machines of this run."""
    path = Path(directory) / "ip_config.txt"
    path.write_text("".join(f"{SUBNET}.{i + 1} {port}\n" for i in range(n)))
    return path


def read_results(directory, n):
    """The trainers' result files (``trainer{i}.json``) of a finished run, in machine order."""
    return [json.loads((Path(directory) / f"trainer{i}.json").read_text()) for i in range(n)]


def run_dir():
    """A fresh directory for one run's ip_config and results."""
    return Path(tempfile.mkdtemp(prefix="directload-dist-"))


if __name__ == "__main__":
    sys.exit(machine_main(int(sys.argv[1]), sys.argv[2:]))

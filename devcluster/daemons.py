"""Start and stop the dev cluster's daemons, each by the PID in its pidfile.

Never by name: a `pkill slurmd` would also hit a production slurmd or a
second test cluster on the same host. A pidfile's PID is trusted only while
/proc says that process runs one of the daemon's known program names, so a
stale pidfile whose PID was reused by something else is never signalled.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.errors import DevClusterError
from slurm_ext.procfs import comm, pid_alive

__all__ = ["Daemon", "running_pid", "start", "stop", "check_port_free", "wait_for"]

log = logging.getLogger("dev")


@dataclass(frozen=True, slots=True)
class Daemon:
    name: str
    argv: tuple[str, ...]
    pidfile: Path
    #: /proc/PID/comm values this daemon runs under (comm is cut at 15 chars)
    comms: frozenset[str]
    logfile: Path
    #: TCP ports it listens on, all on 127.0.0.1
    ports: tuple[int, ...] = ()
    #: config files it reads: `dev up` restarts it when one of them changed
    reads: frozenset[Path] = frozenset()


def running_pid(daemon: Daemon) -> int | None:
    """The daemon's PID from its pidfile, if that PID is alive and is the daemon."""
    try:
        pid = int(daemon.pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid_alive(pid) and comm(pid) in daemon.comms:
        return pid
    return None


def check_port_free(port: int, owner: str) -> None:
    """Raises DevClusterError naming the port when something listens on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise DevClusterError(
                f"{owner}: port {port} on 127.0.0.1 is taken by another process "
                f"(see `ss -ltnp 'sport = :{port}'`); stop it or set another port in [dev]") from None


def wait_for(what: str, test, timeout: float, interval: float = 0.1, logfile: Path | None = None):
    """Poll `test()` until it returns something true, and return that.

    Raises:
        DevClusterError: not true within `timeout`; names the log to read.
    """
    deadline = time.monotonic() + timeout
    while True:
        if value := test():
            return value
        if time.monotonic() > deadline:
            hint = f"; see {logfile}" + _tail(logfile) if logfile else ""
            raise DevClusterError(f"{what}: not ready within {timeout:g}s{hint}")
        time.sleep(interval)


def _tail(logfile: Path, lines: int = 5) -> str:
    try:
        last = logfile.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n  | {line}" for line in last)


def start(daemon: Daemon, env: dict[str, str], timeout: float) -> int:
    """Start `daemon` unless it already runs; return its PID.

    The caller checks its ports first (`check_port_free`), for every daemon it
    is about to start, so that a taken port fails before anything starts.

    Raises:
        DevClusterError: the daemon did not come up (the message quotes the
            end of its log).
    """
    pid = running_pid(daemon)
    if pid:
        return pid
    daemon.pidfile.unlink(missing_ok=True)
    log.info("starting %s", daemon.name)
    with open(daemon.logfile, "ab") as out:
        proc = subprocess.Popen(daemon.argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)

    def started() -> bool:
        # A forking daemon's first process exits 0 once the daemon is detached;
        # any other exit before the pidfile names a live daemon is a failed start.
        code = proc.poll()
        if code:
            raise DevClusterError(f"{daemon.name} failed to start (exit status {code}); see {daemon.logfile}"
                                  + _tail(daemon.logfile))
        return running_pid(daemon) is not None

    wait_for(f"{daemon.name} pidfile {daemon.pidfile}", started, timeout, logfile=daemon.logfile)
    return running_pid(daemon) or 0


def stop(daemon: Daemon, grace: float = 10.0) -> int | None:
    """Stop `daemon` by its pidfile: SIGTERM, then SIGKILL after `grace` seconds.

    Returns the PID it stopped, or None when it was not running.
    """
    pid = running_pid(daemon)
    if pid is None:
        daemon.pidfile.unlink(missing_ok=True)
        return None
    log.info("stopping %s (pid %d)", daemon.name, pid)
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        log.warning("%s (pid %d) ignored SIGTERM for %gs: sending SIGKILL", daemon.name, pid, grace)
        _signal(pid, signal.SIGKILL)
        wait_for(f"{daemon.name} (pid {pid}) to exit after SIGKILL", lambda: not pid_alive(pid), 10.0)
    daemon.pidfile.unlink(missing_ok=True)
    _reap_if_ours(pid)
    return pid


def _reap_if_ours(pid: int) -> None:
    """A daemon that does not fork (mariadbd, the agents) is our child when this
    process started it: reap it, or it stays a zombie until we exit."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

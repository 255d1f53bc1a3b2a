"""Run external commands with a timeout, one way everywhere.

Every call to scontrol, sacct, mariadb, gcc, ... goes through `run`, so a hung
command can never wedge the caller: on timeout the whole process group is
killed (Slurm clients may fork helpers) and the output read so far is kept in
the error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass

from .errors import CommandError, CommandTimeout

__all__ = ["CommandResult", "run", "reap_child"]

# Children `run` has started and not yet waited for, and the wait statuses a
# process-wide reaper took from under them (see reap_child). One lock covers
# both and the spawn itself, so a child is registered before anyone can reap it.
_LOCK = threading.Lock()
_RUNNING: set[int] = set()
_REAPED: dict[int, int] = {}


@dataclass(frozen=True, slots=True)
class CommandResult:
    cmd: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run(
    cmd: list[str],
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run `cmd` and return its result.

    Raises:
        CommandTimeout: the command ran past `timeout` seconds (its process
            group was killed).
        CommandError: the command exited non-zero and `check` is true, or the
            program does not exist.
    """
    try:
        with _LOCK:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
            _RUNNING.add(proc.pid)
    except OSError as err:
        raise CommandError(cmd, None, f"cannot execute {cmd[0]}: {err.strerror}") from err
    try:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            stdout, stderr = proc.communicate()
            raise CommandTimeout(cmd, timeout, stderr or "") from None
    finally:
        with _LOCK:
            _RUNNING.discard(proc.pid)
            status = _REAPED.pop(proc.pid, None)
    # A reaper that took the exit status first left it here; Popen then saw ECHILD and said 0.
    returncode = proc.returncode if status is None else os.waitstatus_to_exitcode(status)
    result = CommandResult(tuple(cmd), returncode, stdout, stderr)
    if check and returncode != 0:
        raise CommandError(cmd, returncode, stderr or stdout)
    return result


def reap_child() -> tuple[int, int] | None:
    """waitpid(-1, WNOHANG) for a process-wide reaper (the node agent, PID 1).

    Returns (pid, wait status) of one exited child, or None when none is
    left. A child that `run` started in another thread is reaped too, but its
    status is kept for that `run` (which would otherwise read exit code 0)
    and the next child is looked at: reaping and registering share a lock, so
    no status can fall between them.
    """
    while True:
        with _LOCK:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            if pid not in _RUNNING:
                return pid, status
            _REAPED[pid] = status


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

"""Run external commands with a timeout, one way everywhere.

Every call to scontrol, sacct, mariadb, gcc, ... goes through `run`, so a hung
command can never wedge the caller: on timeout the whole process group is
killed (Slurm clients may fork helpers) and the output read so far is kept in
the error.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from .errors import CommandError, CommandTimeout

__all__ = ["CommandResult", "run", "CLEAN_PATH"]

#: the PATH of what slurm-ext runs with none of its caller's (scripts, hooks, Slurm's tools), and where
#: `#!/usr/bin/env X` finds X
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    import subprocess  # here: the Python hooks import this module for CLEAN_PATH, and a Prolog runs no command
    try:
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
    except OSError as err:
        raise CommandError(cmd, None, f"cannot execute {cmd[0]}: {err.strerror}") from err
    try:
        stdout, stderr = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        raise CommandTimeout(cmd, timeout, stderr or "") from None
    result = CommandResult(tuple(cmd), proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise CommandError(cmd, proc.returncode, stderr or stdout)
    return result


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

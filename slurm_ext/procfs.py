"""Reading processes from /proc: the one place that parses /proc/PID/stat.

The agent (reaping, sessions, MAINPID ancestry), the dev cluster (pidfiles)
and the tests all ask the same few questions of /proc; `proc` is a parameter
so tests can feed a fixture tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["ProcStat", "read_stat", "pid_alive", "comm", "all_stats"]

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    #: the state letter: R, S, D, Z (zombie), X (dead), ...
    state: str
    ppid: int
    session: int


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process's stat fields, or None when it is gone (or unreadable)."""
    try:
        data = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # the command name in parentheses may itself hold spaces and ')'
    fields = data[data.rindex(b")") + 2:].split()
    return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[3]))


def pid_alive(pid: int, proc: Path = PROC) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    stat = read_stat(pid, proc)
    return stat is not None and stat.state not in ("Z", "X")


def comm(pid: int, proc: Path = PROC) -> str | None:
    """The process's name as the kernel keeps it (cut at 15 characters)."""
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def all_stats(proc: Path = PROC) -> Iterator[ProcStat]:
    """Every process that can be read now."""
    for name in os.listdir(proc):
        if name.isdigit():
            stat = read_stat(int(name), proc)
            if stat is not None:
                yield stat

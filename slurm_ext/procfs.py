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

__all__ = ["ProcStat", "read_stat", "pid_alive", "comm", "all_stats", "real_uid", "pids"]

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    #: the state letter: R, S, D, Z (zombie), X (dead), ...
    state: str
    ppid: int
    session: int
    #: process group id
    pgrp: int
    #: clock ticks after boot when it started: (pid, starttime) names one process even across pid reuse
    starttime: int
    #: the name the kernel keeps (cut at 15 characters)
    comm: str


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process's stat fields, or None when it is gone (or unreadable)."""
    try:
        with open(f"{os.fspath(proc)}/{pid}/stat", "rb") as f:  # not pathlib: scans call this per process
            data = f.read()
    except OSError:
        return None
    # the command name in parentheses may itself hold spaces and ')'
    end = data.rindex(b")")
    fields = data[end + 2:].split()
    return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[2]), int(fields[19]),
                    data[data.index(b"(") + 1:end].decode(errors="replace"))


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


def real_uid(pid: int, proc: Path = PROC) -> int | None:
    """The process's real uid, or None when it is gone.

    /proc/PID's owner is the effective uid, and root for a non-dumpable
    process; so a root-owned entry is checked in status, the slower read.
    """
    base = f"{os.fspath(proc)}/{pid}"
    try:
        owner = os.stat(base).st_uid
    except OSError:
        return None
    if owner != 0:
        return owner
    try:
        with open(f"{base}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def pids(proc: Path = PROC) -> list[int]:
    """Every process id in /proc now."""
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def all_stats(proc: Path = PROC) -> Iterator[ProcStat]:
    """Every process that can be read now."""
    for pid in pids(proc):
        stat = read_stat(pid, proc)
        if stat is not None:
            yield stat

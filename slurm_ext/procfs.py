"""Reading processes from /proc: the one place that parses /proc/PID/stat.

The agent (reaping, sessions, MAINPID ancestry), the dev cluster (pidfiles)
and the tests all ask the same few questions of /proc; `proc` is a parameter
so tests can feed a fixture tree (a Path, or a plain string: the Epilog's
scan passes one, since it is joined with every pid several times).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["boot_id", "ProcStat", "read_stat", "pid_alive", "comm", "all_stats", "real_uid", "pids", "read_whole",
           "Mount", "mounts"]

PROC = Path("/proc")
#: bytes read of /proc/PID/stat: 52 numbers and a name of at most 64 bytes fit with room to spare
_STAT_SIZE = 2048
#: bytes read of /proc/PID/status: its Uid line is the ninth, after a name of at most 64 bytes
_STATUS_HEAD = 1024


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


def boot_id(path: Path | str = "/proc/sys/kernel/random/boot_id") -> str:
    """This boot's identity ("" when it cannot be read): NodeSection.boot_id_file."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def read_stat(pid: int, proc: Path | str = PROC) -> ProcStat | None:
    """The process's stat fields, or None when it is gone (or unreadable)."""
    data = _read(f"{os.fspath(proc)}/{pid}/stat", _STAT_SIZE)
    # the command name in parentheses may itself hold spaces and ')'
    end = data.rfind(b")")
    if end < 0:  # gone between the open and the read (or nothing could be read)
        return None
    fields = data[end + 2:].split()
    return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[2]), int(fields[19]),
                    data[data.index(b"(") + 1:end].decode(errors="replace"))


def _read(path: str, size: int | None) -> bytes:
    """The first `size` bytes of a /proc file (None: all of it), b"" when it cannot be read.

    os.open and os.read, not open(): an Epilog's scan reads a few files
    per process of the node, and the buffered file object costs as much as
    the kernel's work on a small /proc file. /proc files are made whole at
    the first read, so one read of enough bytes sees a consistent text.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if size is not None:
            return os.read(fd, size)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def read_whole(pid: int, name: str, proc: Path | str = PROC) -> bytes:
    """The whole of /proc/PID/<name> (environ and cgroup have no size bound), b"" when it cannot be read."""
    return _read(f"{os.fspath(proc)}/{pid}/{name}", None)


def pid_alive(pid: int, proc: Path | str = PROC) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    stat = read_stat(pid, proc)
    return stat is not None and stat.state not in ("Z", "X")


def comm(pid: int, proc: Path | str = PROC) -> str | None:
    """The process's name as the kernel keeps it (cut at 15 characters)."""
    data = _read(f"{os.fspath(proc)}/{pid}/comm", 64)
    return data.decode(errors="replace").strip() if data else None


def real_uid(pid: int, proc: Path | str = PROC) -> int | None:
    """The process's real uid, or None when it is gone.

    /proc/PID's owner is the effective uid (the kernel keeps it for the
    directory even when the process is not dumpable); so a root-owned entry,
    which may be a setuid-root program a user started, is checked in status,
    the slower read.
    """
    base = f"{os.fspath(proc)}/{pid}"
    try:
        owner = os.stat(base).st_uid
    except OSError:
        return None
    if owner != 0:
        return owner
    data = _read(f"{base}/status", _STATUS_HEAD)
    at = data.find(b"\nUid:")  # Name, the only text a user chooses, comes first and has its newlines escaped
    if at < 0:
        return None
    try:
        return int(data[at + 5:data.index(b"\n", at + 1)].split()[0])
    except (ValueError, IndexError):
        return None


def pids(proc: Path | str = PROC) -> list[int]:
    """Every process id in /proc now."""
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def all_stats(proc: Path | str = PROC) -> Iterator[ProcStat]:
    """Every process that can be read now."""
    for pid in pids(proc):
        stat = read_stat(pid, proc)
        if stat is not None:
            yield stat


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of /proc/self/mountinfo: where, with which options, what file system."""

    point: str
    options: tuple[str, ...]
    fstype: str


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Mount]:
    """The mounts of `mountinfo`, mount points unescaped (the kernel writes a space as \\040); lines not in
    the kernel's format are skipped.

    Raises:
        OSError: the file cannot be read.
    """
    found = []
    for line in mountinfo.read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields = before.split()
        if len(fields) < 6 or not after.split():
            continue
        point = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code.group(1), 8)), fields[4])
        found.append(Mount(point, tuple(fields[5].split(",")), after.split()[0]))
    return found

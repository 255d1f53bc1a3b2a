"""The few cgroup file operations slurm-ext needs: members, freeze, write, rmdir.

One place for both hierarchies' spellings (v1 `freezer.state`, v2
`cgroup.freeze` and `cgroup.events`) and for reading cgroup.procs, so the
Epilog's job cgroups, a user hook's own, the agent's move out of the root
cgroup and the dev cluster's teardown all read and empty cgroups the same way.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

__all__ = ["read_pids", "members", "freeze", "write", "write_each", "rmdir"]

#: freezing settles in milliseconds; nothing waits on it for longer than this
_SETTLE = 1.0
_POLL = 0.005


def read_pids(procs: Path) -> list[int]:
    """The pids listed in one cgroup.procs file, in order, without duplicates.

    Raises:
        OSError: the file cannot be read (the cgroup is gone, say).
    """
    with open(procs, "rb") as f:
        return list(dict.fromkeys(int(word) for word in f.read().split()))


def members(directories: list[Path]) -> set[int]:
    """Pids in the cgroups `directories` and every cgroup below them; one that cannot be read has none."""
    found: set[int] = set()
    for top in directories:
        for directory, _, _ in os.walk(top):
            try:
                found.update(read_pids(Path(directory) / "cgroup.procs"))
            except (OSError, ValueError):
                continue
    return found


def freeze(directory: Path, frozen: bool) -> bool:
    """Freeze (or thaw) a cgroup and wait until it is frozen; False when it cannot freeze."""
    if (directory / "cgroup.freeze").exists():  # v2
        control, value, done, state = "cgroup.freeze", "1" if frozen else "0", "frozen 1", "cgroup.events"
    else:
        control, value, done, state = "freezer.state", "FROZEN" if frozen else "THAWED", "FROZEN", "freezer.state"
    if not (directory / control).exists() or not write(directory / control, value):
        return False
    deadline = time.monotonic() + _SETTLE
    while frozen and time.monotonic() < deadline:
        try:
            if done in (directory / state).read_text():
                break
        except OSError:
            break
        time.sleep(_POLL)
    return True


def write(path: Path, text: str) -> bool:
    """Write one value to a cgroup file; False when the kernel refuses it."""
    try:
        write_each(path, [text])
        return True
    except OSError:
        return False


def write_each(path: Path, lines: list[str]) -> None:
    """One write() per line: cgroup files take one rule per write.

    Raises:
        OSError: the file cannot be opened, or the kernel refuses a line.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for line in lines:
            os.write(fd, line.encode())
    finally:
        os.close(fd)


def rmdir(directory: Path, wait: float = 0.0) -> bool:
    """Remove an emptied cgroup directory (gone already counts); its last processes may take up to
    `wait` seconds to leave it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.01)

"""Empty the container's root cgroup so that slurmd can enable controllers.

Why: cgroup v2 has a "no internal processes" rule. A cgroup other than the
host's real root cannot both hold processes and enable domain controllers
(memory, cpu, io, pids, hugetlb...) for its children: writing "+memory" to
the cgroup.subtree_control of a cgroup that holds processes fails with EBUSY,
and a cgroup whose subtree_control has them refuses new processes. In a
container with its own cgroup namespace, the container's cgroup looks like
"/" to the processes inside, but to the kernel it is an ordinary cgroup. When
the node agent (PID 1) and what it starts live there, slurmd cannot enable the
controllers that its cgroup/v2 plugin needs for job cgroups. This is Slinky
slurm-operator issue 238, what stops slurmd running unprivileged.

The fix is the one systemd and container runtimes use. Before it starts
anything, the agent moves itself (and every other process of the root) into
a leaf child, "supervisor". The root is then empty, so its controllers can be
enabled for the children and slurmd can take them from there.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import time
from pathlib import Path

from slurm_ext import cgroupfs, procfs
from slurm_ext.errors import SlurmExtError

__all__ = ["CgroupError", "leave_root_cgroup", "make_writable", "fix_container_cgroups"]

log = logging.getLogger("supervisor")

#: how many times the root's cgroup.procs is re-read and emptied; processes
#: that fork while being moved can leave children behind for a pass or two,
#: and one in the middle of exiting stays listed (and cannot move) until it is
#: gone: the passes wait PASS_WAIT, then twice that, ... (0.55 s at most)
MAX_PASSES = 10
PASS_WAIT = 0.01


class CgroupError(SlurmExtError, RuntimeError):
    """The root cgroup could not be emptied, so slurmd cannot enable controllers."""


def leave_root_cgroup(
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    leaf: str = "supervisor",
    pid: int | None = None,
) -> Path | None:
    """Move every process of `cgroup_root` into `cgroup_root/leaf`; return the leaf.

    Returns None and changes nothing if `cgroup_root` is not a cgroup v2
    directory (for example cgroup v1, or hybrid with a tmpfs at /sys/fs/cgroup)
    or if it holds no process. `pid` (this process by default) must be one of
    the root's processes. It is moved first, so that anything it forks from
    then on starts in the leaf. Afterwards, as a best effort, the root's
    available controllers are enabled for its children. Raises CgroupError
    (a RuntimeError) if the root cannot be emptied.
    """
    root = Path(cgroup_root)
    procs = root / "cgroup.procs"
    if not (procs.is_file() and (root / "cgroup.controllers").is_file()):
        log.debug(
            "%s is not a cgroup v2 directory (no cgroup.procs or no cgroup.controllers: "
            "cgroup v1, hybrid or no cgroupfs); leaving cgroups alone",
            root,
        )
        return None
    if not leaf or "/" in leaf or leaf in (".", ".."):
        raise ValueError(f"cgroup leaf must be a plain directory name, not {leaf!r}")
    pid = os.getpid() if pid is None else pid
    leaf_dir = root / leaf
    consequence = (
        f"slurmd will not be able to enable cgroup controllers below {root}: cgroup v2 "
        "refuses them to a cgroup that holds processes (the no-internal-process rule, "
        "slurm-operator issue 238)"
    )
    try:
        listed = cgroupfs.read_pids(procs)
        if not listed:
            log.debug("%s holds no process; nothing to move", root)
            return None
        if pid not in listed:
            raise CgroupError(
                f"pid {pid} is not in {procs}, so {root} is not its cgroup; not moving "
                f"the processes there ({consequence})"
            )
        leaf_dir.mkdir(exist_ok=True)
        moved, left = _move_all(procs, listed, leaf_dir / "cgroup.procs", first=pid)
    except OSError as err:
        name = errno.errorcode.get(err.errno or 0, "?")
        raise CgroupError(f"{err.filename}: {err.strerror} ({name}); {consequence}") from err
    if left:
        raise CgroupError(
            f"{root} still holds processes {left} after {MAX_PASSES} "
            f"passes moving them into {leaf_dir} (something keeps forking or adding them); "
            f"{consequence}"
        )
    log.info(
        "moved %d processes from %s into %s: the root cgroup is empty so slurmd can enable controllers",
        moved,
        root,
        leaf_dir,
    )
    _enable_controllers(root)
    return leaf_dir


def _move_all(procs: Path, listed: list[int], dest: Path, first: int) -> tuple[int, list[int]]:
    """Move the pids of `procs` into `dest` until it is empty or MAX_PASSES are done.

    Returns how many processes were moved and the pids still left in `procs`.
    """
    moved: set[int] = set()
    for done in range(1, MAX_PASSES + 1):
        for p in sorted(listed, key=lambda p: p != first):
            try:
                _write(dest, str(p))
            except ProcessLookupError:  # ESRCH: it exited after being listed
                continue
            moved.add(p)
        listed = cgroupfs.read_pids(procs)
        if not listed:
            break
        if done < MAX_PASSES:
            time.sleep(PASS_WAIT * done)
    return len(moved), sorted(listed)


def _enable_controllers(root: Path) -> None:
    """Enable for the children every controller the root has; warn about failures."""
    control = root / "cgroup.subtree_control"
    try:
        available = (root / "cgroup.controllers").read_text().split()
        enabled = set(control.read_text().split())
    except OSError as err:
        log.warning("cannot read the controllers of %s: %s; not enabling any for slurmd", root, err.strerror)
        return
    for name in available:
        if name in enabled:
            continue
        try:
            _write(control, f"+{name}")
        except OSError as err:
            log.warning(
                "cannot enable the %s controller in %s: %s; slurmd will not be able to use it",
                name,
                control,
                err.strerror,
            )


def _write(path: Path, text: str) -> None:
    """One write() call: cgroupfs takes one pid (or one "+controller") per write."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    except OSError as err:  # os.write's errors do not name the file
        raise type(err)(err.errno, err.strerror, str(path)) from None
    finally:
        os.close(fd)


_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 2, 4, 8, 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_KEPT_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
               "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME}


def make_writable(cgroup_root: Path = Path("/sys/fs/cgroup"),
                  mountinfo: Path = Path("/proc/self/mountinfo")) -> list[str]:
    """Remount read-write each cgroup file system at or below `cgroup_root` that is mounted read-only.

    Why: Docker mounts a container's cgroup hierarchies read-only unless it
    is --privileged (which some hosts refuse); slurmd's cgroup plugins
    (proctrack/cgroup, task/cgroup) must create job cgroups there. With a
    private cgroup namespace the container sees only its own subtree, so a
    read-write view gives it nothing --privileged would not. Needs
    CAP_SYS_ADMIN. Returns the mount points remounted.

    Raises:
        CgroupError: a read-only cgroup mount could not be remounted (the
            message names it and the flags that provide the capability).
    """
    root = str(cgroup_root).rstrip("/")
    remounted = []
    libc = ctypes.CDLL(None, use_errno=True)
    for mount in procfs.mounts(mountinfo):
        point, options = mount.point, mount.options
        if mount.fstype not in ("cgroup", "cgroup2") or "ro" not in options:
            continue
        if point != root and not point.startswith(root + "/"):
            continue
        flags = _MS_REMOUNT | _MS_BIND
        for option in options:
            flags |= _KEPT_FLAGS.get(option, 0)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            raise CgroupError(f"cannot remount {point} read-write: {os.strerror(err)}; slurmd's cgroup plugins "
                              "cannot create job cgroups there. Give the container --cap-add SYS_ADMIN and "
                              "--cgroupns private (a Pod: securityContext.capabilities.add [SYS_ADMIN], or "
                              "privileged), or run Slurm with CgroupPlugin=disabled and proctrack/linuxproc")
        remounted.append(point)
    if remounted:
        log.info("remounted read-write for slurmd's cgroup plugins: %s", " ".join(remounted))
    return remounted


def fix_container_cgroups(emit, writable: bool, leave_root: bool) -> None:
    """As PID 1 of a container: make its read-only cgroups writable (`writable`) and leave the root cgroup
    (`leave_root`), each failure an event. Read-only cgroups are a warning, not an error: with
    CgroupPlugin=disabled slurmd needs none (and says nothing of it)."""
    if writable:
        try:
            make_writable()
        except (OSError, CgroupError) as err:
            emit("cgroup-failed", str(err), severity="warning")
    if leave_root:
        try:
            leaf = leave_root_cgroup()
        except (OSError, RuntimeError) as err:
            emit("cgroup-failed", str(err), severity="error")
        else:
            if leaf:
                emit("cgroup-leaf", f"moved out of the root cgroup into {leaf}")

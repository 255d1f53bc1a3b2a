"""Removing the IPC objects a job's user left behind: `clean_ipc`, called by the Epilog as root.

Why: slurmd kills a job's processes and cgroups, but not what they created
in the kernel's IPC namespace. POSIX shared memory (files in /dev/shm, which
is RAM), SysV shared memory segments, semaphore sets and message queues, and
POSIX message queues (/dev/mqueue) outlive every process; NCCL, MPI, PyTorch
DataLoader workers and daemonized helpers routinely leave gigabytes of them
for days, until the node swaps or the next job fails to allocate a segment.

Rules, and why:
  * Only the job user's objects are touched: /dev/shm and /dev/mqueue entries
    by `lstat().st_uid`, SysV objects by the owner (`uid`) OR the creator
    (`cuid`) column of /proc/sysvipc/{shm,sem,msg}: an owner may give an
    object away with IPC_SET (shm_perm.uid = 0) and, as its creator, keep
    every right on it, so an owner-only match would leave it to look like
    root's forever. uid 0 is never cleaned, since root's objects (owner and
    creator 0) belong to system daemons too.
  * Symlinks are never followed. A user can plant /dev/shm/x -> /etc/shadow;
    the link is the user's and is unlinked (which removes the link only), the
    target is never opened, changed or removed. Nothing is ever chmod-ed,
    chown-ed or opened for writing.
  * Entries are found, checked and removed through the directory's fd
    (opened with O_NOFOLLOW), and just before its unlink or rmtree an entry is
    looked at again: when it is no longer the same inode of the same owner
    (renamed away, another file put in its place) it stays, and an error line
    says so, so a swap between the check and the removal cannot make root
    remove another user's or root's file. A user's directory goes with
    `shutil.rmtree`, which works through file descriptors and refuses to step
    through symlinks.
  * A directory of root or another user that is sticky and world-writable
    like /dev/shm itself (MPI libraries make such shared directories) may hold
    files of the user: it is searched too, by the same rules, down to
    `_SHARED_DEPTH` levels, on the same filesystem only, never through a link.
  * exclusive=True (the user has no other job on the node): every object of
    the uid goes, held or not; anything still attached is a leftover too.
  * exclusive=False (another job of the same user still runs here): only
    objects that no live process holds AND that were created or changed at or
    after `since` (the ending job's start) go. Older objects belong to the
    other job. "Held" means, for a file, open, mmap-ed or the working
    directory of some process (one pass over /proc, comparing the targets of
    /proc/PID/fd and cwd links and the device and inode of /proc/PID/maps
    lines: a stat through those links would reach the file's own filesystem,
    and one on a stalled FUSE or NFS server blocks the Epilog); for a SysV
    segment, nattch > 0; for a SysV message queue, its last sender or
    receiver is alive. Semaphore sets record no holder, so they are kept.
    SysV times are whole seconds, so an object made in the job's first
    fraction of a second may be kept: keeping a leftover costs memory,
    removing another job's object breaks that job.
  * One object never stops the others: failures land in `errors`, objects
    that vanished meanwhile (a process removed them) in `notes`.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.procfs import pid_alive
from slurm_ext.words import moment

__all__ = ["IpcCleanup", "clean_ipc"]

#: the command of shmctl/semctl/msgctl that removes the object (linux/ipc.h)
IPC_RMID = 0

#: perms bit the kernel sets on a SysV segment removed while still attached (linux/shm.h)
_SHM_DEST = 0o1000

#: /proc/sysvipc/<kind>: the id column and the columns read from it
_SYSV_COLUMNS = {
    "shm": ("shmid", ("key", "perms", "size", "nattch", "uid", "cuid", "ctime")),
    "sem": ("semid", ("key", "uid", "cuid", "ctime")),
    "msg": ("msqid", ("key", "uid", "cuid", "lspid", "lrpid", "ctime")),
}

#: how directories are opened: never through a symlink, never inherited by a child
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: how many levels of shared sticky directories (root's or another user's, mode 1777) are searched
_SHARED_DEPTH = 4

#: how deep a user's directory is searched for what processes map; deeper ones are kept when not exclusive
_TREE_DEPTH = 64


@dataclass(frozen=True, slots=True)
class IpcCleanup:
    """What `clean_ipc` did, one human-readable line per object, for the Epilog's log."""

    #: removed objects, e.g. "/dev/shm/foo", "sysv shm id 32769 key 0x0000abcd (4096 bytes)",
    #: "sysv sem id 5", "sysv msg id 7", "mqueue /dev/mqueue/q1"
    removed: tuple[str, ...]
    #: objects of the uid left in place, and why, e.g. "/dev/shm/bar: open by pid 123"
    kept: tuple[str, ...]
    #: objects that could not be removed or read, and why
    errors: tuple[str, ...]
    #: what was not checked and objects someone else removed first, e.g. "/dev/mqueue: ... not checked"
    notes: tuple[str, ...] = ()


# This module's private records are neither frozen nor compared: each is built once and only read,
# and frozen=True with eq costs the Python Epilog (a fresh process per job) ~0.7 ms per class to create.
@dataclass(slots=True, eq=False)
class _Holders:
    """Who holds what, from one pass over /proc; only built when not exclusive."""

    #: (st_dev, st_ino) of a /proc/PID/maps line -> "mapped by pid N"
    by_inode: dict[tuple[int, int], str]
    #: path, as the kernel writes it in /proc/PID/fd and cwd links and maps lines ("(deleted)" cut)
    #: -> "open by pid N" / "working directory of pid N" / "mapped by pid N"
    by_path: dict[str, str]
    #: why /proc could not be read at all (then nothing that needs a holder check is removed)
    failed: str | None = None


@dataclass(slots=True, eq=False)
class _SysvObject:
    kind: str  # shm, sem or msg
    ident: int
    key: int
    ctime: float
    owner: int  # uid column, which IPC_SET can change
    creator: int  # cuid column, fixed at creation
    size: int = 0
    nattch: int = 0
    destroyed: bool = False  # shm already removed, still attached
    lspid: int = 0
    lrpid: int = 0

    @property
    def label(self) -> str:
        given = f" (owner uid {self.owner}, creator uid {self.creator})" if self.owner != self.creator else ""
        if self.kind == "shm":
            return f"sysv shm id {self.ident} key 0x{self.key & 0xFFFFFFFF:08x} ({self.size} bytes){given}"
        return f"sysv {self.kind} id {self.ident}{given}"


class _Tally:
    """The lines being collected; frozen into an IpcCleanup at the end."""

    __slots__ = ("removed", "kept", "errors", "notes")

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.kept: list[str] = []
        self.errors: list[str] = []
        self.notes: list[str] = []

    def freeze(self) -> IpcCleanup:
        return IpcCleanup(tuple(self.removed), tuple(self.kept), tuple(self.errors), tuple(self.notes))


def clean_ipc(uid: int, exclusive: bool, since: float = 0.0, *, shm_dir: Path = Path("/dev/shm"),
              mqueue_dir: Path = Path("/dev/mqueue"), proc: Path = Path("/proc")) -> IpcCleanup:
    """Remove the IPC objects of `uid` on this node; see the module docstring for the rules.

    `exclusive`: the uid has no other job on the node, so everything of it
    goes and `since` is not used. Otherwise only unheld objects created or
    changed at or after `since` (epoch seconds, the ending job's start) go.
    POSIX message queues are looked for only when an mqueue filesystem is
    mounted on `mqueue_dir` (per `proc`/self/mounts); else a note says so.

    Never raises for one object: failures are lines in `errors`.
    """
    tally = _Tally()
    if uid == 0:
        tally.notes.append("uid 0: IPC objects not cleaned (root's objects belong to system daemons too)")
        return tally.freeze()
    holders = None if exclusive else _LazyHolders(proc)

    if shm_dir.is_dir():
        _clean_dir(shm_dir, "", uid, exclusive, since, holders, tally)
    else:
        tally.notes.append(f"{shm_dir}: no such directory; POSIX shared memory not checked")
    mounted, why = _is_mqueue_mount(mqueue_dir, proc)
    if mounted:
        _clean_dir(mqueue_dir, "mqueue ", uid, exclusive, since, holders, tally, mqueue=True)
    else:
        tally.notes.append(f"{mqueue_dir}: {why}; POSIX message queues not checked")
    for kind in ("shm", "sem", "msg"):
        _clean_sysv(kind, uid, exclusive, since, holders, proc, tally)
    if holders is not None and holders.scanned and holders.failed:
        tally.notes.append(f"{proc}: {holders.failed}; objects that may be in use are kept")
    return tally.freeze()


class _LazyHolders:
    """The pass over every process's fds and maps, made only when an object needs it (it is the
    Epilog's costliest step, and most jobs leave nothing made since they started)."""

    def __init__(self, proc: Path):
        self.proc = proc
        self._holders: _Holders | None = None

    @property
    def scanned(self) -> bool:
        return self._holders is not None

    def __getattr__(self, name: str):
        if self._holders is None:
            self._holders = _scan_holders(self.proc)
        return getattr(self._holders, name)



# --- files: /dev/shm and /dev/mqueue -----------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class _Rules:
    """What one `_clean_dir` looks for, the same in every directory it searches."""

    uid: int
    exclusive: bool
    since: float
    holders: _LazyHolders | None
    #: put before every line: "" for /dev/shm, "mqueue " for /dev/mqueue
    prefix: str
    #: st_dev of the top directory: a shared directory on another filesystem (a mount) is not searched
    dev: int
    #: the entries are POSIX message queues, whose mq_open fds read "/<name>" in /proc/PID/fd
    mqueue: bool


@dataclass(slots=True, eq=False)
class _Place:
    """A directory being searched, open as `fd`."""

    fd: int
    #: its path in log lines, under the directory clean_ipc was given
    shown: str
    #: its path as the kernel writes it in /proc/PID/fd and cwd links and maps lines, to match holders
    real: str
    #: 0 for the top directory, 1 for a shared directory in it, and so on
    depth: int


def _clean_dir(directory: Path, prefix: str, uid: int, exclusive: bool, since: float,
               holders: _LazyHolders | None, tally: _Tally, *, mqueue: bool = False) -> None:
    """Remove the uid's entries of `directory` and of the shared sticky directories in it.

    The directory's own path is root's (/dev/shm may be root's link to
    /run/shm), so it is resolved; then it is opened once and everything in it
    is listed, lstat-ed and removed through directory fds.
    """
    real = os.path.realpath(directory)
    try:
        fd = os.open(real, _DIR_FLAGS)
    except OSError as err:
        tally.errors.append(f"{prefix}{directory}: cannot open: {err.strerror or err}")
        return
    try:
        rules = _Rules(uid, exclusive, since, holders, prefix, os.fstat(fd).st_dev, mqueue)
        _clean_place(_Place(fd, os.fspath(directory), real, 0), rules, tally)
    finally:
        os.close(fd)


def _clean_place(place: _Place, rules: _Rules, tally: _Tally) -> None:
    """The uid's entries of one open directory (lstat only: links are never followed); the shared sticky
    directories in it are searched in turn."""
    try:
        names = sorted(os.listdir(place.fd))
    except OSError as err:
        tally.errors.append(f"{rules.prefix}{place.shown}: cannot list: {err.strerror or err}")
        return
    for name in names:
        try:
            st = os.stat(name, dir_fd=place.fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone since the listing
        except OSError as err:
            tally.errors.append(f"{rules.prefix}{place.shown}/{name}: cannot lstat: {err.strerror or err}")
            continue
        if st.st_uid == rules.uid:
            _clean_entry(place, name, st, rules, tally)
        elif place.depth < _SHARED_DEPTH and _is_shared(st, rules):
            _search_shared(place, name, st, rules, tally)


def _is_shared(st: os.stat_result, rules: _Rules) -> bool:
    """A directory of root or another user in which anyone may create files (sticky and world-writable,
    like /dev/shm), on the same filesystem: the user's files in it are the user's leftovers too."""
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & stat.S_IWOTH)
            and st.st_dev == rules.dev)


def _search_shared(place: _Place, name: str, st: os.stat_result, rules: _Rules, tally: _Tally) -> None:
    """Clean the uid's entries of a shared directory, opened without following links and only when it is
    still the directory that was lstat-ed."""
    shown = f"{place.shown}/{name}"
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=place.fd)
    except FileNotFoundError:
        return  # gone since the listing
    except OSError as err:  # ELOOP: a link was put in its place
        tally.errors.append(f"{rules.prefix}{shown} (shared directory): not searched: {err.strerror or err}")
        return
    try:
        why = _changed(os.fstat(fd), st)
        if why:
            tally.errors.append(f"{rules.prefix}{shown} (shared directory): not searched: {why}")
            return
        _clean_place(_Place(fd, shown, os.path.join(place.real, name), place.depth + 1), rules, tally)
    finally:
        os.close(fd)


def _clean_entry(place: _Place, name: str, st: os.stat_result, rules: _Rules, tally: _Tally) -> None:
    """One entry of the uid: kept (not exclusive, and held or older than the job) or removed."""
    label = rules.prefix + _describe(place, name, st)
    if rules.holders is not None:
        why = _kept_because(max(st.st_ctime, st.st_mtime), rules.since,
                            lambda: _file_holder(place, name, st, rules))
        if why:
            tally.kept.append(f"{label}: {why}")
            return
    if stat.S_ISDIR(st.st_mode):
        _remove_tree(place.fd, name, st, label, tally)
    else:
        _unlink(place.fd, name, st, label, tally)


def _describe(place: _Place, name: str, st: os.stat_result) -> str:
    path = f"{place.shown}/{name}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} (directory)"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"{path} (symlink to {os.readlink(name, dir_fd=place.fd)})"  # reads the link, not its target
        except OSError:
            return f"{path} (symlink)"
    return path


def _recheck(dir_fd: int, name: str, checked: os.stat_result) -> str | None:
    """Why the entry `name` is no longer the one that was checked, or None when it still is: asked just
    before removing it, so that a rename or a swap since the check cannot make root remove another file.

    Raises:
        FileNotFoundError: it is gone.
        OSError: it cannot be lstat-ed.
    """
    return _changed(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), checked)


def _changed(now: os.stat_result, checked: os.stat_result) -> str | None:
    if (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
        return (f"replaced since it was checked (now inode {now.st_ino} of uid {now.st_uid}, "
                f"checked inode {checked.st_ino})")
    if now.st_uid != checked.st_uid:
        return f"owner changed since it was checked (now uid {now.st_uid}, checked uid {checked.st_uid})"
    return None


def _unlink(dir_fd: int, name: str, st: os.stat_result, label: str, tally: _Tally) -> None:
    """Unlink the entry if it is still the one checked; on a symlink that removes the link, never its target."""
    try:
        why = _recheck(dir_fd, name, st)
        if why is None:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        tally.notes.append(f"{label}: already gone (removed by someone else)")
    except OSError as err:
        tally.errors.append(f"{label}: cannot remove: {err.strerror or err}")
    else:
        if why is None:
            tally.removed.append(label)
        else:
            tally.errors.append(f"{label}: not removed: {why}")


def _remove_tree(dir_fd: int, name: str, st: os.stat_result, label: str, tally: _Tally) -> None:
    """Remove the directory with everything in it if it is still the one checked."""
    import shutil  # only here: it imports compression modules, and most Epilogs remove no directory
    if not shutil.rmtree.avoids_symlink_attacks:
        tally.errors.append(f"{label}: not removed: this platform's shutil.rmtree could follow symlinks")
        return
    try:
        why = _recheck(dir_fd, name, st)
    except FileNotFoundError:
        tally.notes.append(f"{label}: already gone (removed by someone else)")
        return
    except OSError as err:
        tally.errors.append(f"{label}: cannot remove: {err.strerror or err}")
        return
    if why:
        tally.errors.append(f"{label}: not removed: {why}")
        return
    problems: list[str] = []
    gone = False

    def record(_func, failed, exc) -> None:
        nonlocal gone
        exc = exc[1] if isinstance(exc, tuple) else exc  # onerror passes exc_info, onexc the exception
        if isinstance(exc, FileNotFoundError):
            gone = gone or os.fspath(failed) == name
            return
        problems.append(f"{failed}: {getattr(exc, 'strerror', None) or exc}")

    try:
        if sys.version_info >= (3, 12):
            shutil.rmtree(name, dir_fd=dir_fd, onexc=record)
        else:
            shutil.rmtree(name, dir_fd=dir_fd, onerror=record)
    except RecursionError:  # rmtree recurses once per level: a user can nest directories deeper than Python
        problems.insert(0, f"too deep for shutil.rmtree (over {sys.getrecursionlimit()} levels)")
    if gone:
        tally.notes.append(f"{label}: already gone (removed by someone else)")
    elif problems:
        tally.errors.append(f"{label}: cannot remove all of it: {'; '.join(problems[:3])}"
                            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
    else:
        tally.removed.append(label)


def _file_holder(place: _Place, name: str, st: os.stat_result, rules: _Rules) -> str | None:
    """Why the entry (or something in the directory) is in use, or None; matched by path against the
    fd, cwd and maps paths of every process, and by inode against their maps."""
    holders = rules.holders
    if holders.failed:
        return f"cannot tell whether it is in use ({holders.failed})"
    real = os.path.join(place.real, name)
    if not stat.S_ISDIR(st.st_mode):
        return (holders.by_inode.get((st.st_dev, st.st_ino)) or holders.by_path.get(real)
                or (holders.by_path.get("/" + name) if rules.mqueue else None))
    inodes = _tree_inodes(place.fd, name, st)
    if inodes is None:
        return f"cannot tell whether it is in use (unreadable, replaced or over {_TREE_DEPTH} levels deep)"
    for inode in inodes:
        if inode in holders.by_inode:
            return holders.by_inode[inode]
    inside = real + "/"
    for path, who in holders.by_path.items():
        if path == real or path.startswith(inside):
            return who
    return None


def _tree_inodes(dir_fd: int, name: str, st: os.stat_result) -> set[tuple[int, int]] | None:
    """(st_dev, st_ino) of the directory `name` and everything under it, read through directory fds opened
    with O_NOFOLLOW (a link the user swaps in is never followed out of the directory); None when it was
    replaced, part of it cannot be read, or it is over `_TREE_DEPTH` levels deep."""
    found: set[tuple[int, int]] = set()
    stack: list[tuple[int, list[str]]] = []  # one open directory per level, with its subdirectories to do
    try:
        stack.append(_list_dir(dir_fd, name, found))
        if _changed(os.fstat(stack[0][0]), st):
            return None
        while stack:
            fd, subdirs = stack[-1]
            if not subdirs:
                os.close(stack.pop()[0])
            elif len(stack) > _TREE_DEPTH:
                return None
            else:
                try:
                    stack.append(_list_dir(fd, subdirs.pop(), found))
                except FileNotFoundError:
                    continue  # removed since it was listed
    except OSError:
        return None
    finally:
        for fd, _ in stack:
            os.close(fd)
    return found


def _list_dir(dir_fd: int, name: str, found: set[tuple[int, int]]) -> tuple[int, list[str]]:
    """Open the directory `name` of `dir_fd`, add its (st_dev, st_ino) and its entries' to `found`;
    its fd (the caller closes it) and the names of its subdirectories.

    Raises:
        OSError: it cannot be opened (ELOOP: a link is in its place) or listed.
    """
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        own = os.fstat(fd)
        found.add((own.st_dev, own.st_ino))
        subdirs = []
        for entry in os.listdir(fd):
            try:
                entry_st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            found.add((entry_st.st_dev, entry_st.st_ino))
            if stat.S_ISDIR(entry_st.st_mode):
                subdirs.append(entry)
    except BaseException:
        os.close(fd)
        raise
    return fd, subdirs


def _is_mqueue_mount(directory: Path, proc: Path) -> tuple[bool, str]:
    """Whether the last mount on `directory` is an mqueue filesystem, and if not, why.

    Mount points are compared as the kernel writes them (already resolved),
    never resolved again: that would stat every mount point of the node, and
    one on a stalled NFS or FUSE server would block the Epilog.
    """
    try:
        lines = (proc / "self" / "mounts").read_text().splitlines()
    except OSError as err:
        return False, f"cannot tell whether mqueue is mounted ({proc}/self/mounts: {err.strerror or err})"
    wanted = os.path.realpath(directory)
    fstype = None
    for line in lines:
        fields = line.split(maxsplit=3)
        if len(fields) >= 3 and (_unescape(fields[1]) if "\\" in fields[1] else fields[1]) == wanted:
            fstype = fields[2]  # the last mount on a path hides the ones below it
    if fstype == "mqueue":
        return True, ""
    return False, "no mqueue filesystem mounted there" if fstype is None else f"a {fstype} mount, not mqueue"


def _unescape(field: str) -> str:
    """A /proc/self/mounts path: the kernel writes space, tab, newline and backslash as \\ooo."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


# --- holders: one pass over /proc --------------------------------------------------------------------------

def _scan_holders(proc: Path) -> _Holders:
    """Every file some live process has open, mapped or as its working directory.

    Only link targets (readlink of /proc/PID/fd/N and /proc/PID/cwd) and maps
    lines are read, never a stat through those links: the stat would be
    answered by the file's own filesystem, and one of a stalled FUSE or NFS
    server blocks until the server comes back. Processes that exit meanwhile
    are skipped; one whose fd table or maps cannot be read does not stop the
    pass (root can read them all, short of a hardened kernel).
    """
    by_inode: dict[tuple[int, int], str] = {}
    by_path: dict[str, str] = {}
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError as err:
        return _Holders({}, {}, failed=f"cannot list processes: {err.strerror or err}")
    for pid in pids:
        base = f"{os.fspath(proc)}/{pid}"
        try:
            fds = os.listdir(f"{base}/fd")
        except OSError:
            fds = []  # gone, or unreadable: its maps may still tell
        for fd in fds:
            _add_link(f"{base}/fd/{fd}", f"open by pid {pid}", by_path)
        _add_link(f"{base}/cwd", f"working directory of pid {pid}", by_path)
        try:
            with open(f"{base}/maps", encoding="utf-8", errors="surrogateescape") as maps:
                for line in maps:
                    _add_mapping(line, f"mapped by pid {pid}", by_inode, by_path)
        except OSError:
            continue
    return _Holders(by_inode, by_path)


def _add_link(link: str, who: str, by_path: dict[str, str]) -> None:
    """One /proc/PID/fd/N or cwd link, by its target's text (pipes, sockets and anonymous inodes are no paths)."""
    try:
        target = os.readlink(link)
    except OSError:
        return  # closed, or the process exited meanwhile
    if target.startswith("/"):
        by_path.setdefault(target.removesuffix(" (deleted)"), who)


def _add_mapping(line: str, who: str, by_inode: dict[tuple[int, int], str], by_path: dict[str, str]) -> None:
    """One /proc/PID/maps line: "addr perms offset MAJ:MIN inode [path]"."""
    fields = line.split(maxsplit=5)
    if len(fields) < 5 or fields[4] == "0":
        return  # anonymous memory
    try:
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        by_inode.setdefault((os.makedev(major, minor), int(fields[4])), who)
    except ValueError:
        pass
    if len(fields) == 6:
        path = fields[5].rstrip("\n").removesuffix(" (deleted)")
        by_path.setdefault(path, who)


# --- SysV: /proc/sysvipc and IPC_RMID ----------------------------------------------------------------------

def _clean_sysv(kind: str, uid: int, exclusive: bool, since: float, holders: _LazyHolders | None, proc: Path,
                tally: _Tally) -> None:
    table = proc / "sysvipc" / kind
    try:
        objects = _read_sysv(kind, table, uid)
    except FileNotFoundError:
        tally.notes.append(f"{table}: missing (kernel without SysV IPC?); SysV {kind} not checked")
        return
    except (OSError, ValueError) as err:
        tally.errors.append(f"{table}: cannot read: {getattr(err, 'strerror', None) or err}; SysV {kind} not checked")
        return
    for obj in objects:
        if obj.destroyed:  # IPC_RMID done already; the kernel frees it at the last detach
            tally.notes.append(f"{obj.label}: already removed, freed when its {obj.nattch} attached "
                               "process(es) detach")
            continue
        if holders is not None:
            # SysV keeps whole seconds: an object made in the job's first second is the job's
            why = _kept_because(obj.ctime, int(since), lambda: _sysv_holder(obj, uid, holders, proc))
            if why:
                tally.kept.append(f"{obj.label}: {why}")
                continue
        try:
            code = _rmid(kind, obj.ident)
        except OSError as err:  # libc could not be loaded
            tally.errors.append(f"{obj.label}: cannot remove: {err}")
            continue
        if code == 0:
            attached = obj.nattch if kind == "shm" else 0
            tally.removed.append(obj.label + (f"; freed when its {attached} attached process(es) detach"
                                              if attached else ""))
        elif code in (errno.EINVAL, errno.EIDRM):
            tally.notes.append(f"{obj.label}: already gone (removed by someone else)")
        else:
            tally.errors.append(f"{obj.label}: cannot remove: {os.strerror(code)}"
                                + (" (is the Epilog running as root?)" if code == errno.EPERM else ""))


def _read_sysv(kind: str, table: Path, uid: int) -> list[_SysvObject]:
    """The uid's objects in /proc/sysvipc/<kind>: those it owns or created (see the module docstring),
    found by the header's column names.

    Raises:
        ValueError: a column is missing or a line does not fit the header.
    """
    lines = table.read_text().splitlines()
    if not lines:
        raise ValueError("empty file (expected a header line)")
    header = lines[0].split()
    id_column, columns = _SYSV_COLUMNS[kind]
    missing = [name for name in (id_column, *columns) if name not in header]
    if missing:
        raise ValueError(f"no column {', '.join(missing)} in header {' '.join(header)!r}")
    objects = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        values = line.split()
        if len(values) != len(header):
            raise ValueError(f"line {number} has {len(values)} fields, the header {len(header)}")
        row = dict(zip(header, values))
        try:
            owner, creator = int(row["uid"]), int(row["cuid"])
            if uid not in (owner, creator):
                continue
            objects.append(_SysvObject(
                kind=kind, ident=int(row[id_column]), key=int(row["key"]), ctime=float(row["ctime"]),
                owner=owner, creator=creator,
                size=int(row.get("size", 0)), nattch=int(row.get("nattch", 0)),
                destroyed=bool(int(row.get("perms", "0"), 8) & _SHM_DEST) if kind == "shm" else False,
                lspid=int(row.get("lspid", 0)), lrpid=int(row.get("lrpid", 0))))
        except ValueError:
            raise ValueError(f"line {number}: not a number where one belongs: {line.strip()!r}") from None
    return objects


def _sysv_holder(obj: _SysvObject, uid: int, holders: _Holders, proc: Path) -> str | None:
    """Why a SysV object may still be in use by the uid's other job, or None."""
    if obj.kind == "shm":
        if obj.nattch > 0:
            return f"attached by {obj.nattch} process{'es' if obj.nattch > 1 else ''}"
        return None
    if obj.kind == "sem":
        return f"semaphore sets record no holder and uid {uid} still has a job on this node"
    if holders.failed:
        return f"cannot tell whether it is in use ({holders.failed})"
    for pid, role in ((obj.lspid, "sender"), (obj.lrpid, "receiver")):
        if pid > 0 and pid_alive(pid, proc):
            return f"last {role} pid {pid} is alive"
    return None


@functools.cache
def _libc():
    import ctypes  # only when something is to be removed: the Epilog's usual run removes nothing

    # dlopen(NULL): the C library this process already has, without find_library's ldconfig run
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    libc.msgctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    libc.semctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]  # IPC_RMID takes no 4th argument
    for function in (libc.shmctl, libc.msgctl, libc.semctl):
        function.restype = ctypes.c_int
    return libc


def _rmid(kind: str, ident: int) -> int:
    """IPC_RMID on one object; 0 on success, else the errno.

    Raises:
        OSError: libc cannot be loaded.
    """
    libc = _libc()
    if kind == "shm":
        result = libc.shmctl(ident, IPC_RMID, None)
    elif kind == "sem":
        result = libc.semctl(ident, 0, IPC_RMID)
    else:
        result = libc.msgctl(ident, IPC_RMID, None)
    return 0 if result == 0 else _get_errno()


def _get_errno() -> int:
    import ctypes
    return ctypes.get_errno()


def _kept_because(changed: float, since: float, holder: Callable[[], str | None]) -> str | None:
    """Why an object of a user who still has a job here stays: it predates the ending job, or it is
    in use (asked last: finding holders reads every process's fds and maps)."""
    if changed < since:
        return _predates(changed, since)
    return holder()


def _predates(changed: float, since: float) -> str:
    return f"predates the job (last changed {moment(changed)}, job started {moment(since)})"

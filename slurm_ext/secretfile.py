"""One reader for slurm-ext's secret files: `read_secret`, the only place a secret file is opened and checked.

A secret file (the agent credential, a database password, the backup key, the page's token hashes) is opened
without following a link (O_NOFOLLOW: a link planted in its place is refused, never followed to a file of someone
else's choosing), and its type, owner, mode and size are checked on the descriptor it is read from (fstat), so the
file checked is the file read. It must be a regular file of root's, or of the user reading it (a worker's copy
made for it by the agent: supervisor.credentials), that others may neither read nor write; a caller may let the
file's group read it when that group is the reader's own (the page's token hashes, root:slurm-ext-web 0640). Each caller turns a `SecretFileError`
into its own words and advice: `problem` is the fact, `kind` what went wrong.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from .errors import SlurmExtError

__all__ = ["SecretFileError", "Secret", "read_secret", "DEFAULT_MAX_BYTES"]

#: the most bytes a secret file may hold unless the caller says otherwise
DEFAULT_MAX_BYTES = 1 << 20


class SecretFileError(SlurmExtError):
    """A secret file that cannot be used. `kind`: missing, unreadable, link, not-regular, owner, mode, size or
    folder; `problem` says what is wrong in words (the caller adds its setting and its advice)."""

    def __init__(self, path: str, kind: str, problem: str, info: os.stat_result | None = None, folder: str = ""):
        self.path, self.kind, self.problem, self.info, self.folder = path, kind, problem, info, folder
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True, slots=True)
class Secret:
    """What a secret file held, and the file it was read from (as fstat saw it)."""

    path: str
    content: bytes = field(repr=False)
    info: os.stat_result = field(repr=False)

    @property
    def identity(self) -> tuple:
        """What changes when the file is replaced, rewritten, or its owner or mode changed."""
        info = self.info
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def read_secret(path: str | os.PathLike, *, reader_group: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                check_folders: bool = False, follow_link: bool = False) -> Secret:
    """The content of the secret file `path`.

    `reader_group`: a gid whose members may read the file (never write it), where the file's group is that one:
    a file readable by another group (root:users 0640) is refused. `check_folders`: the folder named and the real
    one behind a link must be root's (or this user's) and writable by no one else (a sticky folder of root's, as
    Kubernetes mounts a Secret, is taken): who can write the folder can put a file of their own in its place.
    `follow_link`: a link is followed (a Kubernetes Secret's mount is a link into its ..data folder); give it
    only with check_folders, which then checks the real file's folder too.

    Raises:
        SecretFileError: missing, unreadable, a link, not a regular file, owned by another user than root or this
            one, readable or writable by others (or by its group, unless it is `reader_group`; never writable by
            it), larger
            than `max_bytes`, or (check_folders) in a folder others can change.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_link else os.O_NOFOLLOW))
    except OSError as err:
        kind = {errno.ENOENT: "missing", errno.ELOOP: "link"}.get(err.errno, "unreadable")
        problem = "is a symbolic link: refused (put the file itself there)" if kind == "link" else \
            (err.strerror or str(err))
        raise SecretFileError(path, kind, problem) from None
    try:
        info = os.fstat(fd)
        _check_file(path, info, reader_group, max_bytes)
        if check_folders:
            _check_folders(path)
        content = _read_all(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(content) > max_bytes:  # grown since fstat
        raise SecretFileError(path, "size", f"more than {max_bytes} bytes", info)
    return Secret(path, content, info)


def _check_file(path: str, info: os.stat_result, reader_group: int | None, max_bytes: int) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(path, "not-regular", "not a regular file", info)
    if info.st_uid not in (0, os.geteuid()):
        raise SecretFileError(path, "owner", f"owned by uid {info.st_uid} with mode {mode:04o} (expected root, "
                                             f"or uid {os.geteuid()} that reads it)", info)
    group_bits = stat.S_IWGRP | stat.S_IXGRP if info.st_gid == reader_group else stat.S_IRWXG
    if mode & (stat.S_IRWXO | group_bits):
        raise SecretFileError(path, "mode", f"mode {mode:04o} lets others read or change it", info)
    if info.st_size > max_bytes:
        raise SecretFileError(path, "size", f"{info.st_size} bytes (expected at most {max_bytes})", info)


def _folders_passed(path: str) -> list[str]:
    """The folder of `path` and of every link it leads through, to the real file's: whoever may change any of them
    can point the chain elsewhere (checking the first and the last only let a link in another user's folder in
    the middle of the chain lead to any file of root's)."""
    hops, here = [], os.path.abspath(path)
    for _ in range(40):  # the kernel's own bound on links followed
        hops.append(os.path.dirname(here))
        if not os.path.islink(here):
            break
        here = os.path.join(os.path.dirname(here), os.readlink(here))
    hops.append(os.path.dirname(os.path.realpath(path)))
    return list(dict.fromkeys(hops))


def _check_folders(path: str) -> None:
    for folder in _folders_passed(path):
        try:
            info = os.stat(folder)
        except OSError as err:
            raise SecretFileError(path, "folder", f"its folder {folder} cannot be read: {err.strerror}",
                                  folder=folder) from None
        sticky_roots = info.st_mode & stat.S_ISVTX and info.st_uid == 0
        if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022 and not sticky_roots:
            raise SecretFileError(path, "folder", f"its folder {folder} (mode {stat.S_IMODE(info.st_mode):04o}, "
                                                  f"uid {info.st_uid}) can be changed by others", info, folder)


def _read_all(fd: int, limit: int) -> bytes:
    parts, left = [], limit
    while left > 0:
        part = os.read(fd, left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)

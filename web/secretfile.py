"""A file of root's that holds a secret of the page (the operators' token hashes, the proxy's shared secret):
`SecretFile`, read again whenever it changes.

The file is opened without following a link (O_NOFOLLOW: a link planted in its place is refused, never followed
to a file of someone else's choosing), and its owner and mode are checked on the descriptor it is read from (fstat),
so the file checked is the file read. It must be a regular file of root's that no one else may read or write.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

from slurm_ext.errors import SlurmExtError

__all__ = ["SecretFile", "SecretFileError"]

#: the most bytes read from one (a token file of a few hundred operators)
MAX_BYTES = 1 << 20


class SecretFileError(SlurmExtError):
    """The file cannot be used; the message names the setting, the file and what to do (for the log: never for an
    anonymous caller)."""

    def __init__(self, key: str, path: str, problem: str):
        self.key, self.path, self.problem = key, path, problem
        super().__init__(f"{key} {path}: {problem}")


class SecretFile:
    """The content of the file `path` (the setting `key` names it), read again when its identity changes."""

    def __init__(self, path: str, key: str):
        self.path, self.key = path, key
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._content = b""

    def read(self) -> bytes:
        """The file's content now.

        Raises:
            SecretFileError: missing, a link, not a regular file, not root's, readable or writable by others, or
                larger than MAX_BYTES.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise SecretFileError(self.key, self.path, "is a symbolic link: refused (put the file itself "
                                                           "there)") from None
            raise SecretFileError(self.key, self.path, err.strerror or str(err)) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SecretFileError(self.key, self.path, "not a regular file")
            if info.st_uid != 0 or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise SecretFileError(self.key, self.path, f"owned by uid {info.st_uid} with mode "
                                      f"{stat.S_IMODE(info.st_mode):04o}; it must be root's and readable by no one "
                                      f"else (chown root:root {self.path}; chmod 600 {self.path})")
            if info.st_size > MAX_BYTES:
                raise SecretFileError(self.key, self.path, f"{info.st_size} bytes (expected at most {MAX_BYTES})")
            identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            with self._lock:
                if identity != self._seen:
                    self._content, self._seen = _read_all(fd, info.st_size), identity
                return self._content
        finally:
            os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    parts, left = [], size
    while left > 0:
        part = os.read(fd, left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)

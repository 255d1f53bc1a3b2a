"""A secret file of the page (the operators' token hashes, the proxy's shared secret): `SecretFile`, read again
whenever it changes.

Opening and checking is slurm_ext.secretfile's (never through a link, checked on the descriptor read from: a
regular file of root's, or of the page's own user for the copies the agent makes for it, that others may not
read); what is the page's here is the setting that names the file, the advice, and the change watching.
"""

from __future__ import annotations

import grp
import stat
import threading

from slurm_ext.errors import SlurmExtError
from slurm_ext.secretfile import SecretFileError as _Refused, read_secret

__all__ = ["SecretFile", "SecretFileError"]


class SecretFileError(SlurmExtError):
    """The file cannot be used; the message names the setting, the file and what to do (for the log: never for an
    anonymous caller)."""

    def __init__(self, key: str, path: str, problem: str, kind: str = ""):
        #: what went wrong, as slurm_ext.secretfile names it (missing, link, owner, mode, ...)
        self.key, self.path, self.problem, self.kind = key, path, problem, kind
        super().__init__(f"{key} {path}: {problem}")


class SecretFile:
    """The content of the file `path` (the setting `key` names it), read again when its identity changes.
    `reader_group`: that group may read it too, where it is the file's (the token file of hashes,
    root:slurm-ext-web 0640)."""

    def __init__(self, path: str, key: str, reader_group: int | None = None):
        self.path, self.key, self.reader_group = path, key, reader_group
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._content = b""

    def read(self) -> bytes:
        """The file's content now (the very same bytes object while it is unchanged).

        Raises:
            SecretFileError: missing, a link, not a regular file, not root's (nor this user's), readable or
                writable by others, or larger than slurm_ext.secretfile.DEFAULT_MAX_BYTES.
        """
        try:
            found = read_secret(self.path, reader_group=self.reader_group)
        except _Refused as err:
            raise SecretFileError(self.key, self.path, self._advice(err), err.kind) from None
        with self._lock:
            if found.identity != self._seen:
                self._content, self._seen = found.content, found.identity
            return self._content

    def _advice(self, err: _Refused) -> str:
        if err.kind not in ("owner", "mode"):
            return err.problem
        info = err.info
        found = f"owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o} (group {info.st_gid})"
        if self.reader_group is None:
            return f"{found}; it must be root's and readable by no one else (chown root {self.path}; chmod 600 " \
                   f"{self.path})"
        group = _group_name(self.reader_group)
        return (f"{found}; it must be root's and readable by no one else but group {group} (chown root:{group} "
                f"{self.path}; chmod 640 {self.path})")


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)

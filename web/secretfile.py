"""A secret file of the page (the operators' token hashes, the proxy's shared secret): `SecretFile`, read again
whenever it changes.

Opening and checking is slurm_ext.secretfile's (never through a link, checked on the descriptor read from: a
regular file of root's, or of the page's own user for the copies the agent makes for it, that others may not
read); what is the page's here is the setting that names the file, the advice, and the change watching.
"""

from __future__ import annotations

import stat
import threading

from slurm_ext.errors import SlurmExtError
from slurm_ext.secretfile import SecretFileError as _Refused, read_secret

__all__ = ["SecretFile", "SecretFileError"]


class SecretFileError(SlurmExtError):
    """The file cannot be used; the message names the setting, the file and what to do (for the log: never for an
    anonymous caller)."""

    def __init__(self, key: str, path: str, problem: str):
        self.key, self.path, self.problem = key, path, problem
        super().__init__(f"{key} {path}: {problem}")


class SecretFile:
    """The content of the file `path` (the setting `key` names it), read again when its identity changes.
    `group_may_read`: its group may read it too (the token file of hashes, root:slurm-ext-web 0640)."""

    def __init__(self, path: str, key: str, group_may_read: bool = False):
        self.path, self.key, self.group_may_read = path, key, group_may_read
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
            found = read_secret(self.path, group_may_read=self.group_may_read)
        except _Refused as err:
            raise SecretFileError(self.key, self.path, self._advice(err)) from None
        with self._lock:
            if found.identity != self._seen:
                self._content, self._seen = found.content, found.identity
            return self._content

    def _advice(self, err: _Refused) -> str:
        if err.kind not in ("owner", "mode"):
            return err.problem
        info, chmod = err.info, "chmod 640" if self.group_may_read else "chmod 600"
        return (f"owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}; it must be root's and "
                f"readable by no one else{' but its group' if self.group_may_read else ''} (chown root {self.path}; "
                f"{chmod} {self.path})")

"""The backup key (accounting.backup_key): what authenticates a backup's manifest, `read_key` and `ensure_key`.

A manifest's sha256 proves nothing by itself: whoever can write a dump can write its checksum beside it. Its
HMAC under this key can only come from the key's holder, so restore, verify and retention take a backup only
with a manifest the key authenticates (`dumpfile.Manifest.authenticate`). The key is a root-only file kept
apart from the backups (never on their volume: whoever reads it there can sign a dump of their own), created
by the first backup where it is missing, and refused, like every secret file of slurm-ext, when others can
read or change it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from slurm_ext.secretfile import SecretFileError, read_secret

from .dumpfile import BackupError

__all__ = ["MIN_KEY_BYTES", "BackupKey", "read_key", "ensure_key"]

#: shortest key taken; `ensure_key` writes 64 hex digits (32 random bytes)
MIN_KEY_BYTES = 32
_MAX_KEY_BYTES = 4096


@dataclass(frozen=True, slots=True)
class BackupKey:
    #: the file it was read from (named in every error)
    path: str
    secret: bytes = field(repr=False)


def read_key(path: str | os.PathLike) -> BackupKey:
    """The key in `path`, which must be a regular file of root's (or this user's) that no one else may read.

    Raises:
        BackupError: missing, unreadable, readable or writable by others, owned by another user, or too short.
    """
    path = str(path)
    try:
        text = read_secret(path, max_bytes=_MAX_KEY_BYTES, follow_link=True).content  # a Secret mount is a link
    except SecretFileError as err:
        raise BackupError(f"{path} (accounting.backup_key)", _key_problem(err)) from None
    secret = text.strip()
    if len(secret) < MIN_KEY_BYTES:
        raise BackupError(f"{path} (accounting.backup_key)", f"{len(secret)} bytes: not a backup key (expected "
                          f"{MIN_KEY_BYTES} to {_MAX_KEY_BYTES}; a new one: remove the file and take a backup)")
    return BackupKey(path, secret)


def _key_problem(err: SecretFileError) -> str:
    """read_secret's refusal in the backup key's words, with what to do."""
    path, info = err.path, err.info
    if err.kind == "missing":
        return ("no backup key: verify and restore need the key the backup was made with (copy it from the host "
                "that made it, to a path off the backup volume, root's, mode 0600, and point accounting.backup_key "
                "at it)")
    if err.kind == "owner":
        return (f"owned by uid {info.st_uid} (expected root: chown root:root {path}): whoever owns it can sign "
                "backups")
    if err.kind == "mode":
        return (f"mode {stat.S_IMODE(info.st_mode):04o} lets others read or change it (expected 0600 or 0400: "
                f"chmod 600 {path}): whoever reads it can sign a backup of their own")
    if err.kind == "size":
        return (f"more than {_MAX_KEY_BYTES} bytes: not a backup key (expected {MIN_KEY_BYTES} to {_MAX_KEY_BYTES}; "
                "a new one: remove the file and take a backup)")
    if err.kind == "not-regular":
        return "not a regular file"
    return f"cannot read the backup key: {err.problem}"


def ensure_key(path: str | os.PathLike, backup_dir: Path) -> BackupKey:
    """The key in `path`, made first (32 random bytes as hex, 0600, in a 0700 directory) when there is none.

    A new key is written whole under a name of its own, then linked to `path`: two first backups at once make
    one key, and neither reads it before it is complete (the one that loses the link reads the winner's).

    Raises:
        BackupError: the key lies in `backup_dir` (it would travel with the backups it authenticates), cannot be
            made, or is refused by read_key.
    """
    path = Path(path)
    directory = Path(os.path.realpath(backup_dir))
    real = Path(os.path.realpath(path))
    if real == directory or directory in real.parents:
        raise BackupError(f"{path} (accounting.backup_key)", f"the backup key is inside the backup directory "
                          f"{backup_dir}: whoever can read the backups could sign their own. Keep it apart (on "
                          f"another volume), e.g. /etc/slurm-ext/backup.key")
    if os.path.lexists(path):
        return read_key(path)
    new = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(new, path)
    except FileExistsError:
        pass  # another backup made it first: its key is whole, and the one both use
    except OSError as err:
        raise BackupError(f"{path} (accounting.backup_key)", f"cannot create the backup key: {err.strerror}") from None
    finally:
        with contextlib.suppress(OSError):  # never made, or linked: the name is spare
            os.unlink(new)
    return read_key(path)

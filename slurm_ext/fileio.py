"""Writing files so that no reader and no crash ever sees half of one: `atomic_write`.

One helper for every file slurm-ext replaces (gres.conf, the GPU baseline,
job records, the fallback hooks), so they all give the same guarantee:

- Atomic: the data goes to a new temporary file in the same directory
  (`.<name>.<random>.tmp`, created with O_EXCL|O_NOFOLLOW, so it is never an
  existing file or a link someone planted), gets its mode, and is renamed
  over `path`. A reader sees the old file or the new one, never a mix; on
  any error the old file is untouched and the temporary file removed.
- Durable as `fsync` says:
  "all" (the default): the file is fsynced before the rename and the
  directory after it: once it returns, a crash or power loss leaves the new
  content. "file": only the file is fsynced: after a crash the path holds
  the old content or the complete new one, never an empty or partial file
  (ext4's delayed allocation), but the rename itself may be lost; one fsync
  less, for files on a hot path that a reboot makes stale anyway (job
  records). "none": no fsync; atomic for readers while the kernel runs,
  and after a crash the file may be empty.

The directory must be trusted: writable only by the writer (root's for
root). Whoever else can write it can replace the file after the rename
anyway; O_EXCL|O_NOFOLLOW only keep the temporary file from being a link.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["atomic_write"]

_FSYNC = ("all", "file", "none")
# tries at a fresh temporary name before giving up (a clash needs 48 random bits to repeat)
_NAME_TRIES = 8


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o644, fsync: str = "all",
                 mtime_ns: int | None = None) -> Path:
    """Replace `path` with `data` (str is written as UTF-8), atomically; returns the path.

    `mode` is the new file's mode exactly (the umask does not apply); the
    owner is the writer. `fsync`: "all", "file" or "none", the guarantees
    of the module docstring. `mtime_ns`: the new file's modification time, set
    before the rename (for readers that notice a rewrite by its mtime).

    Raises:
        OSError: the directory is missing or not writable, the disk is full,
            or `path` is a directory; the old file is then as it was.
        ValueError: `fsync` is none of those (a caller's bug).
    """
    if fsync not in _FSYNC:
        raise ValueError(f"fsync={fsync!r} (expected one of {', '.join(_FSYNC)})")
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = _create_temporary(path)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if mtime_ns is not None:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            if fsync != "none":
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync == "all":
        _fsync_directory(path.parent)
    return path


def _create_temporary(path: Path) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_NAME_TRIES):
        tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"{_NAME_TRIES} temporary names for it all taken", str(path))


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; a filesystem that cannot fsync a directory costs durability only."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

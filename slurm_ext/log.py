"""Logging set-up shared by every entry point.

One line per event, in the form operators grep for:
``2026-11-29T17:00:01 slurm-ext[4242] prolog INFO: job 12: ...``.
"""

import logging
import os
import re
import sys

from .config import LogSection

__all__ = ["setup", "printable"]

_FORMAT = "%(asctime)s slurm-ext[%(process)d] %(name)s %(levelname)s: %(message)s"
_DATEFMT = "%Y-%m-%dT%H:%M:%S"
#: C0 and C1 control characters and DEL: a newline in a process name would start a forged log line
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """`text` with control characters escaped (\\n, \\x1b): one log line stays one line.

    Process names, script paths, user names and script output are chosen by
    users; written raw, `comm` "x\\n... slurm-ext[1] supervisor INFO: node
    resumed" would add a line an operator takes for the agent's.
    """
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


class _PrivateFileHandler(logging.FileHandler):
    """A FileHandler whose file is 0640 (less under a stricter umask), as the node journal: the log holds every
    event's fields (a script's output, a job's user and paths), and FileHandler's 0666 under the usual umask 022 let
    every user of the node read them. A file of ours that exists loses its group write and others' bits (one that an
    earlier version made 0644 would stay world-readable after an upgrade); a stricter mode is kept. `tightened` is the
    mode it had when this handler tightened it, for setup() to say so once."""

    tightened: int | None = None

    def _open(self):  # logging's name: FileHandler opens its file here
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        status = os.fstat(fd)
        mode = status.st_mode & 0o7777
        if status.st_uid == os.geteuid() and mode & 0o027:
            os.fchmod(fd, mode & ~0o027)
            self.tightened = mode
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


class _Formatter(logging.Formatter):
    """Escapes the message; a traceback appended below it keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)


def setup(section: LogSection, component: str = "slurm-ext") -> logging.Logger:
    """Configure the root logger from [log] and return the component's logger.

    A log file that cannot be opened falls back to standard error with a
    warning: losing the file must not stop a hook that slurmd is waiting on.
    """
    handler: logging.Handler
    problem = tightened = None
    if section.file:
        try:
            handler = _PrivateFileHandler(section.file)
            if handler.tightened is not None:
                tightened = (f"log.file {section.file} was readable by others ({oct(handler.tightened)}): now "
                             f"{oct(handler.tightened & ~0o027)}, as the node journal (it holds every event's fields)")
        except OSError as err:
            handler = logging.StreamHandler(sys.stderr)
            problem = f"log.file {section.file}: {err.strerror}; logging to standard error"
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(_FORMAT, _DATEFMT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(section.level.upper())
    logger = logging.getLogger(component)
    if problem:
        logger.warning(problem)
    if tightened:
        logger.warning(tightened)
    return logger

"""Node events: one JSON line each in the node journal, and one log line.

The journal (`<node.state_dir>/journal.jsonl`) is what an operator reads to
learn what happened on a node and why (`slurm-ext events`, see `journal`);
Slurm's own history (`sacctmgr show event`) only has what reached slurmctld.
Writing the journal must never take the node down: a full disk or a
read-only state dir is logged and skipped.

Every event name is in the catalogue (`eventnames.CATALOGUE`), with the
components that emit it and its default severity; `emit` refuses any other
name, so a misspelt event fails a test instead of reaching a journal that
no one can explain. `emitter(state_dir, component, **fields)` is the one
way a component binds its name and fixed fields (role, job) once.

The journal is bounded: past JOURNAL_MAX_BYTES it is renamed to
`journal.jsonl.1`, the older ones shift up to `journal.jsonl.JOURNAL_KEEP`
(the oldest goes) and a new one begins, so the journal never takes more
than (JOURNAL_KEEP + 1) * JOURNAL_MAX_BYTES and a line per writer (`journal.lock` beside it orders
writers and rotations: no line is appended to a renamed file); and text from
users (script output, process names, paths) is cut to FIELD_MAX_CHARS per
field, lists to LIST_MAX_ITEMS, so no job can fill the node's disk through
its events.

A worker that runs as its own user (the page) cannot write the journal, root's: the agent gave it a socket
($SLURM_EXT_EVENTS_SOCKET) and `emit` sends the event there for the agent to write (slurm_ext.workerevents).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from . import workerevents
from .eventnames import CATALOGUE, SEVERITIES
from .words import moment

__all__ = ["emit", "emitter", "journal_path", "journal_files", "JOURNAL_MAX_BYTES", "JOURNAL_KEEP",
           "FIELD_MAX_CHARS", "LIST_MAX_ITEMS"]

log = logging.getLogger("events")

_LEVELS = dict(zip(SEVERITIES, (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL), strict=True))
#: size at which the journal is rotated
JOURNAL_MAX_BYTES = 16 * 2**20
#: rotated files kept (journal.jsonl.1 .. .JOURNAL_KEEP, .1 the newest): at most 64 MiB in all by default
JOURNAL_KEEP = 3
#: longest string kept in an event (the message and each field); the tail is what is kept of longer ones
FIELD_MAX_CHARS = 8192
#: most entries kept of a list field
LIST_MAX_ITEMS = 100


def journal_path(state_dir: str) -> Path:
    """The journal being written now."""
    return Path(state_dir) / "journal.jsonl"


def journal_files(state_dir: str) -> list[Path]:
    """Every file the journal may have, oldest first (journal.jsonl.JOURNAL_KEEP .. .1, journal.jsonl)."""
    path = journal_path(state_dir)
    return [path.with_name(f"{path.name}.{n}") for n in range(JOURNAL_KEEP, 0, -1)] + [path]


def emit(state_dir: str | None, component: str, event: str, message: str, severity: str | None = None,
         **fields) -> dict:
    """Record one event; returns the record that was written (or tried).

    `severity` None is the catalogue's default for `event`. `state_dir`
    None writes the log line only (dry runs, which must leave the node's
    journal alone).

    Raises:
        ValueError: with SLURM_EXT_STRICT_EVENTS=1 (the tests set it), when
            `event` is not in `eventnames.CATALOGUE`, `component` is not one
            of its components, or `severity` is not info, warning or error: a
            bug in the caller. Outside the tests the event is written anyway,
            with an error in the log: a misnamed event must not take a node's
            agent or a job's Epilog down.
    """
    entry = CATALOGUE.get(event)
    problem = ""
    if entry is None:
        problem = (f"event {event!r} is not in the catalogue (slurm_ext/eventnames.py): add it there and to the "
                   "table of events in docs/reference/events.md")
    elif component not in entry.components:
        problem = (f"event {event!r}: component {component!r} is not one of its components in the catalogue "
                   f"({', '.join(entry.components)}; slurm_ext/eventnames.py)")
    elif severity is not None and severity not in _LEVELS:
        problem = f"event {event!r}: severity {severity!r} (expected one of {', '.join(SEVERITIES)})"
    if problem:
        if os.environ.get("SLURM_EXT_STRICT_EVENTS") == "1":
            raise ValueError(problem)
        log.error("%s (a bug of slurm-ext; the event is recorded anyway)", problem)
    if severity not in _LEVELS:
        severity = entry.severity if entry is not None and severity is None else "error"
    fields = {key: _bounded(value) for key, value in fields.items()}
    record = {"time": moment(), "component": component, "event": event,
              "severity": severity, "message": _bounded(message), **fields}
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    log.log(_LEVELS[severity], "%s: %s: %s%s", component, event, record["message"],
            f" ({detail})" if detail else "")
    if state_dir is None:
        return record
    if (channel := workerevents.channel()) is not None:  # a worker of its own user: the agent writes it
        workerevents.send(channel, event, record["message"], severity, fields)
        return record
    path = journal_path(state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _append(path, (json.dumps(record, default=str) + "\n").encode())
    except OSError as err:
        log.error("node journal %s: cannot write (%s); event kept in this log only", path, err.strerror)
    return record


def emitter(state_dir: str | None, component: str, **fixed) -> Callable[..., dict]:
    """`emit(event, message, severity=None, **fields)` for `component`, with `fixed` fields in every event.

    What components pass around instead of a wrapper of their own: the
    agent binds its role, a dry run binds state_dir None (log line only).
    A field given to the call replaces a fixed one of the same name.
    """
    def emit_event(event: str, message: str, severity: str | None = None, **fields) -> dict:
        return emit(state_dir, component, event, message, severity, **{**fixed, **fields})
    return emit_event


def _bounded(value):
    """`value` cut to the journal's limits: long strings keep their end (where errors are), lists their head."""
    if isinstance(value, str) and len(value) > FIELD_MAX_CHARS:
        return f"[{len(value) - FIELD_MAX_CHARS} characters cut]" + value[-FIELD_MAX_CHARS:]
    if isinstance(value, (list, tuple)):
        kept = [_bounded(item) for item in value[:LIST_MAX_ITEMS]]
        return kept + [f"[{len(value) - LIST_MAX_ITEMS} more]"] if len(value) > LIST_MAX_ITEMS else kept
    return value


def _open_journal(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)


def _append(path: Path, line: bytes) -> None:
    """Write `line` to the journal in one write, and rotate the file it went to once that is full.

    Why a lock file: a writer that opened the journal just before a rotation and wrote just after it would append
    to journal.jsonl.1, which the controller's collector may have read to its end and left (the line lost to the
    history). Writers open and write under journal.lock's shared lock, a rotation renames under its exclusive one,
    so every line is in its file before that file is renamed. The lock file is never renamed itself.
    """
    lock = _lock(path, fcntl.LOCK_SH)
    try:
        fd = _open_journal(path)
        try:
            os.write(fd, line)  # one write: lines of concurrent writers never interleave
            written = os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        _unlock(lock)
    if written.st_size > JOURNAL_MAX_BYTES:
        _rotate(path, (written.st_dev, written.st_ino))


def _lock(path: Path, kind: int) -> int | None:
    """journal.lock beside `path`, locked `kind`: its descriptor, or None where no lock can be taken (a filesystem
    without them: written unlocked, as before the lock; the collector waits for a rotated file to be quiet)."""
    try:
        fd = os.open(path.with_name("journal.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError:
        return None
    try:
        fcntl.flock(fd, kind)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int | None) -> None:
    """Unlocked before it is closed: a child forked meanwhile shares the descriptor, and would hold the lock."""
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _rotate(path: Path, full: tuple[int, int]) -> None:
    """Shift .1 .. .JOURNAL_KEEP-1 up by one and rename the full journal to .1, once.

    Writers that found the same file full find it already done: the renames run under journal.lock's exclusive
    lock, and only while the file at `path` is still the full one (`full`: its device and inode).
    """
    lock = _lock(path, fcntl.LOCK_EX)
    try:
        try:
            current = os.stat(path)
        except FileNotFoundError:
            return
        if (current.st_dev, current.st_ino) == full:
            for number in range(JOURNAL_KEEP - 1, 0, -1):
                try:
                    os.replace(path.with_name(f"{path.name}.{number}"), path.with_name(f"{path.name}.{number + 1}"))
                except FileNotFoundError:
                    pass
            os.replace(path, path.with_name(path.name + ".1"))
    finally:
        _unlock(lock)

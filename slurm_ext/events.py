"""Node events: one JSON line each in the node journal, and one log line.

The journal (`<node.state_dir>/journal.jsonl`) is what an operator reads to
learn what happened on a node and why; Slurm's own history (`sacctmgr show
event`) only has what reached slurmctld. Writing the journal must never take
the node down: a full disk or a read-only state dir is logged and skipped.

The journal is bounded: past JOURNAL_MAX_BYTES it is renamed to
`journal.jsonl.1` (the one before that goes) and a new one begins; and text
from users (script output, process names, paths) is cut to FIELD_MAX_CHARS
per field, lists to LIST_MAX_ITEMS, so no job can fill the node's disk
through its events.
"""

import fcntl
import json
import logging
import os
import time
from pathlib import Path

__all__ = ["emit", "journal_path", "JOURNAL_MAX_BYTES", "FIELD_MAX_CHARS", "LIST_MAX_ITEMS"]

log = logging.getLogger("events")

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
#: size at which the journal is rotated (one older file is kept)
JOURNAL_MAX_BYTES = 16 * 2**20
#: longest string kept in an event (the message and each field); the tail is what is kept of longer ones
FIELD_MAX_CHARS = 8192
#: most entries kept of a list field
LIST_MAX_ITEMS = 100


def journal_path(state_dir: str) -> Path:
    return Path(state_dir) / "journal.jsonl"


def emit(state_dir: str, component: str, event: str, message: str, severity: str = "info", **fields) -> dict:
    """Record one event; returns the record that was written (or tried)."""
    fields = {key: _bounded(value) for key, value in fields.items()}
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "component": component, "event": event,
              "severity": severity, "message": _bounded(message), **fields}
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    log.log(_LEVELS.get(severity, logging.INFO), "%s: %s: %s%s", component, event, record["message"],
            f" ({detail})" if detail else "")
    path = journal_path(state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, line.encode())  # one write: lines of concurrent writers never interleave
            if os.fstat(fd).st_size > JOURNAL_MAX_BYTES:
                _rotate(path, fd)
        finally:
            os.close(fd)
    except OSError as err:
        log.error("node journal %s: cannot write (%s); event kept in this log only", path, err.strerror)
    return record


def _bounded(value):
    """`value` cut to the journal's limits: long strings keep their end (where errors are), lists their head."""
    if isinstance(value, str) and len(value) > FIELD_MAX_CHARS:
        return f"[{len(value) - FIELD_MAX_CHARS} characters cut]" + value[-FIELD_MAX_CHARS:]
    if isinstance(value, (list, tuple)):
        kept = [_bounded(item) for item in value[:LIST_MAX_ITEMS]]
        return kept + [f"[{len(value) - LIST_MAX_ITEMS} more]"] if len(value) > LIST_MAX_ITEMS else kept
    return value


def _rotate(path: Path, fd: int) -> None:
    """Rename the full journal to .1, once: writers that raced here find it already done."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        mine, current = os.fstat(fd), os.stat(path)
        if (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino):
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)

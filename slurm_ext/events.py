"""Node events: one JSON line each in the node journal, and one log line.

The journal (`<node.state_dir>/journal.jsonl`) is what an operator reads to
learn what happened on a node and why; Slurm's own history (`sacctmgr show
event`) only has what reached slurmctld. Writing the journal must never take
the node down: a full disk or a read-only state dir is logged and skipped.
"""

import json
import logging
import os
import time
from pathlib import Path

__all__ = ["emit", "journal_path"]

log = logging.getLogger("events")

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def journal_path(state_dir: str) -> Path:
    return Path(state_dir) / "journal.jsonl"


def emit(state_dir: str, component: str, event: str, message: str, severity: str = "info", **fields) -> dict:
    """Record one event; returns the record that was written (or tried)."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "component": component, "event": event,
              "severity": severity, "message": message, **fields}
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    log.log(_LEVELS.get(severity, logging.INFO), "%s: %s: %s%s", component, event, message,
            f" ({detail})" if detail else "")
    path = journal_path(state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode())  # one write: lines of concurrent writers never interleave
        finally:
            os.close(fd)
    except OSError as err:
        log.error("node journal %s: cannot write (%s); event kept in this log only", path, err.strerror)
    return record

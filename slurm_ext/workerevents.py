"""A worker's events, sent to its agent to write: the journal is root's (0640), a worker running as its own user
(the page, web.user) cannot write it.

The agent gives such a worker a datagram socket of its own (supervisor/eventchannel.py: owner the worker's user,
0600) and names it in $SLURM_EXT_EVENTS_SOCKET. `events.emit` in the worker then sends each event there, one JSON
object a datagram ({"event", "message", "severity", "fields"}), instead of writing the journal. The agent checks
each with `parse` against the catalogue, for the component the worker may speak for (a page cannot write a
`health-finding` or a `drain-requested`), and writes it under that component with the worker's name.
The worker never waits for the agent: a full socket drops the event (logged), as a full disk does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from dataclasses import dataclass

from .eventnames import CATALOGUE, SEVERITIES

__all__ = ["ENV", "MAX_DATAGRAM", "MAX_FIELDS", "RESERVED", "WorkerEvent", "RefusedEvent", "channel", "send",
           "parse"]

log = logging.getLogger("events")

#: the environment variable naming the worker's socket (set by the agent only for a worker with a user)
ENV = "SLURM_EXT_EVENTS_SOCKET"
#: largest datagram the agent reads as an event; a larger one is refused whole
MAX_DATAGRAM = 16384
#: most fields an event may carry
MAX_FIELDS = 32
#: the record's own keys, the one the agent adds, and events.emit's own parameters (a field named state_dir made
#: the agent's emit call fail): a worker cannot set them as fields
RESERVED = frozenset({"time", "component", "event", "severity", "message", "worker", "role", "state_dir"})
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_SCALARS = (str, int, float, bool, type(None))


class RefusedEvent(ValueError):
    """A datagram that is not an event the worker may write (the reason, for the agent's count and log)."""


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """One accepted datagram: what the agent writes for the worker."""

    event: str
    message: str
    severity: str
    fields: dict


def channel() -> str | None:
    """The socket this process sends its events to: only when the agent gave one and this process is not root
    (root writes the journal itself, as `[web] user = "root"` does)."""
    path = os.environ.get(ENV)
    return path if path and os.geteuid() != 0 else None


def send(path: str, event: str, message: str, severity: str, fields: dict) -> bool:
    """Send one event to the agent's socket at `path`, never waiting; False (and a log line) when it was not."""
    data = json.dumps({"event": event, "message": message, "severity": severity, "fields": fields},
                      default=str).encode()
    if len(data) > MAX_DATAGRAM:
        log.error("event %s: %d bytes, over the %d the agent takes: kept in this log only", event, len(data),
                  MAX_DATAGRAM)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            sock.sendto(data, path)
    except OSError as err:
        log.error("event %s: cannot hand it to the agent at %s (%s): kept in this log only", event, path,
                  err.strerror or err)
        return False
    return True


def parse(data: bytes, component: str) -> WorkerEvent:
    """The event in one datagram, if `component` may write it.

    Raises:
        RefusedEvent: too big, not a JSON object of the expected keys, an event the catalogue does not list for
            `component`, or fields that are too many, named like the record's own keys, or not plain values.
    """
    if len(data) > MAX_DATAGRAM:
        raise RefusedEvent(f"over {MAX_DATAGRAM} bytes")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):  # "[" * 16000 nests deeper than the parser goes
        raise RefusedEvent("not JSON") from None
    if not isinstance(body, dict) or set(body) - {"event", "message", "severity", "fields"}:
        raise RefusedEvent("not an object of event, message, severity, fields")
    event, message = body.get("event"), body.get("message")
    severity, fields = body.get("severity"), body.get("fields", {})
    entry = CATALOGUE.get(event) if isinstance(event, str) else None
    if entry is None:
        raise RefusedEvent(f"event {str(event)[:64]!r} is not in the catalogue")
    if component not in entry.components:
        raise RefusedEvent(f"event {event!r} is not one of component {component}'s")
    if not isinstance(message, str):
        raise RefusedEvent(f"event {event!r}: no message")
    if severity is None:
        severity = entry.severity
    if severity not in SEVERITIES:
        raise RefusedEvent(f"event {event!r}: severity {str(severity)[:16]!r}")
    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise RefusedEvent(f"event {event!r}: fields not an object of at most {MAX_FIELDS}")
    for name, value in fields.items():
        if name in RESERVED or not _FIELD_NAME.fullmatch(name):
            raise RefusedEvent(f"event {event!r}: field name {name[:64]!r}")
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(item, _SCALARS) for item in values):
            raise RefusedEvent(f"event {event!r}: field {name!r} is not a plain value or list of them")
    return WorkerEvent(event, message, severity, fields)

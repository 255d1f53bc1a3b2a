"""supervisor.eventchannel on a real socket, without an agent: what a worker of its own user may send never
escapes into the agent's loop (which runs slurmctld), and refusals cost the same budget as events.

The review of 28.21 crashed the agent with one datagram each: a field named `state_dir` (events.emit's own
parameter) and JSON nested deeper than the parser goes."""

from __future__ import annotations

import json
import socket

from slurm_ext import events
from slurm_ext.supervisor.eventchannel import PER_MINUTE, EventChannel


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _channel(tmp_path, clock: Clock) -> EventChannel:
    state_dir = str(tmp_path / "state")

    def write(event, message, severity, fields, component=""):  # what supervisor/processes.py gives it
        events.emit(state_dir, component or "web", event, message, severity, **{**fields, "worker": "web"})

    return EventChannel(tmp_path / "events.sock", 0, "web", "web", write, clock)


def _send(channel: EventChannel, *datagrams: bytes) -> None:
    """Send each datagram, the channel reading whenever the socket's queue (net.unix.max_dgram_qlen) is full."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as sock:
        for data in datagrams:
            while True:
                try:
                    sock.sendto(data, str(channel.path))
                    break
                except BlockingIOError:
                    channel.receive()


def _journal(tmp_path) -> list[dict]:
    path = tmp_path / "state" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_field_named_like_emits_parameter_and_deep_json_are_refused_not_raised(tmp_path):
    clock = Clock()
    channel = _channel(tmp_path, clock)
    try:
        _send(channel, json.dumps({"event": "web-started", "message": "x", "fields": {"state_dir": "/x"}}).encode(),
              b"[" * 16000,
              json.dumps({"event": "web-started", "message": "the page's own"}).encode())
        channel.receive()  # raised TypeError, then RecursionError, before the fix
        assert (channel.written, channel.refused) == (1, 2)
        clock.now += 61
        channel.tick(clock.now)
        written = [(e["event"], e.get("refused")) for e in _journal(tmp_path)]
        assert written == [("web-started", None), ("worker-events-dropped", 2)], written
    finally:
        channel.close()


def test_refused_datagrams_share_the_budget_of_a_minute(tmp_path):
    channel = _channel(tmp_path, Clock())
    try:
        _send(channel, *([b"{}"] * (PER_MINUTE + 50)))
        channel.receive()
        assert (channel.refused, channel.dropped, channel.written) == (PER_MINUTE, 50, 0)
    finally:
        channel.close()

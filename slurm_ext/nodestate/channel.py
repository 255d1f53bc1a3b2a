"""How another process (the hook service, a Python hook) hands its drain to the agent's owner.

One SOCK_SEQPACKET socket, `<runtime_dir>/nodestate.sock`, served by the
agent's Slurm thread. A request is one JSON message, {"owner": ..., "want":
reason} or {"owner": ..., "clear": true}; the answer, once Slurm shows it
(or someone else's drain holds the node), is {"ok": true, "outcome": ...}.
{"look": true} asks for a pass now (the Prolog, when a drain of ours waits
for Slurm); its outcome is the reason the node shows after it.
Both ends are root's: the server answers only uid 0 (SO_PEERCRED), and the
client talks only to a server running as uid 0, so no user can swallow a
drain by planting a socket.

With no agent (bare metal without it, `slurm-ext hooks serve` under
systemd), `post` applies the want itself through the same owner rules, for
that one request.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from .reconciler import Reconciler, Ticket

__all__ = ["SOCKET_NAME", "ChannelServer", "NoAgent", "request"]

log = logging.getLogger("nodestate")

SOCKET_NAME = "nodestate.sock"
_MAX_MESSAGE = 16384
_MAX_CLIENTS = 64
#: how long the server keeps a request whose drain Slurm does not confirm
_ANSWER_WITHIN = 60.0
_CRED = struct.Struct("3i")


class NoAgent(ConnectionError):
    """No agent serves the node-state socket: the caller applies its want itself."""


def _peer_uid(sock: socket.socket) -> int:
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid


def request(path: Path, message: dict, timeout: float) -> dict:
    """Send one request to the agent at `path` and wait up to `timeout` seconds for its answer.

    Raises:
        NoAgent: nothing listens at `path` (or it is not root's).
        TimeoutError: the agent took the request but did not answer in time.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as err:
            raise NoAgent(f"{path}: {err.strerror}") from None
        if _peer_uid(sock) != 0:
            raise NoAgent(f"{path}: served by uid {_peer_uid(sock)}, not root: not the agent's")
        sock.send(json.dumps(message).encode())
        try:
            data = sock.recv(_MAX_MESSAGE)
        except socket.timeout:
            raise TimeoutError(f"{path}: the agent did not confirm within {timeout:g}s") from None
        if not data:
            raise TimeoutError(f"{path}: the agent closed the request unanswered (stopping?)")
        return json.loads(data)
    finally:
        sock.close()


@dataclass
class _Client:
    sock: socket.socket
    since: float
    ticket: Ticket | None = None


class ChannelServer:
    """The agent's end, served by the thread that reconciles: `serve` is where it waits."""

    def __init__(self, path: Path, reconciler: Reconciler):
        self.path = path
        self.reconciler = reconciler
        self.clients: dict[int, _Client] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            self.sock.bind(str(path))
        finally:
            os.umask(old)
        self.sock.listen(16)
        self._selector.register(self.sock, selectors.EVENT_READ)

    def poke(self) -> None:
        """End the current `serve` now (any thread)."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already poked

    def serve(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for requests or a poke; True when there is work for the reconciler."""
        self._answer_settled()
        work = False
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_r:
                _drain_pipe(self._wake_r)
                work = True
            elif key.fileobj is self.sock:
                self._accept()
            else:
                work |= self._receive(key.fd)
        return work

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.error("node-state socket %s: cannot accept: %s", self.path, err.strerror)
                return
            if len(self.clients) >= _MAX_CLIENTS or _peer_uid(conn) != 0:
                conn.close()  # a user's connection, or a flood: nothing of theirs reaches the owner
                continue
            conn.setblocking(False)
            self.clients[conn.fileno()] = _Client(conn, time.monotonic())
            self._selector.register(conn, selectors.EVENT_READ)

    def _receive(self, fd: int) -> bool:
        """Take the request on `fd`; True when it is a new one."""
        client = self.clients[fd]
        try:
            data = client.sock.recv(_MAX_MESSAGE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data or client.ticket is not None:
            self._close(fd)  # gone, or a second request on one connection
            return False
        try:
            message = json.loads(data)
            if message.get("look") is True:
                client.ticket = self.reconciler.look()
                return True
            owner = str(message["owner"])
            fields = {str(k): str(v) for k, v in dict(message.get("fields") or {}).items()}
            client.ticket = (self.reconciler.clear(owner) if message.get("clear")
                             else self.reconciler.want(owner, str(message["want"]), **fields))
        except (ValueError, KeyError, TypeError) as err:
            self._answer(fd, {"ok": False, "error": f"bad request: {err}"})
            return False
        return True

    def _answer_settled(self) -> None:
        now = time.monotonic()
        for fd, client in list(self.clients.items()):
            if client.ticket is not None and client.ticket.settled:
                self._answer(fd, {"ok": True, "outcome": client.ticket.outcome})
            elif now - client.since > _ANSWER_WITHIN:
                self._answer(fd, {"ok": False, "error": f"not confirmed by Slurm within {_ANSWER_WITHIN:g}s; "
                                  "the agent keeps trying"})

    def _answer(self, fd: int, reply: dict) -> None:
        try:
            self.clients[fd].sock.send(json.dumps(reply).encode())
        except OSError:
            pass  # the client gave up waiting
        self._close(fd)

    def _close(self, fd: int) -> None:
        client = self.clients.pop(fd, None)
        if client is not None:
            self._selector.unregister(client.sock)
            client.sock.close()

    def close(self) -> None:
        for fd in list(self.clients):
            self._close(fd)
        self._selector.close()
        self.sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.path.unlink(missing_ok=True)


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass

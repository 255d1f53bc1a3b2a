"""The NOTIFY_SOCKET the agent serves to workers that speak sd_notify.

slurmd/slurmctld `--systemd` (Slurm >= 23.11) send `READY=1` and
`MAINPID=<pid>` as datagrams; on `scontrol reconfigure` the old slurmd forks
and execs a new one, announces `MAINPID=<new>` and exits. Following MAINPID is
what lets the agent treat the old process's exit as a hand-over, not a crash.
After each READY=1, slurmd (>= 25.11) sends `BARRIER=1` with a pipe's end
passed in the datagram (sd_notify_barrier) and waits until the receiver has
closed it: every descriptor received is closed at once, or slurmd would
wait 5 s before registering.
Each worker gets its own socket, so a message is always about that worker;
the sender's PID comes from the kernel (SCM_CREDENTIALS), never from the text.
"""

import math
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from slurm_ext.procfs import read_stat

__all__ = ["NotifyMessage", "NotifySocket", "SystemdLink", "parse", "is_descendant"]

_MAX_DATAGRAM = 4096
#: seconds before a status systemd did not take is sent again
_RETRY_SEND = 1.0
#: descriptors one datagram may carry (a barrier passes one); more are discarded by the kernel, closed too
_MAX_FDS = 16
_ANCILLARY = socket.CMSG_SPACE(12) + socket.CMSG_SPACE(_MAX_FDS * 4)


@dataclass(frozen=True, slots=True)
class NotifyMessage:
    #: the sending process, as the kernel reports it
    sender: int
    ready: bool = False
    reloading: bool = False
    stopping: bool = False
    mainpid: int | None = None
    status: str | None = None
    #: lines that are not KEY=VALUE, or values that do not parse
    garbage: tuple[str, ...] = field(default_factory=tuple)


def parse(data: bytes, sender: int) -> NotifyMessage:
    """Read one sd_notify datagram; unknown keys are ignored, bad lines kept as garbage."""
    fields: dict = {}
    garbage = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            garbage.append(repr(raw[:80]))
            continue
        key, sep, value = line.partition("=")
        if not sep:
            garbage.append(line[:80])
        elif key == "READY":
            fields["ready"] = value == "1"
        elif key == "RELOADING":
            fields["reloading"] = value == "1"
        elif key == "STOPPING":
            fields["stopping"] = value == "1"
        elif key == "STATUS":
            fields["status"] = value
        elif key == "MAINPID":
            if value.isdigit() and int(value) > 0:
                fields["mainpid"] = int(value)
            else:
                garbage.append(line[:80])
    return NotifyMessage(sender=sender, garbage=tuple(garbage), **fields)


def is_descendant(pid: int, ancestor: int, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants (walks PPid links)."""
    for _ in range(4096):
        if pid == ancestor:
            return True
        stat = read_stat(pid, proc) if pid > 1 else None
        if stat is None:
            return False
        pid = stat.ppid
    return False


class NotifySocket:
    """A datagram socket at `path` that reports each message with its sender's PID."""

    def __init__(self, path: Path, uid: int | None = None):
        """`uid`: the user a worker that drops root speaks as (mariadbd runs as mysql); it gets the socket."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)  # only root (slurmd runs as root) may speak to it, or the worker's own user
        if uid is not None:
            os.chown(self.path, uid, -1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> list[NotifyMessage]:
        """Every datagram waiting now (never blocks)."""
        messages = []
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(_MAX_DATAGRAM, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return messages
            sender = 0
            for level, kind, payload in ancdata:
                if level != socket.SOL_SOCKET:
                    continue
                if kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
                    sender = struct.unpack("3i", payload[:12])[0]
                elif kind == socket.SCM_RIGHTS:  # a barrier: closing our copy is the answer
                    for fd in struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4]):
                        os.close(fd)
            messages.append(parse(data, sender))

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


class SystemdLink:
    """The agent's own sd_notify link to systemd, when systemd runs it: READY=1, STATUS= and the watchdog.

    The protocol is one datagram per message to NOTIFY_SOCKET (a path, or an abstract name after '@'), the side
    NotifySocket receives. A status systemd did not take is sent again at the agent's next tick."""

    def __init__(self, socket_path: str, watchdog_usec: int):
        self._address = "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        #: seconds between WATCHDOG=1 (half of WatchdogSec, as sd_watchdog_enabled advises); 0: none asked
        self.watchdog_every = watchdog_usec / 2e6
        self._last_watchdog = 0.0
        self._status = ""
        #: when a status systemd did not take is sent again (inf: none waits)
        self._retry_at = math.inf

    def next_watchdog(self) -> float:
        return self._last_watchdog + self.watchdog_every

    def next_send(self) -> float:
        """When the agent's loop must tick again for this link: the watchdog's next ping, or a status not taken."""
        return min(self.next_watchdog() if self.watchdog_every else math.inf, self._retry_at)

    def _send(self, message: str) -> bool:
        """One datagram, never blocking the agent's loop; False when it was not taken (said again next tick)."""
        try:
            self._sock.sendto(message.encode(), socket.MSG_DONTWAIT, self._address)
        except OSError:  # systemd away, or its queue full
            return False
        return True

    def tick(self, now: float, ready: bool, status: str) -> None:
        """Pet the watchdog when due; tell systemd a new status (READY=1 with it once ready). The status is one line:
        a newline in it would be read as another assignment (READY=, STOPPING=, MAINPID=)."""
        status = " ".join(status.split())
        if self.watchdog_every and now >= self.next_watchdog():
            self._send("WATCHDOG=1")  # not taken: the next is due in half the WatchdogSec, still in time
            self._last_watchdog = now
        if status != self._status:
            if self._send(("READY=1\n" if ready else "") + f"STATUS={status}"):
                self._status, self._retry_at = status, math.inf
            else:  # READY=1 lost would leave a Type=notify unit starting: again in a second, not at the next pass
                self._retry_at = now + _RETRY_SEND

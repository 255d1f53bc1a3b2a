"""What a node is, as its agent tells the cluster page: OS image, kernel, network interfaces and their counters.

`read_facts()` reads a few small files at request time (the agent's /health
answer): no thread, no state. The page turns two readings of the byte
counters into bandwidth. Interfaces are the node's physical ones (a
`device` link under /sys/class/net, as udev names them) plus any it is told
to watch (health.interfaces), so the dozens of veths of a Kubernetes node do
not crowd the list. `sys_root` and `os_release` are parameters so tests
feed fixture trees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Interface", "NodeFacts", "read_facts", "os_name"]

SYS_NET = Path("/sys/class/net")
OS_RELEASE = Path("/etc/os-release")


@dataclass(frozen=True, slots=True)
class Interface:
    name: str
    #: the kernel's operstate: up, down, lowerlayerdown, unknown, ...
    state: str
    #: link speed in Mbit/s, None when the driver does not say (a virtual link, a link that is down)
    speed_mbps: int | None
    rx_bytes: int
    tx_bytes: int


@dataclass(frozen=True, slots=True)
class NodeFacts:
    #: /etc/os-release's PRETTY_NAME (the image), empty when unknown
    os: str
    #: the running kernel's release
    kernel: str
    interfaces: list = field(default_factory=list)


def os_name(path: Path = OS_RELEASE) -> str:
    """PRETTY_NAME of an os-release file, or "" when there is none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME":
            return value.strip().strip("\"'")
    return ""


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # EINVAL: speed of a link that is down or virtual
        return None


def read_facts(watched: tuple[str, ...] = (), sys_net: Path = SYS_NET, os_release: Path = OS_RELEASE) -> NodeFacts:
    """The node's facts now; `watched`: interfaces listed even when they are virtual."""
    interfaces = []
    try:
        names = sorted(entry.name for entry in sys_net.iterdir())
    except OSError:
        names = []
    for name in names:
        base = sys_net / name
        if name not in watched and not (base / "device").exists():
            continue
        try:
            state = (base / "operstate").read_text().strip()
        except OSError:
            continue  # gone meanwhile
        speed = _number(base / "speed")
        interfaces.append(Interface(name, state, speed if speed is not None and speed > 0 else None,
                                    _number(base / "statistics" / "rx_bytes") or 0,
                                    _number(base / "statistics" / "tx_bytes") or 0))
    return NodeFacts(os_name(os_release), os.uname().release, interfaces)

"""The node's readers besides NVML and the kernel log: file systems, Slurm, network links (netlink)."""

from __future__ import annotations

import os
import select
import time

from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import SlurmClient

from .records import FsSample, LinkChange, NodeSample

__all__ = ["read_filesystems", "read_node", "LinkWatch"]

_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000


def read_filesystems(paths: tuple[str, ...]) -> tuple[FsSample, ...]:
    out = []
    for path in paths:
        try:
            info = os.statvfs(path)
        except OSError as err:
            out.append(FsSample(path, error=err.strerror or str(err)))
            continue
        out.append(FsSample(path, info.f_bavail * info.f_frsize, info.f_blocks * info.f_frsize,
                            bool(info.f_flag & os.ST_RDONLY)))
    return tuple(out)


def read_node(slurm: SlurmClient, name: str) -> NodeSample:
    try:
        node = slurm.node(name)
    except SlurmExtError as err:
        return NodeSample(name, error=str(err))
    return NodeSample(name, node.responding, node.drained, node.reason, node.reason_is_ours)


class LinkWatch:
    """Netlink link messages (pyroute2) for `interfaces`, in `namespace` ('' for the monitor's own).

    `dump()` is every watched interface's state now; `wait(timeout)` the changes that came since.

    Raises (at creation):
        OSError, ImportError: no netlink (pyroute2 missing, the namespace gone).
    """

    def __init__(self, interfaces: tuple[str, ...], namespace: str = ""):
        from pyroute2 import IPRoute
        self.interfaces = set(interfaces)
        self.ipr = IPRoute(netns=namespace) if namespace else IPRoute()
        self.ipr.bind()
        self._up: dict[str, bool] = {}

    def dump(self) -> list[LinkChange]:
        changes = self._read()
        for change in changes:
            self._up[change.ifname] = change.up
        return changes

    def _read(self) -> list[LinkChange]:
        now = time.time()
        present = {}
        for message in self.ipr.get_links():
            change = self._change(message, now)
            if change is not None:
                present[change.ifname] = change
        missing = [LinkChange(name, False, now, exists=False) for name in sorted(self.interfaces - set(present))]
        return [*present.values(), *missing]

    def wait(self, timeout: float) -> list[LinkChange]:
        """The watched interfaces whose state changed: woken by netlink's messages, and read again each call,
        because a carrier lost (a cable, the peer of a veth) may reach netlink only through linkwatch, late or
        not as a message of that interface at all."""
        ready, _, _ = select.select([self.ipr.fileno()], [], [], timeout)
        if ready:
            self.ipr.get()  # what woke us; the dump below is the truth
        out = []
        for change in self._read():
            if self._up.get(change.ifname) != change.up:
                self._up[change.ifname] = change.up
                out.append(change)
        return out

    def _change(self, message, now: float) -> LinkChange | None:
        name = message.get_attr("IFLA_IFNAME")
        if name not in self.interfaces or message.get("event") not in ("RTM_NEWLINK", "RTM_DELLINK", None):
            return None
        if message.get("event") == "RTM_DELLINK":
            return LinkChange(name, False, now, exists=False)
        flags = message["flags"]
        return LinkChange(name, bool(flags & _IFF_UP and flags & _IFF_LOWER_UP), now)

    def close(self) -> None:
        self.ipr.close()

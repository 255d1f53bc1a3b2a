"""Each dev node's network: a network namespace of its own whose `lo` is the interface its health monitor watches.

The host's interfaces are never the dev cluster's to take down; a namespace's own `lo` is (`dev inject NODE
link-down`). `dev up` makes the namespace and brings its `lo` up before the node's agent starts (a new namespace's
`lo` is down, which the monitor would judge a fault); `dev down` removes every namespace of its cluster (named
`slurm-ext-<digest of the state directory>-<node>`: also a node's of an earlier, larger up, or one a killed run
left), never another cluster's. Through pyroute2, which the health monitor already uses: no iproute2 needed.
"""

from __future__ import annotations

import logging

from slurm_ext.errors import DevClusterError

__all__ = ["ensure", "remove", "remove_all", "listed", "MADE", "set_lo", "lo_up"]

log = logging.getLogger("dev")

#: the namespaces this process made (the test suite checks none is left at its end)
MADE: set[str] = set()


def ensure(name: str) -> None:
    """Network namespace `name` exists and its `lo` is up.

    Raises:
        DevClusterError: the namespace cannot be made (not root, no netns support).
    """
    from pyroute2 import netns
    try:
        if name not in netns.listnetns():
            netns.create(name)
            MADE.add(name)
            log.info("network namespace %s made (the node's watched lo)", name)
        set_lo(name, True)
    except OSError as err:
        raise DevClusterError(f"cannot make network namespace {name} (/run/netns/{name}) for the node's watched "
                              f"interface: {err}") from err


def set_lo(name: str, up: bool) -> None:
    """Bring the `lo` of namespace `name` up or down (never the host's: the namespace is named)."""
    from pyroute2 import NetNS
    with NetNS(name, flags=0) as ns:
        (index,) = ns.link_lookup(ifname="lo")
        ns.link("set", index=index, state="up" if up else "down")


def lo_up(name: str) -> bool:
    """Whether the `lo` of namespace `name` is up."""
    from pyroute2 import NetNS
    with NetNS(name, flags=0) as ns:
        (link,) = ns.get_links(ifname="lo")
        return bool(link["flags"] & 1)  # IFF_UP


def remove(name: str) -> None:
    """Remove namespace `name` if it exists (after the node's agent stopped)."""
    from pyroute2 import netns
    if name in netns.listnetns():
        netns.remove(name)
        log.info("network namespace %s removed", name)


def listed() -> list[str]:
    """The host's named network namespaces (/run/netns)."""
    from pyroute2 import netns
    return list(netns.listnetns())


def remove_all(prefix: str) -> list[str]:
    """Remove every namespace whose name starts with `prefix` (one cluster's); the names removed."""
    gone = [name for name in listed() if name.startswith(prefix)]
    for name in gone:
        remove(name)
    return gone

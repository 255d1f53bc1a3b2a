"""Turning acceptance on for a running cluster offers `accept cluster` once.

The nodes start tested from the moment [acceptance] enabled is true, but the nodes running then
were never tested: the controller's agent notices the switch (at its start and at each reload of
its config), says once in its journal (`acceptance-offer`) that one `slurm-ext accept cluster`
tests them, and keeps what it saw in `<state_dir>/acceptance/switch.json` (so a restart of the
agent neither offers again nor forgets an offer). `slurm-ext status` and the cluster page say the
offer until a cluster run ends after it (`cluster_ran`, or a node's last run of trigger cluster).

A cluster whose controller first starts with acceptance on is not offered it: its nodes are tested
as they start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurm_ext.fileio import atomic_write

__all__ = ["OFFER", "switch_path", "noted", "pending", "cluster_ran"]

#: what `status`, the page and the acceptance-offer event say
OFFER = ("acceptance is on: nodes are tested at their next start; run `slurm-ext accept cluster` once to test the "
         "nodes running now")


def switch_path(state_dir: str) -> Path:
    """Where the controller keeps what it saw of the switch (readable by the page's user: nothing secret)."""
    return Path(state_dir) / "acceptance" / "switch.json"


def _read(state_dir: str) -> dict | None:
    try:
        data = json.loads(switch_path(state_dir).read_text())
    except (OSError, ValueError):
        return None  # absent, unreadable or torn: taken as never seen (at worst the offer is not made)
    return data if isinstance(data, dict) else None


def _write(state_dir: str, data: dict) -> None:
    path = switch_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data), mode=0o644, fsync="file")


def noted(state_dir: str, enabled: bool, now: float | None = None) -> bool:
    """Record the switch as the controller sees it now; True when it has just been turned on (off before, as this
    controller last saw it): the one time to offer `accept cluster`.

    Raises:
        OSError: the state directory cannot be written (the offer is then made again at the next look)."""
    now = time.time() if now is None else now
    seen = _read(state_dir)
    if seen is None:
        _write(state_dir, {"enabled": enabled, "since": now, "offered": None, "cluster_run": None})
        return False
    if bool(seen.get("enabled")) == enabled:
        return False
    _write(state_dir, {**seen, "enabled": enabled, "since": now, "offered": now if enabled else None})
    return enabled


def pending(state_dir: str, enabled: bool, cluster_runs: tuple[float, ...] = ()) -> float | None:
    """When the offer was made, while it stands: acceptance still on (`enabled`, the config's), and no cluster run
    ended after it, by this record (`cluster_ran`) or by `cluster_runs` (when nodes' last runs of trigger cluster
    ended); None otherwise."""
    seen = _read(state_dir)
    if not enabled or seen is None or not seen.get("enabled") or not isinstance(seen.get("offered"), (int, float)):
        return None
    offered = float(seen["offered"])
    ran = [float(seen["cluster_run"])] if isinstance(seen.get("cluster_run"), (int, float)) else []
    if any(t >= offered for t in (*ran, *cluster_runs)):
        return None
    return offered


def cluster_ran(state_dir: str, when: float | None = None) -> None:
    """`accept cluster` ended (on the controller): the offer is taken.

    Raises:
        OSError: the state directory cannot be written."""
    seen = _read(state_dir) or {"enabled": True, "since": None, "offered": None}
    _write(state_dir, {**seen, "cluster_run": time.time() if when is None else when})

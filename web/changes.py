"""The page's updates as changes: what changed in the cluster's view since the version a browser last had.

`Changes.take(view)` takes each refresh's view (`watch.PageView`, once, by the refresh thread): every node row is
compared with the row of the view before (as values: at 10,000 nodes of 8 GPUs about a third of serialising them),
serialised only where it changed, and kept as JSON with the version at which it last changed. A row as the page
holds it has no GPU readings: a node's figures (`FIGURES`: its GPUs' mean utilization, memory used and in all, the
hottest, the idle ones) go apart, a few numbers a node, because they move at nearly every answer of a busy node's
agent: at 10,000 nodes whose answers the collector takes every 15 s, a third of them move every 5 s refresh, and
their rows whole would be megabytes an update where their figures are about 100 KiB. The Nodes list, which shows
each GPU, asks for its page of rows whole (/api/nodes), and /api/cluster without `since` is the whole view as the
watcher made it (scripts).
`Changes.body(since)` is then /api/cluster's answer: the whole view, or, for a version this process gave within the
last `KEPT` refreshes, only the rows changed since, the names of the nodes gone and the usage history points newer
than that version (`Changes.since(since)`: the same as a record). Each answer is bytes made once per refresh and
shared: the whole view by every browser that asks for it, a delta by every browser that asks with the same version
(most ask with the one before).

A version is `EPOCH.N`: EPOCH is random per process (a browser's version of another server start names no state
of this one: it gets the whole view), N counts the views taken.

What is not a change: a row's `agent.answered` and `agent.readings_time` (`_UNSHOWN`) move at every answer of its
agent; the page's script shows `answered` only beside the agent's error, and that error's coming is a change, after
which `answered` stands still. The rows served keep them as of the row's last change; `PageView.data` keeps them
current for the server's own routes.

Thread-safety: one writer (`take`; a lock makes a request thread's `take` of a view the refresh thread did not take
safe too) and many readers (`since`, `body`), who read an immutable snapshot swapped in whole.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .watch import PageView

__all__ = ["Changes", "Delta", "KEPT", "VERSION", "FIGURES", "figures_of", "finite", "json_bytes"]

#: refreshes whose changes are kept (at web.refresh 5 s: a minute): a browser whose version is older (a laptop
#: that slept) gets the whole view, made once a refresh; each version asked within has a delta made and kept, so
#: a client that asks with every version it was given costs at most this many
KEPT = 12
#: a version as /api/cluster gives it and takes it back in `since`
VERSION = re.compile(r"^[0-9a-f]{1,16}\.[0-9]{1,12}\Z")
#: the fields of a row's `agent` that move at every answer and are not a change (the module's docstring)
_UNSHOWN = ("answered", "readings_time")
#: what a node's figures are, in order (`figures_of`)
FIGURES = ("utilization", "memory_used_mib", "memory_total_mib", "temperature", "idle")
_NO_FIGURES = [None, None, None, None, 0]
#: gzip's level for the shared bodies: made once a refresh, 6 costs 4 ms a 400 KiB delta
_GZIP_LEVEL = 6
#: what a row as the page holds it leaves out: its GPUs' readings, and its figures (sent apart)
_APART = ("gpu_readings", "figures")


@dataclass(frozen=True, slots=True)
class Delta:
    """What changed since a version: what a browser at that version merges to be at `version`."""

    #: the version this brings the browser to
    version: str
    #: each row changed (or added) since, as JSON, in the view's order
    rows: tuple[bytes, ...]
    #: each node's figures that changed since (FIGURES), by name
    figures: dict
    #: the names of the nodes gone since (a node gone and back is in `rows`)
    removed: tuple[str, ...]
    #: the usage history points (data["usage"]["history"]) newer than the browser's version
    history: list


@dataclass(frozen=True, slots=True)
class _Row:
    """One node row as kept."""

    #: the row as served (JSON, without its GPU readings), as of its last change
    body: bytes
    #: the row of the last view taken, but its GPU readings and its _UNSHOWN fields
    shown: dict
    #: the version number at which it last changed
    changed: int
    #: its figures (FIGURES), and the version number at which they last changed
    figures: list
    figures_changed: int
    #: the view's row it was made of: the watcher hands the same row again while nothing in it changed
    row: dict


@dataclass(frozen=True, slots=True)
class _Step:
    """What one taken view changed but its rows (each row says when it last changed)."""

    number: int
    #: the names of the nodes the view before had and this one has not
    removed: frozenset
    #: the epoch of the newest usage history point of that view (None: none yet)
    newest_point: float | None


@dataclass
class _Snapshot:
    """Everything one taken view answers from; never changed after it is swapped in but for its caches."""

    view: object
    version: str
    number: int
    #: each node's row by name, in the view's order
    rows: dict
    #: the last KEPT views' steps, oldest first (this view's last)
    steps: tuple
    #: the view's data but its nodes
    rest: dict
    #: the bodies made, by (the version number a delta answers, or None for the whole view; gzipped)
    bodies: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Changes:
    """The node rows of the views taken, each with the version at which it last changed, and the changes of the
    last `kept` views."""

    def __init__(self, kept: int = KEPT, epoch: str | None = None):
        self.kept = kept
        #: this process's part of every version (random: another start gives other versions)
        self.epoch = epoch or secrets.token_hex(4)
        self._snapshot: _Snapshot | None = None
        self._writing = threading.Lock()

    @property
    def version(self) -> str | None:
        """The version of the last view taken (None before the first)."""
        snapshot = self._snapshot
        return snapshot.version if snapshot is not None else None

    def take(self, view: PageView) -> str:
        """Take a refresh's view and answer its version; the view taken last again: nothing done. Each view is
        compared with the one taken before it, whichever that was: a request thread that comes late with the view
        before the last makes a version of it, and the next take brings every browser back to the newest."""
        with self._writing:
            last = self._snapshot
            if last is not None and last.view is view:
                return last.version
            number = last.number + 1 if last is not None else 1
            before = last.rows if last is not None else {}
            rows = {}
            data = view.data
            for row in data.get("nodes") or []:
                name = str(row.get("name", ""))
                kept = before.get(name)
                if kept is not None and kept.row is row:  # the same row: nothing to compare
                    rows[name] = kept
                    continue
                shown, figures = _shown(row), row.get("figures") or _NO_FIGURES
                moved = number if kept is None or kept.figures != figures else kept.figures_changed
                if kept is not None and kept.shown == shown:  # compared as values: no serialising
                    rows[name] = _Row(kept.body, shown, kept.changed, figures, moved, row)
                else:  # serialised once, and only what changed
                    rows[name] = _Row(json_bytes(_served(row, shown)), shown, number, figures, moved, row)
            step = _Step(number, frozenset(before.keys() - rows.keys()), _newest_point(data))
            steps = ((last.steps if last is not None else ()) + (step,))[-self.kept:]
            rest = {key: value for key, value in data.items() if key != "nodes"}
            self._snapshot = _Snapshot(view, f"{self.epoch}.{number}", number, rows, steps, rest)
            return self._snapshot.version

    def since(self, version: str | None) -> Delta | None:
        """What changed since `version`; None for the first view, or a version this process did not give within its
        last `kept` views (or None): such a browser gets the whole view."""
        snapshot = self._snapshot
        number = self._known(snapshot, version)
        if number is None:
            return None
        return self._delta(snapshot, number)

    def body(self, since: str | None = None, zipped: bool = False) -> bytes:
        """/api/cluster's answer (JSON) for a browser at version `since`: the view's data with "version" and
        "full": true, or, where `since` is known, the delta ("full": false, "nodes": the rows changed, "removed":
        names, usage "history": the points newer than `since`). Made once per view (per `since`) and shared;
        `zipped`: gzipped (once too): at 10,000 nodes whose GPUs all moved, the figures alone are some 400 KiB,
        gzipped some 50.

        Raises:
            LookupError: no view was taken yet."""
        snapshot = self._snapshot
        if snapshot is None:
            raise LookupError("no view taken yet")
        number = self._known(snapshot, since)
        key = (number, zipped)
        with snapshot.lock:
            found = snapshot.bodies.get(key)
            if found is not None:
                return found
            plain = snapshot.bodies.get((number, False))
            if plain is None:
                plain = snapshot.bodies[(number, False)] = self._made(snapshot, number)
            if zipped:
                found = snapshot.bodies[key] = gzip.compress(plain, compresslevel=_GZIP_LEVEL, mtime=0)
            return found or plain

    def _made(self, snapshot: _Snapshot, number: int | None) -> bytes:
        if number is None:
            figures = {name: row.figures for name, row in snapshot.rows.items()}
            return _body({**snapshot.rest, "version": snapshot.version, "full": True, "figures": figures},
                         [row.body for row in snapshot.rows.values()])
        delta = self._delta(snapshot, number)
        rest = {**snapshot.rest, "version": delta.version, "full": False, "removed": list(delta.removed),
                "figures": delta.figures}
        if isinstance(rest.get("usage"), dict):
            rest["usage"] = {**rest["usage"], "history": delta.history}
        return _body(rest, delta.rows)

    def _known(self, snapshot: _Snapshot | None, version: str | None) -> int | None:
        """The number of `version` where its changes are kept (the last KEPT versions), else None: a browser asks with
        the version before; one that slept, or a client that asks with every version it was given, gets the whole
        view, which is made once a refresh, where a delta is made and kept for each version asked."""
        if snapshot is None or not version or not VERSION.match(version):
            return None
        epoch, _, number = version.partition(".")
        if epoch != self.epoch:
            return None
        number = int(number)
        return number if snapshot.steps[0].number <= number <= snapshot.number else None

    @staticmethod
    def _delta(snapshot: _Snapshot, number: int) -> Delta:
        removed, newest = set(), None
        for step in snapshot.steps:
            if step.number == number:
                newest = step.newest_point
            elif step.number > number:
                removed |= step.removed
        rows = tuple(row.body for row in snapshot.rows.values() if row.changed > number)
        figures = {name: row.figures for name, row in snapshot.rows.items() if row.figures_changed > number}
        history = _points(snapshot.rest)
        if newest is not None:
            history = [point for point in history if point[0] > newest]
        return Delta(snapshot.version, rows, figures, tuple(sorted(removed - snapshot.rows.keys())), history)


def figures_of(gpus, idle: int) -> list:
    """A node's figures (FIGURES) from its GPUs as the page shows them (usage.GpuRow) and how many are flagged idle:
    their mean utilization (whole percent), memory used and in all (whole MiB), the hottest's temperature; None
    where no GPU says it. The watcher puts them in the node's row ("figures")."""
    def whole(values: list) -> int | None:  # a sum of an agent's finite figures may be none (1e308 + 1e308)
        found = sum(value for value in values if value is not None)
        return round(found) if values and math.isfinite(found) else None
    busy = [g.utilization for g in gpus if g.utilization is not None]
    hot = [g.temperature for g in gpus if g.temperature is not None]
    mean = whole(busy)
    return [round(mean / len(busy)) if mean is not None else None,
            whole([g.memory_used_mib for g in gpus if g.memory_used_mib is not None]),
            whole([g.memory_total_mib for g in gpus if g.memory_total_mib is not None]),
            max(hot) if hot else None, idle]


def _served(row: dict, shown: dict) -> dict:
    """The row as /api/cluster?since= serves it: `shown` with its agent's _UNSHOWN fields as they are now."""
    return {**shown, "agent": row["agent"]} if "agent" in row else shown


def _shown(row: dict) -> dict:
    """`row` but its GPU readings and figures (_APART) and its agent's _UNSHOWN fields (shallow copies: the view's
    row is not touched)."""
    shown = {key: value for key, value in row.items() if key not in _APART}
    agent = row.get("agent")
    if isinstance(agent, dict) and any(key in agent for key in _UNSHOWN):
        shown["agent"] = {key: value for key, value in agent.items() if key not in _UNSHOWN}
    return shown


def _points(rest: dict) -> list:
    usage = rest.get("usage")
    history = usage.get("history") if isinstance(usage, dict) else None
    return [point for point in history if isinstance(point, (list, tuple)) and point
            and isinstance(point[0], (int, float))] if isinstance(history, list) else []


def _newest_point(data: dict) -> float | None:
    points = _points(data)
    return points[-1][0] if points else None


def finite(value):
    """`value` with every NaN and infinity made None (JSON has neither; watch.py makes the view's body so too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_bytes(value) -> bytes:
    """`value` as JSON, as the watcher serialises the view: a NaN or infinity of an agent's answer made null."""
    try:
        return json.dumps(value, default=str, allow_nan=False).encode()
    except ValueError:
        return json.dumps(finite(value), default=str).encode()


def _body(rest: dict, rows) -> bytes:
    """`rest` as a JSON object with "nodes": the rows (each JSON already) joined in, not serialised again."""
    head = json_bytes(rest)
    return head[:-1] + (b", " if len(head) > 2 else b"") + b'"nodes": [' + b", ".join(rows) + b"]}"

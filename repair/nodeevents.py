"""The agents' journals as the controller's collector took them: one table of node events, one cursor per node.

`history`, the page's timeline and its Health checks tab read `node_events`
with one query whatever the number of nodes, instead of asking every agent.
The collector (`collector`) writes a batch of pages with `take`, in one
transaction: each page's events and its node's cursor move together, so a
collector stopped at any moment either took a page or did not, and a page is
never taken twice. Under the writers' lock it first compares each page's
starting cursor with the stored one: a page read from a cursor that is no
longer the node's (a second collector took it meanwhile) is dropped whole.

Each row keeps the columns a question filters on (time, node, component,
event, severity, check: each indexed with time) and the event's own fields
as JSON. Values are cut to their columns' sizes here, whatever a hand-written
journal line holds. `prune` keeps the table within its age and its count.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from slurm_ext.agentapi import HealthAnswer
from slurm_ext.words import moment

if TYPE_CHECKING:
    from .store import Store

__all__ = ["NodeEvent", "Cursor", "Page", "StoredHealth", "schema", "take", "failed", "events", "cursors", "failing",
           "forget_errors", "health", "findings", "newest_runs", "lost_marks", "prune", "row_of", "LOST", "REFUSED"]

#: the node_events rows the collector writes for a node whose journal lost lines before they were taken, and for a
#: page of it the database refused (component repair, so they are told apart from the node's own events)
LOST = "journal-lost"
REFUSED = "journal-refused"
#: the most characters kept of a message, and of the fields as JSON (a journal line is at most 4 MiB)
_MESSAGE_CHARS = 8192
_FIELDS_CHARS = 4 * 2**20
#: the rows of one INSERT, and the nodes of one IN (...)
_CHUNK = 1000
#: rows removed by one DELETE when pruning: the writers' lock is never held long
_PRUNE_CHUNK = 20000
_HEAD = ("time", "component", "event", "severity", "message")
#: what a line written by hand, or by an older slurm-ext, may lack
_OPTIONAL = ("severity", "message")


def schema(autoincrement: str, text: str, long_text: str, options: str = "") -> list[str]:
    """The tables and their indexes (made with the repair tables: store._schema); `options` end each CREATE TABLE
    (MariaDB's character set: every character a journal holds, emoji included)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS node_events (
            id {autoincrement}, time DOUBLE NOT NULL, node VARCHAR(255) NOT NULL, component VARCHAR(64) NOT NULL,
            event VARCHAR(64) NOT NULL, severity VARCHAR(16) NOT NULL, check_name VARCHAR(64) NOT NULL,
            message {text} NOT NULL, fields {long_text} NOT NULL){options}""",
        f"""CREATE TABLE IF NOT EXISTS journal_cursors (
            node VARCHAR(255) PRIMARY KEY, cursor_at VARCHAR(40) NOT NULL, boot VARCHAR(64) NOT NULL,
            taken BIGINT NOT NULL, lost BIGINT NOT NULL, collected DOUBLE NOT NULL, error {text} NOT NULL,
            failing_since DOUBLE NOT NULL){options}""",
        f"""CREATE TABLE IF NOT EXISTS node_health (
            node VARCHAR(255) PRIMARY KEY, taken DOUBLE NOT NULL, findings {long_text} NOT NULL,
            body {long_text} NOT NULL){options}""",
        "CREATE INDEX IF NOT EXISTS node_health_taken ON node_health (taken)",
        "CREATE INDEX IF NOT EXISTS node_events_time ON node_events (time)",
        "CREATE INDEX IF NOT EXISTS node_events_node_time ON node_events (node, time)",
        "CREATE INDEX IF NOT EXISTS node_events_component_time ON node_events (component, time)",
        "CREATE INDEX IF NOT EXISTS node_events_check_time ON node_events (check_name, time)",
        "CREATE INDEX IF NOT EXISTS node_events_severity_time ON node_events (severity, time)",
    ]


@dataclass(frozen=True, slots=True)
class NodeEvent:
    id: int
    #: epoch seconds (the journal's whole second)
    time: float
    node: str
    component: str
    event: str
    severity: str
    message: str
    #: the event's own fields (check, gpu, job, evidence, results, ...)
    fields: dict

    def data(self) -> dict:
        """The event as its journal line held it (what the timeline's readers of a journal line take)."""
        return {"time": moment(self.time),
                "component": self.component, "event": self.event, "severity": self.severity,
                "message": self.message, **self.fields}


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the collector is in a node's journal, and how its collection goes."""

    node: str
    cursor: str = ""
    #: the agent's boot id at its last answer
    boot: str = ""
    #: events taken in all
    taken: int = 0
    #: pages that began at the oldest file kept because the cursor's was gone (lines lost before they were taken)
    lost: int = 0
    #: its last answer (epoch seconds; 0: never)
    collected: float = 0.0
    #: why its agent gave no page, since when ("" and 0 while it answers)
    error: str = ""
    failing_since: float = 0.0


@dataclass(frozen=True, slots=True)
class Page:
    """One answer of a node's agent, ready to be taken: the cursor it was read from and the one after it."""

    node: str
    start: str
    cursor: str
    boot: str
    #: rows as `row_of` makes them
    rows: list = field(default_factory=list)
    lost: bool = False
    #: lines that were no journal event (not JSON, no time): counted, not stored
    odd: int = 0
    #: the bytes of its lines (what it holds in the collector's memory)
    size: int = 0
    #: events the database refused: set aside, only a mark of them is stored
    refused: int = 0
    #: the agent's /health answer asked with the page (HealthAnswer.wire() as JSON), "" when not asked this time
    health: str = ""
    #: its monitor's open findings (JSON): what `status` reads of it, without the GPUs' readings
    findings: str = "[]"
    #: when the answer came (the collector's clock): a page that waited for the database is not stamped fresh
    health_at: float = 0.0


@dataclass(frozen=True, slots=True)
class StoredHealth:
    """A node's /health answer as the collector took it."""

    node: str
    #: when the collector took it (the controller's clock, epoch seconds)
    taken: float
    answer: HealthAnswer


def row_of(node: str, line: bytes) -> tuple | None:
    """The node_events row of one journal line (without its id), None when it is no journal event."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            return None
        head = [data.get(key, "" if key in _OPTIONAL else None) for key in _HEAD]
        if not all(isinstance(value, str) for value in head):
            return None
        parsed = datetime.fromisoformat(head[0])
        when = (parsed if parsed.tzinfo else parsed.astimezone()).timestamp()
    except (ValueError, RecursionError, OverflowError, OSError):
        return None
    rest = {key: value for key, value in data.items() if key not in _HEAD}
    check = rest.get("check") if data["component"] == "health" else ""
    head = [_utf8(text) for text in head]
    try:
        fields = json.dumps(rest)  # ASCII: a lone surrogate is escaped, as the journal held it
    except (ValueError, RecursionError):
        return None
    if len(fields) > _FIELDS_CHARS:
        fields = json.dumps({"cut": f"{len(fields)} characters of fields, more than {_FIELDS_CHARS}"})
    return (when, node[:255], head[1][:64], head[2][:64], head[3][:16] or "info",
            _utf8(check[:64]) if isinstance(check, str) else "", head[4][-_MESSAGE_CHARS:], fields)


def _utf8(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (an escaped one in a line, or text decoded with surrogateescape:
    a file name, a script's output) is replaced, or no database driver takes the row, nor the batch it is in."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()


def take(store: Store, pages: list[Page], now: float | None = None) -> tuple[int, list[str]]:
    """Store `pages` and move their nodes' cursors, all in one transaction. Returns (events stored, nodes whose page
    was dropped: its start is no longer the stored cursor)."""
    now = time.time() if now is None else now
    with store.locked("slurm_ext_collector"):
        stored = _cursors(store, [page.node for page in pages])
        taken, dropped, rows, updates, answers = 0, [], [], [], []
        for page in pages:
            before = stored.get(page.node, Cursor(page.node))
            if before.cursor != page.start:
                dropped.append(page.node)
                continue
            rows += page.rows
            stored[page.node] = Cursor(page.node, page.cursor)  # a second page from the same start is dropped
            if page.lost:
                rows.append((now, page.node, "repair", LOST, "warning", "",
                             f"the node's journal had lines that were rotated out before the collector took them "
                             f"(its cursor {page.start} was gone): its events there are missing", "{}"))
            if page.refused:
                rows.append((now, page.node, "repair", REFUSED, "error", "",
                             f"the database refused {page.refused} event(s) of the node's journal after cursor "
                             f"{page.start}: they are missing (the collector's log says why)", "{}"))
            taken += len(page.rows)
            if page.health:
                answers.append((page.node, page.health_at or now, page.findings, page.health))
            updates.append((page.node, page.cursor, page.boot[:64], before.taken + len(page.rows),
                            before.lost + page.lost, now, "", 0.0))
        for start in range(0, len(rows), _CHUNK):
            store._many("INSERT INTO node_events (time, node, component, event, severity, check_name, message, "
                        "fields) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows[start:start + _CHUNK])
        _put(store, updates)
        for start in range(0, len(answers), _CHUNK):
            store._many("REPLACE INTO node_health (node, taken, findings, body) VALUES (?, ?, ?, ?)",
                        answers[start:start + _CHUNK])
    return taken, dropped


def failed(store: Store, problems: dict[str, str], now: float | None = None) -> None:
    """Record why each node's agent gave no page (its cursor stays); the first failure of a run sets since when."""
    now = time.time() if now is None else now
    with store.locked("slurm_ext_collector"):
        stored = _cursors(store, list(problems))
        updates = []
        for node, problem in problems.items():
            before = stored.get(node, Cursor(node))
            updates.append((node, before.cursor, before.boot, before.taken, before.lost, before.collected,
                            problem[:2000], before.failing_since or now))
        _put(store, updates)


def events(store: Store, since: float, until: float | None = None, node: str | None = None,
           components: tuple[str, ...] = (), check: str = "", severities: tuple[str, ...] = (),
           text: str = "", but: tuple[str, ...] = (), names: tuple[str, ...] = (),
           limit: int = 100000) -> list[NodeEvent]:
    """The stored events from `since` (and before `until`), oldest first, the newest `limit` of them: of `node`,
    of `components` (none of `but`), of health check `check`, of `severities`, whose `component/event` holds
    `text` (the page's filter, asked of the database so that `limit` counts what is kept)."""
    where, args = ["time >= ?"], [since]
    if text:
        clause, more = _holding(text)
        where.append(clause)
        args += more
    if but:
        where.append(f"component NOT IN ({', '.join('?' * len(but))})")
        args += list(but)
    if until is not None:
        where.append("time < ?")
        args.append(until)
    if node is not None:
        where.append("node = ?")
        args.append(node)
    if check:
        where.append("check_name = ?")
        args.append(check)
    for column, values in (("component", components), ("severity", severities), ("event", names)):
        if values:
            where.append(f"{column} IN ({', '.join('?' * len(values))})")
            args += list(values)
    rows = store._execute("SELECT id, time, node, component, event, severity, message, fields FROM node_events "
                          f"WHERE {' AND '.join(where)} ORDER BY time DESC, id DESC LIMIT {int(limit)}", tuple(args))
    return [_event(row) for row in reversed(rows)]


def _holding(text: str) -> tuple[str, list]:
    """The condition that `component/event` holds `text`, in SQL both databases take (no concatenation: SQLite's
    `||` is MariaDB's OR). Neither name holds a slash, so a text with one is a component's end and an event's
    start, and one with two matches nothing."""
    def like(part: str) -> str:
        return part.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    escape = " ESCAPE '!'"  # not a backslash: MariaDB reads one in a literal as an escape, SQLite does not
    if text.count("/") > 1:
        return "1 = 0", []
    if "/" in text:
        left, right = text.split("/")
        return (f"component LIKE ?{escape} AND event LIKE ?{escape}", [f"%{like(left)}", f"{like(right)}%"])
    return f"(component LIKE ?{escape} OR event LIKE ?{escape})", [f"%{like(text)}%"] * 2


def cursors(store: Store, nodes: list[str] | None = None) -> dict[str, Cursor]:
    """Every node's cursor row (of `nodes` only, when given)."""
    return _cursors(store, nodes)


def failing(store: Store, nodes: list[str] | None = None) -> dict[str, Cursor]:
    """The cursor rows of the nodes whose agent the collector failed to reach after its last answer (of `nodes`
    only, when given): what `status`, `history` and the page say of them. A few rows, where every cursor is 10,000
    at that size."""
    return _cursors(store, nodes, "error <> ''")


def health(store: Store, since: float = 0.0, held: dict[str, float] | None = None) -> dict[str, StoredHealth]:
    """Each node's /health answer the collector took at `since` or after (the controller's clock), but those whose
    time is the one in `held` (node -> the time of the answer a reader holds): a reader that keeps them reads the
    times of the last few intervals, then only the answers it lacks, whatever order the collector's transactions
    committed in. A row that is no health answer (written by hand, or by another version) is left out: its node is
    then asked directly."""
    held = held or {}
    times = store._execute("SELECT node, taken FROM node_health WHERE taken >= ?", (since,))
    wanted = [node for node, taken in times if held.get(node) != float(taken)]
    rows = []
    for start in range(0, len(wanted), _CHUNK):
        part = wanted[start:start + _CHUNK]
        rows += store._execute(f"SELECT node, taken, body FROM node_health WHERE node IN "
                               f"({', '.join('?' * len(part))})", tuple(part))
    found = {}
    for node, taken, body in rows:
        try:
            found[node] = StoredHealth(node, float(taken), HealthAnswer.of(json.loads(body)))
        except (ValueError, RecursionError):  # agentapi says an odd answer with a ValueError
            continue
    return found


def findings(store: Store, since: float = 0.0) -> dict[str, tuple]:
    """Each node's open findings as its /health answer the collector took at `since` or after said them: `status`'s
    question, a few hundred bytes a node where the whole answer is some 2.5 KiB. A row that is no list of findings is
    left out (its node is then asked directly)."""
    found = {}
    for node, text in store._execute("SELECT node, findings FROM node_health WHERE taken >= ?", (since,)):
        try:
            listed = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(listed, list):
            found[node] = tuple(item for item in listed if isinstance(item, dict))
    return found


def forget_errors(store: Store, nodes: list[str]) -> None:
    """Clear the failures of nodes Slurm no longer lists (their cursors stay: a node listed again goes on from
    it), so that the history does not name them as unreachable for ever."""
    with store.locked("slurm_ext_collector"):
        for start in range(0, len(nodes), _CHUNK):
            part = nodes[start:start + _CHUNK]
            store._execute(f"UPDATE journal_cursors SET error = '', failing_since = 0 WHERE error <> '' AND node IN "
                           f"({', '.join('?' * len(part))})", tuple(part))


def newest_runs(store: Store, since: float) -> dict[str, NodeEvent]:
    """Each node's newest acceptance-done since `since`: its last acceptance run as its journal told it. One query
    whatever the number of runs (the newest row id of each node, then those rows)."""
    rows = store._execute(
        "SELECT id, time, node, component, event, severity, message, fields FROM node_events WHERE id IN ("
        "SELECT MAX(id) FROM node_events WHERE component = 'acceptance' AND event = 'acceptance-done' AND time >= ? "
        "GROUP BY node)", (since,))
    return {found.node: found for found in map(_event, rows)}


def lost_marks(store: Store, since: float, node: str | None = None) -> dict[str, NodeEvent]:
    """The newest journal-lost or journal-refused row of each node since `since` (of `node` only, when given): what
    its history lacks. One query on the component's index, whatever the number of events."""
    found = events(store, since, node=node, components=("repair",), names=(LOST, REFUSED), limit=100000)
    return {mark.node: mark for mark in found}


def prune(store: Store, keep: float, most: int, now: float | None = None) -> int:
    """Remove the events older than `keep` seconds and the oldest beyond about `most` rows, _PRUNE_CHUNK at a time
    (the writers' lock is never held long); the count removed. The count is of ids, which only grow (the rows
    beyond `most` are those more than `most` ids below the newest), so no table scan counts rows."""
    oldest = (time.time() if now is None else now) - keep
    with store.locked("slurm_ext_collector"):  # a node gone from slurm.conf for longer than the events are kept
        store._run("DELETE FROM node_health WHERE taken < ?", (oldest,))
    removed = 0
    while True:
        with store.locked("slurm_ext_collector"):
            high = store._execute("SELECT MAX(id) FROM node_events")[0][0]
            if high is None:
                return removed
            over = store._execute("SELECT id FROM node_events WHERE id <= ? ORDER BY id LIMIT 1 OFFSET ?",
                                  (int(high) - most, _PRUNE_CHUNK))
            _, by_count, _ = store._run("DELETE FROM node_events WHERE id <= ?",
                                        (int(over[0][0]) if over else int(high) - most,))
            after = store._execute("SELECT time FROM node_events WHERE time < ? ORDER BY time LIMIT 1 OFFSET ?",
                                    (oldest, _PRUNE_CHUNK))
            _, by_age, _ = store._run("DELETE FROM node_events WHERE time < ?",
                                      (float(after[0][0]) if after else oldest,))
        removed += max(by_count, 0) + max(by_age, 0)
        if not over and not after:
            return removed


def _cursors(store: Store, nodes: list[str] | None, where: str = "1 = 1") -> dict[str, Cursor]:
    columns = "node, cursor_at, boot, taken, lost, collected, error, failing_since"
    if nodes is None:
        rows = store._execute(f"SELECT {columns} FROM journal_cursors WHERE {where}")
    else:
        rows = []
        for start in range(0, len(nodes), _CHUNK):
            part = nodes[start:start + _CHUNK]
            rows += store._execute(f"SELECT {columns} FROM journal_cursors WHERE {where} AND node IN "
                                   f"({', '.join('?' * len(part))})", tuple(part))
    return {n: Cursor(n, c, b, int(t), int(lo), float(co), e, float(f)) for n, c, b, t, lo, co, e, f in rows}


def _put(store: Store, updates: list[tuple]) -> None:
    for start in range(0, len(updates), _CHUNK):
        store._many("REPLACE INTO journal_cursors (node, cursor_at, boot, taken, lost, collected, error, "
                    "failing_since) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", updates[start:start + _CHUNK])


def _event(row: tuple) -> NodeEvent:
    """A node_events row as `events` and `newest_runs` select it (id, time, node, component, event, severity, message,
    fields)."""
    i, t, n, c, e, s, m, f = row
    return NodeEvent(int(i), float(t), n, c, e, s, m, _fields(f))


def _fields(text: str) -> dict:
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}

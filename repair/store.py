"""The durable record of recommendations, decisions and repair steps.

One record per node and fault: recommended -> approved -> running (its
`step` says where) -> done or failed; or rejected, or gone (the fault
cleared before anyone decided). A record is open until its fault is over
and it is decided (closed set); the service reads the open ones at every
pass, so a controller agent restarted in the middle of a repair carries on
from the step its record names. Every change is also a row of
repair_events: that table is the repair history.

Two backends, the same tables: MariaDB (a database of slurm-ext's own on
the accounting server: same volume, same backups) through PyMySQL, and
SQLite (a file on the controller's state volume) where a cluster has no
accounting database. Writers serialise on one lock (MariaDB's GET_LOCK,
SQLite's BEGIN IMMEDIATE), and every state change is a compare-and-set on
the state it expects, so two operators approving at once, or an operator
and the service, never both win.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from slurm_ext.errors import SlurmExtError

from . import nodeevents

__all__ = ["Record", "Event", "Store", "StoreError", "open_store", "IN_PROGRESS", "ACTS"]

#: states that count against the guard: a repair is under way
IN_PROGRESS = ("approved", "running")
#: what a repair step does to its node right after it is recorded (Event.acts): the history lists what Slurm and the
#: node's agent say in the same whole second after the step that caused it
ACTS = ("drain", "requeue", "reset-gpu", "reboot", "executor", "resume")

_LOCK_TIMEOUT = 30


class StoreError(SlurmExtError):
    """The repair database cannot be reached or written; the message names it."""


@dataclass
class Record:
    node: str
    #: the fault's name: a health check, or check/code (xid/79)
    signature: str
    #: reboot, reprovision, failover, remove
    action: str
    evidence: str
    #: job ids on the node when last seen
    jobs: list = field(default_factory=list)
    state: str = "recommended"
    #: the step a running repair is at: drain, wait-jobs, act, wait-boot, verify, resume
    step: str = ""
    opened: float = 0.0
    updated: float = 0.0
    #: set once the record needs nothing more (decided and its fault over, or finished)
    closed: float | None = None
    decided_by: str = ""
    decided_at: float | None = None
    #: the operator's words (a rejection's reason)
    note: str = ""
    #: step data: when the reboot was issued, the node's boot time before it, ...
    detail: dict = field(default_factory=dict)
    id: int | None = None


@dataclass(frozen=True, slots=True)
class Event:
    time: float
    node: str
    event: str
    message: str
    user: str = ""
    record: int | None = None
    #: one of ACTS when the step acts on the node just after this moment, else empty (a decision, an observation)
    acts: str = ""


_RECORD_COLUMNS = [f.name for f in fields(Record) if f.name != "id"]
_JSON_COLUMNS = ("jobs", "detail")


def _schema(autoincrement: str, text: str, long_text: str, options: str = "") -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS repair_records (
            id {autoincrement}, node VARCHAR(255) NOT NULL, signature VARCHAR(255) NOT NULL,
            action VARCHAR(32) NOT NULL, evidence {text} NOT NULL, jobs {text} NOT NULL, state VARCHAR(32) NOT NULL,
            step VARCHAR(32) NOT NULL, opened DOUBLE NOT NULL, updated DOUBLE NOT NULL, closed DOUBLE,
            decided_by VARCHAR(255) NOT NULL, decided_at DOUBLE, note {text} NOT NULL, detail {text} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS repair_events (
            id {autoincrement}, time DOUBLE NOT NULL, node VARCHAR(255) NOT NULL, event VARCHAR(64) NOT NULL,
            message {text} NOT NULL, user VARCHAR(255) NOT NULL, record BIGINT,
            acts VARCHAR(16) NOT NULL DEFAULT '')""",
        f"""CREATE TABLE IF NOT EXISTS repair_control (
            name VARCHAR(64) PRIMARY KEY, value {text} NOT NULL, user VARCHAR(255) NOT NULL, time DOUBLE NOT NULL)""",
        # every pass reads the open records; history and status read events by node and time
        "CREATE INDEX IF NOT EXISTS repair_records_open ON repair_records (closed, node)",
        "CREATE INDEX IF NOT EXISTS repair_events_node_time ON repair_events (node, time)",
        "CREATE INDEX IF NOT EXISTS repair_events_time ON repair_events (time)",
        *nodeevents.schema(autoincrement, text, long_text, options),
    ]


class Store:
    """The tables over one DB-API connection. `where` names the database in every error."""

    def __init__(self, connection, where: str, placeholder: str, lock_sql: tuple[str, str] | None, ping=None):
        self._db = connection
        self.where = where
        self._ph = placeholder
        self._lock_sql = lock_sql
        #: reconnects a server connection that was lost (MariaDB restarted, wait_timeout): None for a file
        self._ping = ping

    # -- plumbing -------------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self._ph)

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._run(sql, args)[0]

    def _many(self, sql: str, rows: list[tuple]) -> None:
        """One statement for many rows (PyMySQL sends an INSERT's or REPLACE's rows as one statement)."""
        if not rows:
            return
        try:
            cursor = self._db.cursor()
            cursor.executemany(self._sql(sql), rows)
            cursor.close()
        except Exception as err:
            raise StoreError(f"repair database {self.where}: {err}") from err

    def _run(self, sql: str, args: tuple = ()) -> tuple[list[tuple], int, int | None]:
        """(rows, rows changed, the id of a row inserted)."""
        try:
            cursor = self._db.cursor()
            cursor.execute(self._sql(sql), args)
            rows = list(cursor.fetchall()) if cursor.description else []
            result = rows, cursor.rowcount, cursor.lastrowid
            cursor.close()
            return result
        except Exception as err:  # both drivers' errors: one message naming the database
            raise StoreError(f"repair database {self.where}: {err}") from err

    @contextlib.contextmanager
    def locked(self, name: str = "slurm_ext_repair") -> Iterator[None]:
        """One writer at a time, in one transaction: committed on success, rolled back on any error. `name`: the
        writers it keeps apart on MariaDB (the collector's own writes take another lock than the repairs'; SQLite
        has one writer per file)."""
        if self._ping is not None:  # a server connection lost since (MariaDB restarted) is made again here
            try:
                self._ping()
            except Exception as err:
                raise StoreError(f"repair database {self.where}: {err}") from err
        if self._lock_sql:  # MariaDB: a named lock held by this connection
            got = self._execute(self._lock_sql[0], (name, _LOCK_TIMEOUT))
            if not got or got[0][0] != 1:
                raise StoreError(f"repair database {self.where}: another writer held the lock for "
                                 f"{_LOCK_TIMEOUT}s")
        try:
            self._execute("START TRANSACTION" if self._lock_sql else "BEGIN IMMEDIATE")
            yield
            try:
                self._db.commit()
            except Exception as err:
                raise StoreError(f"repair database {self.where}: commit failed: {err}") from err
        except BaseException:
            with contextlib.suppress(Exception):
                self._db.rollback()
            raise
        finally:
            if self._lock_sql:
                with contextlib.suppress(StoreError):
                    self._execute(self._lock_sql[1], (name,))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._db.close()

    # -- records ----------------------------------------------------------------------

    def records(self, *, node: str | None = None, open_only: bool = False, states: tuple[str, ...] = (),
                since: float | None = None) -> list[Record]:
        """Records oldest first: of `node`, still open, in `states`, opened or updated since `since`."""
        where, args = [], []
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if open_only:
            where.append("closed IS NULL")
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args += list(states)
        if since is not None:
            where.append("updated >= ?")
            args.append(since)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._execute(f"SELECT id, {', '.join(_RECORD_COLUMNS)} FROM repair_records{clause} ORDER BY id",
                             tuple(args))
        return [_record(row) for row in rows]

    def get(self, record_id: int) -> Record | None:
        """One record by id, closed or not (None when there is no such record)."""
        rows = self._execute(f"SELECT id, {', '.join(_RECORD_COLUMNS)} FROM repair_records WHERE id = ?",
                             (record_id,))
        return _record(rows[0]) if rows else None

    def add(self, record: Record) -> Record:
        """Insert `record` (inside `locked()`); it gets its id."""
        values = _values(record)
        _, _, record.id = self._run(f"INSERT INTO repair_records ({', '.join(_RECORD_COLUMNS)}) "
                                    f"VALUES ({', '.join('?' * len(values))})", tuple(values))
        return record

    def save(self, record: Record, expect_state: str | None = None) -> bool:
        """Write `record` back; with `expect_state`, only if the stored one is still in that state (False if not)."""
        sets = ", ".join(f"{name} = ?" for name in _RECORD_COLUMNS)
        where, args = "id = ?", [record.id]
        if expect_state is not None:
            where += " AND state = ?"
            args.append(expect_state)
        _, changed, _ = self._run(f"UPDATE repair_records SET {sets} WHERE {where}", tuple(_values(record) + args))
        return expect_state is None or changed == 1

    # -- events -------------------------------------------------------------------------

    def event(self, node: str, event: str, message: str, user: str = "", record: Record | None = None,
              now: float | None = None, acts: str = "") -> Event:
        """Add one row to the history; `now` is the moment it happened (before the action it records), `acts` what
        the step does to the node next (one of ACTS), so the history can list the action's effects after it."""
        entry = Event(now or time.time(), node, event, message, user, record.id if record else None, acts)
        self._execute("INSERT INTO repair_events (time, node, event, message, user, record, acts) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (entry.time, entry.node, entry.event, entry.message, entry.user, entry.record, entry.acts))
        return entry

    def events(self, *, node: str | None = None, since: float | None = None, record: int | None = None,
               limit: int | None = None) -> list[Event]:
        """Events oldest first (the newest `limit` of them, when given)."""
        where, args = [], []
        for column, value in (("node", node), ("record", record)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        order = " ORDER BY time DESC, id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        rows = self._execute(f"SELECT time, node, event, message, user, record, acts FROM repair_events{clause}{order}",
                             tuple(args))
        return [Event(float(t), n, e, m, u, r, a) for t, n, e, m, u, r, a in reversed(rows)]

    def events_after(self, event_id: int, names: tuple[str, ...], limit: int = 1000) -> list[tuple[int, Event]]:
        """(id, event) of the events named `names` whose id is above `event_id`, oldest first, at most `limit`: what
        the notifier has not seen yet (ids only grow)."""
        rows = self._execute("SELECT id, time, node, event, message, user, record, acts FROM repair_events "
                             f"WHERE id > ? AND event IN ({', '.join('?' * len(names))}) "
                             f"ORDER BY id LIMIT {int(limit)}",
                             (event_id, *names))
        return [(int(i), Event(float(t), n, e, m, u, r, a)) for i, t, n, e, m, u, r, a in rows]

    def last_event_id(self) -> int:
        """The id of the newest event (0 when there is none)."""
        rows = self._execute("SELECT MAX(id) FROM repair_events")
        return int(rows[0][0] or 0) if rows else 0

    # -- the pause switch and other cluster-wide settings ----------------------------------------

    def control(self, name: str) -> tuple[str, str, float] | None:
        """(value, who set it, when) of a switch, or None when never set."""
        rows = self._execute("SELECT value, user, time FROM repair_control WHERE name = ?", (name,))
        return (rows[0][0], rows[0][1], float(rows[0][2])) if rows else None

    def set_control(self, name: str, value: str, user: str, now: float | None = None) -> None:
        self._execute("DELETE FROM repair_control WHERE name = ?", (name,))
        self._execute("INSERT INTO repair_control (name, value, user, time) VALUES (?, ?, ?, ?)",
                      (name, value, user, now or time.time()))


def _values(record: Record) -> list:
    data = asdict(record)
    return [json.dumps(data[name]) if name in _JSON_COLUMNS else data[name] for name in _RECORD_COLUMNS]


def _record(row: tuple) -> Record:
    data = dict(zip(["id", *_RECORD_COLUMNS], row))
    for name in _JSON_COLUMNS:
        empty = [] if name == "jobs" else {}
        try:
            value = json.loads(data[name] or "null")
        except ValueError:  # a column someone edited by hand: the record stays readable
            value = None
        data[name] = value if isinstance(value, type(empty)) else empty
    for name in ("opened", "updated"):
        data[name] = float(data[name])
    return Record(**data)


def open_sqlite(path: str, create: bool = True, hint: str = "") -> Store:
    """The store in an SQLite file, made (mode 600, its directory 700 if new) on first use; with `create` false
    (an operator's command) a missing file is an error, not a new empty history. `hint`: what to do, added to a
    failure to open it.

    Raises:
        StoreError: it cannot be opened, or is missing and not to be made (the message says which).
    """
    target = Path(path)
    try:
        there = target.exists()
    except OSError as err:  # a folder on the way this user may not enter
        raise StoreError(f"repair database {path}: cannot open it: {err.strerror or err}{hint}") from err
    if not create and not there:
        raise StoreError(f"repair database {path}: no such file: the repair service keeps it on the controller "
                         "(run this there, or set repair.sqlite_file / repair.database)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old_umask = os.umask(0o077)  # the file and its -wal, -shm beside it: root's alone
        try:
            connection = sqlite3.connect(str(target), timeout=_LOCK_TIMEOUT, isolation_level=None,
                                         check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old_umask)
    except (OSError, sqlite3.Error) as err:
        raise StoreError(f"repair database {path}: cannot open it: {err}{hint}") from err
    store = Store(_Autocommit(connection), path, "?", None)
    for statement in _schema("INTEGER PRIMARY KEY AUTOINCREMENT", "TEXT", "TEXT"):
        store._execute(statement)
    _upgrade(store)
    return store


def open_mariadb(host: str, port: int, user: str, password: str, database: str, timeout: float = 10.0,
                 make_tables: bool = True) -> Store:
    """The store in MariaDB database `database`, its tables made on first use unless `make_tables` is false (the
    page's account may not make or change tables: it finds those the repair service made)."""
    import pymysql  # only where a cluster keeps the history in MariaDB
    where = f"{database} on {host}:{port}"
    try:
        connection = pymysql.connect(host=host, port=port, user=user, password=password, connect_timeout=timeout,
                                     read_timeout=max(timeout, _LOCK_TIMEOUT + 5), write_timeout=timeout,
                                     autocommit=True, charset="utf8mb4")
        if make_tables:
            connection.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        connection.select_db(database)
    except pymysql.MySQLError as err:
        raise StoreError(f"repair database {where}: {err.args[-1] if err.args else err}") from err
    store = Store(connection, where, "%s", ("SELECT GET_LOCK(%s, %s)", "SELECT RELEASE_LOCK(%s)"),
                  ping=lambda: connection.ping(reconnect=True))
    if make_tables:
        for statement in mariadb_schema():
            store._execute(statement)
        _upgrade(store)
    return store


def mariadb_schema() -> list[str]:
    """The statements that make the tables in MariaDB (utf8mb4: every character a journal holds, emoji included)."""
    return _schema("BIGINT AUTO_INCREMENT PRIMARY KEY", "TEXT", "MEDIUMTEXT", " DEFAULT CHARSET=utf8mb4")


#: the columns a table written by an older slurm-ext lacks (CREATE TABLE IF NOT EXISTS leaves its table as it was):
#: table, column, its definition
_ADDED = (("repair_events", "acts", "VARCHAR(16) NOT NULL DEFAULT ''"),
          ("node_health", "findings", "MEDIUMTEXT NOT NULL DEFAULT '[]'"))


def _upgrade(store: Store) -> None:
    """Add the columns a history written by an older slurm-ext lacks. Its old rows keep the column's default: a
    repair event an empty `acts` (listed by its time alone, as it was), a node's answer no findings until the
    collector takes the next."""
    for table, column, definition in _ADDED:
        try:
            store._execute(f"SELECT {column} FROM {table} WHERE 1 = 0")
            continue
        except StoreError:
            pass
        try:
            store._execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        except StoreError:  # another process added it meanwhile: fine if it is there now
            store._execute(f"SELECT {column} FROM {table} WHERE 1 = 0")


class _Autocommit:
    """sqlite3 with isolation_level=None commits each statement by itself; inside BEGIN IMMEDIATE, commit() and
    rollback() end the transaction. This gives it the two methods PyMySQL's connection has."""

    def __init__(self, connection: sqlite3.Connection):
        self._connection = connection

    def cursor(self):
        return self._connection.cursor()

    def commit(self) -> None:
        if self._connection.in_transaction:
            self._connection.execute("COMMIT")

    def rollback(self) -> None:
        if self._connection.in_transaction:
            self._connection.execute("ROLLBACK")

    def close(self) -> None:
        self._connection.close()


def open_store(config, environ: dict[str, str] | None = None, create: bool = True, role: str = "repair") -> Store:
    """The store the config names ([repair] database; auto: MariaDB where the config gives slurm-ext the accounting
    database (run_database, or a password_file), else SQLite: decided from the file alone, so the service and an
    operator's shell pick the same). `create` false: an SQLite file that is not there is an error. `role`: who
    connects, repair (the service, an operator's shell) or page, each as its own database account where it has one
    (accounting.accounts); the page makes no MariaDB table (its account may not).

    Raises:
        StoreError: it cannot be opened (the message names it and why).
        ConfigError: MariaDB, but no password to reach it.
    """
    repair = config.repair
    from slurm_ext.accounting import database as accounting_db  # the accounting server's address and password
    kind = repair.database
    if kind == "auto":
        kind = "mariadb" if accounting_db.configured(config, {}) else "sqlite"
    if kind == "sqlite":
        # the file is root's alone (mode 600) unless an admin made it the page's: seen on the images' cluster
        return open_sqlite(repair.sqlite_file, create, "" if role != "page" else (
            "; the page runs as web.user, which must be able to read it (and, to record decisions, write it and its "
            "folder): or keep the history in MariaDB (repair.database = \"mariadb\", the page as its own account: "
            "docs/operator/web.md)"))
    from slurm_ext.accounting import accounts
    settings = config.accounting
    user, secret = accounts.login(settings, role, os.environ if environ is None else environ,
                                  config.source or "<defaults>")
    return open_mariadb(settings.db_host, settings.db_port, user, secret, settings.own_database,
                        make_tables=role != "page")

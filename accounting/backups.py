"""Backups of the accounting database that can be trusted: `backup`, `restore`, `verify`.

A dump that nobody has restored is a hope, not a backup. Each backup is one consistent
`mariadb-dump --single-transaction` of accounting.database with a manifest beside it (`dumpfile`),
authenticated by an HMAC under the backup key (`backupkey`, accounting.backup_key), and the manifest is
what the other two check against:

- `backup(config, to, keep)`: the dump streams through `RowCounter` while the same bytes are compressed,
  hashed and written, so the counts describe exactly the snapshot in the file (a `SELECT COUNT(*)`
  beside the dump would race slurmdbd's inserts). An incomplete dump is not kept; the newest `keep`
  backups of this cluster stay, newest by their manifests' times, and never without the new one.
- `restore(config, source)`: only a file that matches its authenticated manifest, only into a database
  nobody uses (slurmdbd stopped) that is new or empty, and only through an account that can write
  nothing else (the backup's SQL runs with its rights); the rows after loading must be the manifest's.
- `verify(source, key)`: the file against its authenticated manifest, then loaded into a scratch MariaDB
  (`scratch`, which reaches no file of the host) whose `SELECT COUNT(*)` of every table must be the
  manifest's.

The dump's text is SQL for the server only: every mariadb client runs with `sqlclient.CLIENT_SAFETY`,
and a dump that holds a command of the client is refused before it is loaded. The password reaches
mariadb-dump and mariadb only through a temporary 0600 option file, never a command line (which every
user can read in /proc).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from slurm_ext import fileio
from slurm_ext.config import Config
from slurm_ext.errors import CommandError, ConfigError, SlurmExtError

from . import accounts, database, sqlclient
from .backupkey import BackupKey, ensure_key, read_key
from .dumpfile import (CHUNK, BackupError, Manifest, RowCounter, free_name, manifest_path_for, open_dump,
                       read_manifest, retain, rows_text, scan)
from .render import sql_string
from .scratch import scratch_mariadb
from .settings import AccountingSection
from .sqlclient import DUMP_TIMEOUT, ident

__all__ = ["COMPRESS_LEVEL", "BackupError", "BackupResult", "RestoreResult", "VerifyResult", "backup", "restore",
           "verify"]

#: zlib level: 6 (gzip's default) makes a dump about a fifth smaller than 1 for three times the CPU, and a
#: backup holds the dump open on the live database that long
COMPRESS_LEVEL = 1
#: a consistent snapshot of InnoDB without locking slurmdbd out (--single-transaction), streamed row by
#: row (--quick), with everything slurmdbd creates; binary as hex, so the text holds no raw bytes. No
#: --databases: the dump names no database, so it can be restored under another name.
_DUMP_OPTIONS = ("--single-transaction", "--quick", "--routines", "--events", "--triggers", "--hex-blob",
                 "--no-tablespaces", "--max-allowed-packet=1G")


def _ignore(event: str, message: str, severity: str | None = None, **fields) -> None:
    """The default `emit`: no journal."""


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackupResult:
    #: the new backup (.sql.gz) and its manifest, beside it
    path: Path
    manifest_path: Path
    manifest: Manifest
    #: older backups (the .sql.gz files) deleted by retention, with their manifests
    removed: list[Path]
    seconds: float
    #: the backup of slurm-ext's own database (accounting.own_database: the repair history), taken beside it
    #: when the server has one
    own: "BackupResult | None" = None


@dataclass(frozen=True, slots=True)
class RestoreResult:
    #: table -> rows in the database after the restore
    tables: dict[str, int]
    seconds: float
    #: the database restored into (accounting.database)
    database: str = ""
    #: the manifest's identity marker of the volume the backup was taken from (the marker to put back
    #: beside a restored database volume, so the storage guard accepts it), None when it had none
    identity: dict | None = None


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    #: one line each, naming the file or table, what was found and what was expected
    problems: list[str]
    #: table -> (rows the manifest expects, rows found in the scratch database)
    counts: dict[str, tuple[int, int]]
    seconds: float


# -- backup -------------------------------------------------------------------------------


def _cluster(config: Config) -> str:
    try:
        return database.cluster_name(config)
    except ConfigError:
        return config.accounting.cluster or ""


def _identity(config: Config) -> dict | None:
    """The database volume's marker where this host has it; a backup taken elsewhere has none."""
    try:
        data = json.loads(database.places_of(config).marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def backup(config: Config, to: Path | None = None, keep: int | None = None, *, environ: dict[str, str] | None = None,
           emit: Callable = _ignore) -> BackupResult:
    """Dump accounting.database into `to` (default accounting.backup_dir) with its manifest; keep the newest
    `keep` (default accounting.backup_keep). Emits backup-done or backup-failed.

    Raises:
        BackupError: the database refused or could not be reached (the message names the setting), the
            directory cannot take the backup (read-only, full), the dump is incomplete, or the backup key cannot
            be made or is refused (in the backup directory, readable by others). Nothing of this backup is
            left behind then.
        ConfigError: no password.
    """
    settings = config.accounting
    directory = Path(to) if to else Path(settings.backup_dir)
    keep = settings.backup_keep if keep is None else keep
    environ = dict(os.environ if environ is None else environ)
    try:
        key = ensure_key(settings.backup_key, directory)
        result = _backup(config, directory, keep, key, environ, emit)
        if _exists(config, settings.own_database, environ):  # the repair history: same server, same backups
            own = dataclasses.replace(settings, database=settings.own_database)
            result = dataclasses.replace(result, own=_backup(dataclasses.replace(config, accounting=own), directory,
                                                             keep, key, environ, emit, suffix=f"-{own.database}"))
        return result
    except SlurmExtError as err:
        emit("backup-failed", f"backup into {directory} failed: {err}", directory=str(directory))
        raise


def _connecting_as(config: Config, role: str, environ: dict[str, str]) -> tuple[AccountingSection, str]:
    """accounting's settings as `role` connects (db_user and password_file: its own account's where it has one,
    `accounts.login`), and the password. Backups read as their read-only account; a restore writes as the
    account of the database it fills: slurmdbd's for the accounting database, the repair store's for
    slurm-ext's own, each with rights on its own database only where slurm-ext made the accounts.

    Raises:
        ConfigError: the password cannot be read or used (the message names the file).
    """
    settings = config.accounting
    user, secret = accounts.login(settings, role, environ, config.source or "<defaults>")
    own_file = accounts.password_file_of(settings, role)
    return dataclasses.replace(settings, db_user=user, password_file=own_file or settings.password_file), secret


def _exists(config: Config, name: str, environ: dict[str, str]) -> bool:
    """Whether the accounting server has database `name` (slurm-ext's own, made by MariaDB's start-up SQL).

    Raises:
        BackupError: backups have their own account, which the start-up SQL made with a right on `name`
            (and made `name`), yet it cannot see it: its history would silently no longer be backed up.
    """
    settings, secret = _connecting_as(config, "backup", environ)
    if not name or name == settings.database:
        return False
    with sqlclient.option_file(settings, secret) as options:
        try:
            found = sqlclient.query(["mariadb", f"--defaults-file={options}"],
                                    f"SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = "
                                    f"{sql_string(name)};")
        except CommandError as err:
            raise sqlclient.server_error(err.stderr or str(err), settings, f"looking for database {name}") from None
    if any(row and row[0] == name for row in found):
        return True
    if accounts.has_own_account(settings, "backup"):
        raise BackupError(f"database {name} at {settings.db_host}:{settings.db_port}",
                          f"user {settings.db_user!r} (backups' own account) cannot see database {name}, "
                          f"which the start-up SQL makes and lets it read: restart MariaDB with that SQL "
                          f"(`slurm-ext accounting config`) or check accounting.own_database; the backup of "
                          f"{settings.database} is kept")
    return False


def _backup(config: Config, directory: Path, keep: int, key: BackupKey, environ: dict[str, str], emit: Callable,
            suffix: str = "") -> BackupResult:
    started = time.monotonic()
    settings = config.accounting
    if keep < 1:
        raise BackupError(f"--keep {keep}", "keeping fewer than 1 backup would delete this one: give 1 or more")
    settings, secret = _connecting_as(config, "backup", environ)
    cluster = _cluster(config)
    now = datetime.now(timezone.utc)
    prefix = (cluster or settings.database) + suffix
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise BackupError(directory, f"cannot create the backup directory: {_why(err)}") from None
    try:
        final = free_name(directory, prefix, now)
    except OSError as err:
        raise BackupError(directory, f"cannot list the backup directory: {err.strerror}") from None
    tmp = directory / f".{final.name}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise BackupError(directory, _why(err)) from None
    manifest_path = manifest_path_for(final)
    try:
        try:
            counter, digest, size = _dump(settings, secret, fd, final)
            os.fsync(fd)
        finally:
            os.close(fd)
        manifest = Manifest(created=now.isoformat(timespec="seconds"), cluster=cluster, database=settings.database,
                            identity=_identity(config), tables=dict(counter.tables), sha256=digest, size=size,
                            file=final.name, server_version=counter.server_version,
                            text_size=counter.size).signed(key)
        os.rename(tmp, final)
        try:
            fileio.atomic_write(manifest_path, json.dumps(manifest.as_dict(), indent=1) + "\n", mode=0o644)
        except OSError as err:
            final.unlink(missing_ok=True)
            raise BackupError(directory, _why(err)) from None
    except OSError as err:
        raise BackupError(directory, _why(err)) from None
    finally:
        tmp.unlink(missing_ok=True)
    removed, problems = retain(directory, prefix, keep, key, final)
    result = BackupResult(path=final, manifest_path=manifest_path, manifest=manifest, removed=removed,
                          seconds=time.monotonic() - started)
    emit("backup-done", f"backup {final}: {len(manifest.tables)} tables, {manifest.rows} rows, {size} bytes in "
         f"{result.seconds:.1f}s" + (f"; removed {len(removed)} old" if removed else "")
         + "".join(f"; {p}" for p in problems), "warning" if problems else None,
         path=str(final), size=size, tables=len(manifest.tables), rows=manifest.rows,
         seconds=round(result.seconds, 3), removed=[str(p) for p in removed])
    return result


def _dump(settings: AccountingSection, secret: str, fd: int, final: Path,
          timeout: float = DUMP_TIMEOUT) -> tuple[RowCounter, str, int]:
    """mariadb-dump's stdout counted, compressed, hashed and written to `fd` (what becomes `final`);
    (counter, sha256, size).

    Compression, hashing and writing run in a thread: zlib, hashlib and write release the GIL, so they
    overlap the counting (which holds it) and mariadb-dump itself.

    Raises:
        BackupError: mariadb-dump failed or stopped early.
        OSError: writing failed (the caller names the directory).
    """
    counter = RowCounter()
    with sqlclient.option_file(settings, secret) as options, tempfile.TemporaryFile() as errors:
        cmd = ["mariadb-dump", f"--defaults-file={options}", *_DUMP_OPTIONS, settings.database]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                    start_new_session=True)
        except OSError as err:
            raise BackupError("mariadb-dump", f"cannot execute it: {err.strerror}: install the MariaDB client "
                              f"(Debian: mariadb-client)") from None
        timer = sqlclient.Deadline(timeout, proc.pid)
        writer = _Writer(fd)
        try:
            while chunk := proc.stdout.read(CHUNK):
                writer.put(chunk)
                counter.feed(chunk)
                if writer.error:
                    break
            writer.close()
        except BaseException:
            sqlclient.kill_group(proc.pid)
            writer.close()
            raise
        finally:
            if writer.error:
                sqlclient.kill_group(proc.pid)
            proc.stdout.close()
            returncode = proc.wait()
            timer.cancel()
        if writer.error:
            raise writer.error
        counter.finish()
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace")
    lost = f"nothing was kept of {final.name} in {final.parent}"
    if timer.fired:
        raise BackupError("mariadb-dump", f"did not finish within {timeout:g}s and was killed; {lost}")
    if returncode < 0:
        raise BackupError("mariadb-dump", f"was killed by signal {-returncode} before the end of the dump; {lost}")
    if returncode:
        raise sqlclient.server_error(stderr, settings, "mariadb-dump")
    if not counter.completed:
        raise BackupError("mariadb-dump", f"the dump ended without its '-- Dump completed' line (its last line: "
                          f"{counter.last_line[:120].decode('utf-8', 'replace')!r}); {lost}")
    if counter.malformed:
        raise BackupError("mariadb-dump", f"cannot count the rows of the dump: {counter.malformed[0]}; {lost} "
                          f"(report this: the dump's format is not one slurm-ext reads)")
    return counter, writer.digest.hexdigest(), writer.written


class _Writer:
    """A thread that compresses, hashes and writes chunks in order; the first OSError stops it (`error`).
    After `close`: `digest` is the sha256 and `written` the size of what was written."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.digest = hashlib.sha256()
        self.written = 0
        self.error: OSError | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._zip = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
        self._thread = threading.Thread(target=self._run, name="backup-writer", daemon=True)
        self._thread.start()

    def put(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self.error is None:
                self._write(self._zip.compress(chunk))
        if self.error is None:
            self._write(self._zip.flush())

    def _write(self, data: bytes) -> None:
        try:
            self.digest.update(data)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self.written += len(data)
        except OSError as err:
            self.error = err


def _why(err: OSError) -> str:
    """What a write error in the backup directory means, for the operator (the directory is named before)."""
    elsewhere = "or write elsewhere (--to / accounting.backup_dir)"
    if err.errno == errno.ENOSPC:
        return (f"no space left on the device; nothing of this backup was kept. Free space there, keep fewer "
                f"(--keep / accounting.backup_keep), {elsewhere}")
    if err.errno == errno.EROFS:
        return f"on a read-only file system; nothing was written. Mount it read-write, {elsewhere}"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied; nothing was written. Run as root, {elsewhere}"
    if err.errno == errno.EDQUOT:
        return f"disk quota exceeded; nothing of this backup was kept. Free space there, {elsewhere}"
    return f"cannot write there: {err.strerror or err}; nothing of this backup was kept"


# -- restore ------------------------------------------------------------------------------


def restore(config: Config, source: Path, *, environ: dict[str, str] | None = None,
            emit: Callable = _ignore) -> RestoreResult:
    """Load the backup `source` into accounting.database, which must be new or empty and unused.

    Before anything changes: the manifest must be authenticated by accounting.backup_key, the file must
    match it (size, sha256, a whole gzip stream holding no command of the mariadb client, the completion
    line, the rows), be of this cluster; the connection (accounting.db_user) may write nothing but the
    database (the backup's SQL runs with its rights: with slurm-ext's own database beside, it could approve
    a repair) and must be the account the backup's routines are defined by; no other client (slurmdbd) may
    be connected to the database, nor may it hold rows. After loading, every table's rows must be the
    manifest's. Emits restore-done or restore-failed.

    Raises:
        BackupError: refused (nothing was changed), or the load failed (the message says what is left).
        ConfigError: no password.
    """
    source = Path(source)
    try:
        result = _restore(config, source, dict(os.environ if environ is None else environ))
    except SlurmExtError as err:
        emit("restore-failed", f"restore of {source} failed: {err}", path=str(source))
        raise
    rows = sum(result.tables.values())
    emit("restore-done", f"restored {source} into database {result.database}: {len(result.tables)} tables, {rows} "
         f"rows, as its manifest says, in {result.seconds:.1f}s", path=str(source), database=result.database,
         tables=len(result.tables), rows=rows, seconds=round(result.seconds, 3), identity=result.identity)
    return result


def _restore(config: Config, source: Path, environ: dict[str, str]) -> RestoreResult:
    started = time.monotonic()
    settings = config.accounting
    manifest_path = manifest_path_for(source)
    manifest = read_manifest(manifest_path, read_key(settings.backup_key), source)
    history = manifest.database == settings.own_database != settings.database  # a backup of the repair history
    settings, secret = _connecting_as(config, "repair" if history else "slurmdbd", environ)
    if history:
        settings = dataclasses.replace(settings, database=settings.own_database)
    with open_dump(source) as dump:  # checked and loaded: one file, whatever is renamed over its path meanwhile
        return _restore_from(config, settings, secret, source, dump, manifest, started)


def _restore_from(config: Config, settings: AccountingSection, secret: str, source: Path, dump, manifest: Manifest,
                  started: float) -> RestoreResult:
    db = settings.database
    manifest_path = manifest_path_for(source)
    found = scan(source, manifest.text_size, dump)
    problems = found.against(manifest, manifest_path)
    if problems:
        raise BackupError(source, "refusing to restore a damaged backup (nothing was changed): "
                          + "; ".join(problems))
    cluster = _cluster(config)
    if manifest.cluster and cluster and manifest.cluster != cluster:
        raise BackupError(source, f"the backup is of cluster {manifest.cluster!r}, this config's is {cluster!r}: "
                          f"two clusters must not share one database. Restore it with cluster "
                          f"{manifest.cluster!r}'s config, or fix accounting.cluster / ClusterName")
    with sqlclient.option_file(settings, secret) as options:
        client = ["mariadb", f"--defaults-file={options}"]
        try:
            current = _refuse_wide_grants(client, settings)
            _refuse_definers(current, settings, found.definers)
            _refuse_in_use(client, settings)
            _refuse_data(client, settings)
            sqlclient.query(client, f"CREATE DATABASE IF NOT EXISTS {ident(db)};")
        except CommandError as err:
            raise sqlclient.server_error(err.stderr or str(err), settings,
                                         "checking the database before the restore") from None
        try:
            sqlclient.load(client, dump, db)
        except CommandError as err:
            raise BackupError(f"database {db} at {settings.db_host}:{settings.db_port}",
                              f"loading {source} failed ({sqlclient.error_line(err)}); the database is partly "
                              f"restored: drop it (DROP DATABASE {ident(db)}) before trying again") from None
        try:
            tables = sqlclient.counts(client, db)
        except CommandError as err:
            raise sqlclient.server_error(err.stderr or str(err), settings, "counting the restored rows") from None
    wrong = [f"{t}: {rows_text(tables.get(t))} (expected {manifest.tables[t]})" for t in sorted(manifest.tables)
             if tables.get(t) != manifest.tables[t]]
    if wrong:
        raise BackupError(f"database {db}", f"restored from {source}, but its rows differ from the manifest: "
                          + "; ".join(wrong))
    return RestoreResult(tables=tables, seconds=time.monotonic() - started, database=db, identity=manifest.identity)


def _refuse_in_use(client: list[str], settings: AccountingSection) -> None:
    """Another client connected to the database (slurmdbd keeps connections open) refuses the restore."""
    rows = sqlclient.query(client, f"SELECT ID, USER, HOST, COMMAND FROM information_schema.PROCESSLIST WHERE DB = "
                                   f"{sql_string(settings.database)} AND ID <> CONNECTION_ID();")
    if rows:
        who = ", ".join(f"{user}@{host} (id {number}, {what})" for number, user, host, what in rows[:5])
        raise BackupError(f"database {settings.database} at {settings.db_host}:{settings.db_port}",
                          f"in use by {len(rows)} other connection(s): {who}; stop slurmdbd first (a restore under "
                          f"a running slurmdbd mixes its writes with the backup's). Nothing was changed")


def _refuse_data(client: list[str], settings: AccountingSection) -> None:
    db = settings.database
    tables = sqlclient.base_tables(client, db)
    if not tables:
        return
    sql = "\nUNION ALL ".join(f"SELECT {sql_string(t)} FROM DUAL WHERE EXISTS (SELECT 1 FROM {ident(db)}.{ident(t)})"
                              for t in tables)
    full = [row[0] for row in sqlclient.query(client, sql + ";")]
    if full:
        raise BackupError(f"database {db} at {settings.db_host}:{settings.db_port}",
                          f"it holds data ({len(full)} of its {len(tables)} tables have rows: "
                          f"{', '.join(full[:5])}{', ...' if len(full) > 5 else ''}). A restore goes into a new or "
                          f"emptied database: drop or rename it first (or set accounting.database to a new name); "
                          f"nothing was changed")


def _quote_account(part: str) -> str:
    return "'" + part.replace("'", "''") + "'"


def _grantee(account: str) -> str:
    """`user@host` (CURRENT_USER()) as information_schema's GRANTEE: 'user'@'host'."""
    user, _, host = account.partition("@")
    return f"{_quote_account(user)}@{_quote_account(host)}"


def _unescape(schema: str) -> str:
    """A database-level grant's name, without the LIKE escapes of `_` and `%`."""
    return schema.replace("\\_", "_").replace("\\%", "%")


def _refuse_wide_grants(client: list[str], settings: AccountingSection) -> str:
    """The connection's account (CURRENT_USER()), when it may write nothing but the target database.

    The restore runs the backup's SQL with this account's rights: any it holds beyond the target (ALL on
    slurm-ext's own database, where an INSERT approves a repair; SUPER or SET USER, to act as another account;
    FILE) is refused. Outside the target it may read (SELECT, SHOW VIEW) and hold what mariadb-dump's account
    holds (PROCESS, RELOAD); a grant by pattern (`slurm\\_%`.*) or a role counts as beyond."""
    db = settings.database
    (current,), = sqlclient.query(client, "SELECT CURRENT_USER();")
    grantee = sql_string(_grantee(current))
    rows = sqlclient.query(client, f"""SELECT '*.*', PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES
  WHERE GRANTEE IN ({grantee}, 'PUBLIC')
UNION ALL SELECT CONCAT(TABLE_SCHEMA, '.*'), PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES
  WHERE GRANTEE IN ({grantee}, 'PUBLIC')
UNION ALL SELECT CONCAT(TABLE_SCHEMA, '.', TABLE_NAME), PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES
  WHERE GRANTEE IN ({grantee}, 'PUBLIC') AND TABLE_SCHEMA <> {sql_string(db)}
UNION ALL SELECT CONCAT(TABLE_SCHEMA, '.', TABLE_NAME, '.', COLUMN_NAME), PRIVILEGE_TYPE
  FROM information_schema.COLUMN_PRIVILEGES WHERE GRANTEE IN ({grantee}, 'PUBLIC') AND TABLE_SCHEMA <> {sql_string(db)}
UNION ALL SELECT CONCAT('role ', CURRENT_ROLE()), 'ROLE' FROM DUAL WHERE CURRENT_ROLE() IS NOT NULL;""")
    wide = sorted({f"{privilege} ON {on}" for on, privilege in rows
                   if privilege == "ROLE" or privilege not in _READ_ONLY and _unescape(on) != f"{db}.*"})
    if wide:
        user, _, host = current.partition("@")
        raise BackupError(f"user {current} at {settings.db_host}:{settings.db_port}",
                          f"it may also write outside database {db} ({'; '.join(wide[:6])}"
                          f"{'; ...' if len(wide) > 6 else ''}), and a restore runs the backup's SQL with its rights "
                          f"(in slurm-ext's own database that could approve a repair). Restore as an account with "
                          f"rights on {db} only, the one its routines are defined by (slurmdbd's StorageUser). "
                          f"Where slurm-ext runs the database (accounting.run_database) its start-up SQL gives "
                          f"each part its own account from MariaDB's next start (restart the accounting agent, or "
                          f"run `slurm-ext accounting config` and restart mariadbd). On a server of your own, give the repair store and the page accounts "
                          f"of their own (accounting.repair_password_file, page_password_file) and REVOKE what "
                          f"goes beyond (e.g. REVOKE ALL ON `{settings.own_database}`.* FROM '{user}'@'{host}'), or "
                          f"give accounting.db_user and accounting.password_file of such an account in the "
                          f"restore's config; nothing was changed")
    return current


#: what a restoring connection may hold beyond its database: reading, and what the accounting account holds
#: for mariadb-dump (PROCESS also shows slurmdbd's connections to the in-use check)
_READ_ONLY = frozenset({"USAGE", "SELECT", "SHOW VIEW", "SHOW DATABASES", "PROCESS", "RELOAD", "BINLOG MONITOR",
                        "REPLICATION CLIENT", "SLAVE MONITOR", "REPLICA MONITOR"})


def _refuse_definers(current: str, settings: AccountingSection, definers: frozenset[str]) -> None:
    """Stored programs defined by another account than this connection's would need SUPER or SET USER, which
    let the backup's code run as whomever it names: refuse up front (before anything changes) instead."""
    others = sorted(definers - {current})
    if others:
        raise BackupError(f"user {current} at {settings.db_host}:{settings.db_port}",
                          f"the backup's routines, triggers or events are defined by {', '.join(others)}: restore "
                          f"as that account (with rights on {settings.database} only), through accounting.db_user "
                          f"and accounting.password_file. An account that may create them for another (SET USER, "
                          f"SUPER) is not used: the backup's code would run as whomever it names. Nothing was "
                          f"changed")


# -- verify -------------------------------------------------------------------------------


def verify(source: Path, key: str | os.PathLike, *, emit: Callable = _ignore,
           workdir: Path | None = None) -> VerifyResult:
    """Check `source` against its manifest, authenticated by the backup key in the file `key`
    (accounting.backup_key), load it into a scratch MariaDB (in `workdir`, default the temporary directory)
    and compare every table's SELECT COUNT(*) with the manifest. A backup without an authenticated manifest,
    and a damaged one, is not loaded. Emits verify-done or verify-failed.

    Raises:
        BackupError: the file or the key cannot be read (or the key is refused), or the scratch MariaDB cannot
            be started (the backup's state is then unknown, not bad).
    """
    source = Path(source)
    started = time.monotonic()
    try:
        problems, counts = _verify(source, read_key(key), workdir)
    except SlurmExtError as err:
        emit("verify-failed", f"verify of {source} could not run: {err}", path=str(source))
        raise
    result = VerifyResult(ok=not problems, problems=problems, counts=counts, seconds=time.monotonic() - started)
    rows = sum(found for _, found in counts.values())
    if result.ok:
        emit("verify-done", f"{source}: {len(counts)} tables, {rows} rows restored into a scratch MariaDB, as the "
             f"manifest says", path=str(source), tables=len(counts), rows=rows, seconds=round(result.seconds, 3))
    else:
        emit("verify-failed", f"{source}: {len(problems)} problem(s): {problems[0]}", path=str(source),
             problems=problems)
    return result


def _verify(source: Path, key: BackupKey, workdir: Path | None) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """The file's checks run while the scratch server starts (each takes about a second on a small
    backup); nothing is loaded into it before they pass, nor without an authenticated manifest."""
    manifest_path = manifest_path_for(source)
    try:
        manifest = read_manifest(manifest_path, key, source)
    except BackupError as err:
        return [str(err)], {}
    try:
        dump = open_dump(source)  # checked and loaded: one file, whatever is renamed over its path meanwhile
    except BackupError as err:
        return [str(err)], {}
    with dump:
        return _verify_from(source, dump, manifest, manifest_path, workdir)


def _verify_from(source: Path, dump, manifest: Manifest, manifest_path: Path,
                 workdir: Path | None) -> tuple[list[str], dict[str, tuple[int, int]]]:
    size = os.fstat(dump.fileno()).st_size
    if size != manifest.size:
        return scan(source, manifest.text_size, dump).against(manifest, manifest_path), {}
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="verify-scan") as pool:
        scanning = pool.submit(scan, source, manifest.text_size, dump)
        with scratch_mariadb(workdir=workdir, buffer_pool_mib=min(1024, max(128, (size >> 20) * 8))) as scratch:
            found = scanning.result()
            problems = found.against(manifest, manifest_path)
            if found.problems() or found.sha256 != manifest.sha256 or found.text_size != manifest.text_size:
                return problems, {}  # damaged: not loaded (rows that differ from the manifest's still are)
            expected = manifest.tables
            db = manifest.database or "restored"
            scratch.sql(f"CREATE DATABASE {ident(db)};")
            try:
                restored = scratch.load_limited(dump, db, found.definers)
            except CommandError as err:
                problems.append(f"{source}: loading it into a scratch MariaDB failed: {sqlclient.error_line(err)}")
                return problems, {}
    counts = {}
    for table in sorted(set(expected) | set(restored)):
        counts[table] = (expected.get(table, 0), restored.get(table, 0))
        if table not in restored:
            problems.append(f"table {table}: missing after the load (expected {expected[table]} rows)")
        elif table not in expected:
            problems.append(f"table {table}: {restored[table]} rows after the load, but not in the manifest")
        elif restored[table] != expected[table]:
            problems.append(f"table {table}: {restored[table]} rows after the load (expected {expected[table]})")
    return problems, counts



"""Backups of the accounting database that can be trusted: `backup`, `restore`, `verify`.

A dump that nobody has restored is a hope, not a backup. So each backup is
one consistent `mariadb-dump --single-transaction` of accounting.database,
gzip-compressed, with a manifest beside it (`<name>.manifest.json`: its
sha256 and size, the cluster and the volume's identity marker, and the rows
of every table), and the manifest is what the other two check against:

- `backup(config, to, keep)`: the dump streams through `RowCounter`, which
  counts the row tuples of its INSERT statements, while the same bytes are
  compressed into a temporary file and hashed. The counts therefore describe
  exactly the snapshot in the file; a `SELECT COUNT(*)` beside the dump would
  race slurmdbd's inserts. A dump without mariadb-dump's closing
  `-- Dump completed` line (killed, disk full) is not kept. The newest `keep`
  backups of this cluster's naming pattern stay in the directory.
- `restore(config, source)`: only into a database nobody uses (slurmdbd
  stopped) that is new or empty, and only a file that matches its manifest;
  the row counts after loading must be the manifest's.
- `verify(source)`: the file against its manifest, then loaded into a
  scratch MariaDB (`scratch_mariadb()`, also used by the tests and the
  benchmark) whose `SELECT COUNT(*)` of every table must be the manifest's.

The password reaches mariadb-dump and mariadb only through a temporary 0600
option file, never a command line (which every user can read in /proc).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from slurm_ext import command, fileio
from slurm_ext.config import Config
from slurm_ext.errors import CommandError, ConfigError, SlurmExtError

from . import database
from .render import sql_string
from .settings import PASSWORD_ENV, AccountingSection

__all__ = ["FORMAT", "BackupError", "Manifest", "BackupResult", "RestoreResult", "VerifyResult", "Scan",
           "RowCounter", "ScratchMariaDB", "backup", "restore", "verify", "scan", "read_manifest",
           "manifest_path_for", "backups_in", "scratch_mariadb"]

#: the manifest's format; a reader refuses any other
FORMAT = 1
SUFFIX = ".sql.gz"
MANIFEST_SUFFIX = ".manifest.json"
#: longest a dump or a load may take before it is killed (a large database takes minutes, not hours)
DUMP_TIMEOUT = 6 * 3600.0
#: longest one small query (counts, checks) may take
QUERY_TIMEOUT = 120.0
#: what mariadb-dump writes last, once every table is out; a dump without it is incomplete
COMPLETED = b"-- Dump completed"
#: zlib level: 6 (gzip's default) costs three times the CPU of 1 for a file a few % smaller on this text
COMPRESS_LEVEL = 1
_CHUNK = 1 << 20
#: a consistent snapshot of InnoDB without locking slurmdbd out (--single-transaction), streamed row by
#: row (--quick), with everything slurmdbd creates; binary as hex, so the text holds no raw bytes. No
#: --databases: the dump names no database, so it can be restored under another name.
_DUMP_OPTIONS = ("--single-transaction", "--quick", "--routines", "--events", "--triggers", "--hex-blob",
                 "--no-tablespaces", "--max-allowed-packet=1G")
#: mariadb's error lines that mean the server was not reached, and those that mean the password is wrong
_UNREACHABLE = ("Can't connect", "Unknown server host", "Unknown MySQL server host", "Lost connection",
                "Connection refused", "No route to host", "timed out", "Can't create TCP/IP socket")
_DENIED = ("(using password:",)


class BackupError(SlurmExtError):
    """A backup, restore or verify failed or was refused; `where` is the file, directory or setting to fix."""

    def __init__(self, where: str | os.PathLike, problem: str):
        self.where = str(where)
        self.problem = problem
        super().__init__(f"{self.where}: {problem}")


def _ignore(event: str, message: str, severity: str | None = None, **fields) -> None:
    """The default `emit`: no journal."""


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a backup holds, written beside it as JSON: the checks of restore and verify."""

    #: when the dump started, ISO 8601 UTC
    created: str
    #: the cluster's name ("" when this host knows none)
    cluster: str
    #: the database that was dumped (accounting.database)
    database: str
    #: the database volume's identity marker where this host has it (cluster, id, created, kind), else None
    identity: dict | None
    #: table -> rows in the dump, every table of the dump (0 for an empty one)
    tables: dict[str, int]
    #: of the .sql.gz file as written
    sha256: str
    size: int
    #: the .sql.gz file's name (the manifest lies beside it)
    file: str
    #: the server's version, from the dump's header
    server_version: str
    format: int = FORMAT

    @property
    def rows(self) -> int:
        return sum(self.tables.values())

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str | os.PathLike = "<manifest>") -> Manifest:
        """Raises: BackupError: not a manifest of this format."""
        try:
            if data.get("format") != FORMAT:
                raise BackupError(source, f"manifest format {data.get('format')!r} (this slurm-ext reads {FORMAT}): "
                                  f"written by another version of slurm-ext; verify or restore it with that one")
            tables = {str(k): int(v) for k, v in data["tables"].items()}
            identity = data.get("identity")
            return cls(created=str(data["created"]), cluster=str(data["cluster"]), database=str(data["database"]),
                       identity=dict(identity) if identity else None, tables=tables, sha256=str(data["sha256"]),
                       size=int(data["size"]), file=str(data["file"]), server_version=str(data["server_version"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BackupError(source, f"the manifest is damaged ({type(err).__name__}: {err}): it should be the JSON "
                              f"that `slurm-ext accounting backup` wrote beside the dump") from None


@dataclass(frozen=True, slots=True)
class BackupResult:
    path: Path
    manifest_path: Path
    manifest: Manifest
    #: older backups (the .sql.gz files) deleted by retention, with their manifests
    removed: list[Path]
    seconds: float


@dataclass(frozen=True, slots=True)
class RestoreResult:
    #: table -> rows in the database after the restore
    tables: dict[str, int]
    seconds: float
    #: the database restored into (accounting.database)
    database: str = ""


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    #: one line each, naming the file or table, what was found and what was expected
    problems: list[str]
    #: table -> (rows the manifest expects, rows found in the scratch database)
    counts: dict[str, tuple[int, int]]
    seconds: float


@dataclass(frozen=True, slots=True)
class Scan:
    """A backup file read end to end (`scan`): what it is, independent of any manifest."""

    path: Path
    size: int
    sha256: str
    #: why the gzip stream is broken (truncated, a bad CRC), "" when it is whole
    gzip_problem: str
    #: the dump's last line is mariadb-dump's completion line
    completed: bool
    #: table -> rows, from the dump's text (RowCounter)
    tables: dict[str, int]
    server_version: str
    #: statements RowCounter could not read
    malformed: list[str]

    def problems(self) -> list[str]:
        found = []
        if self.gzip_problem:
            found.append(f"{self.path}: {self.gzip_problem}")
        elif not self.completed:
            found.append(f"{self.path}: the dump has no '-- Dump completed' line at its end: mariadb-dump did "
                         f"not finish it (killed, or the disk was full); it is incomplete")
        found += [f"{self.path}: {bad}" for bad in self.malformed]
        return found


# -- the dump's text ----------------------------------------------------------------------

_NAME = rb"`((?:[^`\n]|``)+)`"
#: the lines the counter acts on; the stream is read as if it began with a newline
_LANDMARK = re.compile(
    rb"\n(?:(?:INSERT|REPLACE)(?: IGNORE)? INTO " + _NAME + rb"(?: \([^\n]*?\))? VALUES"
    rb"|CREATE TABLE (?:IF NOT EXISTS )?" + _NAME +
    rb"|DELIMITER ([^\s]+)"
    rb"|-- Server version\s+([^\n]*))")
#: an INSERT's values up to its end: runs without quote or ';', and whole string literals ('...', backslash
#: escapes; '' inside one reads as two adjacent literals, which counts the same)
_BODY = re.compile(rb"(?:[^';]++|'[^'\\]*+(?:\\.[^'\\]*+)*+')*+", re.S)
_STRING = re.compile(rb"'[^'\\]*+(?:\\.[^'\\]*+)*+'", re.S)
_NOT_PARENS = bytes(b for b in range(256) if b not in b"()")
#: longest piece of an INSERT held while waiting for a string's closing quote (mariadb-dump's statements
#: are about net_buffer_length, 1 MiB); past it the text is not a dump
_MAX_PENDING = 256 << 20


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").replace("``", "`")


class RowCounter:
    """Counts the rows of every table in a mariadb-dump text, fed in chunks of any size.

    A row is a top-level '(' of an `INSERT INTO `t` VALUES (...),(...);`
    statement outside string literals; statements may span lines (MariaDB
    10.11.8 and later put each row on its own line) and chunks. Every table
    of a `CREATE TABLE` is listed, with 0 when it has no INSERT. Text between
    `DELIMITER ;;` and `DELIMITER ;` is a routine's, trigger's or event's
    body, whose INSERTs are not data. Never raises on bad input: what it
    cannot read is listed in `malformed`.
    """

    def __init__(self) -> None:
        self.tables: dict[str, int] = {}
        self.server_version = ""
        self.malformed: list[str] = []
        self._buf = b"\n"
        self._table: str | None = None  # the table whose INSERT is being read
        self._depth = 0
        self._delimiter = b";"
        self._tail = b""
        self._broken = False

    def feed(self, data: bytes) -> None:
        self._tail = (self._tail + data[-4096:])[-4096:]
        if self._broken:
            return
        self._buf += data
        self._scan(final=False)

    def finish(self) -> None:
        """The end of the dump: reads what is left."""
        if not self._broken:
            self._scan(final=True)
            if self._table is not None:
                self._bad(f"the INSERT into `{self._table}` has no end (the dump stops inside it)")
        self._buf = b""

    @property
    def last_line(self) -> bytes:
        return self._tail.rstrip(b"\r\n\t ").rsplit(b"\n", 1)[-1]

    @property
    def completed(self) -> bool:
        """The text ends with mariadb-dump's completion line (meaningful after finish())."""
        return self.last_line.startswith(COMPLETED) and self._table is None

    def _bad(self, problem: str) -> None:
        self.malformed.append(problem)
        self._broken = True

    def _scan(self, final: bool) -> None:
        buf, pos = self._buf, 0
        while True:
            if self._table is not None:
                end = _BODY.match(buf, pos).end()
                self._count(buf[pos:end])
                pos = end
                if end < len(buf) and buf[end] == 0x3B:  # ';': the statement's end
                    if self._depth:
                        self._bad(f"an INSERT into `{self._table}` ends inside a row (unbalanced parentheses)")
                        return
                    self._table = None
                    pos += 1
                    continue
                if end < len(buf) and not final:  # a string literal still open: wait for its end
                    if len(buf) - pos > _MAX_PENDING:
                        self._bad(f"a string in the INSERT into `{self._table}` never ends")
                    break
                if end < len(buf):
                    self._bad(f"a string in the INSERT into `{self._table}` has no closing quote")
                break
            limit = len(buf) if final else buf.rfind(b"\n")
            found = _LANDMARK.search(buf, pos, max(limit, pos))
            if found is None:
                pos = max(limit, pos)
                break
            insert, create, delimiter, version = found.groups()
            pos = found.end()
            if delimiter is not None:
                self._delimiter = delimiter
            elif version is not None:
                self.server_version = version.decode("utf-8", "replace").strip()
            elif self._delimiter != b";":
                continue  # a stored program's body
            elif create is not None:
                self.tables.setdefault(_name(create), 0)
            else:
                self._table = _name(insert)
                self.tables.setdefault(self._table, 0)
        self._buf = buf[pos:]

    def _count(self, body: bytes) -> None:
        parens = _STRING.sub(b"", body).translate(None, _NOT_PARENS)
        half = len(parens) // 2
        if not self._depth and parens == b"()" * half:  # flat rows, the usual case
            self.tables[self._table] += half
            return
        rows, depth = 0, self._depth
        for byte in parens:
            if byte == 0x28:
                rows += depth == 0
                depth += 1
            elif depth == 0:
                self._bad(f"an INSERT into `{self._table}` closes a parenthesis it never opened")
                return
            else:
                depth -= 1
        self.tables[self._table] += rows
        self._depth = depth


# -- files --------------------------------------------------------------------------------


def manifest_path_for(path: Path) -> Path:
    """`x.sql.gz` -> `x.manifest.json` (beside it)."""
    name = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(name + MANIFEST_SUFFIX)


def read_manifest(path: Path) -> Manifest:
    """Raises: BackupError: missing, unreadable, not JSON or not a manifest."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BackupError(path, "no manifest: every backup has one beside it (written by `slurm-ext accounting "
                          "backup`); without it nothing says what the dump should hold") from None
    except OSError as err:
        raise BackupError(path, f"cannot read the manifest: {err.strerror}") from None
    except ValueError as err:
        raise BackupError(path, f"the manifest is not JSON ({err}): it is damaged") from None
    if not isinstance(data, dict):
        raise BackupError(path, "the manifest is not a JSON object: it is damaged")
    return Manifest.from_dict(data, path)


def scan(path: Path) -> Scan:
    """Read a backup end to end: its checksum, its gzip stream (CRC and length) and its dump text.

    Raises:
        BackupError: the file cannot be read.
    """
    path = Path(path)
    digest, counter, size = hashlib.sha256(), RowCounter(), 0
    unzip = zlib.decompressobj(31)
    problem = ""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                size += len(chunk)
                digest.update(chunk)
                if problem:
                    continue
                try:
                    counter.feed(unzip.decompress(chunk))
                except zlib.error as err:
                    problem = f"not a valid gzip file, or damaged: {err}"
                    continue
                if unzip.eof and unzip.unused_data:
                    problem = "data after the end of its gzip stream: it was changed after the backup"
    except OSError as err:
        raise BackupError(path, f"cannot read the backup: {err.strerror}") from None
    if not problem and not unzip.eof:
        problem = "its gzip stream ends early: the file is truncated"
    counter.finish()
    return Scan(path=path, size=size, sha256=digest.hexdigest(), gzip_problem=problem, completed=counter.completed,
                tables=dict(counter.tables), server_version=counter.server_version,
                malformed=list(counter.malformed))


def _against(found: Scan, manifest: Manifest, manifest_path: Path) -> list[str]:
    """Everything in which the file differs from its manifest, damage first."""
    problems = []
    if found.size != manifest.size:
        problems.append(f"{found.path}: {found.size} bytes, its manifest {manifest_path} says {manifest.size}: "
                        + ("the file is truncated" if found.size < manifest.size else "the file was changed"))
    if found.sha256 != manifest.sha256:
        problems.append(f"{found.path}: sha256 {found.sha256}, its manifest says {manifest.sha256}: the file was "
                        f"damaged or changed after the backup")
    problems += found.problems()
    if problems:
        return problems
    for table in sorted(set(found.tables) | set(manifest.tables)):
        if found.tables.get(table) != manifest.tables.get(table):
            problems.append(f"table {table}: the dump holds {_rows(found.tables.get(table))}, the manifest says "
                            f"{_rows(manifest.tables.get(table))}")
    return problems


def _rows(count: int | None) -> str:
    return "no such table" if count is None else f"{count} rows"


_STAMP = "%Y%m%dT%H%M%SZ"


def _pattern(prefix: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(prefix)}-(\d{{8}}T\d{{6}}Z)(?:-(\d+))?{re.escape(SUFFIX)}$")


def backups_in(directory: Path, prefix: str) -> list[Path]:
    """The backups named `<prefix>-<UTC stamp>[-n].sql.gz` in `directory`, oldest first."""
    pattern, found = _pattern(prefix), []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        match = pattern.match(name)
        if match:
            found.append((match.group(1), int(match.group(2) or 0), name))
    return [Path(directory) / name for _, _, name in sorted(found)]


def _retain(directory: Path, prefix: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` backups of this pattern, each with its manifest."""
    removed = []
    for old in backups_in(directory, prefix)[:-keep]:
        try:
            old.unlink()
            manifest_path_for(old).unlink(missing_ok=True)
        except OSError as err:
            raise BackupError(old, f"the new backup is written, but an old one cannot be removed ({err.strerror}); "
                              f"remove it by hand") from None
        removed.append(old)
    return removed


def _why(err: OSError, directory: Path) -> str:
    if err.errno == errno.ENOSPC:
        return (f"no space left on {directory}: nothing was kept of this backup; free space there, keep fewer "
                f"(--keep / accounting.backup_keep) or write elsewhere (--to / accounting.backup_dir)")
    if err.errno == errno.EROFS:
        return (f"{directory} is on a read-only file system: mount it read-write, or write elsewhere "
                f"(--to / accounting.backup_dir)")
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied writing in {directory}: run as root, or write elsewhere (--to / accounting.backup_dir)"
    if err.errno == errno.EDQUOT:
        return f"disk quota exceeded on {directory}: nothing was kept of this backup"
    return f"cannot write in {directory}: {err.strerror or err}"


# -- talking to the database --------------------------------------------------------------


def _quote_option(value: str) -> str:
    """A value for a MariaDB option file: double-quoted, '\\' and '"' escaped (the parser unescapes them)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextlib.contextmanager
def _option_file(settings: AccountingSection, secret: str) -> Iterator[Path]:
    """A 0600 option file with the connection and the password, removed on the way out.

    --defaults-file, not --defaults-extra-file: no /etc/mysql/my.cnf or ~/.my.cnf can change the user,
    the password or the protocol under us."""
    fd, name = tempfile.mkstemp(prefix="slurm-ext-db-", suffix=".cnf")  # 0600, root's
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"[client]\nuser={settings.db_user}\npassword={_quote_option(secret)}\n"
                    f"host={settings.db_host}\nport={settings.db_port}\nprotocol=TCP\nconnect-timeout=15\n")
        yield Path(name)
    finally:
        os.unlink(name)


def _password_source(settings: AccountingSection) -> str:
    return (f"{settings.password_file} (accounting.password_file)" if settings.password_file
            else f"${PASSWORD_ENV} (accounting.password_file is empty)")


def _server_error(stderr: str, settings: AccountingSection, what: str) -> BackupError:
    """mariadb's or mariadb-dump's complaint as an error that names the setting to fix."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else "no message"
    address = f"{settings.db_host}:{settings.db_port}"
    for line in lines:
        if any(text in line for text in _DENIED):
            return BackupError(_password_source(settings),
                               f"the database at {address} refused user {settings.db_user!r} ({line.split(': ', 1)[-1]}):"
                               f" put slurmdbd's password there (StoragePass), or check accounting.db_user")
        if any(text in line for text in _UNREACHABLE):
            return BackupError(f"accounting.db_host:db_port ({address})",
                               f"cannot connect to the database ({line.split(': ', 1)[-1]}): is mariadbd running "
                               f"there, and is that its address and port?")
        if "Unknown database" in line:
            return BackupError(f"accounting.database ({settings.database})",
                               f"no such database at {address}: check accounting.database (slurmdbd's StorageLoc)")
    if "Access denied" in stderr:
        return BackupError(f"user {settings.db_user!r} at {address}",
                           f"{what} failed for lack of a privilege ({detail}): give it the grants of the start-up "
                           f"SQL (`slurm-ext accounting config`): ALL on `{settings.database}`.*, SELECT on "
                           f"mysql.proc, RELOAD and PROCESS on *.*")
    return BackupError(f"the database at {address}", f"{what} failed: {detail}")


def _query(client: list[str], sql: str, timeout: float = QUERY_TIMEOUT) -> list[tuple[str, ...]]:
    """Rows of `sql` run by the mariadb client `client` (tab-separated, no header).

    Raises:
        CommandError: the client failed (its stderr is in the error).
    """
    result = command.run([*client, "--batch", "--skip-column-names"], timeout, input=sql)
    return [tuple(line.split("\t")) for line in result.stdout.splitlines()]


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _base_tables(client: list[str], db: str) -> list[str]:
    rows = _query(client, f"SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = {sql_string(db)} "
                          f"AND TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') ORDER BY TABLE_NAME;")
    return [row[0] for row in rows]


def _counts(client: list[str], db: str) -> dict[str, int]:
    """SELECT COUNT(*) of every base table of `db`."""
    tables = _base_tables(client, db)
    if not tables:
        return {}
    sql = "\nUNION ALL ".join(f"SELECT {sql_string(t)}, COUNT(*) FROM {_ident(db)}.{_ident(t)}" for t in tables)
    return {name: int(count) for name, count in _query(client, sql + ";", DUMP_TIMEOUT)}


def _load(client: list[str], source: Path, db: str, timeout: float = DUMP_TIMEOUT) -> None:
    """Stream the decompressed dump into `client` connected to `db`.

    Raises:
        CommandError: the client failed (its stderr in the error), or ran past `timeout`.
    """
    cmd = [*client, "--batch", "--max-allowed-packet=1G", db]
    with tempfile.TemporaryFile() as errors, open(source, "rb") as f:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                                    start_new_session=True)
        except OSError as err:
            raise CommandError(cmd, None, f"cannot execute {cmd[0]}: {err.strerror}") from None
        timer = threading.Timer(timeout, _kill_group, (proc.pid,))
        timer.start()
        unzip = zlib.decompressobj(31)
        try:
            while chunk := f.read(_CHUNK):
                proc.stdin.write(unzip.decompress(chunk))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it stopped reading: its status and stderr say why
        except BaseException:
            _kill_group(proc.pid)
            raise
        finally:
            returncode = proc.wait()
            timer.cancel()
        if returncode:
            errors.seek(0)
            stderr = errors.read().decode("utf-8", "replace")
            if returncode == -signal.SIGKILL and not stderr:
                raise command.CommandTimeout(cmd, timeout)
            raise CommandError(cmd, returncode, stderr)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


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
            directory cannot take the backup (read-only, full), or the dump is incomplete. Nothing of this
            backup is left behind then.
        ConfigError: no password.
    """
    settings = config.accounting
    directory = Path(to) if to else Path(settings.backup_dir)
    try:
        return _backup(config, directory, settings.backup_keep if keep is None else keep,
                       dict(os.environ if environ is None else environ), emit)
    except SlurmExtError as err:
        emit("backup-failed", f"backup into {directory} failed: {err}", directory=str(directory))
        raise


def _backup(config: Config, directory: Path, keep: int, environ: dict[str, str], emit: Callable) -> BackupResult:
    started = time.monotonic()
    settings = config.accounting
    if keep < 1:
        raise BackupError(f"--keep {keep}", "keeping fewer than 1 backup would delete this one: give 1 or more")
    secret = database.password(settings, environ, config.source or "<defaults>")
    cluster = _cluster(config)
    now = datetime.now(timezone.utc)
    prefix = cluster or settings.database
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise BackupError(directory, f"cannot create the backup directory: {_why(err, directory)}") from None
    final = _free_name(directory, f"{prefix}-{now.strftime(_STAMP)}")
    tmp = directory / f".{final.name}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise BackupError(directory, _why(err, directory)) from None
    manifest_path = manifest_path_for(final)
    try:
        try:
            counter, digest, size = _dump(settings, secret, fd, directory)
            os.fsync(fd)
        finally:
            os.close(fd)
        manifest = Manifest(created=now.isoformat(timespec="seconds"), cluster=cluster, database=settings.database,
                            identity=_identity(config), tables=dict(counter.tables), sha256=digest, size=size,
                            file=final.name, server_version=counter.server_version)
        os.rename(tmp, final)
        try:
            fileio.atomic_write(manifest_path, json.dumps(manifest.as_dict(), indent=1) + "\n", mode=0o644)
        except OSError as err:
            final.unlink(missing_ok=True)
            raise BackupError(directory, _why(err, directory)) from None
    except OSError as err:
        raise BackupError(directory, _why(err, directory)) from None
    finally:
        tmp.unlink(missing_ok=True)
    removed = _retain(directory, prefix, keep)
    result = BackupResult(path=final, manifest_path=manifest_path, manifest=manifest, removed=removed,
                          seconds=time.monotonic() - started)
    emit("backup-done", f"backup {final}: {len(manifest.tables)} tables, {manifest.rows} rows, {size} bytes in "
         f"{result.seconds:.1f}s" + (f"; removed {len(removed)} old" if removed else ""),
         path=str(final), size=size, tables=len(manifest.tables), rows=manifest.rows,
         seconds=round(result.seconds, 3), removed=[str(p) for p in removed])
    return result


def _free_name(directory: Path, stem: str) -> Path:
    """`stem.sql.gz`, or `stem-2.sql.gz`, ... when a backup of the same second is there."""
    path, n = directory / f"{stem}{SUFFIX}", 1
    while path.exists() or manifest_path_for(path).exists():
        n += 1
        path = directory / f"{stem}-{n}{SUFFIX}"
    return path


def _dump(settings: AccountingSection, secret: str, fd: int, directory: Path,
          timeout: float = DUMP_TIMEOUT) -> tuple[RowCounter, str, int]:
    """mariadb-dump's stdout counted, compressed, hashed and written to `fd`; (counter, sha256, size).

    Compression, hashing and writing run in a thread: zlib, hashlib and write release the GIL, so they
    overlap the counting (which holds it) and mariadb-dump itself.

    Raises:
        BackupError: mariadb-dump failed or stopped early.
        OSError: writing failed (the caller names the directory).
    """
    counter, digest = RowCounter(), hashlib.sha256()
    written = [0]
    with _option_file(settings, secret) as options, tempfile.TemporaryFile() as errors:
        cmd = ["mariadb-dump", f"--defaults-file={options}", *_DUMP_OPTIONS, settings.database]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                    start_new_session=True)
        except OSError as err:
            raise BackupError("mariadb-dump", f"cannot execute it: {err.strerror}: install the MariaDB client "
                              f"(Debian: mariadb-client)") from None
        timer = threading.Timer(timeout, _kill_group, (proc.pid,))
        timer.start()
        writer = _Writer(fd, digest, written)
        try:
            while chunk := proc.stdout.read(_CHUNK):
                writer.put(chunk)
                counter.feed(chunk)
                if writer.error:
                    break
            writer.close()
        except BaseException:
            _kill_group(proc.pid)
            writer.close()
            raise
        finally:
            if writer.error:
                _kill_group(proc.pid)
            proc.stdout.close()
            returncode = proc.wait()
            timer.cancel()
        if writer.error:
            raise writer.error
        counter.finish()
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace")
    if returncode == -signal.SIGKILL:
        raise BackupError("mariadb-dump", f"did not finish within {timeout:g}s and was killed; nothing was kept")
    if returncode:
        raise _server_error(stderr, settings, "mariadb-dump")
    if not counter.completed:
        raise BackupError("mariadb-dump", f"the dump ended without its '-- Dump completed' line (last line: "
                          f"{counter.last_line[:120]!r}); nothing was kept")
    if counter.malformed:
        raise BackupError("mariadb-dump", f"cannot count the rows of the dump: {counter.malformed[0]}; nothing "
                          f"was kept (report this: the dump's format is not what slurm-ext reads)")
    return counter, digest.hexdigest(), written[0]


class _Writer:
    """A thread that compresses, hashes and writes chunks in order; the first OSError stops it."""

    def __init__(self, fd: int, digest, written: list[int]) -> None:
        import queue
        self._fd, self._digest, self._written = fd, digest, written
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._zip = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
        self.error: OSError | None = None
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
                try:
                    self._write(self._zip.compress(chunk))
                except OSError as err:
                    self.error = err
        if self.error is None:
            try:
                self._write(self._zip.flush())
            except OSError as err:
                self.error = err

    def _write(self, data: bytes) -> None:
        self._digest.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._written[0] += len(data)


# -- restore ------------------------------------------------------------------------------


def restore(config: Config, source: Path, *, environ: dict[str, str] | None = None,
            emit: Callable = _ignore) -> RestoreResult:
    """Load the backup `source` into accounting.database, which must be new or empty and unused.

    Before anything changes: the file must match its manifest (size, sha256, a whole gzip stream, the
    completion line, the rows), be of this cluster, and no other client (slurmdbd) may be connected to
    the database, nor may it hold rows. After loading, every table's rows must be the manifest's.
    Emits restore-done or restore-failed.

    Raises:
        BackupError: refused (nothing was changed), or the load failed (the message says what is left).
        ConfigError: no password.
    """
    source = Path(source)
    try:
        return _restore(config, source, dict(os.environ if environ is None else environ))
    except SlurmExtError as err:
        emit("restore-failed", f"restore of {source} failed: {err}", path=str(source))
        raise


def _restore(config: Config, source: Path, environ: dict[str, str]) -> RestoreResult:
    started = time.monotonic()
    settings = config.accounting
    db = settings.database
    manifest_path = manifest_path_for(source)
    manifest = read_manifest(manifest_path)
    problems = _against(scan(source), manifest, manifest_path)
    if problems:
        raise BackupError(source, "refusing to restore a damaged backup (nothing was changed): "
                          + "; ".join(problems))
    cluster = _cluster(config)
    if manifest.cluster and cluster and manifest.cluster != cluster:
        raise BackupError(source, f"the backup is of cluster {manifest.cluster!r}, this config's is {cluster!r}: "
                          f"two clusters must not share one database. Restore it with cluster "
                          f"{manifest.cluster!r}'s config, or fix accounting.cluster / ClusterName")
    secret = database.password(settings, environ, config.source or "<defaults>")
    with _option_file(settings, secret) as options:
        client = ["mariadb", f"--defaults-file={options}"]
        try:
            _refuse_in_use(client, settings)
            _refuse_data(client, settings)
            _query(client, f"CREATE DATABASE IF NOT EXISTS {_ident(db)};")
        except CommandError as err:
            raise _server_error(err.stderr or str(err), settings, "checking the database before the restore") from None
        try:
            _load(client, source, db)
        except CommandError as err:
            raise BackupError(f"database {db} at {settings.db_host}:{settings.db_port}",
                              f"loading {source} failed ({_last_line(err)}); the database is partly restored: drop "
                              f"it (DROP DATABASE {_ident(db)}) before trying again") from None
        try:
            tables = _counts(client, db)
        except CommandError as err:
            raise _server_error(err.stderr or str(err), settings, "counting the restored rows") from None
    wrong = [f"{t}: {_rows(tables.get(t))} (expected {manifest.tables[t]})" for t in sorted(manifest.tables)
             if tables.get(t) != manifest.tables[t]]
    if wrong:
        raise BackupError(f"database {db}", f"restored from {source}, but its rows differ from the manifest: "
                          + "; ".join(wrong))
    return RestoreResult(tables=tables, seconds=time.monotonic() - started, database=db)


def _last_line(err: CommandError) -> str:
    lines = [line for line in (err.stderr or str(err)).splitlines() if line.strip()]
    return lines[-1].strip() if lines else str(err)


def _refuse_in_use(client: list[str], settings: AccountingSection) -> None:
    """Another client connected to the database (slurmdbd keeps connections open) refuses the restore."""
    rows = _query(client, f"SELECT ID, USER, HOST, COMMAND FROM information_schema.PROCESSLIST WHERE DB = "
                          f"{sql_string(settings.database)} AND ID <> CONNECTION_ID();")
    if rows:
        who = ", ".join(f"{user}@{host} (id {ident}, {what})" for ident, user, host, what in rows[:5])
        raise BackupError(f"database {settings.database} at {settings.db_host}:{settings.db_port}",
                          f"{len(rows)} other connection(s) use it: {who}. Stop slurmdbd first (a restore under a "
                          f"running slurmdbd mixes its writes with the backup's); nothing was changed")


def _refuse_data(client: list[str], settings: AccountingSection) -> None:
    db = settings.database
    tables = _base_tables(client, db)
    if not tables:
        return
    sql = "\nUNION ALL ".join(f"SELECT {sql_string(t)} FROM DUAL WHERE EXISTS (SELECT 1 FROM {_ident(db)}.{_ident(t)})"
                              for t in tables)
    full = [row[0] for row in _query(client, sql + ";")]
    if full:
        raise BackupError(f"database {db} at {settings.db_host}:{settings.db_port}",
                          f"it holds data ({len(full)} of its {len(tables)} tables have rows: "
                          f"{', '.join(full[:5])}{', ...' if len(full) > 5 else ''}). A restore goes into a new or "
                          f"emptied database: drop or rename it first (or set accounting.database to a new name); "
                          f"nothing was changed")


# -- verify -------------------------------------------------------------------------------


def verify(source: Path, *, emit: Callable = _ignore, workdir: Path | None = None) -> VerifyResult:
    """Check `source` against its manifest, load it into a scratch MariaDB (in `workdir`, default the
    temporary directory) and compare every table's SELECT COUNT(*) with the manifest. A damaged file is
    not loaded. Emits verify-done or verify-failed.

    Raises:
        BackupError: the file cannot be read, or the scratch MariaDB cannot be started (the backup's
            state is then unknown, not bad).
    """
    source = Path(source)
    started = time.monotonic()
    try:
        problems, counts = _verify(source, workdir)
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


def _verify(source: Path, workdir: Path | None) -> tuple[list[str], dict[str, tuple[int, int]]]:
    manifest_path = manifest_path_for(source)
    problems: list[str] = []
    try:
        manifest: Manifest | None = read_manifest(manifest_path)
    except BackupError as err:
        manifest = None
        problems.append(str(err))
    found = scan(source)
    problems += _against(found, manifest, manifest_path) if manifest else found.problems()
    if found.problems() or (manifest and (found.sha256, found.size) != (manifest.sha256, manifest.size)):
        return problems, {}  # damaged: not worth loading (rows that differ from the manifest's still are)
    expected = manifest.tables if manifest else found.tables
    db = (manifest.database if manifest else "") or "restored"
    with scratch_mariadb(workdir=workdir) as scratch:
        scratch.sql(f"CREATE DATABASE {_ident(db)};")
        try:
            scratch.load(source, db)
        except CommandError as err:
            problems.append(f"{source}: loading it into a scratch MariaDB failed: {_last_line(err)}")
            return problems, {}
        restored = scratch.counts(db)
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


# -- the scratch MariaDB ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScratchMariaDB:
    """A throw-away mariadbd of `scratch_mariadb()`: root through its socket, TCP only when given a port."""

    root: Path
    socket: Path
    pid: int
    #: the TCP port on `bind`, None with --skip-networking
    port: int | None = None
    bind: str = "127.0.0.1"

    @property
    def client(self) -> list[str]:
        """The mariadb client's command, as root over the socket."""
        return ["mariadb", "--no-defaults", f"--socket={self.socket}", "--user=root"]

    def sql(self, statements: str, database: str | None = None, timeout: float = QUERY_TIMEOUT) -> list[tuple[str, ...]]:
        """Rows of the last result of `statements` (tab-split strings).

        Raises:
            CommandError: the server refused a statement.
        """
        return _query(self.client + ([database] if database else []), statements, timeout)

    def load(self, source: Path, database: str, timeout: float = DUMP_TIMEOUT) -> None:
        """Load a backup (.sql.gz) into `database` (which must exist).

        Raises:
            CommandError: the load failed.
        """
        _load(self.client, source, database, timeout)

    def counts(self, database: str) -> dict[str, int]:
        """SELECT COUNT(*) of every table of `database`."""
        return _counts(self.client, database)


@contextlib.contextmanager
def scratch_mariadb(*, port: int | None = None, bind: str = "127.0.0.1", workdir: Path | None = None,
                    buffer_pool_mib: int = 64, timeout: float = 60.0) -> Iterator[ScratchMariaDB]:
    """A new, empty mariadbd in a temporary directory, stopped by its PID and removed on the way out.

    Its datadir is made by mariadb-install-db (root through the socket only, no test database); it runs as
    mysql, without the host's option files, with --skip-networking unless `port` is given, and with
    durability traded for speed (innodb_flush_log_at_trx_commit=0, no doublewrite): it holds nothing
    worth keeping.

    Raises:
        BackupError: MariaDB is not installed, or the server did not start (its log's end in the message).
    """
    try:
        mysql = pwd.getpwnam("mysql")
    except KeyError:
        raise BackupError("mariadbd", "this host has no mysql user: install mariadb-server") from None
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-scratch-db-", dir=workdir))
    proc = None
    try:
        root.chmod(0o755)  # mysql must reach its datadir
        data, run, tmp = root / "data", root / "run", root / "tmp"
        for path in (run, tmp):
            path.mkdir()
            os.chown(path, mysql.pw_uid, mysql.pw_gid)
        try:
            command.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=mysql",
                         "--auth-root-authentication-method=socket", "--skip-test-db"], 300)
        except CommandError as err:
            raise BackupError("mariadb-install-db", f"cannot make a scratch datadir in {root}: {err}") from None
        sock = run / "mariadbd.sock"
        network = [f"--port={port}", f"--bind-address={bind}"] if port else ["--skip-networking"]
        cmd = ["mariadbd", "--no-defaults", "--user=mysql", f"--datadir={data}", f"--tmpdir={tmp}",
               f"--socket={sock}", f"--pid-file={run / 'mariadbd.pid'}", *network, "--skip-name-resolve",
               f"--innodb-buffer-pool-size={buffer_pool_mib}M", "--innodb-flush-log-at-trx-commit=0",
               "--innodb-doublewrite=0", "--event-scheduler=DISABLED", "--max-allowed-packet=1G",
               "--skip-log-bin"]
        log = root / "mariadbd.log"
        with open(log, "wb") as out:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            except OSError as err:
                raise BackupError("mariadbd", f"cannot execute it: {err.strerror}: install mariadb-server") from None
        _wait_ready(proc, sock, log, timeout)
        yield ScratchMariaDB(root=root, socket=sock, pid=proc.pid, port=port, bind=bind)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen, sock: Path, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BackupError("mariadbd", f"the scratch server exited with status {proc.returncode}: {_tail(log)}")
        if sock.exists():
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(sock))
                    return
                except OSError:
                    pass
        time.sleep(0.02)
    raise BackupError("mariadbd", f"the scratch server did not answer within {timeout:g}s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if "[ERROR]" in line or "rror" in line]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no error in its log"


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the scratch server's own PID, SIGKILL after `grace`; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

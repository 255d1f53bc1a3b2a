"""The backup file and its manifest: what a backup is on disk, and how it is read and named.

A backup is one mariadb-dump text, gzip-compressed (`<prefix>-<UTC stamp>[-n].sql.gz`), with a manifest
beside it (`<name>.manifest.json`, `Manifest`): its sha256 and size, the cluster, the volume's identity
marker, and the rows of every table. `RowCounter` counts those rows from the dump's text; `scan` reads
a file end to end (checksum, gzip stream, rows) into a `Scan`, which `Scan.against` compares with its
manifest. `backups_in`, `free_name` and `retain` are the naming pattern and the retention by it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from slurm_ext.errors import SlurmExtError

__all__ = ["FORMAT", "SUFFIX", "MANIFEST_SUFFIX", "COMPLETED", "CHUNK", "BackupError", "Manifest", "Scan",
           "RowCounter", "scan", "read_manifest", "manifest_path_for", "backups_in", "free_name", "retain",
           "rows_text"]

#: the manifest's format; a reader refuses any other
FORMAT = 1
SUFFIX = ".sql.gz"
MANIFEST_SUFFIX = ".manifest.json"
#: what mariadb-dump writes last, once every table is out; a dump without it is incomplete
COMPLETED = b"-- Dump completed"
#: how much of a backup is read or written at a time
CHUNK = 1 << 20
_STAMP = "%Y%m%dT%H%M%SZ"


class BackupError(SlurmExtError):
    """A backup, restore or verify failed or was refused; `where` is the file, directory or setting to fix."""

    def __init__(self, where: str | os.PathLike, problem: str):
        self.where = str(where)
        self.problem = problem
        super().__init__(f"{self.where}: {problem}")


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
        """The manifest's JSON, its format first."""
        return {"format": self.format, **{k: v for k, v in asdict(self).items() if k != "format"}}

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
    #: the DEFINERs (user@host) of its stored programs and views
    definers: frozenset[str] = frozenset()

    def problems(self) -> list[str]:
        """The file's damage: a broken gzip stream, no completion line, what RowCounter could not read."""
        found = []
        if self.gzip_problem:
            found.append(f"{self.path}: {self.gzip_problem}")
        elif not self.completed:
            found.append(f"{self.path}: the dump has no '-- Dump completed' line at its end: mariadb-dump did "
                         f"not finish it (killed, or the disk was full); it is incomplete")
        found += [f"{self.path}: {bad}" for bad in self.malformed]
        return found

    def against(self, manifest: Manifest, manifest_path: Path) -> list[str]:
        """Everything in which the file differs from its manifest, damage first (then no row is compared)."""
        found = []
        if self.size != manifest.size:
            found.append(f"{self.path}: {self.size} bytes, its manifest {manifest_path} says {manifest.size}: "
                         + ("the file is truncated" if self.size < manifest.size else "the file was changed"))
        if self.sha256 != manifest.sha256:
            found.append(f"{self.path}: sha256 {self.sha256}, its manifest says {manifest.sha256}: the file was "
                         f"damaged or changed after the backup")
        found += self.problems()
        if found:
            return found
        return [f"table {table}: the dump holds {rows_text(self.tables.get(table))}, the manifest says "
                f"{rows_text(manifest.tables.get(table))}"
                for table in sorted(set(self.tables) | set(manifest.tables))
                if self.tables.get(table) != manifest.tables.get(table)]


def rows_text(count: int | None) -> str:
    """A table's rows in a message: `N rows`, or `no such table` for None."""
    return "no such table" if count is None else f"{count} rows"


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
#: who a routine, trigger, event or view runs as; restoring it as another user takes SET USER or SUPER
#: a stored program's definer, quoted with backquotes, or double quotes where the dump sets ANSI_QUOTES for it
#: (mariadb-dump writes routines so: DEFINER="slurm"@"%")
_DEFINER = re.compile(rb'DEFINER=(?:`((?:[^`\n]|``)*)`|"((?:[^"\n]|"")*)")@(?:`((?:[^`\n]|``)*)`|"((?:[^"\n]|"")*)")')
_NOT_PARENS = bytes(b for b in range(256) if b not in b"()")
#: longest piece of an INSERT held while waiting for a string's closing quote (mariadb-dump's statements
#: are about net_buffer_length, 1 MiB); past it the text is not a dump
_MAX_PENDING = 64 << 20


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").replace("``", "`").replace('""', '"')


class RowCounter:
    """Counts the rows of every table in a mariadb-dump text, fed in chunks of any size.

    A row is a top-level '(' of an `INSERT INTO `t` VALUES (...),(...);`
    statement outside string literals; statements may span lines and
    chunks. Every table of a `CREATE TABLE` is listed, with 0 when it has
    no INSERT. Text between `DELIMITER ;;` and `DELIMITER ;` is a routine's,
    trigger's or event's body, whose INSERTs are not data. Never raises on
    bad input: what it cannot read is listed in `malformed`.

    Two ways to count, the same result on what mariadb-dump writes. It
    escapes every newline inside a string as \\n, so a raw newline is always
    outside string literals; and recent versions put each row on a line of
    its own (`VALUES\\n(...),\\n(...);\\n`). A statement of that shape whose
    only newlines are the one after VALUES and one per `),\\n(` between rows
    holds exactly that many rows: three byte counts, ten times faster than
    reading every literal. Any other statement (one line, or a raw newline
    somewhere else) is read literal by literal.
    """

    def __init__(self) -> None:
        self.tables: dict[str, int] = {}
        self.server_version = ""
        self.malformed: list[str] = []
        #: the DEFINERs (user@host) of the dump's stored programs and views
        self.definers: set[str] = set()
        self._buf = b"\n"
        self._table: str | None = None  # the table whose INSERT is being read
        self._depth = 0
        self._fresh = False  # nothing of the current INSERT is counted yet: it may take the fast way
        self._probe = 0  # how far past the INSERT's start its end was looked for already
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
            if self._table is not None and self._fresh:
                rows = self._rows_by_line(buf, pos, final)
                if rows is None:  # wait for the statement's end
                    break
                if rows:
                    self.tables[self._table] += rows[0]
                    pos = rows[1] + 1
                    self._table = None
                    continue
                self._fresh = False
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
            before = found.start() if found else max(limit, pos)
            if buf.find(b"DEFINER=", pos, before) >= 0:
                self.definers.update(f"{_name(user_bq or user_dq)}@{_name(host_bq or host_dq)}"
                                     for user_bq, user_dq, host_bq, host_dq in _DEFINER.findall(buf, pos, before))
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
                self._fresh, self._probe = True, 0
        self._buf = buf[pos:]

    def _rows_by_line(self, buf: bytes, pos: int, final: bool) -> tuple | None:
        """(rows, index of its ';') of a row-per-line INSERT starting at `pos`; () when it is not one
        (read it literal by literal), None when its end is not in `buf` yet."""
        if not buf.startswith(b"\n(", pos):
            return ()
        end = buf.find(b";\n", pos + self._probe)
        if end < 0:
            if final or len(buf) - pos > _MAX_PENDING:
                return ()
            self._probe = max(0, len(buf) - pos - 1)
            return None
        if buf[end - 1] != 0x29:  # ')'
            return ()
        rows = buf.count(b"),\n(", pos, end) + 1
        return (rows, end) if buf.count(b"\n", pos, end) == rows else ()

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
            while chunk := f.read(CHUNK):
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
                malformed=list(counter.malformed), definers=frozenset(counter.definers))


# -- names and retention ------------------------------------------------------------------


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


def free_name(directory: Path, prefix: str, when: datetime) -> Path:
    """`<prefix>-<UTC stamp of when>.sql.gz`; past another backup of the same second, `-2`, `-3`, ... after the
    highest there, so names keep the order the backups were taken in (retention goes by name).

    Raises:
        OSError: `directory` cannot be listed.
    """
    stamp = when.strftime(_STAMP)
    taken = [int(m.group(2) or 1) for m in map(_pattern(prefix).match, os.listdir(directory))
             if m and m.group(1) == stamp]
    if not taken and not (directory / f"{prefix}-{stamp}{MANIFEST_SUFFIX}").exists():
        return directory / f"{prefix}-{stamp}{SUFFIX}"
    return directory / f"{prefix}-{stamp}-{max(taken, default=1) + 1}{SUFFIX}"


def retain(directory: Path, prefix: str, keep: int) -> tuple[list[Path], list[str]]:
    """Delete all but the newest `keep` backups of this pattern, each with its manifest: (removed, what
    could not be). Never raises: the new backup is written by then, and a failure here must not fail it."""
    removed, problems = [], []
    for old in backups_in(directory, prefix)[:-keep]:
        try:
            old.unlink()
            manifest_path_for(old).unlink(missing_ok=True)
        except OSError as err:
            problems.append(f"cannot remove the old backup {old}: {err.strerror}; remove it by hand")
            continue
        removed.append(old)
    return removed, problems

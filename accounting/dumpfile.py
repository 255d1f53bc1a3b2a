"""The backup file and its manifest: what a backup is on disk, and how it is read and named.

A backup is one mariadb-dump text, gzip-compressed (`<prefix>-<UTC stamp>[-n].sql.gz`), with a manifest
beside it (`<name>.manifest.json`, `Manifest`): its sha256 and sizes, the cluster, the volume's identity
marker, and the rows of every table, authenticated by an HMAC under the backup key (`backupkey`), which
is kept apart from the backups: anyone who can write a dump can write a sha256 beside it, only the key's
holder an HMAC. `read_manifest` returns only an authenticated manifest. `RowCounter` counts the rows from
the dump's text and refuses what the mariadb client would take for its own commands (`\\!`, `system`,
`source`, ...); `scan` reads a file end to end (checksum, gzip stream, rows) into a `Scan`, in bounded
memory whatever the file holds, which `Scan.against` compares with its manifest. `backups_in` and
`free_name` are the naming pattern; `retain` keeps the newest backups by their manifests' own times.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import stat
import zlib
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from slurm_ext.errors import SlurmExtError

if TYPE_CHECKING:
    from .backupkey import BackupKey

__all__ = ["FORMAT", "SUFFIX", "MANIFEST_SUFFIX", "COMPLETED", "CHUNK", "MAX_LINE", "BackupError", "Manifest",
           "Scan", "RowCounter", "open_dump", "scan", "read_manifest", "manifest_path_for", "backups_in", "free_name",
           "retain", "rows_text"]

#: the manifest's format; a reader refuses any other (1: before manifests were authenticated)
FORMAT = 2
SUFFIX = ".sql.gz"
MANIFEST_SUFFIX = ".manifest.json"
#: what mariadb-dump writes last, once every table is out; a dump without it is incomplete
COMPLETED = b"-- Dump completed"
#: how much of a backup is read or written at a time, and most text one read of it decompresses to
CHUNK = 1 << 20
#: longest line outside an INSERT's rows: mariadb-dump's schema and routine lines are short, and a text
#: without newlines (or a gzip bomb of one byte) is refused after this much instead of held in memory
MAX_LINE = 1 << 20
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
    """What a backup holds, written beside it as JSON: the checks of restore and verify, authenticated by
    `hmac`."""

    #: when the dump started, ISO 8601 UTC (retention keeps the newest by it)
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
    #: bytes of the dump's text (decompressed): a scan reads no more than this
    text_size: int = 0
    #: HMAC-SHA256 (hex) of every other field under the backup key; "" when unsigned
    hmac: str = ""
    format: int = FORMAT

    @property
    def rows(self) -> int:
        return sum(self.tables.values())

    def as_dict(self) -> dict:
        """The manifest's JSON, its format first."""
        return {"format": self.format, **{k: v for k, v in asdict(self).items() if k != "format"}}

    def signed_text(self) -> bytes:
        """What the HMAC covers: every field but the HMAC (the dump's sha256 among them), as canonical JSON."""
        fields = {k: v for k, v in self.as_dict().items() if k != "hmac"}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    def signed(self, key: BackupKey) -> Manifest:
        """This manifest with its HMAC under `key`."""
        return replace(self, hmac=hmac.new(key.secret, self.signed_text(), hashlib.sha256).hexdigest())

    def authenticate(self, key: BackupKey, source: str | os.PathLike, dump: str | None = None) -> None:
        """Raises: BackupError: no HMAC, one that `key` did not make, or (given `dump`, the file's name) the
        manifest of another file."""
        if not self.hmac:
            raise BackupError(source, "the manifest carries no HMAC: nothing proves that slurm-ext wrote it (whoever "
                              "can write a dump can write its sha256 beside it). Refusing it; take a new backup "
                              "(`slurm-ext accounting backup`)")
        if not hmac.compare_digest(self.hmac.encode(), self.signed(key).hmac.encode()):
            raise BackupError(source, f"its HMAC does not match under the backup key {key.path} "
                              f"(accounting.backup_key): the manifest was changed or forged, or written under "
                              f"another host's key (use that key). Refusing it")
        if dump is not None and self.file != dump:
            raise BackupError(source, f"the manifest is that of {self.file!r}, not of {dump!r}: a backup renamed or "
                              f"a manifest copied beside another dump. Refusing it")

    @classmethod
    def from_dict(cls, data: dict, source: str | os.PathLike = "<manifest>") -> Manifest:
        """Raises: BackupError: not a manifest of this format."""
        try:
            if data.get("format") == 1:
                raise BackupError(source, "manifest format 1, written before slurm-ext authenticated its manifests: "
                                  "nothing proves the backup was not changed, and slurm-ext loads no such backup. "
                                  "Take a new backup; to load this one anyway, check its content yourself and load "
                                  "it by hand (gunzip -c FILE | mariadb --binary-mode --sandbox DATABASE)")
            if data.get("format") != FORMAT:
                raise BackupError(source, f"manifest format {data.get('format')!r} (this slurm-ext reads {FORMAT}): "
                                  f"written by another version of slurm-ext; verify or restore it with that one")
            tables = {str(k): int(v) for k, v in data["tables"].items()}
            identity = data.get("identity")
            return cls(created=str(data["created"]), cluster=str(data["cluster"]), database=str(data["database"]),
                       identity=dict(identity) if identity is not None else None, tables=tables,
                       sha256=str(data["sha256"]),
                       size=int(data["size"]), file=str(data["file"]), server_version=str(data["server_version"]),
                       text_size=int(data["text_size"]), hmac=str(data.get("hmac") or ""))
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
    #: bytes of text the gzip stream held (as far as it was read)
    text_size: int = 0

    def problems(self) -> list[str]:
        """The file's damage: a broken gzip stream, no completion line, what RowCounter could not read."""
        found = []
        if self.gzip_problem:
            found.append(f"{self.path}: {self.gzip_problem}")
        elif not self.completed and not self.malformed:
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
        if not found and self.text_size != manifest.text_size:
            found.append(f"{self.path}: {self.text_size} bytes of text, its manifest says {manifest.text_size}")
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
#: the mariadb client's own commands (mysql.cc's table), which it runs when a line starts with one: `\!` runs a
#: shell, `source` and `\.` read a file, `tee` writes one, `connect` and `use` change the database. mariadb-dump
#: writes none of them but `DELIMITER ;;` and `DELIMITER ;`
_CLIENT_COMMANDS = (rb"charset|clear|connect|edit|ego|exit|go|help|nopager|notee|nowarning|pager|print|prompt|"
                    rb"quit|rehash|sandbox|source|status|system|tee|use|warnings|query_attributes")
#: what mariadb-dump writes as DELIMITER: around its stored programs, and back
_DELIMITERS = (b";;", b";")
#: the lines the counter acts on; the stream is read as if it began with a newline. A DELIMITER or version
#: line counts once its newline is in (its text is whole); the others as soon as they are recognisable.
_LANDMARK = re.compile(
    rb"\n(?:(?:INSERT|REPLACE)(?: IGNORE)? INTO " + _NAME + rb"(?: \([^\n]*?\))? VALUES"
    rb"|CREATE TABLE (?:IF NOT EXISTS )?" + _NAME + rb"(?=[ \t]*\()"
    rb"|(?P<delimiter>[ \t]*(?i:delimiter)(?:[ \t]+[^\n]*?)?)[ \t]*(?=\r?\n)"
    rb"|-- Server version[ \t]+([^\n]*)(?=\n)"
    rb"|(?P<command>[ \t]*(?:\\|\?|(?i:" + _CLIENT_COMMANDS + rb")(?=[\s;]))[^\n]*))")
#: a string literal or a backslash outside one, in an INSERT's values
_STRING_OR_BACKSLASH = re.compile(rb"'[^'\\]*+(?:\\.[^'\\]*+)*+'|\\", re.S)
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
        #: bytes fed: the dump's text size
        self.size = 0
        #: newlines in the text already read and let go of (the leading one included): line numbers for messages
        self._newlines = 0

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        self._tail = (self._tail + data[-4096:])[-4096:]
        if self._broken:
            return
        self._buf += data
        self._scan(final=False)

    @property
    def broken(self) -> bool:
        """What it was fed is not a dump it reads (`malformed` says why): the rest is not read."""
        return self._broken

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

    def _line_at(self, buf: bytes, index: int) -> int:
        """The number (from 1) of the line that holds buf[index]."""
        return self._newlines + buf.count(b"\n", 0, index)

    def _client_command(self, buf: bytes, index: int, text: bytes) -> None:
        shown = "".join(c if c.isprintable() else "?" for c in text.strip()[:120].decode("utf-8", "replace"))
        self._bad(f"line {self._line_at(buf, index)}: '{shown}' is a command "
                  f"of the mariadb client (it could run a shell, read or write files), which mariadb-dump never "
                  f"writes: this dump was made or changed by hand, and is not loaded")

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
                self._count(buf, pos, end)
                if self._broken:
                    return
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
            complete = len(buf) if final else buf.rfind(b"\n")  # the whole lines
            found = _LANDMARK.search(buf, pos)
            before = found.start() if found else max(complete, pos)
            if buf.find(b"DEFINER=", pos, min(before, max(complete, pos))) >= 0:
                self.definers.update(f"{_name(user_bq or user_dq)}@{_name(host_bq or host_dq)}"
                                     for user_bq, user_dq, host_bq, host_dq in
                                     _DEFINER.findall(buf, pos, min(before, max(complete, pos))))
            if found is None:
                pos = max(complete, pos)  # a landmark may start at the last newline: keep that line
                if len(buf) - pos > MAX_LINE:
                    self._bad(f"line {self._line_at(buf, pos + 1)} is longer than {MAX_LINE} bytes outside an "
                              f"INSERT: not a dump of mariadb-dump")
                    return
                break
            insert, create, delimiter, version, command = found.groups()
            pos = found.end()
            if command is not None:
                if found.end() == len(buf) and not final and len(buf) - found.start() <= MAX_LINE:
                    pos = found.start()  # the line's end is still to come: name it whole
                    break
                self._client_command(buf, found.start() + 1, command)
                return
            if delimiter is not None:
                words = delimiter.split(None, 1)
                if len(words) != 2 or words[1].strip() not in _DELIMITERS:  # the client's, not mariadb-dump's
                    self._client_command(buf, found.start() + 1, delimiter)
                    return
                self._delimiter = words[1].strip()
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
        self._newlines += buf.count(b"\n", 0, pos)
        self._buf = buf[pos:]

    def _rows_by_line(self, buf: bytes, pos: int, final: bool) -> tuple | None:
        """(rows, index of its ';') of a row-per-line INSERT starting at `pos`; () when it is not one
        (read it literal by literal), None when its end is not in `buf` yet."""
        if len(buf) - pos < 2 and not final:
            return None  # the statement's first row has not come yet
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

    def _count(self, buf: bytes, start: int, end: int) -> None:
        body = buf[start:end]
        outside = _STRING.sub(b"", body)
        if b"\\" in outside:  # a backslash outside the strings: the client's command, never a value
            at = next(m.start() for m in _STRING_OR_BACKSLASH.finditer(body) if m.group() == b"\\")
            line_end = body.find(b"\n", at)
            self._client_command(buf, start + at, body[at:line_end if line_end >= 0 else len(body)])
            return
        parens = outside.translate(None, _NOT_PARENS)
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


def read_manifest(path: Path, key: BackupKey, dump: Path | None = None) -> Manifest:
    """The manifest at `path`, authenticated under `key` (and, given `dump`, that dump's).

    Raises:
        BackupError: missing, unreadable, not JSON, not a manifest, or not authenticated.
    """
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
    manifest = Manifest.from_dict(data, path)
    manifest.authenticate(key, path, dump.name if dump is not None else None)
    return manifest


def open_dump(path: Path) -> BinaryIO:
    """The backup at `path`, opened once for reading: its check and its load must read the same file, which a
    path opened twice does not promise (a file renamed over it in between). Not through a symbolic link, and
    only a regular file.

    Raises:
        BackupError: it cannot be opened, is a symbolic link, or is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BackupError(path, "is a symbolic link: give the backup file itself") from None
        raise BackupError(path, f"cannot read the backup: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BackupError(path, "is not a regular file: give the backup file itself")
    return os.fdopen(fd, "rb")


def scan(path: Path, text_limit: int | None = None, file: BinaryIO | None = None) -> Scan:
    """Read a backup end to end: its checksum, its gzip stream (CRC and length) and its dump text.

    The text is decompressed a CHUNK at a time and read no further than `text_limit` bytes (the manifest's
    text_size), a line outside an INSERT no longer than MAX_LINE, nor past the first thing that is not a
    dump: a gzip bomb or a text without newlines costs a few MiB, not its decompressed size. The checksum
    always covers the whole file. Given `file` (`open_dump`'s), that is what is read, from its start.

    Raises:
        BackupError: the file cannot be read.
    """
    path = Path(path)
    digest, counter, size = hashlib.sha256(), RowCounter(), 0
    unzip = zlib.decompressobj(31)
    problem = ""
    try:
        with contextlib.nullcontext(file) if file is not None else open(path, "rb") as f:
            f.seek(0)
            while chunk := f.read(CHUNK):
                size += len(chunk)
                digest.update(chunk)
                if problem or counter.broken:
                    continue
                try:
                    problem = _decompress(unzip, chunk, counter, text_limit)
                except zlib.error as err:
                    problem = f"not a valid gzip file, or damaged: {err}"
                    continue
                if not problem and unzip.eof and unzip.unused_data:
                    problem = "data after the end of its gzip stream: it was changed after the backup"
    except OSError as err:
        raise BackupError(path, f"cannot read the backup: {err.strerror}") from None
    if not problem and not counter.broken and not unzip.eof:
        problem = "its gzip stream ends early: the file is truncated"
    counter.finish()
    return Scan(path=path, size=size, sha256=digest.hexdigest(), gzip_problem=problem, completed=counter.completed,
                tables=dict(counter.tables), server_version=counter.server_version,
                malformed=list(counter.malformed), definers=frozenset(counter.definers), text_size=counter.size)


def _decompress(unzip, chunk: bytes, counter: RowCounter, text_limit: int | None) -> str:
    """Feed `chunk`'s text to `counter`, CHUNK bytes at a time; why it stopped early ("" when it did not)."""
    while chunk:
        text = unzip.decompress(chunk, CHUNK)
        chunk = unzip.unconsumed_tail
        if text_limit is not None and counter.size + len(text) > text_limit:
            return (f"its text is longer than the {text_limit} bytes its manifest records: it was changed after the "
                    f"backup (or is a gzip bomb); not read further")
        counter.feed(text)
        if counter.broken:
            return ""
    return ""


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
    highest there, so names keep the order the backups were taken in (for people: retention goes by manifests).

    Raises:
        OSError: `directory` cannot be listed.
    """
    stamp = when.strftime(_STAMP)
    taken = [int(m.group(2) or 1) for m in map(_pattern(prefix).match, os.listdir(directory))
             if m and m.group(1) == stamp]
    if not taken and not (directory / f"{prefix}-{stamp}{MANIFEST_SUFFIX}").exists():
        return directory / f"{prefix}-{stamp}{SUFFIX}"
    return directory / f"{prefix}-{stamp}-{max(taken, default=1) + 1}{SUFFIX}"


def retain(directory: Path, prefix: str, keep: int, key: BackupKey, current: Path) -> tuple[list[Path], list[str]]:
    """Keep `current` (the backup just written) and the newest `keep` - 1 others of this pattern, newest by their
    manifests' own authenticated times (a name says nothing: anyone who can write the directory can name a file
    after any time); delete the rest, each with its manifest. A backup whose manifest is missing or not
    authenticated is neither counted nor deleted. Returns (removed, what could not be done). Never raises: the
    new backup is written by then, and a failure here must not fail it."""
    dated, problems = [], []
    for order, path in enumerate(backups_in(directory, prefix)):  # same time: the order of their names
        if path == current:
            continue
        try:
            manifest = read_manifest(manifest_path_for(path), key, path)
            created = datetime.fromisoformat(manifest.created)
        except BackupError as err:
            problems.append(f"left {path} alone ({err.problem})")
            continue
        except ValueError:
            problems.append(f"left {path} alone (its manifest's time {manifest.created!r} is not ISO 8601)")
            continue
        dated.append((created.timestamp(), order, path))
    dated.sort()
    removed = []
    for _, _, old in dated[:max(0, len(dated) - (keep - 1))]:
        try:
            old.unlink()
            manifest_path_for(old).unlink(missing_ok=True)
        except OSError as err:
            problems.append(f"cannot remove the old backup {old}: {err.strerror}; remove it by hand")
            continue
        removed.append(old)
    return removed, problems

"""The mariadb client, the one way the backup code reaches a MariaDB server.

Every client runs with CLIENT_SAFETY: --binary-mode (the text is SQL only: no `\\!`, `source`, `tee` or other
client command is parsed, however a backup spells it), --sandbox (the commands that reach files or a shell
are refused even where one would be parsed) and --local-infile=0 (no LOAD DATA LOCAL reads this host's files).

`option_file` holds the connection as slurmdbd's user (the password never on a command line, which every
user can read in /proc); `query` runs small statements, `counts` takes every table's SELECT COUNT(*),
`load` streams a backup (.sql.gz) into a database; `server_error` turns the client's complaint into a
BackupError that names the setting to fix. `Deadline` kills a streaming client past its timeout.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from slurm_ext import command
from slurm_ext.errors import CommandError, CommandTimeout

from .dumpfile import CHUNK, BackupError
from .render import sql_string
from .settings import PASSWORD_ENV, AccountingSection

__all__ = ["CLIENT_SAFETY", "DUMP_TIMEOUT", "QUERY_TIMEOUT", "quote_option", "option_file", "server_error", "query",
           "ident", "base_tables", "counts", "load", "error_line", "Deadline", "kill_group",
           "SANDBOX_SINCE", "sandbox_problem", "require_sandbox"]

#: longest a dump or a load may take before it is killed (a large database takes minutes, not hours)
DUMP_TIMEOUT = 6 * 3600.0
#: longest one small query (counts, checks) may take
QUERY_TIMEOUT = 120.0
#: options of every mariadb client this code runs (see the module's docstring): a backup is text that someone
#: else may have written
CLIENT_SAFETY = ("--binary-mode", "--sandbox", "--local-infile=0")
#: mariadb's error lines that mean the server was not reached, and those that mean the password is wrong
_UNREACHABLE = ("Can't connect", "Unknown server host", "Unknown MySQL server host", "Lost connection",
                "Connection refused", "No route to host", "timed out", "Can't create TCP/IP socket")
_DENIED = ("(using password:",)
#: the first release of each series whose mariadb client has --sandbox; a series after the newest here has it
SANDBOX_SINCE = {(10, 5): 25, (10, 6): 18, (10, 11): 8, (11, 0): 6, (11, 1): 5, (11, 2): 4, (11, 4): 2}
_MARIADB_VERSION = re.compile(r"\b(\d+)\.(\d+)\.(\d+)-MariaDB")


def sandbox_problem(version: str) -> str:
    """Why the client that printed `version` (`mariadb --version`) lacks --sandbox, "" when it has it."""
    found = _MARIADB_VERSION.search(version)
    if found:
        major, minor, patch = (int(part) for part in found.groups())
        since = SANDBOX_SINCE.get((major, minor))
        if since is not None and patch >= since or since is None and (major, minor) > max(SANDBOX_SINCE):
            return ""
    first = ", ".join(f"{major}.{minor}.{patch}" for (major, minor), patch in SANDBOX_SINCE.items())
    return (f"the mariadb client is {found.group(0) if found else version.strip()[:80]!r}, which has no --sandbox "
            f"(the option that keeps a backup's text from running commands of the client); it came in {first} "
            f"and every later series: install a newer MariaDB client (Debian: mariadb-client)")


@functools.cache
def require_sandbox() -> None:
    """Refuse, once per process, a mariadb client that has no --sandbox: every client here runs with it.

    Raises:
        BackupError: the client is missing or too old (the message names the minimum versions).
    """
    try:
        version = command.run(["mariadb", "--version"], QUERY_TIMEOUT).stdout
    except CommandError as err:
        raise BackupError("mariadb", f"cannot run `mariadb --version`: {err}: install the MariaDB client "
                          f"(Debian: mariadb-client)") from None
    problem = sandbox_problem(version)
    if problem:
        raise BackupError("mariadb", problem)


def quote_option(value: str) -> str:
    """A value for a MariaDB option file: double-quoted, '\\' and '"' escaped (the parser unescapes them)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextlib.contextmanager
def option_file(settings: AccountingSection, secret: str) -> Iterator[Path]:
    """A 0600 option file with the connection and the password, removed on the way out.

    --defaults-file, not --defaults-extra-file: no /etc/mysql/my.cnf or ~/.my.cnf can change the user,
    the password or the protocol under us."""
    fd, name = tempfile.mkstemp(prefix="slurm-ext-db-", suffix=".cnf")  # 0600, root's
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"[client]\nuser={settings.db_user}\npassword={quote_option(secret)}\n"
                    f"host={settings.db_host}\nport={settings.db_port}\nprotocol=TCP\n")
        yield Path(name)
    finally:
        os.unlink(name)


def _password_source(settings: AccountingSection) -> str:
    return (f"{settings.password_file} (accounting.password_file)" if settings.password_file
            else f"${PASSWORD_ENV} (accounting.password_file is empty)")


def server_error(stderr: str, settings: AccountingSection, what: str) -> BackupError:
    """mariadb's or mariadb-dump's complaint as an error that names the setting to fix."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else "no message"
    address = f"{settings.db_host}:{settings.db_port}"
    for line in lines:
        if any(text in line for text in _DENIED):
            return BackupError(_password_source(settings),
                               f"the database at {address} refused user {settings.db_user!r} "
                               f"({line.split(': ', 1)[-1]}): put slurmdbd's password there (StoragePass), or check "
                               f"accounting.db_user")
        if any(text in line for text in _UNREACHABLE):
            return BackupError(f"accounting.db_host:db_port ({address})",
                               f"cannot connect to the database ({line.split(': ', 1)[-1]}): is mariadbd running "
                               f"there, and is that its address and port?")
        if "to database" in line and "Access denied" in line:
            return BackupError(f"accounting.database ({settings.database})",
                               f"user {settings.db_user!r} may not use it at {address} ({line.split(': ', 1)[-1]}): "
                               f"it does not exist there, or the user lacks ALL on `{settings.database}`.*; check "
                               f"accounting.database (slurmdbd's StorageLoc) and the grants")
        if "Unknown database" in line:
            return BackupError(f"accounting.database ({settings.database})",
                               f"no such database at {address}: check accounting.database (slurmdbd's StorageLoc)")
    if "Access denied" in stderr:
        return BackupError(f"user {settings.db_user!r} at {address}",
                           f"{what} failed for lack of a privilege ({detail}): give it the grants of the start-up "
                           f"SQL (`slurm-ext accounting config`): ALL on `{settings.database}`.*, SELECT on "
                           f"mysql.proc, RELOAD and PROCESS on *.*")
    return BackupError(f"the database at {address}", f"{what} failed: {detail}")


def query(client: list[str], sql: str, timeout: float = QUERY_TIMEOUT,
          database: str | None = None) -> list[tuple[str, ...]]:
    """The rows `sql` prints, run by the mariadb client `client` (tab-separated, no header).

    Raises:
        CommandError: the client failed (its stderr is in the error).
    """
    require_sandbox()
    result = command.run([*client, *CLIENT_SAFETY, "--batch", "--skip-column-names",
                          *([database] if database else [])], timeout, input=sql)
    return [tuple(line.split("\t")) for line in result.stdout.splitlines()]


def ident(name: str) -> str:
    """`name` as an SQL identifier: backquoted, backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


def base_tables(client: list[str], db: str) -> list[str]:
    rows = query(client, f"SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = {sql_string(db)} "
                         f"AND TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') ORDER BY TABLE_NAME;")
    return [row[0] for row in rows]


def counts(client: list[str], db: str) -> dict[str, int]:
    """SELECT COUNT(*) of every base table of `db`."""
    tables = base_tables(client, db)
    if not tables:
        return {}
    sql = "\nUNION ALL ".join(f"SELECT {sql_string(t)}, COUNT(*) FROM {ident(db)}.{ident(t)}" for t in tables)
    return {name: int(count) for name, count in query(client, sql + ";", DUMP_TIMEOUT)}


def load(client: list[str], source: Path | BinaryIO, db: str, timeout: float = DUMP_TIMEOUT) -> None:
    """Stream the decompressed dump `source` into `client` connected to `db`: a path, or the file its check read
    (`dumpfile.open_dump`), loaded from its start.

    Raises:
        CommandError: the client failed (its stderr in the error), or ran past `timeout`.
    """
    require_sandbox()
    cmd = [*client, *CLIENT_SAFETY, "--batch", "--max-allowed-packet=1G", db]
    opened = contextlib.nullcontext(source) if hasattr(source, "read") else open(source, "rb")
    with tempfile.TemporaryFile() as errors, opened as f:
        f.seek(0)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                                    start_new_session=True)
        except OSError as err:
            raise CommandError(cmd, None, f"cannot execute {cmd[0]}: {err.strerror}") from None
        timer = Deadline(timeout, proc.pid)
        unzip = zlib.decompressobj(31)
        try:
            while chunk := f.read(CHUNK):
                while chunk:  # a CHUNK of text at a time, whatever the file holds
                    proc.stdin.write(unzip.decompress(chunk, CHUNK))
                    chunk = unzip.unconsumed_tail
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it stopped reading: its status and stderr say why
        except BaseException:
            kill_group(proc.pid)
            raise
        finally:
            returncode = proc.wait()
            timer.cancel()
        if returncode:
            errors.seek(0)
            stderr = errors.read().decode("utf-8", "replace")
            if timer.fired:
                raise CommandTimeout(cmd, timeout, stderr)
            raise CommandError(cmd, returncode, stderr)


def error_line(err: CommandError) -> str:
    """The client's last non-empty line of complaint: the one that says why."""
    lines = [line for line in (err.stderr or str(err)).splitlines() if line.strip()]
    return lines[-1].strip() if lines else str(err)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


class Deadline:
    """Kills a process group once `timeout` seconds have passed, unless cancelled first."""

    def __init__(self, timeout: float, pgid: int) -> None:
        self.fired = False
        self._pgid = pgid
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        kill_group(self._pgid)

    def cancel(self) -> None:
        self._timer.cancel()

"""A throw-away MariaDB server, `scratch_mariadb()`: where `verify` loads a backup to count its rows, and
where the tests and the benchmark keep their databases.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from slurm_ext import command
from slurm_ext.errors import CommandError

from . import sqlclient
from .dumpfile import BackupError
from .render import sql_string
from .sqlclient import DUMP_TIMEOUT, QUERY_TIMEOUT

__all__ = ["ScratchMariaDB", "scratch_mariadb"]

#: the accounts mariadb-install-db makes, which a backup's program must not run as
_BUILT_IN = frozenset({("root", "localhost"), ("mysql", "localhost"), ("mariadb.sys", "localhost")})


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

    def sql(self, statements: str, database: str | None = None,
            timeout: float = QUERY_TIMEOUT) -> list[tuple[str, ...]]:
        """The rows `statements` print (tab-split strings), run as root in `database`.

        Raises:
            CommandError: the server refused a statement.
        """
        return sqlclient.query(self.client, statements, timeout, database)

    def load(self, source: Path | BinaryIO, database: str, timeout: float = DUMP_TIMEOUT) -> None:
        """Load a backup (.sql.gz) into `database` (which must exist).

        Raises:
            CommandError: the load failed.
        """
        sqlclient.load(self.client, source, database, timeout)

    def counts(self, database: str) -> dict[str, int]:
        """SELECT COUNT(*) of every table of `database`."""
        return sqlclient.counts(self.client, database)

    def load_limited(self, source: Path | BinaryIO, database: str, definers: frozenset[str],
                     timeout: float = DUMP_TIMEOUT) -> dict[str, int]:
        """Load a backup into `database` (which must exist) as an account that may use that database only, and
        count its tables: SQL that slurm-ext did not write gets no root (no SET GLOBAL, no logs put elsewhere).

        The accounts the backup's programs are defined by (`definers`) are made with rights on `database` only,
        and the loader may create programs for them (SET USER); root and mysql, whom a program could otherwise
        name, are dropped first, and the rest is done as an administrator of a random name. The server is
        of no use for anything else afterwards.

        Raises:
            CommandError: the load failed (its stderr in the error).
        """
        admin, loader = f"slurm_ext_admin_{secrets.token_hex(6)}", "slurm_ext_loader"
        admin_pw, loader_pw = secrets.token_hex(16), secrets.token_hex(16)
        db = sqlclient.ident(database)
        made = [f"CREATE USER '{admin}'@'localhost' IDENTIFIED BY '{admin_pw}'",
                f"GRANT ALL ON *.* TO '{admin}'@'localhost' WITH GRANT OPTION",
                f"CREATE USER '{loader}'@'localhost' IDENTIFIED BY '{loader_pw}'",
                f"GRANT ALL ON {db}.* TO '{loader}'@'localhost'", f"GRANT SET USER ON *.* TO '{loader}'@'localhost'"]
        for account in sorted(definers):
            user, _, host = account.rpartition("@")
            who = f"{sql_string(user)}@{sql_string(host)}"
            if (user, host) not in _BUILT_IN:
                made += [f"CREATE USER IF NOT EXISTS {who} ACCOUNT LOCK", f"GRANT ALL ON {db}.* TO {who}"]
        self.sql("".join(f"{statement};\n" for statement in made))
        admin_client = self._client_as(admin, admin_pw)
        sqlclient.query(admin_client, "".join(f"DROP USER IF EXISTS {who};\n" for who in (
            "'root'@'localhost'", "'mysql'@'localhost'", "''@'localhost'")))
        sqlclient.load(self._client_as(loader, loader_pw), source, database, timeout)
        return sqlclient.counts(admin_client, database)

    def _client_as(self, user: str, password: str) -> list[str]:
        """The mariadb client as `user` through the socket, its password in a 0600 option file."""
        options = self.root / f"{user}.cnf"
        fd = os.open(options, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"[client]\nuser={user}\npassword={password}\nsocket={self.socket}\n")
        return ["mariadb", f"--defaults-file={options}"]


@contextlib.contextmanager
def scratch_mariadb(*, port: int | None = None, bind: str = "127.0.0.1", workdir: Path | None = None,
                    buffer_pool_mib: int = 64, timeout: float = 60.0) -> Iterator[ScratchMariaDB]:
    """A new, empty mariadbd in a temporary directory, stopped by its PID and removed on the way out.

    Its datadir is made by mariadb-install-db (root through the socket only, no test database); it runs as
    mysql, without the host's option files, with --skip-networking unless `port` is given, and with
    durability traded for speed (innodb_flush_log_at_trx_commit=0, no doublewrite): it holds nothing
    worth keeping. What it loads may be SQL that slurm-ext did not write (`verify` of a backup), so it takes
    no file statement: --secure-file-priv is an empty directory of root's that mysql cannot write (no
    SELECT ... INTO OUTFILE or LOAD_FILE elsewhere, nothing written there), --local-infile=0, no DATA
    DIRECTORY (--skip-symbolic-links), and the same empty directory as --plugin-dir (no INSTALL SONAME of
    the audit plugin, whose log file could be put anywhere). Its root could still point the general or slow
    query log at a file mysql may write: `load_limited` loads as an account that cannot.

    Raises:
        BackupError: MariaDB is not installed, or the server did not start (its log's end in the message).
    """
    try:
        mysql = pwd.getpwnam("mysql")
    except KeyError:
        raise BackupError("mariadbd", "this host has no mysql user: install mariadb-server") from None
    blocked = _untraversable(Path(workdir or tempfile.gettempdir()), mysql)
    if blocked is not None:
        raise BackupError(blocked, f"the mysql user cannot reach a scratch datadir under it (mode "
                          f"{blocked.stat().st_mode & 0o7777:04o}): give another directory, one every user may "
                          f"traverse (chmod o+x), or TMPDIR")
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-scratch-db-", dir=workdir))
    proc = None
    try:
        root.chmod(0o755)  # mysql must reach its datadir
        data, run, tmp, files = root / "data", root / "run", root / "tmp", root / "no-files"
        for path in (run, tmp):
            path.mkdir()
            os.chown(path, mysql.pw_uid, mysql.pw_gid)
        files.mkdir(mode=0o755)  # root's, empty: the only place file statements may name, and mysql cannot write
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
               "--innodb-doublewrite=0", "--event-scheduler=OFF", "--max-allowed-packet=1G",
               "--skip-log-bin", f"--secure-file-priv={files}", "--local-infile=0", "--skip-symbolic-links",
               f"--plugin-dir={files}"]
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


def _untraversable(directory: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory from / down to `directory` that `user` may not search, else None."""
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    for path in [*reversed(directory.resolve().parents), directory.resolve()]:
        st = path.stat()
        if st.st_uid == user.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return path
    return None


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
    """The server log's last error line, else its last line."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"no log ({log})"
    errors = [line for line in lines if "[ERROR]" in line]
    return (errors or lines or ["an empty log"])[-1]


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

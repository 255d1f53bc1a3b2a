"""slurmdbd.conf, MariaDB's option file and its start-up SQL, as text: pure functions of the settings.

Slurm's advice for the database (accounting.html, and the values slurmdbd
checks at start, warning below half of them): a buffer pool of 5-50 % of the
memory, a redo log of a quarter of the pool, innodb_lock_wait_timeout=900,
max_allowed_packet of 16M or more, and innodb_snapshot_isolation=OFF
(MariaDB >= 11.6.2 turns it on, and slurmdbd dies on the first write
conflict with it). Datadir, tmpdir and logs all live on the volume, so
nothing the database needs is on a container's own layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .accounts import OWN_USERS, accounts, init_statements
from .settings import AccountingSection
from .storage import MARKER_NAME

__all__ = ["Places", "places", "slurmdbd_conf", "my_cnf", "init_sql", "buffer_pool_mib", "sql_string"]

_HEADER = "# written by `slurm-ext accounting config`; edits are overwritten at the next run\n"
#: the smallest buffer pool we write, whatever memory is given (MariaDB's own minimum is 5M)
_MIN_POOL_MIB = 128
#: innodb_log_file_size: a quarter of the pool, not below what slurmdbd checks for (64M / 2)
_MIN_LOG_MIB = 64


@dataclass(frozen=True, slots=True)
class Places:
    """Where each part of the database lives: all under the volume, except the socket."""

    volume: Path
    datadir: Path
    tmpdir: Path
    logdir: Path
    #: the identity marker (storage.MARKER), at the volume's top: beside the datadir, not in it
    #: (MariaDB takes every directory of its datadir for a database)
    marker: Path
    #: in a directory of mysql's own, below `etc`
    socket: Path
    pidfile: Path
    #: my.cnf and the start-up SQL: root's, readable by group mysql
    etc: Path


def places(settings: AccountingSection, runtime_dir: Path = Path("/run/slurm-ext")) -> Places:
    volume = Path(settings.volume)
    run = runtime_dir / "accounting"
    return Places(volume=volume, datadir=volume / "mysql", tmpdir=volume / "tmp", logdir=volume / "log",
                  marker=volume / MARKER_NAME, socket=run / "mysqld" / "mysqld.sock",
                  pidfile=run / "mysqld" / "mariadbd.pid", etc=run)


def buffer_pool_mib(memory_mib: int) -> int:
    """Half the database's memory: within Slurm's 5-50 % and what soperator uses."""
    return max(_MIN_POOL_MIB, memory_mib // 2)


def slurmdbd_conf(settings: AccountingSection, password: str, slurm_user: str, auth: str,
                  pidfile: Path | None = None, logfile: Path | None = None) -> str:
    """slurmdbd.conf; it holds the password (StoragePass), so the caller writes it 0600, owned by `slurm_user`.
    `auth`: slurm.conf's AuthType, which slurmdbd must share with slurmctld.

    No LogFile by default: slurmdbd runs in the foreground under the agent and
    logs on stderr, which the agent's log (or the container's) keeps."""
    lines = [
        f"AuthType={auth}",
        f"DbdHost={settings.dbd_host}",
        *([f"DbdAddr={settings.dbd_addr}"] if settings.dbd_addr else []),
        f"DbdPort={settings.dbd_port}",
        *(["CommunicationParameters=NoInAddrAny"] if settings.dbd_addr.startswith("127.") else []),
        f"SlurmUser={slurm_user}",
        *([f"LogFile={logfile}"] if logfile else []),
        *([f"PidFile={pidfile}"] if pidfile else []),
        "StorageType=accounting_storage/mysql",
        f"StorageHost={settings.db_host}",
        f"StoragePort={settings.db_port}",
        f"StorageUser={settings.db_user}",
        f"StoragePass={password}",
        f"StorageLoc={settings.database}",
    ]
    return _HEADER + "\n".join(lines) + "\n"


def my_cnf(settings: AccountingSection, where: Places, memory_mib: int) -> str:
    """MariaDB's option file for the accounting database (mariadbd --defaults-file=...)."""
    pool = buffer_pool_mib(memory_mib)
    return _HEADER + f"""\
[mysqld]
datadir={where.datadir}
tmpdir={where.tmpdir}
log-error={where.logdir}/mariadbd.err
socket={where.socket}
pid-file={where.pidfile}
bind-address={settings.db_listen}
port={settings.db_port}
user=mysql
skip-name-resolve
innodb_buffer_pool_size={pool}M
innodb_log_file_size={max(_MIN_LOG_MIB, pool // 4)}M
innodb_lock_wait_timeout=900
innodb_default_row_format=DYNAMIC
max_allowed_packet=64M
innodb_flush_log_at_trx_commit=1
[mariadbd]
innodb_snapshot_isolation=OFF
[client]
socket={where.socket}
user=root
"""


def sql_string(text: str) -> str:
    """`text` as an SQL string literal, quotes doubled. No backslash: it means two things depending on sql_mode
    (NO_BACKSLASH_ESCAPES), and a password with one is refused before it gets here."""
    if any(ord(c) < 32 for c in text) or "\\" in text:
        raise ValueError("holds a control character (a newline?) or a backslash")
    return "'" + text.replace("'", "''") + "'"


def init_sql(settings: AccountingSection, password: str, own_passwords: dict[str, str] | None = None) -> str:
    """What mariadbd runs at every start (--init-file): the databases, and each account (accounts.py: slurmdbd's,
    and the repair store's, the page's and backups' where they have their own) with the password of now (a
    rotated Secret takes effect at the next start, Slinky issue 44) and only its grants; all idempotent.

    `password`: slurmdbd's, which every own account without a password file has too; `own_passwords`: role ->
    password of each role with a password file of its own."""
    passwords = {account.user: password for account in accounts(settings)}
    passwords.update({OWN_USERS[role]: secret for role, secret in (own_passwords or {}).items()})
    return "".join(f"{s};\n" for s in init_statements(settings, passwords, sql_string))

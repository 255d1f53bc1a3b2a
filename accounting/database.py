"""The accounting pair's files and storage, made ready before mariadbd and slurmctld start.

`write_config` is `slurm-ext accounting config` and the accounting role's
first start step: slurmdbd.conf (0600, SlurmUser's), and, when this agent
runs the database, my.cnf and the start-up SQL that sets slurmdbd's user
and password (read from a file or the environment, never a command line).
`prepare_storage` is `check-storage` and the next step: the guard
(storage.check), MariaDB's first initialisation of an empty datadir, then
the identity markers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import command, fileio
from slurm_ext.config import Config
from slurm_ext.errors import CommandError, ConfigError, SlurmExtError
from slurm_ext.secretfile import SecretFileError, read_secret
from slurm_ext.slurm import SlurmClient
from slurm_ext.weaksecret import weakness

from . import accounts, render, slurmconf, storage
from .settings import PASSWORD_ENV, AccountingSection

__all__ = ["Written", "configured", "password", "cluster_name", "write_config", "guarded_volumes", "prepare_storage",
           "memory_mib", "places_of"]

#: what a StoragePass may hold: slurmdbd.conf has no quoting, '#' starts a comment, and a backslash means
#: two things in SQL depending on sql_mode (NO_BACKSLASH_ESCAPES)
_PASSWORD = re.compile(r"^[!-\[\]-~]+$")
#: the shortest database password taken at start
MIN_PASSWORD = 16


@dataclass(frozen=True, slots=True)
class Written:
    slurmdbd_conf: Path | None
    my_cnf: Path | None
    init_sql: Path | None


def _slurm_values(config: Config) -> dict[str, str]:
    path = config.slurm.conf_path()
    return slurmconf.read(path) if path.exists() else dict(slurmconf.DEFAULTS)


def cluster_name(config: Config) -> str:
    """accounting.cluster, else slurm.conf's ClusterName.

    Raises:
        ConfigError: neither names one.
    """
    name = config.accounting.cluster or _slurm_values(config).get("clustername", "")
    if not name:
        raise ConfigError(config.source or "<defaults>", f"no cluster name: set accounting.cluster, or ClusterName "
                          f"in {config.slurm.conf_path()}", key="accounting.cluster")
    return name


def places_of(config: Config) -> render.Places:
    return render.places(config.accounting, Path(config.node.runtime_dir))


def password(settings: AccountingSection, environ: dict[str, str], source: str = "<defaults>") -> str:
    """The database password, from accounting.password_file or $SLURM_EXT_DB_PASSWORD.

    Raises:
        ConfigError: neither gives one, the file cannot be read, others may read it or it is not root's (or
            this user's), or the password cannot go into slurmdbd.conf (spaces, '#', control characters).
    """
    if settings.password_file:
        secret = _read_secret_file(settings.password_file)
        where = settings.password_file
    else:
        secret, where = environ.get(PASSWORD_ENV, ""), f"${PASSWORD_ENV}"
    if not secret:
        raise ConfigError(source, f"no database password: {where} is empty; set accounting.password_file (a "
                          f"Secret's mount) or {PASSWORD_ENV}", key="accounting.password_file")
    if not _PASSWORD.match(secret) or "#" in secret:
        raise ConfigError(where, "the database password must be printable ASCII without spaces, '#' or '\\' "
                          "(slurmdbd.conf has no quoting)")
    return secret


def _read_secret_file(path: str) -> str:
    """The password in `path`, a regular file of root's (or of the user this runs as) that no one else may read
    or change: a password others can read is everyone's, and one another user can change is theirs to choose.

    Raises:
        ConfigError: naming the file, its owner and its mode.
    """
    try:  # a Kubernetes Secret's mount is a link into its ..data folder
        data = read_secret(path, max_bytes=65536, follow_link=True).content
    except SecretFileError as err:
        raise ConfigError(path, _password_file_problem(err)) from None
    try:
        return data.decode().strip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(path, "the database password is not text (UTF-8)") from None


def _password_file_problem(err: SecretFileError) -> str:
    """read_secret's refusal in the password file's words, with what to do."""
    path, info = err.path, err.info
    if info is None:
        return f"cannot read the database password: {err.problem}"
    mode, owner = stat.S_IMODE(info.st_mode), _user_name(info.st_uid)
    if err.kind == "owner":
        return (f"the database password file is owned by {owner} (mode {mode:04o}): expected root (or the user "
                f"slurm-ext runs as), who alone may set it: chown root {path}")
    if err.kind == "mode":
        return (f"the database password file (owner {owner}, mode {mode:04o}) may be read or changed by others: "
                f"chmod 600 {path} (Kubernetes: the Secret's defaultMode 0400)")
    if err.kind == "not-regular":
        return "the database password file is not a regular file"
    return f"the database password file: {err.problem}"


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def memory_mib(settings: AccountingSection, cgroup: Path = Path("/sys/fs/cgroup"),
               meminfo: Path = Path("/proc/meminfo")) -> int:
    """accounting.memory, else the container's memory limit, else a quarter of the host's memory (a host
    that runs more than the database: its buffer pool is then an eighth)."""
    if settings.memory:
        return settings.memory
    for limit_file in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 50:  # v1's "no limit" is a huge number
            return int(text) // (1024 * 1024)
    try:
        found = re.search(r"^MemTotal:\s+(\d+) kB", meminfo.read_text(), re.M)
    except OSError:
        found = None
    return int(found.group(1)) // 4096 if found else 1024


def _owner(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError("slurm.conf", f"SlurmUser {user!r} does not exist on this host") from None
    return entry.pw_uid, entry.pw_gid


def configured(config: Config, environ: dict[str, str] | None = None) -> bool:
    """Whether slurm-ext writes slurmdbd's files here: it runs the database, or was given its password. An
    operator who mounts a slurmdbd.conf of their own gives neither, and keeps it."""
    settings = config.accounting
    environ = os.environ if environ is None else environ
    return settings.run_database or bool(settings.password_file) or bool(environ.get(PASSWORD_ENV))


def write_config(config: Config, environ: dict[str, str] | None = None, slurmdbd: bool = True) -> Written:
    """Write slurmdbd.conf (unless `slurmdbd` is false: it runs elsewhere) and, with run_database, my.cnf and
    the start-up SQL. Idempotent.

    Raises:
        ConfigError: no password, an unknown SlurmUser, no mysql user (MariaDB not installed).
        OSError: a file cannot be written (the message names it).
    """
    settings = config.accounting
    environ = dict(os.environ if environ is None else environ)
    secret = password(settings, environ, config.source or "<defaults>")
    _refuse_weak(secret, settings.password_file or f"${PASSWORD_ENV}")
    own = {}  # the password of each role with an account of its own, checked before anything is written
    if settings.run_database:
        for account in accounts.accounts(settings)[1:]:
            [role] = account.roles
            _, own[role] = accounts.login(settings, role, environ, config.source or "<defaults>")
            if account.password_file:  # else slurmdbd's, checked above
                _refuse_weak(own[role], account.password_file)
    conf = None
    if slurmdbd:
        values = _slurm_values(config)
        slurm_user = settings.slurm_user or values["slurmuser"]
        uid, gid = _owner(slurm_user)
        conf = Path(settings.slurmdbd_conf or config.slurm.conf_path().parent / "slurmdbd.conf")
        conf.parent.mkdir(parents=True, exist_ok=True)
        # slurmdbd SIGTERMs whatever PID its PidFile names: Slurm's default (/var/run/slurmdbd.pid) would let a
        # second slurmdbd on the host (another cluster's) stop this one
        pidfile = Path(config.node.runtime_dir) / "slurmdbd.pid"
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        _write(conf, render.slurmdbd_conf(settings, secret, slurm_user, values["authtype"], pidfile=pidfile),
               0o600, uid, gid)
    if not settings.run_database:
        return Written(conf, None, None)
    where = places_of(config)
    mysql = _mysql()
    # root's directory, group mysql: the SQL holds the password, and no mysql process may replace a file
    # root then reads or writes
    where.etc.mkdir(parents=True, exist_ok=True)
    os.chown(where.etc, 0, mysql.pw_gid)
    where.etc.chmod(0o750)
    where.socket.parent.mkdir(exist_ok=True)  # the volume's directories: prepare_storage, after the guard
    os.chown(where.socket.parent, mysql.pw_uid, mysql.pw_gid)
    cnf = where.etc / "my.cnf"
    _write(cnf, render.my_cnf(settings, where, memory_mib(settings)), 0o640, 0, mysql.pw_gid)
    sql = where.etc / "init.sql"
    _write(sql, render.init_sql(settings, secret, own), 0o640, 0, mysql.pw_gid)
    return Written(conf, cnf, sql)


def _refuse_weak(secret: str, where: str) -> None:
    """A database password that a reader of the examples knows, or a short one, is refused at start: it would
    open slurmdbd's records (or slurm-ext's repair decisions) to anyone who can reach the database.

    Raises:
        ConfigError: naming `where` (the file, or the environment variable) and why.
    """
    why = weakness(secret.encode(), MIN_PASSWORD)
    if why:
        raise ConfigError(where, f"the database password {why}: make one with `openssl rand -hex 24` (Slinky: "
                                 f"containers/slinky/create-secrets.sh)")


def _write(path: Path, text: str, mode: int, uid: int, gid: int) -> None:
    try:
        if path.read_text() == text and path.stat().st_mode & 0o7777 == mode:
            os.chown(path, uid, gid)
            return
    except (OSError, UnicodeDecodeError):
        pass
    fileio.atomic_write(path, text, mode=mode)
    os.chown(path, uid, gid)


def guarded_volumes(config: Config, role: str) -> list[storage.Volume]:
    """The volumes this host guards for `role`: the database's (run_database), StateSaveLocation (controller),
    and the other one too where it is on this host and marked, so that their markers are compared."""
    settings = config.accounting
    where = places_of(config)
    database = storage.Volume("database", where.volume, where.marker, (where.datadir / "mysql",))
    state_dir = _state_dir(config)
    state = storage.Volume("state", state_dir, state_dir / storage.MARKER_NAME,
                           tuple(state_dir / name for name in ("node_state", "job_state", "clustername")))
    volumes = []
    # only the accounting role initialises and marks the database: the controller compares a marked one
    if (settings.run_database and role != "controller") or (role == "controller" and where.marker.exists()):
        volumes.append(database)
    if role == "controller" or state_dir.is_dir():
        volumes.append(state)
    return volumes


def _state_dir(config: Config) -> Path:
    return Path(config.accounting.state_save_location or _slurm_values(config)["statesavelocation"])


def prepare_storage(config: Config, role: str, allow_ephemeral: bool = False) -> storage.StorageCheck:
    """The guard for `role`, MariaDB's first initialisation when the datadir is new, then the markers. One at a
    time on a host (a lock in the runtime dir): two roles starting together must not mark the pair twice.

    Raises:
        StorageRefused: the guard refused (nothing was initialised).
        ConfigError: no cluster name.
        CommandError: mariadb-install-db failed.
    """
    settings = config.accounting
    allow = allow_ephemeral or settings.allow_ephemeral
    volumes = guarded_volumes(config, role)
    if not volumes:
        return storage.StorageCheck(notes=[f"role {role}: no accounting storage on this host to guard (the database "
                                      f"runs elsewhere: accounting.run_database is off)"])
    with _storage_lock(config):
        if role == "controller":
            _make_state_dir(config)
        verdict = storage.check(volumes, cluster_name(config), settings.min_free, allow)
        database = next((v for v in volumes if v.kind == "database"), None)
        if database is not None and role != "controller":
            _database_dirs(config)
            if not database.has_data():
                _initialise(config)
        if role == "controller":
            _check_database_knows_cluster(config, volumes, verdict)
        storage.commit(verdict)
    return verdict


@contextlib.contextmanager
def _storage_lock(config: Config):
    path = Path(config.node.runtime_dir) / "accounting-storage.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _make_state_dir(config: Config) -> None:
    """StateSaveLocation made by the guard is SlurmUser's, as slurmctld needs it (0750)."""
    state_dir = _state_dir(config)
    if state_dir.exists():
        return
    state_dir.mkdir(parents=True, mode=0o750)
    uid, gid = _owner(config.accounting.slurm_user or _slurm_values(config)["slurmuser"])
    os.chown(state_dir, uid, gid)


def _check_database_knows_cluster(config: Config, volumes: list[storage.Volume], verdict: storage.StorageCheck) -> None:
    """From the controller, which cannot see the database's volume in a pod of its own: a StateSaveLocation
    with slurmctld's state in it belongs to a cluster that slurmdbd's database knows. One that does not know
    it is a database re-created empty (or another one): slurmctld would register into it and carry on
    without the history. Not checkable while slurmdbd does not answer (then slurmctld waits for it too)."""
    state = next(v for v in volumes if v.kind == "state")
    if not state.has_data():
        return
    cluster = cluster_name(config)
    try:
        known = SlurmClient(config.slurm).clusters()
    except SlurmExtError as err:
        verdict.notes.append(f"StateSaveLocation {state.path}: not compared with the accounting database "
                             f"(slurmdbd: {err})")
        return
    if cluster not in known:
        raise storage.StorageRefused(
            f"StateSaveLocation {state.path} holds the state of cluster {cluster}, but slurmdbd's database knows "
            f"only {', '.join(known) or 'no cluster'}: the database was re-created empty, or slurmdbd points at "
            f"another one (accounting.db_host, StorageLoc). Refusing to start slurmctld on it: bring back the "
            f"database (its volume, or `slurm-ext accounting restore`), then start again")


def _mysql() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("mysql")
    except KeyError:
        raise ConfigError("accounting.run_database", "this host has no mysql user: install mariadb-server "
                          "(the agent runs MariaDB as mysql)") from None


def _database_dirs(config: Config) -> None:
    """MariaDB's datadir, tmpdir and log directory on the volume, mysql's."""
    where = places_of(config)
    mysql = _mysql()
    for path in (where.datadir, where.tmpdir, where.logdir):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, mysql.pw_uid, mysql.pw_gid)


def _initialise(config: Config) -> None:
    """mariadb-install-db into the empty datadir, as mysql, with root reachable only through the socket."""
    where = places_of(config)
    try:
        command.run(["mariadb-install-db", "--user=mysql", f"--datadir={where.datadir}", "--skip-test-db",
                     "--auth-root-authentication-method=socket"], 300)
    except CommandError as err:
        # what it left is no database: empty the datadir, or the next start would take it for an old one
        for child in where.datadir.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        said = " | ".join(err.stderr.splitlines()[-4:]) or str(err)
        raise CommandError(err.cmd, err.returncode, err.stderr, f"mariadb-install-db could not initialise the "
                           f"accounting database in {where.datadir} (exit status {err.returncode}): {said}") from None

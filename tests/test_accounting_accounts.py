"""The database accounts of the start-up SQL on a real MariaDB (issue 28, items 7 and 21).

The start-up SQL that the accounting agent writes (render.init_sql) is run as root on a scratch mariadbd, as
mariadbd runs its --init-file; then each account connects over TCP and tries what it must not do: slurmdbd's
account writes an approved repair into slurm-ext's database, backups' account writes anywhere, the page's
account deletes or changes the schema, the repair store's account touches slurmdbd's database. A database
set up before (one account with every grant) loses those grants at the next start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pymysql
import pytest

from slurm_ext.accounting import accounts, backups, render, scratch
from slurm_ext.accounting.dumpfile import BackupError
from slurm_ext.accounting.settings import AccountingSection
from slurm_ext.config import Config, SlurmSection
from slurm_ext.repair.store import mariadb_schema

PASSWORDS = {"slurmdbd": "pw-slurmdbd-" + os.urandom(8).hex(), "repair": "pw-repair-" + os.urandom(8).hex(),
             "page": "pw-page-" + os.urandom(8).hex(), "backup": "pw-backup-" + os.urandom(8).hex()}
#: slurm-ext's repair tables, as the repair store makes them in MariaDB
REPAIR_TABLES = "".join(f"{statement};\n" for statement in mariadb_schema())
#: what `accounting backup` runs mariadb-dump with (accounting/backups.py)
DUMP_OPTIONS = ("--single-transaction", "--quick", "--routines", "--events", "--triggers", "--hex-blob")
DENIED = (1044, 1045, 1142, 1143, 1227, 1370)  # access denied: to a database, a table, a column, a privilege


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    workdir = Path(tempfile.mkdtemp(prefix="slurm-ext-accounts-test-"))
    workdir.chmod(0o755)
    try:
        with scratch.scratch_mariadb(port=_free_port(), workdir=workdir) as db:
            yield db
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _settings(own: tuple[str, ...]) -> AccountingSection:
    """The settings with an own account (any file name: the SQL takes the passwords given) for each of `own`."""
    return AccountingSection(**{f"{role}_password_file": f"/run/secrets/{role}" for role in own})


def _init(server: scratch.ScratchMariaDB, own: tuple[str, ...]) -> None:
    """What mariadbd runs at start (--init-file), run as root."""
    settings = _settings(own)
    sql = render.init_sql(settings, PASSWORDS["slurmdbd"], {role: PASSWORDS[role] for role in own})
    server.sql(sql)
    server.sql(REPAIR_TABLES, settings.own_database)
    server.sql("CREATE TABLE IF NOT EXISTS job_table (id_job INT PRIMARY KEY)", settings.database)


def _connect(server: scratch.ScratchMariaDB, role: str, own: tuple[str, ...]) -> pymysql.Connection:
    user = accounts.OWN_USERS[role] if role in own else "slurm"
    password = PASSWORDS[role] if role in own else PASSWORDS["slurmdbd"]
    return pymysql.connect(host="127.0.0.1", port=server.port, user=user, password=password, autocommit=True)


def _may(connection: pymysql.Connection, sql: str) -> bool:
    """Whether the server runs `sql` for this account (False: access denied; any other error is the test's)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
        return True
    except pymysql.err.OperationalError as err:
        if err.args[0] in DENIED:
            return False
        raise
    except pymysql.err.ProgrammingError as err:
        if err.args[0] in DENIED:
            return False
        raise


#: the review's attack: a repair approved by no operator, which the repair service would carry out
APPROVE = ("INSERT INTO slurm_ext.repair_records (node, signature, action, evidence, jobs, state, step, opened, "
           "updated, decided_by, note, detail) VALUES ('n1', 'xid/79', 'remove', '', '[]', 'approved', 'waiting', 0, "
           "0, 'mallory', '', '{}')")


def test_one_shared_account_holds_every_grant_then_each_part_gets_its_own(server):
    """Before: the one account (what every start made until now) may approve a repair in slurm-ext's database.
    After a start with the parts' own accounts, it may not; and each account may do only its part."""
    _init(server, own=())
    shared = _connect(server, "slurmdbd", own=())
    assert _may(shared, APPROVE)  # one password opens both databases: what the review found
    shared.close()

    own = ("repair", "page", "backup")
    _init(server, own)
    slurmdbd = _connect(server, "slurmdbd", own)
    assert _may(slurmdbd, "INSERT INTO slurm_acct_db.job_table VALUES (1)")
    assert _may(slurmdbd, "CREATE TABLE slurm_acct_db.t_new (x INT)")
    assert not _may(slurmdbd, APPROVE)
    assert not _may(slurmdbd, "SELECT * FROM slurm_ext.repair_records")

    repair = _connect(server, "repair", own)
    assert _may(repair, APPROVE)
    assert _may(repair, "ALTER TABLE slurm_ext.repair_records ADD COLUMN IF NOT EXISTS probe INT")
    assert not _may(repair, "SELECT * FROM slurm_acct_db.job_table")
    assert not _may(repair, "DELETE FROM slurm_acct_db.job_table")

    page = _connect(server, "page", own)
    assert _may(page, "SELECT * FROM slurm_ext.repair_records")
    assert _may(page, "UPDATE slurm_ext.repair_records SET state = 'rejected' WHERE node = 'n1'")
    assert _may(page, APPROVE)  # it records what an operator decides on it
    assert not _may(page, "DELETE FROM slurm_ext.repair_records")
    assert not _may(page, "DROP TABLE slurm_ext.repair_records")
    assert not _may(page, "CREATE TABLE slurm_ext.t_new (x INT)")
    assert not _may(page, "SELECT * FROM slurm_acct_db.job_table")

    backup = _connect(server, "backup", own)
    assert _may(backup, "SELECT * FROM slurm_acct_db.job_table")
    assert _may(backup, "SELECT * FROM slurm_ext.repair_records")
    assert _may(backup, "LOCK TABLES slurm_acct_db.job_table READ")
    assert _may(backup, "UNLOCK TABLES")
    for write in (APPROVE, "INSERT INTO slurm_acct_db.job_table VALUES (2)", "DELETE FROM slurm_acct_db.job_table",
                  "DROP TABLE slurm_acct_db.job_table", "CREATE TABLE slurm_ext.t_new (x INT)",
                  "UPDATE slurm_ext.repair_records SET state = 'approved'"):
        assert not _may(backup, write), write
    for connection in (slurmdbd, repair, page, backup):
        connection.close()


def test_the_start_up_sql_runs_again_unchanged_and_grants_are_exactly_the_roles(server):
    own = ("repair", "page", "backup")
    _init(server, own)
    _init(server, own)  # every start runs it: idempotent, no REVOKE of nothing
    settings = _settings(own)
    for account in accounts.accounts(settings):
        shown = {row[0] for row in server.sql(f"SHOW GRANTS FOR '{account.user}'@'%';")}
        granted = {line.split(" TO ")[0].removeprefix("GRANT ") for line in shown if not line.startswith("GRANT USAGE")}
        wanted = {grant for role in account.roles for grant in accounts.grants(settings, role)}
        if "slurmdbd" in account.roles:
            wanted.add("PROCESS ON *.*")
        # MariaDB writes the privileges in its own order, which accounts.grants keeps
        assert granted == wanted, (account.user, shown)


def test_backups_read_only_account_can_still_make_a_whole_dump(server):
    """mariadb-dump with the options backups use (one transaction, routines, events, triggers) as the read-only
    account: everything a backup needs, nothing more."""
    own = ("repair", "page", "backup")
    _init(server, own)
    server.sql("CREATE PROCEDURE IF NOT EXISTS p_kept() SELECT 1;", "slurm_acct_db")
    with tempfile.NamedTemporaryFile("w", suffix=".cnf") as options:
        options.write(f"[client]\nuser={accounts.OWN_USERS['backup']}\npassword={PASSWORDS['backup']}\n"
                      f"host=127.0.0.1\nport={server.port}\nprotocol=TCP\n")
        options.flush()
        done = subprocess.run(["mariadb-dump", f"--defaults-file={options.name}", *DUMP_OPTIONS, "slurm_acct_db"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE `job_table`" in done.stdout and "p_kept" in done.stdout


def test_the_page_opens_the_repair_store_as_its_own_account_and_makes_no_table(server):
    from slurm_ext.config import Config
    from slurm_ext.repair.settings import RepairSection
    from slurm_ext.repair.store import StoreError, open_store
    own = ("repair", "page", "backup")
    _init(server, own)
    workdir = Path(tempfile.mkdtemp(prefix="slurm-ext-accounts-files-"))
    try:
        files = {}
        for role in own:
            files[role] = workdir / role
            files[role].write_text(PASSWORDS[role] + "\n")
            files[role].chmod(0o600)
        settings = AccountingSection(db_host="127.0.0.1", db_port=server.port,
                                     **{f"{role}_password_file": str(path) for role, path in files.items()})
        config = Config(accounting=settings, repair=RepairSection(database="mariadb"))
        store = open_store(config, environ={}, role="repair")  # makes its tables, as the repair service does
        store.close()
        page = open_store(config, environ={}, create=False, role="page")
        with page.locked():
            page.event("n1", "repair-approved", "approved from the page", "alice")
        assert [e for e in page.events(node="n1") if e.message == "approved from the page"]
        with pytest.raises(StoreError, match="denied"):
            page._execute("DELETE FROM repair_events")
        page.close()
    finally:
        shutil.rmtree(workdir)


def test_backups_connect_as_their_own_account_and_take_the_repair_history_too(server, tmp_path):
    """Issue 28.7 (review): with every role's own account (as the Slinky manifests set them), slurmdbd's account
    has no right on slurm-ext's database; `accounting backup` connects as backups' account
    (backup_password_file), so the repair history is backed up beside the accounting database, not silently
    left out. A database backups' account cannot see, though the start-up SQL made it, is an error."""
    own = ("repair", "page", "backup")
    _init(server, own)
    files = {}
    for role in ("slurmdbd", "backup"):
        files[role] = tmp_path / f"{role}.password"
        files[role].write_text(PASSWORDS[role] + "\n")
        files[role].chmod(0o600)
    settings = AccountingSection(db_host="127.0.0.1", db_port=server.port, cluster="acct",
                                 password_file=str(files["slurmdbd"]), backup_password_file=str(files["backup"]),
                                 repair_password_file="/run/secrets/repair", page_password_file="/run/secrets/page",
                                 backup_key=str(tmp_path / "keys" / "backup.key"),
                                 backup_dir=str(tmp_path / "backups"), volume=str(tmp_path / "volume"))
    config = Config(accounting=settings, slurm=SlurmSection(conf=str(tmp_path / "no-slurm.conf")))
    result = backups.backup(config, environ={})
    assert result.own is not None, "slurm-ext's own database (the repair history) was not backed up"
    assert "repair_records" in result.own.manifest.tables and "job_table" in result.manifest.tables
    server.sql(f"REVOKE ALL PRIVILEGES ON `{settings.own_database}`.* FROM 'slurm_ext_backup'@'%';")
    try:
        with pytest.raises(BackupError, match=f"cannot see database {settings.own_database}"):
            backups.backup(config, environ={})
    finally:
        _init(server, own)


def test_a_site_with_one_password_restores_as_slurmdbd_and_as_the_repair_store(server, tmp_path):
    """Issue 28.1 (review): the dev cluster's and a small site's setup: slurm-ext runs MariaDB (run_database)
    with one password and no account file of the parts' own. The start-up SQL gives the repair store, the page
    and backups accounts of their own with slurmdbd's password, so slurmdbd's account writes nothing of
    slurm-ext's: a backup restores as it into the accounting database, and the repair history restores as the
    repair store's account into its own. Before, slurmdbd's account also held ALL on slurm-ext's database, and
    every restore on such a site was refused."""
    password_file = tmp_path / "slurmdbd.password"
    password_file.write_text(PASSWORDS["slurmdbd"] + "\n")
    password_file.chmod(0o600)
    settings = AccountingSection(run_database=True, db_host="127.0.0.1", db_port=server.port, cluster="acct",
                                 password_file=str(password_file), backup_key=str(tmp_path / "keys" / "backup.key"),
                                 backup_dir=str(tmp_path / "backups"), volume=str(tmp_path / "volume"))
    # databases of their own (the other tests' routines are defined by root)
    server.sql(f"DROP DATABASE IF EXISTS {settings.database}; DROP DATABASE IF EXISTS {settings.own_database};")
    server.sql(render.init_sql(settings, PASSWORDS["slurmdbd"]))
    server.sql(REPAIR_TABLES, settings.own_database)
    server.sql("CREATE TABLE job_table (id_job INT PRIMARY KEY); INSERT INTO job_table VALUES (1), (2), (3);",
               settings.database)
    slurmdbd = pymysql.connect(host="127.0.0.1", port=server.port, user="slurm", password=PASSWORDS["slurmdbd"],
                               autocommit=True)
    assert not _may(slurmdbd, APPROVE)
    slurmdbd.close()
    repair = pymysql.connect(host="127.0.0.1", port=server.port, user=accounts.OWN_USERS["repair"],
                             password=PASSWORDS["slurmdbd"], autocommit=True)
    assert _may(repair, "DELETE FROM slurm_ext.repair_records") and _may(repair, APPROVE)
    repair.close()

    config = Config(accounting=settings, slurm=SlurmSection(conf=str(tmp_path / "no-slurm.conf")))
    made = backups.backup(config, environ={})
    assert made.own is not None and made.own.manifest.tables["repair_records"] == 1
    server.sql(f"DROP DATABASE {settings.database}; DROP DATABASE {settings.own_database};")
    restored = backups.restore(config, made.path, environ={})
    assert restored.database == settings.database and restored.tables["job_table"] == 3
    history = backups.restore(config, made.own.path, environ={})
    assert history.database == settings.own_database and history.tables["repair_records"] == 1
    assert server.sql("SELECT node, state FROM repair_records", settings.own_database) == [("n1", "approved")]


def test_a_part_that_is_not_root_is_never_given_slurmdbds_password(tmp_path):
    """The review of 28.21: the page, running as its own user, was given a copy of slurmdbd's password where the
    site had no page password file; where slurm-ext runs the database every part's account has that password, so
    the page's user could log in as slurmdbd's account and the repair store's. The agent now copies only the
    page's own password file, and a part that is not root asking for slurmdbd's password is refused, naming the
    setting that gives it one of its own."""
    from slurm_ext.web.plugin import PLUGIN
    from slurm_ext.web.settings import WebSection
    password_file = tmp_path / "slurmdbd.password"
    password_file.write_text(PASSWORDS["slurmdbd"] + "\n")
    password_file.chmod(0o644)  # readable, so that only login's own refusal can stop the child below
    settings = AccountingSection(run_database=True, password_file=str(password_file))
    config = Config(accounting=settings, web=WebSection(user="nobody"))
    copied = PLUGIN.spec_changes(config, "controller")["web"]["credentials"]
    assert "accounting.password_file" not in copied and "accounting.page_password_file" in copied
    child = (f"import dataclasses; from slurm_ext.accounting import accounts; "
             f"from slurm_ext.accounting.settings import AccountingSection; "
             f"settings = AccountingSection(run_database=True, password_file={str(password_file)!r}); "
             f"print(accounts.login(settings, 'page', {{}}))")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", child],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode != 0 and PASSWORDS["slurmdbd"] not in done.stdout, done.stdout
    assert "accounting.page_password_file: empty, and the page runs as uid 65534, not root" in done.stderr, \
        done.stderr

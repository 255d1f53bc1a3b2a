"""accounting.backups against real MariaDB servers: backup, verify, restore, and the ways they must fail.

The "live" accounting database is a scratch mariadbd (scratch.scratch_mariadb) on a TCP port of
33300-33399 on 127.0.0.1, with slurmdbd's user and grants and tables shaped like slurmdbd's, whose
strings hold quotes, parentheses, commas, backslashes, newlines, NULLs and binary, so the row counter
meets what a real dump holds. A second one ("fresh") is the server a backup is restored onto. The
read-only and full directories are tmpfs mounts the tests make and remove. Every server is stopped by
its PID, and the end of the module checks that no server, mount or directory of these tests is left.

Run as root: python -m pytest tests/test_accounting_backup.py -q
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest

from slurm_ext.accounting import backupkey, backups, dumpfile, scratch, sqlclient
from slurm_ext.accounting.dumpfile import BackupError, RowCounter
from slurm_ext.accounting.sqlclient import quote_option
from slurm_ext.errors import CommandError, ConfigError
from slurm_ext.accounting.settings import AccountingSection
from slurm_ext.config import Config, SlurmSection
from slurm_ext.eventnames import CATALOGUE

CLUSTER = "bktest"
DB = "slurm_acct_db"
#: printable, no space, '#' or backslash (what accounting.database.password accepts), and hard to quote
PASSWORD = 'Bk"t/es;t`1\'x'
#: the live database's size: large enough that its compressed dump overflows FULL_TMPFS
JOBS = 6000
FULL_TMPFS = "512k"
PORTS = range(33300, 33400)
SCRATCH_PREFIX = "slurm-ext-scratch-db-"


def free_port() -> int:
    """A port of 33300-33399 that nothing listens on (tried from a place that depends on our PID)."""
    start = os.getpid() % len(PORTS)
    for i in range(len(PORTS)):
        port = PORTS[(start + i) % len(PORTS)]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 33300-33399")


# -- a database shaped like slurmdbd's ----------------------------------------------------


def add_user(server: scratch.ScratchMariaDB, databases: tuple[str, ...] = (DB,), password: str = PASSWORD,
             user: str = "slurm") -> None:
    """slurmdbd's user, with the grants a backup needs (render.init_sql's)."""
    secret = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
    server.sql("".join(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY {secret};\n" for host in HOSTS))
    grant_only(server, databases, user)


#: the hosts of each test account: TCP from 127.0.0.1 (no name resolution), the socket, anywhere
HOSTS = ("127.0.0.1", "localhost", "%")


def grant_only(server: scratch.ScratchMariaDB, databases: tuple[str, ...], user: str = "slurm") -> None:
    """`user` may use `databases` and nothing else beyond what a backup needs (its grants before taken back)."""
    statements = []
    for host in HOSTS:
        statements += [f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '{user}'@'{host}'",
                       *(f"GRANT ALL ON {db}.* TO '{user}'@'{host}'" for db in databases),
                       f"GRANT SELECT ON mysql.proc TO '{user}'@'{host}'",
                       f"GRANT RELOAD, PROCESS ON *.* TO '{user}'@'{host}'"]
    server.sql("".join(f"{s};\n" for s in statements))


def schema_sql(c: str) -> str:
    """A few of slurmdbd's tables (columns of theirs), and an empty one."""
    return f"""
CREATE TABLE cluster_table (creation_time bigint unsigned NOT NULL, mod_time bigint unsigned NOT NULL DEFAULT 0,
  deleted tinyint DEFAULT 0, name tinytext NOT NULL, control_host tinytext NOT NULL DEFAULT '',
  control_port int unsigned NOT NULL DEFAULT 0, rpc_version smallint unsigned NOT NULL DEFAULT 0,
  features text, PRIMARY KEY (name(42))) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE `{c}_job_table` (job_db_inx bigint unsigned NOT NULL AUTO_INCREMENT, mod_time bigint unsigned NOT NULL
  DEFAULT 0, deleted tinyint DEFAULT 0, account tinytext, admin_comment text, array_task_str text,
  cpus_req int unsigned NOT NULL, derived_ec int unsigned NOT NULL DEFAULT 0, exit_code int unsigned NOT NULL
  DEFAULT 0, timelimit int unsigned NOT NULL DEFAULT 0, time_submit bigint unsigned NOT NULL DEFAULT 0,
  time_start bigint unsigned NOT NULL DEFAULT 0, time_end bigint unsigned NOT NULL DEFAULT 0, gres_used text,
  id_job int unsigned NOT NULL, id_user int unsigned NOT NULL, id_group int unsigned NOT NULL,
  mem_req bigint unsigned DEFAULT 0, nodelist text, node_inx text, `partition` tinytext NOT NULL,
  state int unsigned NOT NULL, submit_line longtext, tres_alloc text NOT NULL DEFAULT '', tres_req text NOT NULL
  DEFAULT '', work_dir text NOT NULL DEFAULT '', job_name tinytext NOT NULL, env_hash text NOT NULL DEFAULT '',
  script_hash blob, PRIMARY KEY (job_db_inx), UNIQUE KEY (id_job, time_submit)) ENGINE=InnoDB
  DEFAULT CHARSET=utf8mb4;
CREATE TABLE `{c}_step_table` (job_db_inx bigint unsigned NOT NULL, deleted tinyint DEFAULT 0, exit_code int
  NOT NULL DEFAULT 0, id_step int NOT NULL, step_het_comp int unsigned NOT NULL DEFAULT 4294967294, nodelist text
  NOT NULL, nodes_alloc int unsigned NOT NULL, state smallint unsigned NOT NULL, step_name text NOT NULL,
  task_cnt int unsigned NOT NULL, time_start bigint unsigned NOT NULL DEFAULT 0, time_end bigint unsigned NOT NULL
  DEFAULT 0, user_sec bigint unsigned NOT NULL DEFAULT 0, tres_alloc text NOT NULL DEFAULT '',
  tres_usage_in_max text NOT NULL DEFAULT '', PRIMARY KEY (job_db_inx, id_step, step_het_comp)) ENGINE=InnoDB
  DEFAULT CHARSET=utf8mb4;
CREATE TABLE `{c}_resv_table` (id_resv int unsigned NOT NULL, resv_name text NOT NULL, PRIMARY KEY (id_resv))
  ENGINE=InnoDB;
CREATE TABLE `{c}_last_ran_table` (hourly_rollup bigint unsigned NOT NULL DEFAULT 0, daily_rollup bigint unsigned
  NOT NULL DEFAULT 0, monthly_rollup bigint unsigned NOT NULL DEFAULT 0, PRIMARY KEY (hourly_rollup)) ENGINE=InnoDB;
INSERT INTO cluster_table (creation_time, mod_time, name, control_host, control_port, rpc_version, features) VALUES
  (1700000000, 1700000001, '{c}', '10.0.0.1', 6817, 10240, 'gpu,h200;nvlink'),
  (1700000000, 1700000002, 'other', 'ctl (backup), \\'b\\'', 6817, 10240, NULL);
INSERT INTO `{c}_last_ran_table` VALUES (1700003600, 1700000000, 1700000000);
"""


def programs_sql(c: str) -> str:
    """A procedure and an event whose bodies hold INSERT lines that are not data (made by slurm, as slurmdbd
    makes its own)."""
    return f"""
DELIMITER ;;
CREATE PROCEDURE bk_unused(n int)
BEGIN
INSERT INTO `{c}_resv_table` VALUES (1, 'not (data)'),(2, 'n\\'either');
INSERT INTO `{c}_resv_table` VALUES
(3, 'nor');
END;;
CREATE EVENT bk_event ON SCHEDULE EVERY 1 DAY DISABLE DO
INSERT INTO `{c}_resv_table` VALUES (4, 'never');;
DELIMITER ;
"""


def fill_sql(c: str, first: int, last: int, pad: int = 2) -> str:
    """Jobs first..last, 3 steps each (batch, extern, 0), with awkward strings; `pad` SHA-512s of hex in
    env_hash make the dump hard to compress."""
    env = "CONCAT(" + ", ".join(f"SHA2(seq * {k + 1}, 512)" for k in range(pad)) + ")" if pad else "SHA2(seq, 256)"
    return rf"""
INSERT INTO `{c}_job_table` (job_db_inx, mod_time, account, admin_comment, array_task_str, cpus_req, exit_code,
  timelimit, time_submit, time_start, time_end, gres_used, id_job, id_user, id_group, mem_req, nodelist, node_inx,
  `partition`, state, submit_line, tres_alloc, tres_req, work_dir, job_name, env_hash, script_hash)
SELECT seq, 1700000000 + seq, ELT(1 + seq % 4, 'physics', 'bio''chem', 'ml (gpu)', 'a,b'),
  IF(seq % 7 = 0, NULL, CONCAT('it''s job ', seq, ' (a, b); back\\slash')), IF(seq % 5 = 0, '0-31%4', NULL),
  1 + seq % 128, IF(seq % 11 = 0, 256, 0), 60 * (1 + seq % 48), 1700000000 + seq * 10, 1700000005 + seq * 10,
  1700000100 + seq * 10, 'gpu:h200:8(IDX:0-7)', seq, 1000 + seq % 50, 1000, 1024 * (1 + seq % 64),
  CONCAT('gpu[', 1 + seq % 16, '-', 2 + seq % 16, ']'), CONCAT(seq % 16, '-', 1 + seq % 16),
  IF(seq % 3 = 0, 'gpu', 'batch,debug'), 3, CONCAT('sbatch --wrap="python -c ''print((1, 2))''"\n# line 2; ', seq),
  CONCAT('1=', 1 + seq % 128, ',2=', 1024 * (1 + seq % 64), ',1001=8'), '1=1,2=1024,4=1', '/home/u (x)/w',
  CONCAT('train-', seq, IF(seq % 13 = 0, '\\\'q', '')), {env}, UNHEX(SHA2(seq, 256))
FROM seq_{first}_to_{last};
INSERT INTO `{c}_step_table` (job_db_inx, id_step, nodelist, nodes_alloc, state, step_name, task_cnt, time_start,
  time_end, user_sec, tres_alloc, tres_usage_in_max)
SELECT j.seq, ELT(s.seq + 1, -5, -4, 0), CONCAT('gpu', j.seq % 16), 1, 3, ELT(s.seq + 1, 'batch', 'extern',
  CONCAT('python (', j.seq, ')')), 1 + j.seq % 8, 1700000005 + j.seq * 10, 1700000100 + j.seq * 10, j.seq % 1000,
  '1=8,2=1024', CONCAT('1=', j.seq % 97, ',7=', j.seq)
FROM seq_{first}_to_{last} j, seq_0_to_2 s;
"""


def tricky_sql(c: str, job: int) -> str:
    """One job whose every string is an edge of the dump's quoting, with its 3 steps."""
    return rf"""
INSERT INTO `{c}_job_table` (job_db_inx, account, admin_comment, array_task_str, cpus_req, id_job, id_user,
  id_group, nodelist, `partition`, state, submit_line, job_name, env_hash, script_hash)
VALUES ({job}, 'a''b', '),(', '\\', 1, {job}, 1, 1, 'x\'y\\', '(', 1, 'line1\nline2\r\n\ttab; ''q'' "dq" \\\\'' ),(',
  '\'),(\'', '', 0x0027285C293B2C0A0D00FF);
INSERT INTO `{c}_step_table` (job_db_inx, id_step, nodelist, nodes_alloc, state, step_name, task_cnt) VALUES
  ({job}, -5, '(', 1, 3, '\\', 1), ({job}, -4, ')', 1, 3, '''', 1), ({job}, 0, ';', 1, 3, '),(''),(', 1);
"""


def as_slurm(server: scratch.ScratchMariaDB, workdir: Path, sql: str, database: str) -> None:
    """Run `sql` as slurm over TCP, as slurmdbd would (the DEFINER of what it creates is slurm's)."""
    options = workdir / "slurm.cnf"
    options.write_text(f"[client]\nuser=slurm\npassword={quote_option(PASSWORD)}\nhost=127.0.0.1\n"
                       f"port={server.port}\nprotocol=TCP\n")
    options.chmod(0o600)
    subprocess.run(["mariadb", f"--defaults-file={options}", database], input=sql, text=True, check=True,
                   timeout=60)


@pytest.fixture(scope="module")
def workdir():
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-backup-test-"))
    try:
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    """No scratch server, mount or temporary directory of these tests outlives them: they make theirs in a
    TMPDIR of the module's own, so the scratch servers the other half of the suite makes at the same time in
    /tmp are not taken for leftovers of these. It is mode 1777 as /tmp: mariadbd, as mysql, makes its own
    temporary files in TMPDIR."""
    tmp = Path(tempfile.mkdtemp(prefix="slurm-ext-backup-tmp-"))
    tmp.chmod(0o1777)
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(tmp)
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
    left = sorted(p.name for p in tmp.iterdir() if p.name.startswith((SCRATCH_PREFIX, "slurm-ext-db-")))
    assert not left, f"left behind in {tmp}: {left}"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert "slurm-ext-backup-test-" not in mounts
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(tmp).encode() not in cmdline, f"process {pid} left behind"
    shutil.rmtree(tmp)


@pytest.fixture(scope="module")
def live(workdir):
    """The accounting database: 'slurm' with a password, JOBS jobs and 3 steps each, and one tricky job."""
    with scratch.scratch_mariadb(port=free_port()) as server:
        server.sql(f"CREATE DATABASE {DB};")
        add_user(server, databases=(DB, "bk_definer"))
        server.sql(schema_sql(CLUSTER), DB)
        as_slurm(server, workdir, programs_sql(CLUSTER), DB)
        server.sql(fill_sql(CLUSTER, 1, JOBS), DB)
        server.sql(tricky_sql(CLUSTER, JOBS + 1), DB)
        yield server


@pytest.fixture(scope="module")
def fresh(workdir):
    """A server to restore onto: slurm may use no database yet (each test grants it the one it restores into, and
    only that one); none exists yet."""
    with scratch.scratch_mariadb(port=free_port()) as server:
        add_user(server, databases=())
        yield server


class Events:
    """An `emit` that keeps what it is given, and checks each name against the catalogue."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict]] = []

    def __call__(self, event: str, message: str, severity: str | None = None, **fields) -> None:
        assert event in CATALOGUE and "accounting" in CATALOGUE[event].components, event
        self.seen.append((event, message, fields))

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.seen]


def make_config(workdir: Path, server: scratch.ScratchMariaDB, *, database: str = DB, password: str | None = PASSWORD,
                cluster: str = CLUSTER, **settings) -> Config:
    secret = workdir / f"password-{hashlib.sha1((password or '').encode()).hexdigest()[:8]}"
    if password is not None:
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        settings.setdefault("password_file", str(secret))
    volume = workdir / "volume"
    volume.mkdir(exist_ok=True)
    settings.setdefault("backup_key", str(key_path(workdir)))
    return Config(accounting=AccountingSection(db_host="127.0.0.1", db_port=server.port, database=database,
                                               cluster=cluster, volume=str(volume),
                                               backup_dir=str(workdir / "backups"), **settings),
                  slurm=SlurmSection(conf=str(workdir / "no-slurm.conf")))


def key_path(workdir: Path) -> Path:
    """The tests' backup key: made by the first backup, apart from every backup directory."""
    return workdir / "keys" / "backup.key"


def key_of(workdir: Path) -> backupkey.BackupKey:
    """The tests' backup key, made now where no backup made it yet."""
    return backupkey.ensure_key(key_path(workdir), workdir / "backups")


@pytest.fixture(scope="module")
def made(workdir, live):
    """One backup of the live database, shared by the tests that only read it."""
    return backups.backup(make_config(workdir, live), workdir / "made", environ={})


def copy_backup(made: backups.BackupResult, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / made.path.name
    shutil.copy(made.path, target)
    shutil.copy(made.manifest_path, dumpfile.manifest_path_for(target))
    return target


# -- the row counter ----------------------------------------------------------------------


def count(text: bytes, chunk: int | None = None) -> RowCounter:
    counter = RowCounter()
    step = chunk or len(text) or 1
    for i in range(0, len(text), step):
        counter.feed(text[i:i + step])
    counter.finish()
    return counter


DUMP = rb"""/*M!999999\- enable the sandbox mode */
-- MariaDB dump 10.19  Distrib 10.11.19-MariaDB, for debian-linux-gnu (x86_64)
-- Server version	10.11.19-MariaDB-0+deb12u1
DROP TABLE IF EXISTS `t`;
CREATE TABLE `t` (
  `id` int(11) NOT NULL,
  `s` text DEFAULT NULL COMMENT 'INSERT INTO `t` VALUES (9);',
  PRIMARY KEY (`id`)
) ENGINE=InnoDB;
CREATE TABLE `empty` (
  `id` int(11) NOT NULL
) ENGINE=InnoDB;
CREATE TABLE `we``ird` (
  `id` int(11) NOT NULL
) ENGINE=InnoDB;
LOCK TABLES `t` WRITE;
INSERT INTO `t` VALUES
(1,'a(b),c'),
(2,'it\'s (x), y'),
(3,'back\\'),
(4,'\\\'),('),
(5,NULL),
(6,0x00FF27285C29),
(7,'line\nbreak;'),
(8,'it''s ('),
(9,'');
INSERT INTO `t` VALUES (10,'x'),(11,')'),(12,'(');
UNLOCK TABLES;
INSERT INTO `we``ird` VALUES (1),(2);
DELIMITER ;;
CREATE DEFINER=`slurm`@`%` PROCEDURE `p`()
BEGIN
INSERT INTO `t` VALUES (100,'no'),(101,'no');
CREATE TABLE `not_a_table` (id int);
END ;;
DELIMITER ;

-- Dump completed on 2026-12-01 17:18:58
"""


def test_row_counter_counts_rows_outside_string_literals():
    found = count(DUMP)
    assert found.tables == {"t": 12, "empty": 0, "we`ird": 2}
    assert found.server_version == "10.11.19-MariaDB-0+deb12u1"
    assert found.completed and not found.malformed
    assert found.definers == {"slurm@%"}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1000])
def test_row_counter_gives_the_same_counts_in_chunks_of_any_size(chunk):
    found = count(DUMP, chunk)
    assert found.tables == {"t": 12, "empty": 0, "we`ird": 2}
    assert found.completed and not found.malformed


def test_row_counter_reads_one_line_inserts_and_raw_newlines_in_strings():
    text = (b"CREATE TABLE `a` (\n  `x` int\n);\nINSERT INTO `a` VALUES (1,'raw\nnewline),('),(2,'\\\\'),(3,'(');\n"
            b"-- Dump completed on 2026-01-01 00:00:00\n")
    for chunk in (None, 1, 5):
        found = count(text, chunk)
        assert found.tables == {"a": 3} and found.completed


def test_row_counter_reads_a_row_per_line_insert_with_a_raw_newline_literal_by_literal():
    """mariadb-dump never writes a raw newline inside a string; another writer may, and then the row
    per line shortcut does not apply."""
    text = (b"CREATE TABLE `a` (\n  `x` int\n);\nINSERT INTO `a` VALUES\n(1,'raw\n(newline'),\n(2,'x;\n'),\n"
            b"(3,'(');\n-- Dump completed on 2026-01-01 00:00:00\n")
    for chunk in (None, 1, 4, 9):
        found = count(text, chunk)
        assert found.tables == {"a": 3} and found.completed and not found.malformed


def test_row_counter_counts_top_level_parentheses_only():
    found = count(b"CREATE TABLE `g` (\n);\nINSERT INTO `g` VALUES (1,(2)),(3,((4),5));\n-- Dump completed\n")
    assert found.tables == {"g": 2}


def test_row_counter_sees_a_dump_that_stops_early():
    cut = DUMP[:DUMP.index(b"(7,'line")]
    found = count(cut)
    assert not found.completed
    assert any("no end" in problem for problem in found.malformed)
    found = count(DUMP[:DUMP.index(b"-- Dump completed")])
    assert not found.completed and not found.malformed


def test_row_counter_reports_an_unterminated_string():
    found = count(b"CREATE TABLE `t` (\n);\nINSERT INTO `t` VALUES (1,'open);\n-- Dump completed\n")
    assert found.malformed and "closing quote" in found.malformed[0]
    assert not found.completed


def gz(path: Path, text: bytes) -> Path:
    path.write_bytes(gzip.compress(text))
    return path


def test_scan_finds_truncation_and_trailing_data(tmp_path):
    whole = gz(tmp_path / "whole.sql.gz", DUMP)
    assert dumpfile.scan(whole).problems() == []
    cut = tmp_path / "cut.sql.gz"
    cut.write_bytes(whole.read_bytes()[:-20])
    assert "truncated" in dumpfile.scan(cut).problems()[0]
    extra = tmp_path / "extra.sql.gz"
    extra.write_bytes(whole.read_bytes() + b"junk")
    assert "after the end" in dumpfile.scan(extra).problems()[0]
    plain = tmp_path / "plain.sql.gz"
    plain.write_bytes(DUMP)
    assert "not a valid gzip" in dumpfile.scan(plain).problems()[0]
    unfinished = gz(tmp_path / "unfinished.sql.gz", DUMP[:DUMP.index(b"-- Dump completed")])
    assert "Dump completed" in dumpfile.scan(unfinished).problems()[0]


def test_manifest_path_and_retention_pattern(tmp_path):
    assert (dumpfile.manifest_path_for(Path("/b/c-20260101T000000Z.sql.gz"))
            == Path("/b/c-20260101T000000Z.manifest.json"))
    names = ["c-20260101T000000Z.sql.gz", "c-20260101T000000Z-2.sql.gz", "c-20250101T000000Z.sql.gz",
             "c-x-20240101T000000Z.sql.gz", "c-latest.sql.gz", "c-20230101T000000Z.sql.gz.tmp",
             "d-20200101T000000Z.sql.gz"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in dumpfile.backups_in(tmp_path, "c")] == [
        "c-20250101T000000Z.sql.gz", "c-20260101T000000Z.sql.gz", "c-20260101T000000Z-2.sql.gz"]


# -- backup and verify --------------------------------------------------------------------


def test_backup_writes_a_dump_and_a_manifest_that_verify_confirms(workdir, live, monkeypatch):
    volume = workdir / "volume"
    volume.mkdir(exist_ok=True)
    marker = {"cluster": CLUSTER, "id": "0123456789abcdef", "created": "2026-01-01T00:00:00+00:00", "kind": "database"}
    (volume / "slurm-ext-volume.json").write_text(json.dumps(marker))
    started = []
    real_popen = subprocess.Popen

    def spy(cmd, *args, **kwargs):
        for arg in cmd:
            assert "es;t" not in str(arg), f"the password is on a command line: {cmd}"
            if str(arg).startswith("--defaults-file="):
                options = Path(str(arg).split("=", 1)[1])
                assert options.stat().st_mode & 0o777 == 0o600
                started.append(options)
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    emitted = Events()
    result = backups.backup(make_config(workdir, live), workdir / "first", environ={}, emit=emitted)
    monkeypatch.undo()
    (volume / "slurm-ext-volume.json").unlink()

    assert started and not any(p.exists() for p in started), "the option file with the password was left"
    manifest = result.manifest
    assert result.path.name == manifest.file and result.path.name.startswith(f"{CLUSTER}-")
    assert result.path.stat().st_mode & 0o777 == 0o600
    assert manifest.size == result.path.stat().st_size
    assert manifest.sha256 == hashlib.sha256(result.path.read_bytes()).hexdigest()
    assert json.loads(result.manifest_path.read_text()) == manifest.as_dict()
    assert (manifest.format, manifest.cluster, manifest.database) == (2, CLUSTER, DB)
    assert manifest.text_size == len(gzip.decompress(result.path.read_bytes()))
    manifest.authenticate(key_of(workdir), result.manifest_path, result.path.name)
    key = key_path(workdir)
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_uid == os.geteuid()
    assert manifest.identity == marker
    assert manifest.server_version.startswith("10.")
    assert manifest.created.endswith("+00:00")
    assert manifest.tables == live.counts(DB)
    assert manifest.tables[f"{CLUSTER}_resv_table"] == 0
    assert manifest.tables[f"{CLUSTER}_job_table"] == JOBS + 1
    assert manifest.tables[f"{CLUSTER}_step_table"] == 3 * (JOBS + 1)
    assert gzip.decompress(result.path.read_bytes()).rstrip().splitlines()[-1].startswith(b"-- Dump completed")
    assert emitted.names == ["backup-done"]

    checked = Events()
    verified = backups.verify(result.path, key_path(workdir), emit=checked)
    assert verified.ok, verified.problems
    assert verified.counts == {t: (n, n) for t, n in manifest.tables.items()}
    assert checked.names == ["verify-done"]


def test_backup_while_jobs_are_inserted_counts_one_snapshot(workdir, live):
    """An inserter commits a job and its 3 steps per transaction all through the dump: the manifest must
    hold 3 steps per job (one snapshot of both tables) and be what verify finds after loading."""
    jobs, steps = f"`{CLUSTER}_job_table`", f"`{CLUSTER}_step_table`"
    inserter = subprocess.Popen([*live.client, DB], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def insert() -> None:
        job = 1_000_000
        while not stop.is_set():
            batch = []
            for _ in range(20):
                job += 1
                batch.append(f"BEGIN; INSERT INTO {jobs} (job_db_inx, cpus_req, id_job, id_user, id_group, "
                             f"`partition`, state, job_name, submit_line) VALUES ({job}, 1, {job}, 1, 1, 'gpu', 1, "
                             f"'live', 'srun (x), ''y''');\nINSERT INTO {steps} (job_db_inx, id_step, nodelist, "
                             f"nodes_alloc, state, step_name, task_cnt) VALUES ({job}, -5, 'n', 1, 1, 'batch', 1), "
                             f"({job}, -4, 'n', 1, 1, 'extern', 1), ({job}, 0, 'n', 1, 1, 's(0)', 1); COMMIT;\n")
            inserter.stdin.write("".join(batch))
            inserter.stdin.flush()

    def rows() -> int:
        return int(live.sql(f"SELECT COUNT(*) FROM {jobs};", DB)[0][0])

    thread = threading.Thread(target=insert)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        first = rows()
        while rows() < first + 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = rows()
        result = backups.backup(make_config(workdir, live), workdir / "concurrent", environ={})
        after = rows()
    finally:
        stop.set()
        thread.join()
        inserter.stdin.close()
        assert inserter.wait(30) == 0, inserter.stderr.read()
    tables = result.manifest.tables
    assert after > before, "no job was inserted while the dump ran: the test proves nothing"
    assert before <= tables[f"{CLUSTER}_job_table"] <= after
    assert tables[f"{CLUSTER}_step_table"] == 3 * tables[f"{CLUSTER}_job_table"]
    verified = backups.verify(result.path, key_path(workdir))
    assert verified.ok, verified.problems
    assert {t: found for t, (_, found) in verified.counts.items()} == tables


def test_retention_keeps_the_newest_and_nothing_else_is_touched(workdir, live):
    directory = workdir / "retention"
    directory.mkdir()
    others = ["notes.txt", f"{CLUSTER}-latest.sql.gz", "othercluster-20200101T000000Z.sql.gz",
              f"{CLUSTER}-20200101T000000Z.manifest.json"]
    for name in others:
        (directory / name).write_text("not ours to delete\n")
    config = make_config(workdir, live)
    results = [backups.backup(config, directory, keep=2, environ={}) for _ in range(4)]
    kept = dumpfile.backups_in(directory, CLUSTER)
    assert kept == [results[2].path, results[3].path]
    assert results[2].removed == [results[0].path] and results[3].removed == [results[1].path]
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        others + [p.name for p in kept] + [dumpfile.manifest_path_for(p).name for p in kept])


def test_verify_loads_no_backup_without_its_manifest(workdir, made):
    lonely = copy_backup(made, workdir / "lonely")
    dumpfile.manifest_path_for(lonely).unlink()
    emitted = Events()
    result = backups.verify(lonely, key_path(workdir), emit=emitted)
    assert not result.ok
    assert len(result.problems) == 1 and "no manifest" in result.problems[0]
    assert result.counts == {}
    assert emitted.names == ["verify-failed"]


def test_verify_compares_with_the_manifest_counts(workdir, made):
    """An edited manifest is refused as it is (its HMAC no longer matches); signed again by the key's holder, its
    counts are compared with what the load gives."""
    edited = copy_backup(made, workdir / "edited")
    manifest_path = dumpfile.manifest_path_for(edited)
    data = json.loads(manifest_path.read_text())
    data["tables"][f"{CLUSTER}_job_table"] += 1
    manifest_path.write_text(json.dumps(data))
    refused = backups.verify(edited, key_path(workdir))
    assert not refused.ok and refused.counts == {}
    assert "HMAC does not match" in refused.problems[0] and str(key_path(workdir)) in refused.problems[0]
    resigned = dumpfile.Manifest.from_dict(data).signed(key_of(workdir))
    manifest_path.write_text(json.dumps(resigned.as_dict()))
    result = backups.verify(edited, key_path(workdir))
    assert not result.ok
    job_table = f"{CLUSTER}_job_table"
    assert any(p.startswith(f"table {job_table}:") for p in result.problems), result.problems
    rows = made.manifest.tables[job_table]
    assert result.counts[job_table] == (rows + 1, rows)


@pytest.fixture
def damaged(workdir, made, request):
    """A copy of the backup, truncated to half or with one byte flipped in the middle."""
    path = copy_backup(made, workdir / f"damaged-{request.param}")
    data = bytearray(path.read_bytes())
    if request.param == "truncated":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return request.param, path


@pytest.mark.parametrize("damaged", ["truncated", "flipped"], indirect=True)
def test_a_damaged_backup_is_refused_by_verify_and_restore(workdir, fresh, damaged):
    kind, path = damaged
    result = backups.verify(path, key_path(workdir))
    assert not result.ok and result.counts == {}
    assert any(("truncated" if kind == "truncated" else "sha256") in p for p in result.problems), result.problems
    emitted = Events()
    config = make_config(workdir, fresh, database=f"r_{kind}")
    with pytest.raises(BackupError, match="refusing to restore a damaged backup") as err:
        backups.restore(config, path, environ={}, emit=emitted)
    assert str(path) in str(err.value)
    assert emitted.names == ["restore-failed"]
    assert fresh.sql(f"SHOW DATABASES LIKE 'r\\_{kind}';") == [], "a refused restore changed the server"


# -- restore ------------------------------------------------------------------------------


def test_restore_into_a_new_database_gives_the_manifest_counts(workdir, live, fresh, made):
    emitted = Events()
    config = make_config(workdir, fresh, database="r_new")
    grant_only(fresh, ("r_new",))
    result = backups.restore(config, made.path, environ={}, emit=emitted)
    assert result.tables == made.manifest.tables == fresh.counts("r_new")
    assert emitted.names == ["restore-done"]
    tricky = (f"SELECT HEX(CONCAT_WS('|', account, admin_comment, array_task_str, nodelist, `partition`, "
              f"submit_line, job_name, script_hash)) FROM `{CLUSTER}_job_table` WHERE job_db_inx = {JOBS + 1};")
    assert fresh.sql(tricky, "r_new") == live.sql(tricky, DB)
    routines = "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE();"
    assert fresh.sql(routines, "r_new") == [("bk_unused",)]
    with pytest.raises(BackupError, match="drop or rename it first"):
        backups.restore(config, made.path, environ={})


def test_restore_is_refused_while_another_client_uses_the_database(workdir, fresh, made):
    fresh.sql("CREATE DATABASE r_inuse;")
    grant_only(fresh, ("r_inuse",))
    holder = subprocess.Popen([*fresh.client, "r_inuse"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not fresh.sql("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'r_inuse';"):
            assert time.monotonic() < deadline, "the holding connection never showed"
            time.sleep(0.02)
        emitted = Events()
        with pytest.raises(BackupError, match="stop slurmdbd first") as err:
            backups.restore(make_config(workdir, fresh, database="r_inuse"), made.path, environ={}, emit=emitted)
        assert "r_inuse" in str(err.value)
        assert emitted.names == ["restore-failed"]
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert fresh.sql("SHOW TABLES;", "r_inuse") == []


def test_restore_is_refused_onto_a_database_with_data(workdir, live, made):
    counts = live.counts(DB)
    grant_only(live, (DB,))
    try:
        with pytest.raises(BackupError, match="drop or rename it first"):
            backups.restore(make_config(workdir, live), made.path, environ={})
    finally:
        grant_only(live, (DB, "bk_definer"))
    assert live.counts(DB) == counts


def test_restore_is_refused_when_the_routines_belong_to_another_user(workdir, live, fresh):
    """root made a procedure in the database: slurm cannot re-create it as root, so the restore would stop
    half-way; it is refused before anything changes, and still with SET USER (which would let the backup's code
    run as whomever it names)."""
    live.sql("CREATE DATABASE bk_definer; CREATE TABLE bk_definer.t (id int); INSERT INTO bk_definer.t VALUES (1);"
             "CREATE PROCEDURE bk_definer.p() SELECT 1;")
    made = backups.backup(make_config(workdir, live, database="bk_definer"), workdir / "definer", environ={})
    grant_only(fresh, ("r_definer",))
    with pytest.raises(BackupError, match=r"defined by root@localhost: restore as that account") as err:
        backups.restore(make_config(workdir, fresh, database="r_definer"), made.path, environ={})
    assert "Nothing was changed" in str(err.value)
    assert fresh.sql("SHOW DATABASES LIKE 'r\\_definer';") == []
    fresh.sql("GRANT SET USER ON *.* TO 'slurm'@'127.0.0.1';")
    try:
        with pytest.raises(BackupError, match=r"may also write outside database r_definer \(SET USER ON \*\.\*\)"):
            backups.restore(make_config(workdir, fresh, database="r_definer"), made.path, environ={})
    finally:
        fresh.sql("REVOKE SET USER ON *.* FROM 'slurm'@'127.0.0.1';")
    assert fresh.sql("SHOW DATABASES LIKE 'r\\_definer';") == []


def test_restore_is_refused_for_another_cluster(workdir, fresh, made):
    with pytest.raises(BackupError, match="two clusters must not share one database"):
        backups.restore(make_config(workdir, fresh, database="r_other", cluster="othercluster"), made.path, environ={})
    assert fresh.sql("SHOW DATABASES LIKE 'r\\_other';") == []


# -- the ways a backup fails --------------------------------------------------------------


def test_a_wrong_password_names_where_it_came_from(workdir, live):
    directory = workdir / "denied"
    config = make_config(workdir, live, password="wrong-one")
    emitted = Events()
    with pytest.raises(BackupError) as err:
        backups.backup(config, directory, environ={}, emit=emitted)
    message = str(err.value)
    assert config.accounting.password_file in message and "accounting.password_file" in message
    assert "Access denied" in message
    assert emitted.names == ["backup-failed"]
    assert list(directory.iterdir()) == []
    from_env = make_config(workdir, live, password=None)
    with pytest.raises(BackupError, match=r"\$SLURM_EXT_DB_PASSWORD"):
        backups.backup(from_env, directory, environ={"SLURM_EXT_DB_PASSWORD": "wrong-too"})


def test_a_server_that_is_down_names_the_address_setting(workdir, live):
    config = make_config(workdir, live)
    port = free_port()
    config = Config(accounting=AccountingSection(**{**_fields(config.accounting), "db_port": port}),
                    slurm=config.slurm)
    with pytest.raises(BackupError, match=rf"accounting.db_host:db_port \(127.0.0.1:{port}\): cannot connect"):
        backups.backup(config, workdir / "down", environ={})
    assert list((workdir / "down").iterdir()) == []


def _fields(section) -> dict:
    return {name: getattr(section, name) for name in section.__dataclass_fields__}


@pytest.fixture
def mount(workdir):
    """mount(name, options) -> a tmpfs at workdir/name, unmounted and removed after the test."""
    made: list[Path] = []

    def make(name: str, options: str) -> Path:
        target = workdir / name
        target.mkdir()
        made.append(target)
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "slurm-ext-backup-test", str(target)], check=True)
        return target

    yield make
    for target in made:
        subprocess.run(["umount", str(target)], check=False)
        target.rmdir()


def test_a_read_only_directory_is_refused(workdir, live, mount):
    target = mount("readonly", "size=1m,mode=0700")
    subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True)
    emitted = Events()
    with pytest.raises(BackupError, match="read-only") as err:
        backups.backup(make_config(workdir, live), target, environ={}, emit=emitted)
    assert str(target) in str(err.value)
    assert emitted.names == ["backup-failed"]


def test_a_full_directory_keeps_nothing(workdir, live, made, mount):
    assert made.manifest.size > 2 * 512 * 1024, "the dump must not fit the tmpfs"
    target = mount("full", f"size={FULL_TMPFS},mode=0700")
    emitted = Events()
    with pytest.raises(BackupError, match=f"^{target}: no space left on the device; nothing of this backup was kept"):
        backups.backup(make_config(workdir, live), target, environ={}, emit=emitted)
    assert list(target.iterdir()) == []
    assert emitted.names == ["backup-failed"]


@pytest.mark.parametrize("how", ["killed", "exit 0"])
def test_a_dump_that_stops_early_keeps_nothing(workdir, live, made, monkeypatch, how):
    """A mariadb-dump that dies half-way (or claims success without its last line) leaves no backup."""
    bin_dir = workdir / f"fake-bin-{how.replace(' ', '')}"
    bin_dir.mkdir()
    half = workdir / f"half-{how.replace(' ', '')}.sql"
    half.write_bytes(gzip.decompress(made.path.read_bytes())[:400_000])
    fake = bin_dir / "mariadb-dump"
    fake.write_text(f"#!/bin/sh\ncat {half}\n" + ("kill -9 $$\n" if how == "killed" else "exit 0\n"))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    directory = workdir / f"early-{how.replace(' ', '')}"
    emitted = Events()
    with pytest.raises(BackupError, match="killed by signal 9" if how == "killed" else "without its '-- Dump "
                       "completed' line") as err:
        backups.backup(make_config(workdir, live), directory, environ={}, emit=emitted)
    assert f"nothing was kept of {CLUSTER}-" in str(err.value) and str(directory) in str(err.value)
    assert list(directory.iterdir()) == []
    assert emitted.names == ["backup-failed"]


def test_the_cli_backs_up_and_verifies(workdir, live):
    config = make_config(workdir, live)
    toml = workdir / "slurm-ext.toml"
    toml.write_text(f'[node]\nstate_dir = "{workdir / "state"}"\n[slurm]\nconf = "{workdir / "no-slurm.conf"}"\n'
                    f'[accounting]\ndb_port = {live.port}\ncluster = "{CLUSTER}"\n'
                    f'password_file = "{config.accounting.password_file}"\nvolume = "{workdir / "volume"}"\n'
                    f'backup_dir = "{workdir / "cli"}"\nbackup_keep = 1\nbackup_key = "{key_path(workdir)}"\n')
    run = [sys.executable, "-m", "slurm_ext.cli", "--config", str(toml), "accounting"]
    done = subprocess.run([*run, "backup"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "backup " in done.stdout and "rows" in done.stdout
    path = dumpfile.backups_in(workdir / "cli", CLUSTER)[0]
    checked = subprocess.run([*run, "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert ": OK:" in checked.stdout
    journal = [json.loads(line) for line in (workdir / "state" / "journal.jsonl").read_text().splitlines()]
    assert [e["event"] for e in journal] == ["backup-done", "verify-done"]


def test_slurm_exts_own_database_is_backed_up_beside_and_restored_into_its_own(workdir):
    """The repair history (accounting.own_database) on the same server goes into the same backups: a file of its
    own beside the accounting database's, verified and restored the same way, into its own database."""
    with scratch.scratch_mariadb(port=free_port()) as server:
        server.sql(f"CREATE DATABASE {DB}; CREATE DATABASE slurm_ext;")
        add_user(server, databases=(DB, "slurm_ext"))
        server.sql(schema_sql(CLUSTER), DB)
        server.sql(fill_sql(CLUSTER, 1, 5), DB)
        server.sql("CREATE TABLE repair_events (id INT PRIMARY KEY, message TEXT); "
                   "INSERT INTO repair_events VALUES (1, 'approved by alice'), (2, 'resumed');", "slurm_ext")
        config = make_config(workdir, server)
        result = backups.backup(config, workdir / "own", environ={})
        own = result.own
        assert own is not None and own.manifest.database == "slurm_ext" and own.manifest.tables == {
            "repair_events": 2}
        assert own.path.name.startswith(f"{CLUSTER}-slurm_ext-") and result.manifest.database == DB
        assert dumpfile.backups_in(workdir / "own", CLUSTER) == [result.path]  # each kept by its own retention
        assert backups.verify(own.path, key_path(workdir)).ok
        server.sql("DROP DATABASE slurm_ext; CREATE DATABASE slurm_ext;")
        with pytest.raises(BackupError, match=rf"may also write outside database slurm_ext \(.*ON {DB}\.\*"):
            backups.restore(config, own.path, environ={})  # slurm may write the accounting database too
        add_user(server, databases=("slurm_ext",), user="ownrestore")
        restored = backups.restore(make_config(workdir, server, db_user="ownrestore"), own.path, environ={})
        assert restored.database == "slurm_ext" and server.counts("slurm_ext") == {"repair_events": 2}
        assert server.counts(DB) == result.manifest.tables  # the accounting database was not touched


# -- issue 28: crafted backups, keys and files ----------------------------------------------


def write_backup(directory: Path, name: str, text: bytes, key: backupkey.BackupKey | None, *,
                 created: str = "2026-01-01T00:00:00+00:00", **fields) -> Path:
    """A backup made by hand (as whoever can write the backup directory would): `text` compressed as `name`, and
    beside it a manifest with its true sha256, sizes and rows, signed with `key` (None: not signed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(gzip.compress(text))
    manifest = dumpfile.Manifest(created=created, cluster=CLUSTER, database=DB, identity=None,
                                 tables=dict(count(text).tables), sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                 size=path.stat().st_size, file=name, server_version="10.11.19-MariaDB",
                                 text_size=len(text))
    manifest = dataclasses.replace(manifest, **fields)
    if key is not None:
        manifest = manifest.signed(key)
    dumpfile.manifest_path_for(path).write_text(json.dumps(manifest.as_dict()))
    return path


#: DUMP as whoever writes a dump by hand would: without mariadb-dump's first line, which turns the client's
#: sandbox mode on
CRAFTED = DUMP[DUMP.index(b"\n") + 1:]


def with_line(text: bytes, line: bytes) -> tuple[bytes, int]:
    """`text` with `line` put before its completion line, and that line's number."""
    at = text.index(b"-- Dump completed")
    return text[:at] + line + b"\n" + text[at:], text[:at].count(b"\n") + 1


def markers(workdir: Path, name: str) -> Path:
    """An empty directory anyone may write and reach (mysql too: else an attack would fail for the wrong
    reason), for what an attack would leave."""
    workdir.chmod(0o711)
    (workdir / "markers").mkdir(mode=0o711, exist_ok=True)
    directory = workdir / "markers" / name
    directory.mkdir()
    directory.chmod(0o1777)
    return directory


#: client commands, as whoever writes a dump would put them (MARK: the file each one would make)
CLIENT_ATTACKS = {
    "shell": b"\\! id > MARK",
    "shell-indented": b"  \\! id > MARK",
    "system": b"system id > MARK",
    "SYSTEM": b"SYSTEM id > MARK;",
    "source": b"\\. SCRIPT",
    "source-named": b"source SCRIPT",
    "tee": b"\\T MARK",
    "tee-named": b"tee MARK",
    "delimiter": b"DELIMITER $$",
    "in-an-insert": b"INSERT INTO `t` VALUES (13,'x'),\n\\! id > MARK\n(14,'y');",
}


@pytest.mark.parametrize("attack", sorted(CLIENT_ATTACKS))
def test_a_dump_with_a_client_command_runs_nothing_and_is_refused_naming_the_line(workdir, fresh, attack):
    """Issue 28.1: verify and restore of a dump that holds a command of the mariadb client run nothing (the file
    it would write stays absent) and name its line, even under a manifest signed with the right key; and the
    client alone, given the same text without any check before it, runs nothing either (--binary-mode,
    --sandbox)."""
    where = markers(workdir, f"client-{attack}")
    mark, script = where / "mark", where / "script.sql"
    script.write_text(f"\\! id > {mark}\n")
    line = CLIENT_ATTACKS[attack].replace(b"MARK", bytes(mark)).replace(b"SCRIPT", bytes(script))
    text, number = with_line(CRAFTED, line)
    if attack == "in-an-insert":
        number += 1
    path = write_backup(workdir / f"client-{attack}", f"{CLUSTER}-20260101T000000Z.sql.gz", text, key_of(workdir))
    result = backups.verify(path, key_path(workdir))
    assert not result.ok and result.counts == {}
    assert any(f"line {number}: " in p and "command of the mariadb client" in p for p in result.problems), \
        result.problems
    with pytest.raises(BackupError, match=f"line {number}: .*command of the mariadb client"):
        backups.restore(make_config(workdir, fresh, database="r_client"), path, environ={})
    assert not mark.exists()
    fresh.sql("CREATE DATABASE IF NOT EXISTS r_client;")
    try:
        sqlclient.load(fresh.client, path, "r_client")
    except CommandError:
        pass  # the server refused the text as SQL
    finally:
        fresh.sql("DROP DATABASE r_client;")
    assert not mark.exists(), f"the mariadb client ran {line!r}"


def test_row_counter_takes_mariadb_dumps_own_lines():
    """What mariadb-dump writes is not taken for a client command: its sandbox line, DELIMITER ;; and ;, words of
    the list inside strings and backquotes, and backslashes inside strings."""
    text = (b"/*M!999999\\- enable the sandbox mode */\n-- Server version\t10.11\nCREATE TABLE `status` (\n"
            b"  `use` int,\n  `source` text DEFAULT 'system \\\\! x'\n);\nINSERT INTO `status` VALUES (1,'\\\\! id'),"
            b"(2,'\nsystem id\n');\nDELIMITER ;;\nCREATE DEFINER=`slurm`@`%` PROCEDURE `p`()\nBEGIN\nSELECT 1;\n"
            b"END ;;\nDELIMITER ;\n-- Dump completed on 2026-12-01 17:18:58\n")
    for chunk in (None, 1, 3, 64):
        found = count(text, chunk)
        assert found.tables == {"status": 2} and not found.malformed and found.completed, found.malformed


def test_verify_and_restore_refuse_a_manifest_without_or_with_a_forged_hmac(workdir, fresh, made):
    """Issue 28.1: whoever can write the backup directory can write a dump and its true sha256; a manifest
    without an HMAC, with one made under another key, of format 1, or beside another dump is refused, and
    nothing is loaded (the dump's shell command never runs)."""
    where = markers(workdir, "forged")
    mark = where / "mark"
    text, _ = with_line(CRAFTED, b"\\! id > " + bytes(mark))
    other_key = backupkey.BackupKey("another host's key", b"0" * 64)
    cases = {"unsigned": None, "other key": other_key}
    for case, key in cases.items():
        path = write_backup(workdir / f"forged-{case.replace(' ', '-')}", f"{CLUSTER}-20260101T000000Z.sql.gz",
                            text, key)
        emitted = Events()
        result = backups.verify(path, key_path(workdir), emit=emitted)
        assert not result.ok and result.counts == {} and emitted.names == ["verify-failed"]
        assert ("carries no HMAC" if key is None else "HMAC does not match") in result.problems[0], result.problems
        with pytest.raises(BackupError, match="carries no HMAC" if key is None else "HMAC does not match"):
            backups.restore(make_config(workdir, fresh, database="r_forged"), path, environ={})
    assert not mark.exists()
    real = copy_backup(made, workdir / "format-1")
    manifest_path = dumpfile.manifest_path_for(real)
    data = json.loads(manifest_path.read_text())
    old = {k: v for k, v in data.items() if k not in ("hmac", "text_size")} | {"format": 1}
    manifest_path.write_text(json.dumps(old))
    assert "format 1, written before slurm-ext authenticated" in backups.verify(real, key_path(workdir)).problems[0]
    moved = copy_backup(made, workdir / "moved")
    renamed = moved.with_name(f"{CLUSTER}-20250101T000000Z.sql.gz")
    moved.rename(renamed)
    dumpfile.manifest_path_for(moved).rename(dumpfile.manifest_path_for(renamed))
    assert "the manifest is that of" in backups.verify(renamed, key_path(workdir)).problems[0]
    assert fresh.sql("SHOW DATABASES LIKE 'r\\_forged';") == []


@pytest.mark.parametrize("statement, refusal", [
    ("SELECT 'written' INTO OUTFILE 'MARK';", "--secure-file-priv|FILE privilege"),
    ("SELECT 'written' INTO DUMPFILE 'MARK';", "--secure-file-priv|FILE privilege"),
    ("INSTALL SONAME 'server_audit'; SET GLOBAL server_audit_file_path = 'MARK'; SET GLOBAL server_audit_logging = ON;",
     "server_audit.so|denied"),
    ("SET GLOBAL general_log_file = 'MARK'; SET GLOBAL general_log = 1; SELECT 1;", "SUPER"),
    ("CREATE DEFINER=`root`@`localhost` PROCEDURE bk_p() SET GLOBAL general_log_file = 'MARK'; CALL bk_p(); "
     "SET GLOBAL general_log = 1;", "definer .*does not exist"),
], ids=["outfile", "dumpfile", "audit-plugin", "general-log", "as-root"])
def test_a_dumps_sql_in_verify_writes_no_file(workdir, statement, refusal):
    """Issue 28.1: with a manifest signed by the key's holder, the dump's SQL in verify's scratch server still
    cannot write a file of the host: it is loaded as an account with rights on its database only (no FILE, no
    SUPER, and root, whom a program could name as its definer, is gone), --secure-file-priv is an empty
    directory mysql cannot write, and there is no plugin to install. The statement comes first, so that the
    server meets it."""
    mark = markers(workdir, f"sql-{statement.split()[0].lower()}-{len(statement)}") / "mark"
    text = statement.replace("MARK", str(mark)).encode() + b"\n" + CRAFTED
    path = write_backup(workdir / f"sql-{len(statement)}", f"{CLUSTER}-20260101T000000Z.sql.gz", text,
                        key_of(workdir))
    result = backups.verify(path, key_path(workdir))
    assert not result.ok, result.problems
    assert "loading it into a scratch MariaDB failed" in result.problems[-1], result.problems
    assert re.search(refusal, result.problems[-1]), result.problems
    assert not mark.exists(), f"{statement} wrote {mark}"


def test_a_restored_dump_cannot_touch_slurm_exts_own_database(workdir):
    """Issue 28.1: a dump (signed by the key's holder) whose text also approves a repair in slurm-ext's own
    database: restore as the accounting user while it also holds slurm-ext's database is refused before anything
    changes; as an account with rights on the target only, the INSERT is denied. The repair records stay empty."""
    with scratch.scratch_mariadb(port=free_port()) as server:
        server.sql(f"CREATE DATABASE {DB}; CREATE DATABASE slurm_ext;")
        server.sql("CREATE TABLE repair_records (id INT PRIMARY KEY, node TEXT, state TEXT, action TEXT);",
                   "slurm_ext")
        add_user(server, databases=(DB, "slurm_ext"))
        server.sql(schema_sql(CLUSTER), DB)
        server.sql(fill_sql(CLUSTER, 1, 20), DB)
        made = backups.backup(make_config(workdir, server), workdir / "approve", environ={})
        approve = b"INSERT INTO `slurm_ext`.`repair_records` VALUES (1,'gpu7','approved','remove');"
        text, _ = with_line(gzip.decompress(made.path.read_bytes()), approve)
        path = write_backup(workdir / "approve-crafted", made.path.name, text, key_of(workdir),
                            created=made.manifest.created)
        config = make_config(workdir, server, database="r_attack")
        grant_only(server, ("r_attack", "slurm_ext"))
        with pytest.raises(BackupError, match=r"may also write outside database r_attack \(.*ON slurm_ext\.\*"):
            backups.restore(config, path, environ={})
        assert server.sql("SHOW DATABASES LIKE 'r\\_attack';") == []
        grant_only(server, ("r_attack",))
        with pytest.raises(BackupError, match="loading .* failed .*denied"):
            backups.restore(config, path, environ={})
        assert server.sql("SELECT COUNT(*) FROM repair_records;", "slurm_ext") == [("0",)]


BOMB_CHILD = """
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from slurm_ext.accounting import dumpfile

def peak():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))

before = peak()
found = dumpfile.scan(Path(sys.argv[1]), int(sys.argv[2]) or None)
print(json.dumps([before, peak(), found.problems()]))
"""


@pytest.fixture(scope="module")
def bombs(workdir):
    """1 MiB gzip files of 1 GiB of text: one without a newline, one an INSERT's string that never ends."""
    made = {}
    for name, head in (("no-newline", b""), ("open-string", b"CREATE TABLE `t` (\n);\nINSERT INTO `t` VALUES (1,'")):
        path = workdir / "bombs" / f"{name}.sql.gz"
        path.parent.mkdir(exist_ok=True)
        zipper = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = b"\0" * (1 << 20)
        with open(path, "wb") as out:
            out.write(zipper.compress(head))
            for _ in range(1024):
                out.write(zipper.compress(block))
            out.write(zipper.flush())
        made[name] = path
    return made


@pytest.mark.parametrize("bomb, limit, why", [
    ("no-newline", 0, "longer than 1048576 bytes outside an INSERT"),
    ("open-string", 4 << 20, "longer than the 4194304 bytes its manifest records"),
])
def test_a_gzip_bomb_costs_the_scanner_a_few_mib(bombs, bomb, limit, why):
    """Issue 28.4: 1 MiB of gzip that holds 1 GiB of text, read by a child (memory capped at 1 GiB) whose own
    high-water mark (VmHWM) must grow by a few MiB only: a line outside an INSERT is bounded, and the text by the
    size its manifest records."""
    path = bombs[bomb]
    assert path.stat().st_size < 1100 * 1024
    done = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(path), str(limit)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    before, after, problems = json.loads(done.stdout)
    assert (after - before) / 1024 < 16, f"the scan's peak grew by {(after - before) / 1024:.0f} MiB"
    assert any(why in p for p in problems), problems


def test_retention_goes_by_the_manifests_times_and_never_deletes_the_new_backup(workdir, live):
    """Issue 28.5: files named after the year 2999 (a copy of a real backup renamed, a file of junk) neither make
    a new backup delete itself nor are deleted for their names; a manifest really dated 2999 (the key holder's clock
    gone wrong) does not either; the older backup by its manifest's time goes."""
    directory = workdir / "future"
    config = make_config(workdir, live)
    first = backups.backup(config, directory, keep=2, environ={})
    renamed = directory / f"{CLUSTER}-29991231T235959Z.sql.gz"
    shutil.copy(first.path, renamed)
    shutil.copy(first.manifest_path, dumpfile.manifest_path_for(renamed))
    junk = directory / f"{CLUSTER}-29991231T235958Z.sql.gz"
    junk.write_bytes(b"junk")
    emitted = Events()
    second = backups.backup(config, directory, keep=1, environ={}, emit=emitted)
    assert second.path.exists() and second.manifest_path.exists()
    assert second.removed == [first.path] and not first.manifest_path.exists()
    assert renamed.exists() and junk.exists()
    (_, message, _), = emitted.seen
    assert f"left {renamed} alone" in message and f"left {junk} alone" in message
    dated = write_backup(directory, f"{CLUSTER}-20000101T000000Z.sql.gz", DUMP, key_of(workdir),
                         created="2999-12-31T23:59:59+00:00")
    third = backups.backup(config, directory, keep=2, environ={})
    assert third.path.exists() and dated.exists() and third.removed == [second.path]


def test_a_password_file_others_can_read_or_another_user_owns_is_refused(workdir, live, tmp_path):
    """Issue 28.13: a backup with a password file of mode 0644 or 0640, or owned by another user, is refused
    naming the file, its owner and its mode; nothing is written."""
    from slurm_ext.accounting.database import password
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    directory = workdir / "password-modes"
    for mode in (0o644, 0o640, 0o604):
        secret.chmod(mode)
        config = make_config(workdir, live, password_file=str(secret))
        emitted = Events()
        with pytest.raises(ConfigError, match=rf"{secret}: .*owner root \(uid 0\), mode {mode:04o}.*chmod 600"):
            backups.backup(config, directory, environ={}, emit=emitted)
        assert emitted.names == ["backup-failed"]
    secret.chmod(0o600)
    os.chown(secret, 65534, 65534)
    with pytest.raises(ConfigError, match=rf"{secret}: .*owned by .*uid 65534.*mode 0600"):
        password(AccountingSection(password_file=str(secret)), {})
    os.chown(secret, 0, 0)
    assert password(AccountingSection(password_file=str(secret)), {}) == PASSWORD
    assert not directory.exists() or list(directory.iterdir()) == []


def test_the_backup_key_is_refused_where_others_can_read_it_or_beside_the_backups(workdir, live, made, tmp_path):
    """The key authenticates every manifest: one others can read, one in the backup directory, and a missing one
    (for verify: it is never made there) are refused, naming accounting.backup_key."""
    readable = tmp_path / "readable.key"
    readable.write_text("k" * 64 + "\n")
    readable.chmod(0o644)
    with pytest.raises(BackupError, match=rf"{readable} \(accounting.backup_key\): mode 0644 lets others read"):
        backups.backup(make_config(workdir, live, backup_key=str(readable)), tmp_path / "b1", environ={})
    with pytest.raises(BackupError, match="mode 0644 lets others read"):
        backups.verify(made.path, readable)
    inside = tmp_path / "b2" / "backup.key"
    with pytest.raises(BackupError, match="the backup key is inside the backup directory"):
        backups.backup(make_config(workdir, live, backup_key=str(inside)), tmp_path / "b2", environ={})
    assert not inside.exists()
    with pytest.raises(BackupError, match=r"no backup key: verify and restore need the key the backup was made with"):
        backups.verify(made.path, tmp_path / "missing.key")
    assert not (tmp_path / "missing.key").exists()


# -- the review of issue 28's fixes --------------------------------------------------------


def test_a_dump_swapped_after_its_check_is_not_what_is_loaded(workdir, fresh, made, monkeypatch):
    """Issue 28.1 (review): whoever can write the backup directory renames a crafted dump over the genuine one
    right after verify's and restore's check of it; what is loaded is still the file that was checked (one
    descriptor, opened once), so the crafted table never appears. A dump that is a symbolic link is refused."""
    genuine = gzip.decompress(made.path.read_bytes())
    at = genuine.index(b"-- Dump completed")
    crafted = genuine[:at] + b"CREATE TABLE `pwned` (id int);\nINSERT INTO `pwned` VALUES (1);\n" + genuine[at:]
    real_scan = backups.scan

    def swap_after_scan(source: Path):
        def scan(*args, **kwargs):
            found = real_scan(*args, **kwargs)
            os.rename(source.with_name("crafted.sql.gz"), source)
            return found
        return scan

    for operation in ("verify", "restore"):
        source = copy_backup(made, workdir / f"swap-{operation}")
        source.with_name("crafted.sql.gz").write_bytes(gzip.compress(crafted))
        monkeypatch.setattr(backups, "scan", swap_after_scan(source))
        if operation == "verify":
            result = backups.verify(source, key_path(workdir))
            assert result.ok and "pwned" not in result.counts, result.problems
        else:
            grant_only(fresh, ("r_swap",))
            backups.restore(make_config(workdir, fresh, database="r_swap"), source, environ={})
            assert fresh.sql("SHOW TABLES LIKE 'pwned';", "r_swap") == []
        assert gzip.decompress(source.read_bytes()) == crafted  # the swap did happen
    monkeypatch.setattr(backups, "scan", real_scan)
    link = workdir / "swap-link" / made.path.name
    link.parent.mkdir()
    link.symlink_to(copy_backup(made, workdir / "swap-target"))
    shutil.copy(made.manifest_path, dumpfile.manifest_path_for(link))
    with pytest.raises(BackupError, match="symbolic link"):
        backups.restore(make_config(workdir, fresh, database="r_link"), link, environ={})
    assert "symbolic link" in backups.verify(link, key_path(workdir)).problems[0]


@pytest.mark.parametrize("text, refused", [
    ("mariadb  Ver 15.1 Distrib 10.11.19-MariaDB, for debian-linux-gnu (x86_64) using  EditLine wrapper", False),
    ("mariadb  Ver 15.1 Distrib 10.11.7-MariaDB, for debian-linux-gnu (x86_64) using  EditLine wrapper", True),
    ("mariadb  Ver 15.1 Distrib 10.5.25-MariaDB, for Linux (x86_64) using readline 5.1", False),
    ("mariadb  Ver 15.1 Distrib 10.5.24-MariaDB, for Linux (x86_64) using readline 5.1", True),
    ("mariadb  Ver 15.1 Distrib 10.6.18-MariaDB, for Linux (x86_64) using readline 5.1", False),
    ("mariadb  Ver 15.1 Distrib 10.9.8-MariaDB, for Linux (x86_64) using readline 5.1", True),
    ("mariadb from 11.4.2-MariaDB, client 15.2 for debian-linux-gnu (x86_64) using  EditLine wrapper", False),
    ("mariadb from 11.4.1-MariaDB, client 15.2 for debian-linux-gnu (x86_64) using  EditLine wrapper", True),
    ("mariadb from 11.8.3-MariaDB, client 15.2 for debian-linux-gnu (x86_64) using  EditLine wrapper", False),
    ("mysql  Ver 8.0.36 for Linux on x86_64 (MySQL Community Server - GPL)", True),
])
def test_a_mariadb_client_without_sandbox_is_refused_naming_the_minimum(text, refused):
    """Issue 28.1 (review): --sandbox exists in the mariadb client only since 10.5.25, 10.6.18, 10.11.8 (and
    11.0.6, 11.1.5, 11.2.4, 11.4.2); an older client would reject the option (or a client without it would parse
    `\\!`), so the version is checked and an older one named with the minimum."""
    problem = sqlclient.sandbox_problem(text)
    assert bool(problem) == refused, problem
    if refused:
        assert "10.11.8" in problem and "--sandbox" in problem


def test_this_hosts_mariadb_client_has_sandbox():
    """The check run on this host's real client: it passes, once, and the version it read is the client's."""
    version = subprocess.run(["mariadb", "--version"], capture_output=True, text=True, check=True).stdout
    sqlclient.require_sandbox.cache_clear()
    sqlclient.require_sandbox()
    assert sqlclient.sandbox_problem(version) == ""


KEY_RACER = """
import os, sys
from pathlib import Path
from slurm_ext.accounting import backupkey
go = Path(sys.argv[2])
while not go.exists():
    pass
print(backupkey.ensure_key(sys.argv[1], Path(sys.argv[3])).secret.hex())
"""


def test_two_first_backups_at_once_make_and_read_one_whole_key(tmp_path):
    """Issue 28.1 (review): two first backups at once both make the key; neither reads it before it is whole
    (the key is written under another name and linked into place), and both sign with the same key. Real
    processes, released together, many times."""
    for round in range(25):
        key, go = tmp_path / f"keys-{round}" / "backup.key", tmp_path / f"go-{round}"
        racers = [subprocess.Popen([sys.executable, "-c", KEY_RACER, str(key), str(go), str(tmp_path / "backups")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        time.sleep(0.3)
        go.touch()
        results = [racer.communicate(timeout=60) for racer in racers]
        assert all(racer.returncode == 0 for racer in racers), [err for _, err in results]
        assert len({out for out, _ in results}) == 1
        assert [p.name for p in key.parent.iterdir()] == ["backup.key"]

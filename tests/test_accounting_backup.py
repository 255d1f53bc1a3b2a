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

import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_ext.accounting import backups, dumpfile, scratch
from slurm_ext.accounting.dumpfile import BackupError, RowCounter
from slurm_ext.accounting.sqlclient import quote_option
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


def add_user(server: scratch.ScratchMariaDB, databases: tuple[str, ...] = (DB,), password: str = PASSWORD) -> None:
    """slurmdbd's user, with the grants a backup needs (render.init_sql's)."""
    secret = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"
    statements = []
    for host in ("127.0.0.1", "localhost", "%"):
        statements += [f"CREATE USER 'slurm'@'{host}' IDENTIFIED BY {secret}",
                       *(f"GRANT ALL ON {db}.* TO 'slurm'@'{host}'" for db in databases),
                       f"GRANT SELECT ON mysql.proc TO 'slurm'@'{host}'",
                       f"GRANT RELOAD, PROCESS ON *.* TO 'slurm'@'{host}'"]
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
    """No scratch server, mount or temporary directory of these tests outlives them."""
    tmp = Path(tempfile.gettempdir())
    before = {p.name for p in tmp.iterdir() if p.name.startswith((SCRATCH_PREFIX, "slurm-ext-db-"))}
    yield
    after = {p.name for p in tmp.iterdir() if p.name.startswith((SCRATCH_PREFIX, "slurm-ext-db-"))}
    assert after <= before, f"left behind in {tmp}: {sorted(after - before)}"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert "slurm-ext-backup-test-" not in mounts
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert not any(name.encode() in cmdline for name in after - before), f"process {pid} left behind"


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
    """A server to restore onto: slurm may use any database named r_...; none exists yet."""
    with scratch.scratch_mariadb(port=free_port()) as server:
        add_user(server, databases=("`r\\_%`",))
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
    return Config(accounting=AccountingSection(db_host="127.0.0.1", db_port=server.port, database=database,
                                               cluster=cluster, volume=str(volume),
                                               backup_dir=str(workdir / "backups"), **settings),
                  slurm=SlurmSection(conf=str(workdir / "no-slurm.conf")))


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
    assert (manifest.format, manifest.cluster, manifest.database) == (1, CLUSTER, DB)
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
    verified = backups.verify(result.path, emit=checked)
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
    verified = backups.verify(result.path)
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


def test_verify_reports_a_backup_without_manifest_and_still_loads_it(workdir, made):
    lonely = copy_backup(made, workdir / "lonely")
    dumpfile.manifest_path_for(lonely).unlink()
    emitted = Events()
    result = backups.verify(lonely, emit=emitted)
    assert not result.ok
    assert len(result.problems) == 1 and "no manifest" in result.problems[0]
    assert result.counts == {t: (n, n) for t, n in made.manifest.tables.items()}
    assert emitted.names == ["verify-failed"]


def test_verify_compares_with_the_manifest_counts(workdir, made):
    edited = copy_backup(made, workdir / "edited")
    manifest_path = dumpfile.manifest_path_for(edited)
    data = json.loads(manifest_path.read_text())
    data["tables"][f"{CLUSTER}_job_table"] += 1
    manifest_path.write_text(json.dumps(data))
    result = backups.verify(edited)
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
    result = backups.verify(path)
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
    with pytest.raises(BackupError, match="drop or rename it first"):
        backups.restore(make_config(workdir, live), made.path, environ={})
    assert live.counts(DB) == counts


def test_restore_is_refused_when_the_routines_belong_to_another_user(workdir, live, fresh):
    """root made a procedure in the database: slurm cannot re-create it as root, so the restore would stop
    half-way; it is refused before anything changes."""
    live.sql("CREATE DATABASE bk_definer; CREATE TABLE bk_definer.t (id int); INSERT INTO bk_definer.t VALUES (1);"
             "CREATE PROCEDURE bk_definer.p() SELECT 1;")
    made = backups.backup(make_config(workdir, live, database="bk_definer"), workdir / "definer", environ={})
    with pytest.raises(BackupError, match=r"defined by root@localhost.*GRANT SET USER") as err:
        backups.restore(make_config(workdir, fresh, database="r_definer"), made.path, environ={})
    assert "nothing was changed" in str(err.value)
    assert fresh.sql("SHOW DATABASES LIKE 'r\\_definer';") == []
    fresh.sql("GRANT SET USER ON *.* TO 'slurm'@'127.0.0.1';")
    try:
        restored = backups.restore(make_config(workdir, fresh, database="r_definer"), made.path, environ={})
    finally:
        fresh.sql("REVOKE SET USER ON *.* FROM 'slurm'@'127.0.0.1';")
    assert restored.tables == {"t": 1}


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
                    f'backup_dir = "{workdir / "cli"}"\nbackup_keep = 1\n')
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
        assert backups.verify(own.path).ok
        server.sql("DROP DATABASE slurm_ext; CREATE DATABASE slurm_ext;")
        restored = backups.restore(config, own.path, environ={})
        assert restored.database == "slurm_ext" and server.counts("slurm_ext") == {"repair_events": 2}
        assert server.counts(DB) == result.manifest.tables  # the accounting database was not touched

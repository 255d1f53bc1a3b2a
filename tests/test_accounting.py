"""Durable accounting's pure parts: the guard's rules on real directories, the files it renders, the
queue alarm, the witness. The daemons themselves: test_accounting_cluster.py and test_accounting_backup.py."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from helpers.wait import wait_for
from slurm_ext import config
from slurm_ext.accounting import render, slurmconf, storage
from slurm_ext.accounting.database import guarded_volumes, memory_mib, password
from slurm_ext.accounting.queue import QueueAlarm
from slurm_ext.accounting.reconcile import read_witness
from slurm_ext.accounting.settings import AccountingSection
from slurm_ext.errors import ConfigError
from slurm_ext.accounting.plugin import local_database
from slurm_ext.supervisor.workers import workers_for


def _volumes(root: Path) -> tuple[storage.Volume, storage.Volume]:
    database = storage.Volume("database", root / "db", root / "db" / storage.MARKER_NAME, (root / "db/mysql/mysql",))
    state = storage.Volume("state", root / "ctld", root / "ctld" / storage.MARKER_NAME, (root / "ctld/job_state",))
    return database, state


def _first_start(root: Path) -> tuple[storage.Volume, storage.Volume]:
    database, state = _volumes(root)
    verdict = storage.check([database, state], "c1", 0)
    (root / "db/mysql/mysql").mkdir(parents=True)  # what mariadb-install-db makes before commit
    storage.commit(verdict)
    return database, state


def test_first_initialisation_marks_both_volumes_with_one_id(tmp_path):
    database, state = _first_start(tmp_path)
    one, two = (json.loads(v.marker.read_text()) for v in (database, state))
    assert one["id"] == two["id"] and one["cluster"] == two["cluster"] == "c1"
    assert (one["kind"], two["kind"]) == ("database", "state")
    again = storage.check([database, state], "c1", 0)
    assert again.to_mark == [] and any(": OK (" in note for note in again.notes)


def test_a_database_volume_replaced_by_an_empty_one_is_refused_and_left_empty(tmp_path):
    database, state = _first_start(tmp_path)
    os.rename(database.path, tmp_path / "aside")
    database.path.mkdir()
    with pytest.raises(storage.StorageRefused, match="replaced by an empty one or lost") as refused:
        storage.check([database, state], "c1", 0)
    assert str(database.path) in str(refused.value) and "mount the right volume" in str(refused.value)
    assert list(database.path.iterdir()) == []


def test_a_state_marked_alone_first_takes_its_database_in_at_the_first_initialisation(tmp_path):
    """A controller that starts before the database marks StateSaveLocation alone (unpaired): the database's
    first initialisation then joins it, and from then on an empty database is a replaced one."""
    database, state = _volumes(tmp_path)
    storage.commit(storage.check([state], "c1", 0))
    assert json.loads(state.marker.read_text())["paired"] is False
    verdict = storage.check([database, state], "c1", 0)
    (tmp_path / "db/mysql/mysql").mkdir(parents=True)
    storage.commit(verdict)
    one, two = (json.loads(v.marker.read_text()) for v in (database, state))
    assert one["id"] == two["id"] and one["paired"] is two["paired"] is True
    os.rename(database.path, tmp_path / "aside")
    database.path.mkdir()
    with pytest.raises(storage.StorageRefused, match="replaced by an empty one"):
        storage.check([database, state], "c1", 0)


def test_a_marker_without_its_database_is_refused(tmp_path):
    database, state = _first_start(tmp_path)
    (tmp_path / "db/mysql/mysql").rmdir()
    with pytest.raises(storage.StorageRefused, match="its data is gone"):
        storage.check([database], "c1", 0)


def test_markers_that_disagree_and_another_clusters_volume_are_refused(tmp_path):
    database, state = _first_start(tmp_path)
    marker = json.loads(state.marker.read_text())
    state.marker.write_text(json.dumps({**marker, "id": "0000"}))
    with pytest.raises(storage.StorageRefused, match="disagree"):
        storage.check([database, state], "c1", 0)
    with pytest.raises(storage.StorageRefused, match="belongs to another cluster"):
        storage.check([database], "c2", 0)


def test_a_damaged_marker_names_its_file(tmp_path):
    database, _ = _first_start(tmp_path)
    database.marker.write_text("{not json")
    with pytest.raises(storage.StorageRefused, match=str(database.marker)):
        storage.check([database], "c1", 0)


def test_data_from_before_the_guard_is_adopted(tmp_path):
    database, state = _volumes(tmp_path)
    (tmp_path / "db/mysql/mysql").mkdir(parents=True)
    verdict = storage.check([database, state], "c1", 0)
    assert any("from before slurm-ext guarded it" in note for note in verdict.notes)


def test_overlay_and_tmpfs_are_refused_unless_allowed(tmp_path):
    database, _ = _volumes(tmp_path)
    mountinfo = tmp_path / "mountinfo"
    for fstype, words in (("overlay", "container's own layer"), ("tmpfs", "lives in memory")):
        mountinfo.write_text(f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {tmp_path} rw - {fstype} x rw\n")
        with pytest.raises(storage.StorageRefused, match=words):
            storage.check([database], "c1", 0, mountinfo=mountinfo)
        allowed = storage.check([database], "c1", 0, allow_ephemeral=True, mountinfo=mountinfo)
        assert allowed.notes and all(n.startswith(storage.EPHEMERAL_NOTE) for n in allowed.notes)


def test_too_little_free_space_says_how_much(tmp_path):
    database, _ = _volumes(tmp_path)
    with pytest.raises(storage.StorageRefused, match=r"only \d+ MiB free, 1073741824 MiB needed"):
        storage.check([database], "c1", 1 << 30)


def test_my_cnf_follows_slurms_advice_and_keeps_everything_on_the_volume():
    settings = AccountingSection(volume="/data/acct", db_port=3307)
    where = render.places(settings, Path("/run/x"))
    text = render.my_cnf(settings, where, 8192)
    for line in ("datadir=/data/acct/mysql", "tmpdir=/data/acct/tmp", "log-error=/data/acct/log/mariadbd.err",
                 "innodb_buffer_pool_size=4096M", "innodb_log_file_size=1024M", "innodb_lock_wait_timeout=900",
                 "max_allowed_packet=64M", "innodb_snapshot_isolation=OFF", "port=3307"):
        assert line in text.splitlines(), line
    assert "innodb_buffer_pool_size=128M" in render.my_cnf(settings, where, 100)


def test_the_password_is_quoted_for_sql_and_refused_where_slurmdbd_conf_cannot_hold_it(tmp_path):
    sql = render.init_sql(AccountingSection(), "it's")
    assert "IDENTIFIED BY 'it''s'" in sql and "innodb" not in sql
    secret = tmp_path / "pw"
    secret.write_text("has space\n")
    secret.chmod(0o600)
    with pytest.raises(ConfigError, match="printable ASCII without spaces"):
        password(AccountingSection(password_file=str(secret)), {})
    secret.write_text("back\\slash\n")
    with pytest.raises(ConfigError, match="without spaces, '#' or"):
        password(AccountingSection(password_file=str(secret)), {})
    with pytest.raises(ConfigError, match="SLURM_EXT_DB_PASSWORD"):
        password(AccountingSection(), {})
    assert password(AccountingSection(), {"SLURM_EXT_DB_PASSWORD": "s3cret"}) == "s3cret"
    conf = render.slurmdbd_conf(AccountingSection(), "s3cret", "slurm", "auth/slurm")
    assert "StoragePass=s3cret" in conf and "AuthType=auth/slurm" in conf and "SlurmUser=slurm" in conf


def test_memory_comes_from_the_setting_the_cgroup_limit_or_a_quarter_of_the_host(tmp_path):
    assert memory_mib(AccountingSection(memory=2048)) == 2048
    (tmp_path / "memory.max").write_text(f"{4 << 30}\n")
    assert memory_mib(AccountingSection(), cgroup=tmp_path) == 4096
    (tmp_path / "memory.max").write_text("max\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16777216 kB\n")
    assert memory_mib(AccountingSection(), cgroup=tmp_path, meminfo=meminfo) == 4096


def test_slurm_conf_values_follow_includes_and_keep_slurms_defaults(tmp_path):
    (tmp_path / "more.conf").write_text("JobCompLoc=/spool/jobcomp.log\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c1 # ours\nstatesavelocation=/spool\nInclude more.conf\n"
                    "NodeName=n1 CPUs=2 State=UNKNOWN\n")
    values = slurmconf.read(conf)
    assert values["clustername"] == "c1" and values["statesavelocation"] == "/spool"
    assert values["jobcomploc"] == "/spool/jobcomp.log" and values["slurmuser"] == "root"
    assert "nodename" not in values


def test_guarded_volumes_per_role(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=c1\nStateSaveLocation={tmp_path / 'ctld'}\n")
    loaded = config.Config(slurm=config.SlurmSection(conf=str(conf)),
                           accounting=AccountingSection(volume=str(tmp_path / "acct"), run_database=True))
    assert [v.kind for v in guarded_volumes(loaded, "accounting")] == ["database"]
    (tmp_path / "ctld").mkdir()
    assert [v.kind for v in guarded_volumes(loaded, "accounting")] == ["database", "state"]
    assert [v.kind for v in guarded_volumes(loaded, "controller")] == ["state"]  # the database not marked yet
    (tmp_path / "acct").mkdir()
    (tmp_path / "acct" / storage.MARKER_NAME).write_text("{}")
    assert [v.kind for v in guarded_volumes(loaded, "controller")] == ["database", "state"]


def test_the_queue_alarm_speaks_once_per_threshold_and_when_the_outage_ends():
    alarm = QueueAlarm(alert_after=60)
    assert alarm.observe(5, 10000, now=0) == []
    assert [a.event for a in alarm.observe(9, 10000, now=61)] == ["dbd-queue-growing"]
    assert alarm.observe(12, 10000, now=70) == []
    assert [a.event for a in alarm.observe(5000, 10000, now=80)] == ["dbd-queue-half-full"]
    assert alarm.observe(6000, 10000, now=90) == []
    drained = alarm.observe(0, 10000, now=100)
    assert [a.event for a in drained] == ["dbd-queue-drained"] and "100s" in drained[0].message
    assert alarm.observe(0, 10000, now=101) == [] and alarm.observe(1, 10000, now=102) == []


def test_the_witness_keeps_each_jobs_last_end_since_a_time_and_a_job_name_cannot_pose_as_another_job(tmp_path):
    def line(job, user, name, state, end):
        return (f"JobId={job} UserId={user} GroupId=g(1) Name={name} JobState={state} Partition=debug "
                f"TimeLimit=UNLIMITED StartTime={end} EndTime={end} NodeList=n1 NodeCnt=1 ProcCnt=1 WorkDir=/tmp "
                f"ReservationName= Tres=cpu=1 Account=a QOS=normal WcKey= Cluster=c1 SubmitTime={end} "
                f"EligibleTime={end} DerivedExitCode=0:0 ExitCode=0:0\n")
    log = tmp_path / "jobcomp.log"
    log.write_text(line(7, "alice(1001)", "a b", "COMPLETED", "2026-01-01T10:00:00") + "garbage line\n"
                   + line(8, "bob(1002)", "x JobId=9 UserId=eve(6)", "FAILED", "2026-01-02T10:00:00")
                   + line(7, "alice(1001)", "a", "TIMEOUT", "2026-01-03T10:00:00"))
    jobs = read_witness(log)
    assert [(j.job_id, j.state, j.user, j.line) for j in jobs] == [(7, "TIMEOUT", "alice", 4), (8, "FAILED", "bob", 3)]
    assert [j.job_id for j in read_witness(log, since=datetime(2026, 1, 2, 12))] == [7]


#: a run of the fields slurmctld writes between a job's name and its work dir, ending 2020: a forged end
_FORGED_RUN = ("JobState=COMPLETED Partition=debug TimeLimit=UNLIMITED StartTime=2020-01-01T00:00:00 "
               "EndTime=2020-01-01T00:00:00 NodeList=n1 NodeCnt=1 ProcCnt=1 WorkDir=")
#: a whole forged head, to follow a newline in a job's name
_FORGED_HEAD = "JobId={} UserId=root(0) GroupId=root(0) Name=b"


def _witness_line(job: int, name: str, workdir: str, state: str, end: str) -> str:
    """A job's line in jobcomp/filetxt's format, as slurmctld writes it (the name and work dir as they are)."""
    return (f"JobId={job} UserId=eve(1003) GroupId=g(1) Name={name} JobState={state} Partition=debug "
            f"TimeLimit=UNLIMITED StartTime={end} EndTime={end} NodeList=n1 NodeCnt=1 ProcCnt=1 WorkDir={workdir} "
            f"ReservationName= Tres=cpu=1 Account=a QOS=normal WcKey= Cluster=c1 SubmitTime={end} "
            f"EligibleTime={end} DerivedExitCode=0:0 ExitCode=1:0 \n")


def test_a_forged_run_of_fields_in_a_name_or_work_dir_never_moves_a_jobs_end_earlier(tmp_path):
    """Issue 28.17 on literal lines: the name and the work dir lie on either side of Slurm's own run; of the runs a
    line holds, the latest end counts."""
    log = tmp_path / "jobcomp.log"
    log.write_text(_witness_line(21, f"x {_FORGED_RUN}/", "/home/eve", "FAILED", "2026-01-03T10:00:00")
                   + _witness_line(22, "x", f"/tmp/a {_FORGED_RUN}/b", "FAILED", "2026-01-03T10:00:00")
                   + _witness_line(23, f"x {_FORGED_RUN}", f"/tmp/a {_FORGED_RUN}", "TIMEOUT", "2026-01-03T10:00:00"))
    jobs = read_witness(log, since=datetime(2026, 1, 2))
    assert [(j.job_id, j.state, j.end) for j in jobs] == [(21, "FAILED", "2026-01-03T10:00:00"),
                                                          (22, "FAILED", "2026-01-03T10:00:00"),
                                                          (23, "TIMEOUT", "2026-01-03T10:00:00")]


def test_a_name_with_newlines_stays_its_jobs_and_a_whole_forged_line_is_still_in_the_window(tmp_path):
    """Issue 28.17: Slurm writes a job's name with its newlines (seen on 22.05). A name "a\\nJobId=99 ..." cut its
    job's line short (the job unseen) and gave its end to job 99; a name holding a whole line, EndTime 2020, then a
    newline and another job's head, hid its job from every window. The window now goes by the place in the file."""
    whole = (f"x {_FORGED_RUN}/ ReservationName= Tres=cpu=1 Account=a QOS=normal WcKey= Cluster=c1 "
             f"SubmitTime=2020-01-01T00:00:00 EligibleTime=2020-01-01T00:00:00 DerivedExitCode=0:0 ExitCode=0:0 \n"
             + _FORGED_HEAD.format(98))
    log = tmp_path / "jobcomp.log"
    log.write_text(_witness_line(30, "x", "/h", "COMPLETED", "2026-01-01T10:00:00")
                   + _witness_line(31, "x", "/h", "COMPLETED", "2026-01-03T09:00:00")
                   + _witness_line(32, "a\n" + _FORGED_HEAD.format(99), "/h", "FAILED", "2026-01-03T10:00:00")
                   + _witness_line(33, whole, "/h", "FAILED", "2026-01-03T11:00:00"))
    jobs = read_witness(log, since=datetime(2026, 1, 2))
    assert [(j.job_id, j.state, j.end, j.line) for j in jobs] == [
        (31, "COMPLETED", "2026-01-03T09:00:00", 2), (32, "FAILED", "2026-01-03T10:00:00", 3),
        (33, "COMPLETED", "2020-01-01T00:00:00", 5), (98, "FAILED", "2026-01-03T11:00:00", 6),
        (99, "FAILED", "2026-01-03T10:00:00", 4)]  # the name's forged job is checked too: more is safe, fewer is not


def test_a_work_dir_ending_in_a_forged_head_cannot_take_the_next_jobs_line(tmp_path):
    """Issue 28 review of 28.17: a work dir "/tmp/a\\nJobId=999 UserId=root(0) ... Name=x" (no run of Slurm's
    fields) started a record that took the next real line, another user's job with its head and run, as its own:
    that job was attributed to 999 and never checked. A line with a head and a run is now its own record too."""
    log = tmp_path / "jobcomp.log"
    victim = _witness_line(41, "v", "/h", "FAILED", "2026-01-03T10:00:00").replace("UserId=eve(1003)",
                                                                                  "UserId=victim(1004)")
    log.write_text(_witness_line(40, "x", "/tmp/a\n" + _FORGED_HEAD.format(999), "COMPLETED", "2026-01-03T09:00:00")
                   + victim)
    jobs = {job.job_id: job for job in read_witness(log, since=datetime(2026, 1, 2))}
    assert (jobs[41].state, jobs[41].end, jobs[41].user, jobs[41].line) == ("FAILED", "2026-01-03T10:00:00",
                                                                           "victim", 3)
    assert jobs[40].state == "COMPLETED"


def test_a_job_cannot_forge_its_own_end_in_the_witness_with_its_name_or_work_dir(running_cluster, tmp_path):
    """Issue 28.17 on the real cluster: jobs named, or started in a directory named, with a run of the witness's
    fields ending in 2020, and one named with a newline and another job's head, ended now, in slurmctld's real
    jobcomp lines; `reconcile --since` an hour ago missed the first and the last before (the first run counted, the
    name's; the line ended at the newline), and checks all three now, with their real state."""
    cluster = running_cluster
    since = datetime.now() - timedelta(hours=1)
    forged_dir = tmp_path / f"w {_FORGED_RUN}" / "job"
    forged_dir.mkdir(parents=True)
    out = f"--output={cluster.layout.out}/%j.out"
    submitted = [cluster.run("sbatch", "--parsable", out, f"--chdir={directory}", *name, "--wrap", "false").stdout
                 for directory, name in ((cluster.layout.out, [f"--job-name=x {_FORGED_RUN}/"]), (forged_dir, []),
                                         (cluster.layout.out, ["--job-name=a\n" + _FORGED_HEAD.format(999999)]))]
    jobs = [int(text.strip().split(";")[0]) for text in submitted]
    witness = cluster.layout.jobcomp_log

    def written():
        text = witness.read_text(errors="replace")
        return text if all(f"\nJobId={job} " in "\n" + text for job in jobs) else None
    text = wait_for(f"jobs {jobs} in the witness", written, 60, interval=0.3)
    assert f"Name=x {_FORGED_RUN}/ JobState=FAILED" in text and f"WorkDir={forged_dir} " in text
    assert f"Name=a\n{_FORGED_HEAD.format(999999)} JobState=FAILED" in text  # slurmctld wrote the newline as it is
    seen = {job.job_id: job for job in read_witness(witness, since=since)}
    assert all(job in seen and seen[job].state == "FAILED" for job in jobs), seen  # 999999 is checked too: harmless
    assert all(seen[job].end >= since.strftime("%Y-%m-%dT%H:%M:%S") for job in jobs), seen


def test_slurmdbd_starts_after_its_database_when_the_agent_runs_one():
    supervisor = config.Config().supervisor
    specs = {s.name: s for s in workers_for("accounting", supervisor, changes=local_database("/c", "/i"))}
    assert list(specs) == ["mariadbd", "slurmdbd"]
    assert specs["slurmdbd"].after == ("mariadbd",) and specs["mariadbd"].ready == "notify"
    assert specs["mariadbd"].command == ("mariadbd", "--defaults-file=/c", "--init-file=/i")
    assert [s.name for s in workers_for("accounting", supervisor)] == ["slurmdbd"]
    own = config.from_dict({"supervisor": {"workers": {"x": {"roles": ["login"], "command": ["true"],
                                                             "after": ["nothere"]}}}})
    with pytest.raises(ValueError, match="starts after nothere"):
        workers_for("login", own.supervisor)


def test_the_controller_agent_holds_sigkill_while_slurmctld_holds_records_and_says_so_when_it_must(agents, tmp_path):
    """A slurmctld stand-in that ignores SIGTERM, with sdiag saying 7 records are queued: past its stop grace
    the agent holds SIGKILL until accounting.stop_deadline (slurmctld-stop-held), then kills it loudly. (On
    real daemons: test_accounting_cluster's clean stop keeps every record.)"""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in (("sdiag", "echo 'DBD Agent queue size: 7'"),
                       ("scontrol", "echo 'MaxDBDMsgs              = 20000'"),
                       ("slurmctld", "trap '' TERM; while :; do sleep 0.1; done")):
        (tools / name).write_text(f"#!/bin/sh\n{text}\n")
        (tools / name).chmod(0o755)
    agent = agents(f"""
        [accounting]
        stop_deadline = "3s"
        queue_interval = "1s"
        state_save_location = "{tmp_path / 'ctld'}"
        min_free = 0
        cluster = "c1"
        [supervisor.workers.slurmctld]
        command = ["{tools / 'slurmctld'}"]
        stop_grace = "500ms"
        """, role="controller", slurm=f'bin_dir = "{tools}"')
    def scraped() -> str:
        try:
            return agent.get("/metrics")[1]
        except OSError:  # not listening yet
            return ""
    wait_for("the queue read", lambda: "slurm_ext_accounting_dbd_queue{" in scraped(), timeout=20, interval=0.2)
    assert agent.metric("slurm_ext_accounting_dbd_queue", role="controller") == 7
    started = time.monotonic()
    assert agent.stop(timeout=30) == 1  # SIGKILL was needed in the end
    took = time.monotonic() - started
    events = {e["event"]: e for e in agent.journal()}
    assert events["slurmctld-stop-held"]["queued"] == 7, events.get("slurmctld-stop-held")
    killed = events["slurmctld-killed-with-records"]
    assert killed["severity"] == "error" and "LOST" in killed["message"] and "reconcile" in killed["message"]
    assert 3.0 <= took < 10.0, took


def test_definers_are_found_in_either_quoting():
    """mariadb-dump writes a trigger's definer in backquotes and a routine's in double quotes (ANSI_QUOTES):
    restore must see both to refuse, before loading anything, what it could not create."""
    from slurm_ext.accounting.dumpfile import RowCounter
    counter = RowCounter()
    counter.feed(b"/*!50003 CREATE*/ /*!50017 DEFINER=`root`@`localhost`*/ /*!50003 TRIGGER t BEFORE INSERT ON x "
                 b"FOR EACH ROW SET @a = 1 */;\nDELIMITER ;;\nCREATE DEFINER=\"slurm\"@\"%\" PROCEDURE \"p\"()\n"
                 b"BEGIN END ;;\nDELIMITER ;\n-- Dump completed on 2026-12-01 17:56:18\n")
    counter.finish()
    assert counter.definers == {"root@localhost", "slurm@%"}


def test_a_read_only_volume_is_refused_naming_the_mount(tmp_path):
    import subprocess
    database, _ = _volumes(tmp_path)
    database.path.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(database.path), str(database.path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(database.path)], check=True)
        with pytest.raises(storage.StorageRefused, match="mounted read-only; mount it read-write") as refused:
            storage.check([database], "c1", 0)
        assert str(database.path) in str(refused.value)
    finally:
        subprocess.run(["umount", str(database.path)], check=True)

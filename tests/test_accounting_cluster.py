"""Durable accounting on the real cluster (issue 12): MariaDB and slurmdbd under the accounting agent,
the storage guard, Slurm's own loss of queued records and `reconcile` catching it.

A cluster of its own (ports, names and state directory apart from the session's), with MinJobAge=2 so
that slurmctld forgets finished jobs within a purge cycle (about a minute): what a slurmctld killed during
a database outage then loses is exactly its in-memory queue, as on a cluster whose outage outlasts
MinJobAge's default of five minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import replace
from datetime import datetime

import psutil
import pytest

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, Cluster, cluster_of_its_own
from helpers.files import temp_dir
from helpers.wait import wait_for
from slurm_ext import config as config_mod, devcluster as dev
from slurm_ext.accounting import dumpfile, reconcile as reconciling
from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.errors import DevClusterError, SlurmError

pytestmark = pytest.mark.cluster

ACCOUNTING_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextacct", "node_name": "acctnode1",
                      "slurmctld_port": 17817, "slurmd_port": 17818, "slurmdbd_port": 17819, "mariadb_port": 13308,
                      "controller_probe_port": 19821, "worker_probe_port": 19820, "accounting_probe_port": 19822, "web_port": 19823,
                      "gpu_count": 0, "min_job_age": 2,
                      # a kernel log of its own: the health tests, beside it, write Xids to /dev/kmsg
                      "kernel_log": ""}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


@pytest.fixture(scope="module")
def acct():
    with cluster_of_its_own("slurm-ext-acct-", **ACCOUNTING_CLUSTER) as settings:
        yield Cluster(settings)


def _daemon(cluster: Cluster, name: str):
    return next(d for d in cluster_daemons(cluster.layout) if d.name == name)


def _agent_worker(cluster: Cluster, role: str, name: str) -> int | None:
    """The pid of worker `name` (mariadbd, slurmdbd, slurmctld) under `role`'s agent."""
    agent = daemons.running_pid(_daemon(cluster, f"supervise-{role}"))
    if not agent:
        return None
    for child in psutil.Process(agent).children():
        try:
            if child.name() == name and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def _wait_pair_up(cluster: Cluster, what: str) -> dict[str, int]:
    """mariadbd and slurmdbd both running under the accounting agent, and slurmdbd answering."""
    def up():
        pids = {name: _agent_worker(cluster, "accounting", name) for name in ("mariadbd", "slurmdbd")}
        answers = cluster.run("sacctmgr", "-n", "show", "cluster", check=False).returncode == 0
        return pids if all(pids.values()) and answers else None
    return wait_for(what, up, timeout=60, interval=0.1)


def _kill_and_wait_back(cluster: Cluster, names: list[str]) -> None:
    """SIGKILL the accounting workers `names` at once; wait until the agent has both running anew and
    slurmdbd answers."""
    old = _wait_pair_up(cluster, "the pair up before the kill")
    for name in names:
        os.kill(old[name], signal.SIGKILL)
    pids = _wait_pair_up(cluster, f"{' and '.join(names)} back by themselves after kill -9")
    assert all(pids[name] != old[name] for name in names), (old, pids)


def _queue(cluster) -> int | None:
    """Records slurmctld holds for slurmdbd (a Cluster's, or the images' twin's); None while it does not answer."""
    try:
        return cluster.client(timeout=5.0).dbd_queue()
    except Exception:
        return None


def _states(cluster: Cluster, ids: list[int]) -> dict[int, str]:
    return cluster.client(timeout=30.0).accounted_states(ids)


def _wait_accounted(cluster: Cluster, ids: list[int], timeout: float = 120) -> dict[int, str]:
    def done():
        try:
            states = _states(cluster, ids)
        except SlurmError:  # slurmdbd restarting
            return None
        return states if all(states.get(i) in FINAL for i in ids) else None
    try:
        return wait_for(f"{len(ids)} jobs final in sacct", done, timeout=timeout, interval=1.0)
    except AssertionError:
        states = _states(cluster, ids)
        raise AssertionError(f"not final in sacct: {[(i, states.get(i)) for i in ids if states.get(i) not in FINAL]}")


def _submit(cluster: Cluster, count: int, every: float = 0.0) -> list[int]:
    ids = []
    for _ in range(count):
        ids.append(cluster.sbatch("--wrap=true", "-o", "/dev/null"))
        if every:
            time.sleep(every)
    return ids


def _wait_ended(cluster: Cluster, ids: list[int]) -> None:
    witness = cluster.layout.jobcomp_log
    wait_for(f"jobs {ids[0]}..{ids[-1]} ended (in the jobcomp witness)",
             lambda: {j.job_id for j in reconciling.read_witness(witness)} >= set(ids), timeout=120, interval=0.5)


def _wait_forgotten(books, ids: list[int]) -> int:
    """slurmctld has purged the finished jobs (MinJobAge, a purge cycle about every minute) and saved a job
    state without them: a purge alone does not make it save, a new job does (held, so it never runs: its
    id is returned, to cancel)."""
    def forgotten():
        out = books.run("scontrol", "show", "job", str(ids[-1]), check=False)
        return out.returncode != 0 or "Invalid job id" in out.stdout + out.stderr
    wait_for("slurmctld to purge the finished jobs", forgotten, timeout=150, interval=1.0)
    saved = books.job_state_saved()
    held = books.sbatch("--hold", "--wrap=true", "-o", "/dev/null")
    wait_for("slurmctld to save its job state", lambda: books.job_state_saved() > saved, timeout=30, interval=0.2)
    return held


def _reconcile(cluster: Cluster, *args: str) -> tuple[int, dict]:
    done = cli("--config", str(cluster.layout.slurm_ext_conf), "accounting", "reconcile", "--json", *args)
    return done.returncode, json.loads(done.stdout)


def _metric(cluster: Cluster, name: str) -> float | None:
    """A sample of the controller agent's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.settings.controller_probe_port}/metrics",
                                timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def _events(cluster: Cluster, name: str) -> list[dict]:
    lines = (cluster.layout.node_state / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_the_pair_comes_back_from_kill_9_during_300_jobs_and_nothing_is_lost(acct):
    """300 jobs at a steady rate; mariadbd and slurmdbd killed together, then each alone: every job is in sacct
    with its final state, and reconcile finds nothing missing."""
    ids: list[int] = []
    submitter = threading.Thread(target=lambda: ids.extend(_submit(acct, 300, every=0.15)))
    started = time.time()
    submitter.start()
    try:
        for at, names in ((60, ["mariadbd", "slurmdbd"]), (140, ["mariadbd"]), (220, ["slurmdbd"])):
            wait_for(f"{at} jobs submitted", lambda: len(ids) >= at or not submitter.is_alive(), timeout=120)
            _kill_and_wait_back(acct, names)
    finally:
        submitter.join()
    assert len(ids) == 300
    _wait_ended(acct, ids)
    states = _wait_accounted(acct, ids, timeout=180)
    assert set(states) == set(ids) and all(state == "COMPLETED" for state in states.values()), states
    code, found = _reconcile(acct, "--since", datetime.fromtimestamp(started - 5).isoformat(timespec="seconds"))
    assert found["missing"] == [] and found["checked"] == 300, found
    # a database killed mid-commit can leave a job's first row behind as a runaway (seen once, in a run whose
    # kills came while slurmdbd started): reconcile lists those too, and only those make it exit 1
    assert code == (1 if found["runaway"] else 0), found
    print(f"runaway after the kills: {found['runaway']}")


class HostBooks:
    """What the reconcile test asks of the host's accounting cluster (22.05), as the images' cluster
    (helpers/containerrepair.py, 26.05) offers it: one test body on both."""

    kind = "host"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @contextlib.contextmanager
    def slurmdbd_away(self):
        daemons.stop(_daemon(self.cluster, "supervise-accounting"), grace=120.0)
        try:
            yield
        finally:
            dev.up(self.cluster.settings)

    def signal_slurmctld(self, signum: int) -> None:
        os.kill(_agent_worker(self.cluster, "controller", "slurmctld"), signum)

    def saved_state(self, name: str) -> bool:
        return (self.cluster.layout.ctld_state / name).exists()

    def witness_jobs(self) -> set[int]:
        return {j.job_id for j in reconciling.read_witness(self.cluster.layout.jobcomp_log)}

    def job_state_saved(self) -> float:
        return (self.cluster.layout.ctld_state / "job_state").stat().st_mtime

    def reconcile(self, *args: str) -> subprocess.CompletedProcess:
        return cli("--config", str(self.cluster.layout.slurm_ext_conf), "accounting", "reconcile", *args)

    def controller_metric(self, name: str) -> float | None:
        return _metric(self.cluster, name)

    def client(self, timeout: float = 30.0):
        return self.cluster.client(timeout=timeout)

    def run(self, *cmd: str, check: bool = True):
        return self.cluster.run(*cmd, check=check)

    def sbatch(self, *args: str) -> int:
        return self.cluster.sbatch(*args)


@pytest.fixture(params=["host", pytest.param("images", marks=pytest.mark.containers)])
def books(request):
    """The reconcile test on the host's accounting cluster (Slurm 22.05, MinJobAge=2) and on the images' (Slurm
    26.05, or the suite's SLURM_EXT_TEST_IMAGE_SUITE: the session's `twin`, with the same witness and MinJobAge),
    settled after it as the other tests on the twin are."""
    if request.param == "host":
        yield HostBooks(request.getfixturevalue("acct"))
        return
    twin = request.getfixturevalue("twin")
    yield twin
    twin.settle(twin.nodes)


def _controller_up(books) -> bool:
    """`scontrol ping` says slurmctld is UP (as devcluster's own wait reads it, not by its exit status)."""
    return "is UP" in books.run("scontrol", "ping", check=False).stdout


def test_slurm_loses_a_killed_slurmctlds_queue_and_reconcile_lists_exactly_those_jobs(books):
    """slurmdbd away, 50 jobs, slurmctld SIGKILLed: Slurm alone loses their records; reconcile names all 50."""
    if not books.saved_state("assoc_usage"):
        # slurmctld saves it at its stop and every 5 minutes; 26.05's will not start again without it (fatal: "No
        # Assoc usage file ... to recover"), as a slurmctld that has run 5 minutes has: so it stops once first
        books.signal_slurmctld(signal.SIGTERM)
        wait_for("slurmctld saved its state and answers again",
                 lambda: books.saved_state("assoc_usage") and _controller_up(books), 120, interval=1.0)
    since = datetime.now().astimezone().isoformat(timespec="seconds")  # the zone said: the CLI may be a container's
    with books.slurmdbd_away():
        ids = [books.sbatch("--wrap=true", "-o", "/dev/null") for _ in range(50)]
        wait_for(f"jobs {ids[0]}..{ids[-1]} ended (in the jobcomp witness)",
                 lambda: books.witness_jobs() >= set(ids), timeout=120, interval=0.5)
        held = _wait_forgotten(books, ids)
        assert (_queue(books) or 0) >= 50, "slurmctld holds their records while slurmdbd is away"
        # its agent restarts it, and it stops at once ("no TRES from" the database) until slurmdbd answers: Slurm's
        # own rule when slurmctld has no cache of associations yet
        books.signal_slurmctld(signal.SIGKILL)
    wait_for("slurmctld answering again", lambda: _controller_up(books), 120, interval=1.0)
    books.run("scancel", str(held))
    wait_for("the DBD agent queue to drain", lambda: _queue(books) == 0, timeout=120, interval=1.0)
    time.sleep(3)
    states = books.client().accounted_states(ids)
    done = books.reconcile("--json", "--since", since)
    found = json.loads(done.stdout)
    missing = sorted(job["job_id"] for job in found["missing"])
    assert not any(states.get(i) in FINAL for i in ids), f"Slurm kept some records after all: {states}"
    assert done.returncode == 1 and missing == ids, (done.stderr, found)
    assert books.controller_metric("slurm_ext_accounting_missing_jobs") == 50


def test_the_controller_agents_own_stop_loses_nothing_while_slurmdbd_is_away(acct):
    """slurmdbd away, 50 jobs, the controller agent stopped (SIGTERM and its grace): dbd.messages keeps them all."""
    accounting = _daemon(acct, "supervise-accounting")
    since = datetime.now().isoformat(timespec="seconds")
    said_before = len(_events(acct, "dbd-queue-growing"))  # the journal is the module's: earlier outages said it too
    daemons.stop(accounting, grace=120.0)
    try:
        ids = _submit(acct, 50)
        _wait_ended(acct, ids)
        held = _wait_forgotten(HostBooks(acct), ids)
        assert (_queue(acct) or 0) >= 50, "slurmctld holds their records while slurmdbd is away"
        # the controller agent has said so by now, and holds SIGKILL back while records are queued
        wait_for("dbd-queue-growing", lambda: len(_events(acct, "dbd-queue-growing")) > said_before, timeout=90,
                 interval=1.0)
        daemons.stop(_daemon(acct, "supervise-controller"), grace=120.0)
    finally:
        dev.up(acct.settings)
    acct.run("scancel", str(held))
    wait_for("the DBD agent queue to drain", lambda: _queue(acct) == 0, timeout=120, interval=1.0)
    time.sleep(3)
    states = _states(acct, ids)
    code, found = _reconcile(acct, "--since", since)
    assert all(states.get(i) == "COMPLETED" for i in ids), states
    # runaway rows an earlier kill -9 of the database may have left make it exit 1, nothing of this run
    assert [job["job_id"] for job in found["missing"]] == [] and code == (1 if found["runaway"] else 0), found
    # said once an outage, queue_alert_after in, with what was queued then
    growing = _events(acct, "dbd-queue-growing")[said_before]
    assert growing["queued"] > 0 and "slurmdbd or its database is away" in growing["message"], growing


def test_history_survives_a_restart_and_an_empty_volume_is_refused(acct):
    ids = _submit(acct, 3)
    _wait_accounted(acct, ids)
    dev.down(acct.settings)
    dev.up(acct.settings)
    assert all(state == "COMPLETED" for state in _wait_accounted(acct, ids).values())

    dev.down(acct.settings)
    volume = acct.layout.accounting
    aside = volume.with_name("accounting.aside")
    volume.rename(aside)
    volume.mkdir()
    try:
        with pytest.raises(DevClusterError):
            dev.up(replace(acct.settings, up_timeout=15.0))
        refused = [e for e in _events(acct, "start-step-failed") if e.get("step") == "check-storage"]
        assert refused and "replaced by an empty one" in refused[-1]["message"], refused[-1:]
        assert str(volume) in refused[-1]["message"]
        assert list(volume.iterdir()) == [], "the guard let something initialise the empty volume"
    finally:
        dev.down(acct.settings)
        shutil.rmtree(volume)
        aside.rename(volume)
        dev.up(acct.settings)
    assert all(state == "COMPLETED" for state in _wait_accounted(acct, ids).values())


def test_check_storage_refuses_tmpfs_unless_ephemeral_is_allowed():
    tmp_path = temp_dir()  # mysql initialises the datadir: it must reach it
    mount = tmp_path / "volume"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], check=True)
    try:
        conf = tmp_path / "slurm-ext.toml"
        conf.write_text(f'[accounting]\nvolume = "{mount}"\nrun_database = true\ncluster = "demo"\nmin_free = 1\n'
                        f'state_save_location = "{tmp_path / "ctld"}"\n')
        refused = cli("--config", str(conf), "accounting", "check-storage")
        assert refused.returncode == 3, refused
        assert f"the accounting database volume {mount} is on tmpfs" in refused.stderr, refused.stderr
        assert not (mount / "mysql").exists()
        # --allow-ephemeral: initialised, and every line says what it costs
        allowed = cli("--config", str(conf), "accounting", "check-storage", "--allow-ephemeral")
        assert allowed.returncode == 0, allowed.stderr
        lines = allowed.stdout.splitlines()
        assert lines and all(line.startswith("EPHEMERAL STORAGE ALLOWED") for line in lines), lines
        assert (mount / "mysql" / "mysql").is_dir() and (mount / "slurm-ext-volume.json").exists()
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        shutil.rmtree(tmp_path)


def test_a_full_volume_is_named_and_accounting_catches_up_once_space_is_freed(acct):
    """The database volume on a small loop image, filled up: the running agent names the volume
    (storage-low), a restart is refused by the guard with how much is free and needed, the jobs run on
    meanwhile; once space is freed the agent's retry starts the pair and sacct has every job."""
    layout = acct.layout
    volume, aside = layout.accounting, layout.accounting.with_name("accounting.plain")
    image = layout.root / "accounting.img"
    dev.down(acct.settings)
    subprocess.run(["truncate", "-s", "512M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    volume.rename(aside)
    volume.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(volume)], check=True)
    filler = volume / "filler"
    try:
        subprocess.run(["cp", "-a", f"{aside}/.", str(volume)], check=True)
        shutil.rmtree(volume / "lost+found")
        dev.up(acct.settings)
        free = shutil.disk_usage(volume).free // (1024 * 1024)
        subprocess.run(["fallocate", "-l", f"{free - 20}M", str(filler)], check=True)
        low = wait_for("storage-low naming the volume", lambda: [e for e in _events(acct, "storage-low")
                                                                 if e.get("volume") == str(volume)], timeout=60)
        assert "below accounting.min_free" in low[-1]["message"], low[-1]

        daemons.stop(_daemon(acct, "supervise-accounting"), grace=120.0)
        ids = _submit(acct, 10)
        with pytest.raises(DevClusterError):
            dev.up(replace(acct.settings, up_timeout=10.0))
        refused = [e for e in _events(acct, "start-step-failed") if e.get("step") == "check-storage"]
        assert refused and f"{volume}: only" in refused[-1]["message"], refused[-1:]
        assert "MiB needed (accounting.min_free)" in refused[-1]["message"]
        _wait_ended(acct, ids)

        filler.unlink()  # the agent's next try (at most backoff_max later) finds the space
        states = _wait_accounted(acct, ids, timeout=120)
        assert all(state == "COMPLETED" for state in states.values()), states
        assert wait_for("storage-ok", lambda: [e for e in _events(acct, "storage-ok")
                                               if e.get("volume") == str(volume)], timeout=60)
    finally:
        dev.down(acct.settings)
        filler.unlink(missing_ok=True)
        shutil.rmtree(aside)
        subprocess.run(["cp", "-a", f"{volume}/.", str(aside)], check=True)
        subprocess.run(["umount", str(volume)], check=True)
        volume.rmdir()
        aside.rename(volume)
        image.unlink()
        dev.up(acct.settings)


def test_a_backup_taken_during_submission_verifies_and_restores_into_a_new_database(acct):
    """While jobs are submitted and end: backup (CLI), verify (a scratch MariaDB: exit 0), and restore into a
    new database on another server, whose row counts are the manifest's."""
    from slurm_ext.accounting import backups
    from slurm_ext.accounting.scratch import scratch_mariadb
    from slurm_ext.accounting.settings import AccountingSection
    backup_dir = acct.layout.root / "backups"
    ids: list[int] = []
    submitter = threading.Thread(target=lambda: ids.extend(_submit(acct, 40, every=0.05)))
    submitter.start()
    try:
        wait_for("jobs under way", lambda: len(ids) >= 10, timeout=60)
        done = cli("--config", str(acct.layout.slurm_ext_conf), "accounting", "backup", "--to", str(backup_dir))
        assert done.returncode == 0, done.stderr
    finally:
        submitter.join()
    dumps = dumpfile.backups_in(backup_dir, ACCOUNTING_CLUSTER["cluster_name"])
    assert len(dumps) == 1 and "rows" in done.stdout, done.stdout
    # the repair history (slurm-ext's own database on the same server) went into the same backup, beside it
    assert len(dumpfile.backups_in(backup_dir, f"{ACCOUNTING_CLUSTER['cluster_name']}-slurm_ext")) == 1, done.stdout
    manifest = json.loads(dumps[0].with_name(dumps[0].name.replace(".sql.gz", ".manifest.json")).read_text())
    assert manifest["cluster"] == ACCOUNTING_CLUSTER["cluster_name"]
    marker = json.loads((acct.layout.accounting / "slurm-ext-volume.json").read_text())
    assert manifest["identity"]["id"] == marker["id"]
    jobs = manifest["tables"][f"{ACCOUNTING_CLUSTER['cluster_name']}_job_table"]
    assert jobs >= 10, manifest["tables"]

    checked = cli("--config", str(acct.layout.slurm_ext_conf), "accounting", "verify", str(dumps[0]))
    assert checked.returncode == 0 and ": OK:" in checked.stdout, (checked.stdout, checked.stderr)

    workdir = temp_dir()
    secret = workdir / "password"
    secret.write_text("restore-pw\n")
    secret.chmod(0o600)
    try:
        with scratch_mariadb(port=13399, workdir=workdir) as server:
            # the account slurmdbd's routines name as their definer (slurm@%, as the accounting agent makes it)
            server.sql("CREATE USER 'slurm'@'%' IDENTIFIED BY 'restore-pw'; "
                       "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%'")
            target = config_mod.Config(accounting=AccountingSection(
                db_host="127.0.0.1", db_port=13399, cluster=ACCOUNTING_CLUSTER["cluster_name"],
                password_file=str(secret), backup_key=str(acct.layout.etc / "backup.key")))
            restored = backups.restore(target, dumps[0])
            assert restored.tables == manifest["tables"]
            assert server.counts("slurm_acct_db") == manifest["tables"]
    finally:
        shutil.rmtree(workdir)


def test_a_controller_alone_refuses_a_database_that_does_not_know_its_cluster(acct):
    """What a controller pod sees (no database volume beside it): StateSaveLocation with slurmctld's state, and a
    slurmdbd whose database does not know the cluster (re-created empty, or another one). Here: a copy of this
    cluster's StateSaveLocation under another cluster's name, against the real slurmdbd."""
    work = temp_dir()
    try:
        state = work / "ctld"
        shutil.copytree(acct.layout.ctld_state, state)
        marker = state / "slurm-ext-volume.json"

        def check(cluster: str) -> subprocess.CompletedProcess:
            marker.write_text(json.dumps({**json.loads(marker.read_text()), "cluster": cluster}))
            conf = work / "slurm-ext.toml"
            conf.write_text(f'[slurm]\nconf = "{acct.layout.slurm_conf}"\n[node]\nruntime_dir = "{work}/run"\n'
                            f'[accounting]\ncluster = "{cluster}"\nstate_save_location = "{state}"\n'
                            f'volume = "{work}/acct"\nmin_free = 1\n')
            return cli("--config", str(conf), "accounting", "check-storage", "--role", "controller")

        refused = check("elsewhere")
        assert refused.returncode == 3, refused
        assert f"holds the state of cluster elsewhere, but slurmdbd's database knows only " \
               f"{ACCOUNTING_CLUSTER['cluster_name']}" in refused.stderr, refused.stderr
        accepted = check(ACCOUNTING_CLUSTER["cluster_name"])
        assert accepted.returncode == 0 and "StateSaveLocation" in accepted.stdout, accepted
    finally:
        shutil.rmtree(work)

"""prolog_epilog.procs on real processes, real /proc and real cgroups: no mocks.

Every process a test starts runs as a uid that no process on the host had
when the test began (picked fresh per test), or is a root child of pytest, so
the finalizer can kill all of them by uid and by pid and never anything else.
Jobs are 9_000_000+n on node `procs-test-<pytest pid>`, so their cgroups
never meet a Slurm test cluster's (slurm_testnode1/, slurm_node1/). The
finalizer thaws, kills, reaps, and removes only the cgroup directories the
test made. PID 1 here reaps orphans slowly, so a zombie counts as dead.

Needs root, setpriv, the cgroup v1 freezer and memory hierarchies and the
cgroup2 mount at /sys/fs/cgroup/unified (this project's CI has them all).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_ext.procfs import pids, read_stat, real_uid
from slurm_ext.prolog_epilog.jobrecord import JobRecord, cgroup_paths
from slurm_ext.prolog_epilog.procs import (JobProcess, find_job_processes, gpu_process_of,
                                           kill_job, kill_process, protected_pids, signal_uid)


@pytest.fixture(autouse=True)
def _as_root():
    """These tests start processes as other uids and make cgroups; CI runs as root, so not being root fails."""
    if os.geteuid() != 0:
        pytest.fail("tests/test_procs.py must run as root (it starts processes as other uids and makes cgroups)")


CGROUP = Path("/sys/fs/cgroup")
FREEZER = CGROUP / "freezer"
MEMORY = CGROUP / "memory"
UNIFIED = CGROUP / "unified"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SLEEP = shutil.which("sleep", path=PATH) or "/bin/sleep"
#: a Python every uid can run (the test's own may live under /root)
SYSTEM_PYTHON = "/usr/bin/python3"
JOB_BASE = 9_000_000 + (os.getpid() % 1000) * 100


# -- reading the kernel ----------------------------------------------------------------


def _alive(pid: int, starttime: int) -> bool:
    """True while that very process runs; a zombie, or a recycled pid, is dead."""
    stat = read_stat(pid)
    return stat is not None and stat.starttime == starttime and stat.state not in ("Z", "X")


def _untouched(pid: int, starttime: int) -> bool:
    """Alive, neither stopped (T) nor frozen (D): asleep, or still on its way into sleep (R) on a busy machine."""
    stat = read_stat(pid)
    return _alive(pid, starttime) and stat is not None and stat.state in ("S", "R")


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _carrying(job_id: int) -> set[int]:
    """Live processes whose environment has SLURM_JOB_ID=<job_id>."""
    entry = f"SLURM_JOB_ID={job_id}".encode()
    found = set()
    for pid in pids():
        stat = read_stat(pid)
        if stat is not None and stat.state not in ("Z", "X") and entry in _environ(pid):
            found.add(pid)
    return found


def _wait(what: str, condition: Callable[[], object], timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s")
        time.sleep(0.01)


def _wait_dead(processes: dict[int, int], timeout: float = 5.0) -> None:
    """Wait until every (pid -> starttime) is dead; fail naming those that are not."""
    deadline = time.monotonic() + timeout
    while True:
        left = {pid: read_stat(pid) for pid, start in processes.items() if _alive(pid, start)}
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still alive after {timeout}s: {left}")
        time.sleep(0.01)


def _exec_done(pid: int) -> bool:
    """True once execve has laid out the new environment: the kernel renames the process (comm) a
    little before it does, and /proc/PID/environ reads empty in between."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2:].split()
    return len(fields) > 48 and int(fields[48]) != 0  # env_end, field 51


def _free_uids(count: int) -> list[int]:
    """Uids no process has now, from a range of this pytest's own."""
    used = {real_uid(pid) for pid in pids()}
    uid, found = 420_000 + (os.getpid() % 10_000) * 10, []
    while len(found) < count:
        if uid not in used:
            found.append(uid)
        uid += 1
    return found


def _kill_exact(pid: int, starttime: int) -> None:
    """SIGKILL that very process (pidfd, start time checked); nothing when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        stat = read_stat(pid)
        if stat is not None and stat.starttime == starttime:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _by_pid(found: list[JobProcess] | tuple[JobProcess, ...]) -> dict[int, JobProcess]:
    return {p.pid: p for p in found}


# -- the lab: what a test starts and makes, and its cleanup -------------------------


class Lab:
    """Processes and cgroups of one test, all undone by close()."""

    def __init__(self) -> None:
        self.node = f"procs-test-{os.getpid()}"
        #: the job's user and a stranger; both had no process when the test began
        self.uid, self.other_uid = _free_uids(2)
        self.children: list[subprocess.Popen] = []
        #: slurm-ext-hook, which sends the uid sweep's signals (the `hook_client` fixture's)
        self.hook_client = ""
        #: pid -> starttime of every process started, the orphans among them
        self.started: dict[int, int] = {}
        #: cgroup directories this test made, in the order it made them
        self.created: list[Path] = []
        self._jobs = 0

    def job(self, uid: int | None = None) -> JobRecord:
        self._jobs += 1
        return JobRecord(job_id=JOB_BASE + self._jobs, uid=self.uid if uid is None else uid,
                         gid=self.uid if uid is None else uid, user="procs-test", node=self.node, gpus=(),
                         start=time.time(), cgroups=())

    def popen(self, *argv: str, uid: int | None = None, job_id: int | None = None, setsid: bool = False,
              stdout: int = subprocess.DEVNULL) -> subprocess.Popen:
        """Start argv as `uid` (root when None), with SLURM_JOB_ID=job_id when given."""
        env = {"PATH": PATH} | ({"SLURM_JOB_ID": str(job_id)} if job_id is not None else {})
        prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        child = subprocess.Popen([*prefix, *argv], env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=stdout,
                                 stderr=subprocess.DEVNULL, start_new_session=setsid)
        self.children.append(child)
        return child

    def spawn(self, *argv: str, comm: str = "sleep", **how) -> int:
        """popen(), then wait until the exec chain (setpriv, env -i, ...) has reached `comm`."""
        pid = self.popen(*argv, **how).pid
        return self.settled(pid, comm)

    def orphan(self, command: str, *, uid: int, job_id: int | None, comm: str = "sleep") -> int:
        """Run `command &` in sh as `uid`; sh exits, leaving it to PID 1. Its pid."""
        sh = self.popen("sh", "-c", f"{command} </dev/null >/dev/null 2>&1 & echo $!", uid=uid, job_id=job_id,
                        stdout=subprocess.PIPE)
        out, _ = sh.communicate(timeout=10)
        return self.settled(int(out), comm)

    def settled(self, pid: int, comm: str) -> int:
        stat = _wait(f"pid {pid} runs {comm}",
                     lambda: (s := read_stat(pid)) and s.comm == comm and _exec_done(pid) and s)
        self.started[pid] = stat.starttime
        return pid

    def children_of(self, ppid: int, count: int, comm: str = "sleep") -> list[int]:
        """The `count` children of `ppid` that have exec'd `comm`, once they all have."""
        def ready():
            found = [s.pid for s in map(read_stat, pids()) if s and s.ppid == ppid and s.comm == comm]
            return found if len(found) == count else None
        found = _wait(f"{count} {comm} children of {ppid}", ready)
        for pid in found:
            self.settled(pid, comm)
        return found

    def mkcgroup(self, path: Path) -> Path:
        """mkdir -p, remembering each level this test made."""
        for level in [*reversed(path.parents), path]:
            if not level.exists():
                level.mkdir()
                self.created.append(level)
        return path

    def close(self) -> None:
        for directory in reversed(self.created):  # thaw first: a frozen task cannot die
            for name, text in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                try:
                    (directory / name).write_text(text)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        while True:  # rounds: a respawner left alive may fork between two scans
            ours = {pid: s.starttime for pid in pids()
                    if real_uid(pid) in (self.uid, self.other_uid) and (s := read_stat(pid)) and s.state != "Z"}
            ours |= {pid: start for pid, start in self.started.items() if _alive(pid, start)}
            for pid, start in ours.items():
                _kill_exact(pid, start)
            for child in self.children:
                if child.poll() is None:
                    child.kill()
            if not ours or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        for child in self.children:
            child.wait(timeout=10)
        left = []
        for directory in reversed(self.created):  # deepest first
            for _ in range(200):
                try:
                    if directory.exists():
                        directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                left.append(directory)
        assert not ours, f"test processes survived cleanup: {ours}"
        assert not left, f"cgroups left behind: {left}"


@pytest.fixture
def lab(hook_client) -> Iterator[Lab]:
    lab = Lab()
    lab.hook_client = hook_client
    try:
        yield lab
    finally:
        lab.close()


def _find(job: JobRecord, *, sweep: bool, protected: frozenset[int] | None = None,
          live: tuple[JobRecord, ...] = ()) -> dict[int, JobProcess]:
    return _by_pid(find_job_processes(job, sweep_uid=sweep, protected=protected or protected_pids(),
                                      live_jobs=frozenset(j.job_id for j in live), cgroup_root=CGROUP))


def _kill(job: JobRecord, *, sweep: bool, timeout: float = 5.0, protected: frozenset[int] | None = None,
          live: tuple[JobRecord, ...] = (), helper: str | None = None):
    return kill_job(job, sweep_uid=sweep, protected=protected or protected_pids(), timeout=timeout,
                    live_jobs=frozenset(j.job_id for j in live), signal_helper=helper, cgroup_root=CGROUP)


# -- ties ---------------------------------------------------------------------------


def test_environ_tie_finds_setsid_nohup_and_double_fork_and_kills_them(lab):
    job = lab.job()
    daemon = lab.orphan(f"setsid nohup {SLEEP} 1000", uid=lab.uid, job_id=job.job_id)
    forked = lab.orphan(f"{SLEEP} 1000", uid=lab.uid, job_id=job.job_id)
    assert read_stat(daemon).session == daemon  # its own session ...
    assert {read_stat(daemon).ppid, read_stat(forked).ppid}.isdisjoint({os.getpid()})  # ... and both orphans

    found = _find(job, sweep=False)
    assert {pid: p.tie for pid, p in found.items()} == {daemon: "environ", forked: "environ"}
    assert found[daemon].uid == lab.uid and found[daemon].comm == "sleep"

    cleanup = _kill(job, sweep=False)
    assert {p.pid for p in cleanup.found} == {daemon, forked}
    assert cleanup.survivors == ()
    assert cleanup.cgroups_removed == 0
    _wait_dead({daemon: lab.started[daemon], forked: lab.started[forked]}, timeout=0.5)
    assert _carrying(job.job_id) == set()


def test_family_ties_env_i_child_and_orphaned_grandchild_of_the_same_session(lab):
    job = lab.job()
    # the parent keeps SLURM_JOB_ID; its child and a subshell's orphan drop their environment
    parent = lab.spawn("sh", "-c", f"env -i {SLEEP} 1000 & (env -i {SLEEP} 1001 &); exec {SLEEP} 1000",
                       uid=lab.uid, job_id=job.job_id, setsid=True)
    [child] = lab.children_of(parent, 1)

    def orphaned():  # the subshell's sleep, once the subshell has exited and left it to PID 1
        return [pid for pid in pids() if (s := read_stat(pid)) and s.session == parent and s.comm == "sleep"
                and pid not in (parent, child) and (p := read_stat(s.ppid)) and p.session != parent]
    [orphan] = _wait("the subshell's orphan", orphaned)
    lab.settled(orphan, "sleep")
    assert _environ(child) == [b""] and _environ(orphan) == [b""]

    found = _find(job, sweep=False)
    assert {pid: p.tie for pid, p in found.items()} == {parent: "environ", child: "family", orphan: "family"}

    cleanup = _kill(job, sweep=False)
    assert {p.pid for p in cleanup.found} == {parent, child, orphan}
    assert cleanup.survivors == ()
    _wait_dead({pid: lab.started[pid] for pid in (parent, child, orphan)}, timeout=0.5)


def test_uid_sweep_takes_bare_processes_of_the_user_only_when_asked(lab):
    job, other_job = lab.job(), lab.job()
    bare = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    others = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=other_job.job_id, setsid=True)

    assert _find(job, sweep=False) == {}
    found = _find(job, sweep=True, live=(other_job,))
    assert {pid: p.tie for pid, p in found.items()} == {bare: "uid"}
    assert _find(other_job, sweep=False).keys() == {others}

    cleanup = _kill(job, sweep=True, helper=lab.hook_client, live=(other_job,))
    assert {p.pid for p in cleanup.found} == {bare}
    assert cleanup.survivors == ()
    _wait_dead({bare: lab.started[bare]}, timeout=0.5)
    # the uid stop stopped it a moment; it was continued
    assert _untouched(others, lab.started[others])


def test_family_and_sweep_never_reach_root_or_another_user(lab):
    job = lab.job()
    setpriv = "setpriv --reuid={0} --regid={0} --clear-groups"
    # a root session leader, parent of a tied process of the job's user and of a stranger's bare process
    leader = lab.spawn("sh", "-c", f"{setpriv.format(lab.uid)} env SLURM_JOB_ID={job.job_id} {SLEEP} 1000 & "
                                   f"{setpriv.format(lab.other_uid)} {SLEEP} 1000 & exec {SLEEP} 1000", setsid=True)
    [tied, stranger] = sorted(lab.children_of(leader, 2), key=real_uid)
    assert (real_uid(tied), real_uid(stranger), real_uid(leader)) == (lab.uid, lab.other_uid, 0)
    loner = lab.spawn(SLEEP, "1000", uid=lab.other_uid, setsid=True)  # another user, no tie at all
    root_plain = lab.spawn(SLEEP, "1000", setsid=True)  # root, no tie
    # root with the job's environment: a daemon an admin job-start script started, say; root is the job's
    # only by its cgroup
    root_env = lab.spawn(SLEEP, "1000", job_id=job.job_id, setsid=True)

    found = _find(job, sweep=True)
    assert {pid: p.tie for pid, p in found.items()} == {tied: "environ"}

    cleanup = _kill(job, sweep=True, helper=lab.hook_client)
    assert {p.pid for p in cleanup.found} == {tied}
    assert cleanup.survivors == ()
    _wait_dead({tied: lab.started[tied]}, timeout=0.5)
    for pid in (leader, stranger, loner, root_plain, root_env):
        assert _untouched(pid, lab.started[pid]), read_stat(pid)


def test_protected_pids_and_their_sessions_are_spared(lab):
    job = lab.job()
    guard = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=job.job_id)  # stands in for the agent
    bystander = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid)  # the job's user, in pytest's session
    victim = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=job.job_id, setsid=True)
    protected = protected_pids((guard,))
    assert {1, os.getpid(), os.getppid(), guard} <= protected
    assert bystander not in protected and victim not in protected

    assert _find(job, sweep=False, protected=protected).keys() == {victim}
    cleanup = _kill(job, sweep=False, protected=protected)
    assert {p.pid for p in cleanup.found} == {victim}
    _wait_dead({victim: lab.started[victim]}, timeout=0.5)
    for pid in (guard, bystander):
        assert _untouched(pid, lab.started[pid]), read_stat(pid)


def test_root_slurmstepd_is_never_touched_but_a_users_binary_of_that_name_is(lab):
    directory = Path(tempfile.mkdtemp(prefix="procs-test-"))
    try:
        directory.chmod(0o755)
        fake = directory / "slurmstepd"
        shutil.copy(SLEEP, fake)
        fake.chmod(0o755)
        job = lab.job()
        daemon = lab.spawn(str(fake), "1000", job_id=job.job_id, comm="slurmstepd")
        impostor = lab.spawn(str(fake), "1000", uid=lab.uid, job_id=job.job_id, comm="slurmstepd", setsid=True)

        assert _find(job, sweep=True).keys() == {impostor}
        assert gpu_process_of(job, daemon, protected_pids()) is None
        cleanup = _kill(job, sweep=True, helper=lab.hook_client)
        assert {p.pid for p in cleanup.found} == {impostor}
        _wait_dead({impostor: lab.started[impostor]}, timeout=0.5)
        assert _untouched(daemon, lab.started[daemon])
    finally:
        shutil.rmtree(directory)


def test_a_process_renamed_like_a_kernel_thread_is_still_found(lab):
    job = lab.job()
    rename = ("import ctypes, signal; ctypes.CDLL(None).prctl(15, b'kworker/0:1', 0, 0, 0); "
              "signal.pause()")  # PR_SET_NAME
    pid = lab.spawn(SYSTEM_PYTHON, "-c", rename, uid=lab.uid, job_id=job.job_id, setsid=True, comm="kworker/0:1")
    assert read_stat(pid).ppid != 2

    found = _find(job, sweep=False)
    assert found.keys() == {pid} and found[pid].comm == "kworker/0:1" and found[pid].tie == "environ"
    cleanup = _kill(job, sweep=False)
    assert [p.pid for p in cleanup.found] == [pid]
    _wait_dead({pid: lab.started[pid]}, timeout=0.5)


@pytest.mark.parametrize("body", [f"{SLEEP} 1000", "/bin/true"], ids=["respawns-sleep", "forks-nonstop"])
def test_a_respawning_loop_and_its_children_all_die(lab, body):
    job = lab.job()
    loop = lab.spawn("sh", "-c", f"while true; do {body}; done", uid=lab.uid, job_id=job.job_id, setsid=True,
                     comm="sh")
    if body.startswith(SLEEP):
        [first] = lab.children_of(loop, 1)
    else:
        time.sleep(0.1)  # let it churn

    cleanup = _kill(job, sweep=False)
    assert loop in {p.pid for p in cleanup.found}
    if body.startswith(SLEEP):
        assert first in {p.pid for p in cleanup.found}
    assert cleanup.survivors == ()
    _wait_dead({loop: lab.started[loop]}, timeout=0.5)
    assert _carrying(job.job_id) == set()
    time.sleep(0.3)  # nothing respawns later either
    assert _carrying(job.job_id) == set()


# -- cgroups --------------------------------------------------------------------------


def test_cgroup_v1_membership_ties_any_uid_and_the_job_cgroups_are_frozen_killed_and_removed(lab):
    job = lab.job()
    steps = [lab.mkcgroup(h / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{job.job_id}" / "step_0")
             for h in (FREEZER, MEMORY)]
    bare = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    helper = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.other_uid, setsid=True)  # a setuid helper, say
    for step in steps:
        for pid in (bare, helper):
            (step / "cgroup.procs").write_text(str(pid))
    assert f"freezer:/slurm_{job.node}/uid_{job.uid}/job_{job.job_id}/step_0" in Path(
        f"/proc/{bare}/cgroup").read_text()

    found = _find(job, sweep=False)
    assert {pid: p.tie for pid, p in found.items()} == {bare: "cgroup", helper: "cgroup"}

    cleanup = _kill(job, sweep=False)
    assert {p.pid for p in cleanup.found} == {bare, helper}
    assert cleanup.survivors == ()
    _wait_dead({pid: lab.started[pid] for pid in (bare, helper)}, timeout=0.5)
    assert cleanup.cgroups_removed == 4  # job_<id> and step_0 on both hierarchies
    for step in steps:
        assert not step.parent.exists()
        assert step.parent.parent.is_dir()  # uid_<uid> is Slurm's, not the job's


def test_sweep_spares_the_users_process_in_another_jobs_cgroup(lab):
    job, other_job = lab.job(), lab.job()
    other = lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{other_job.job_id}")
    bare = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    (other / "cgroup.procs").write_text(str(bare))

    assert _find(job, sweep=True) == {}
    assert gpu_process_of(job, bare, protected_pids(), cgroup_root=CGROUP) is None
    assert {pid: p.tie for pid, p in _find(other_job, sweep=False).items()} == {bare: "cgroup"}
    cleanup = _kill(job, sweep=True, helper=lab.hook_client)
    assert cleanup.found == () and cleanup.survivors == ()
    assert _untouched(bare, lab.started[bare])
    assert other.is_dir()  # another job's cgroup is not removed


def test_this_jobs_environment_inside_another_jobs_cgroup_is_that_jobs(lab):
    job, other_job = lab.job(), lab.job()
    other = lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{other_job.job_id}")
    pid = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=job.job_id, setsid=True)
    (other / "cgroup.procs").write_text(str(pid))

    assert {p: found.tie for p, found in _find(other_job, sweep=False).items()} == {pid: "cgroup"}
    assert _find(job, sweep=True) == {}


def test_cgroup_v2_membership_ties_and_cgroup_kill_empties_it(lab):
    job = lab.job()
    job_dir = UNIFIED / "system.slice" / "slurmstepd.scope" / f"job_{job.job_id}"
    assert job_dir in cgroup_paths(job.job_id, job.uid, job.node, CGROUP)  # the hybrid root still finds v2
    step = lab.mkcgroup(job_dir / "step_0")
    assert (job_dir / "cgroup.kill").exists() and (job_dir / "cgroup.freeze").exists()
    stranger = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.other_uid, setsid=True)
    mine = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    (step / "cgroup.procs").write_text(str(stranger))
    (job_dir / "cgroup.procs").write_text(str(mine))

    found = _find(job, sweep=False)
    assert {pid: p.tie for pid, p in found.items()} == {stranger: "cgroup", mine: "cgroup"}

    cleanup = _kill(job, sweep=False)
    assert {p.pid for p in cleanup.found} == {stranger, mine}
    assert cleanup.survivors == ()
    _wait_dead({pid: lab.started[pid] for pid in (stranger, mine)}, timeout=0.5)
    assert cleanup.cgroups_removed == 2
    assert not job_dir.exists() and job_dir.parent.is_dir()


def test_a_task_frozen_outside_the_job_is_reported_as_survivor_without_hanging(lab):
    job = lab.job()
    cage = lab.mkcgroup(FREEZER / f"procs-test-frozen-{os.getpid()}")
    pid = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=job.job_id, setsid=True)
    (cage / "cgroup.procs").write_text(str(pid))
    (cage / "freezer.state").write_text("FROZEN")
    _wait("frozen", lambda: (cage / "freezer.state").read_text().strip() == "FROZEN")

    began = time.monotonic()
    cleanup = _kill(job, sweep=False, timeout=0.5)
    took = time.monotonic() - began
    print(f"frozen survivor: state {cleanup.survivors[0][1] if cleanup.survivors else None!r}, "
          f"kill_job took {took:.3f}s")
    assert took < 3.0
    assert [(p.pid, p.tie) for p in cleanup.found] == [(pid, "environ")]
    assert [(p.pid, state) for p, state in cleanup.survivors] == [(pid, "D")]  # a v1-frozen task shows D
    assert _alive(pid, lab.started[pid])

    (cage / "freezer.state").write_text("THAWED")  # the SIGKILL it got is pending: it dies now
    _wait_dead({pid: lab.started[pid]}, timeout=2.0)


# -- single processes -----------------------------------------------------------------


def test_kill_process_never_signals_a_process_whose_start_time_differs(lab):
    pid = lab.spawn(SLEEP, "1000", uid=lab.uid)
    start = lab.started[pid]
    assert kill_process(JobProcess(pid, start + 1, lab.uid, "sleep", "gpu")) is False
    time.sleep(0.1)
    assert _untouched(pid, start)

    real = JobProcess(pid, start, lab.uid, "sleep", "gpu")
    assert kill_process(real) is True
    [child] = [c for c in lab.children if c.pid == pid]
    assert child.wait(timeout=5) == -signal.SIGKILL
    assert kill_process(real) is False  # reaped: gone


def test_gpu_process_of_ties_the_users_bare_process_and_nothing_foreign(lab):
    job, other_job = lab.job(), lab.job()
    bare = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    others = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=other_job.job_id, setsid=True)
    stranger = lab.spawn(SLEEP, "1000", uid=lab.other_uid, setsid=True)
    root_tied = lab.spawn(SLEEP, "1000", job_id=job.job_id, setsid=True)
    guard = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    protected = protected_pids((guard,))

    def tie(pid):
        found = gpu_process_of(job, pid, protected, live_jobs=frozenset({other_job.job_id}), cgroup_root=CGROUP)
        return found and (found.tie, found.starttime == lab.started[pid])

    assert tie(bare) == ("gpu", True)
    assert tie(root_tied) is None  # root's environment is no tie
    assert tie(others) is None and tie(stranger) is None and tie(guard) is None
    _kill_exact(bare, lab.started[bare])
    _wait_dead({bare: lab.started[bare]})
    assert tie(bare) is None  # a zombie is no GPU process


def test_two_hundred_processes(lab):
    job = lab.job()
    sh = lab.popen("sh", "-c", f"i=0; while [ $i -lt 200 ]; do {SLEEP} 1000 </dev/null >/dev/null 2>&1 & "
                               "i=$((i+1)); done", uid=lab.uid, job_id=job.job_id, setsid=True)
    assert sh.wait(timeout=30) == 0
    def all_asleep():
        found = {pid for pid in _carrying(job.job_id) if (stat := read_stat(pid)) and stat.comm == "sleep"}
        return found if len(found) == 200 else None
    sleepers = _wait("200 sleepers", all_asleep, timeout=30)
    for pid in sleepers:
        lab.settled(pid, "sleep")

    cleanup = _kill(job, sweep=False, timeout=10)
    print(f"kill_job: {len(cleanup.found)} processes in {cleanup.seconds:.3f}s")
    assert {p.pid for p in cleanup.found} == sleepers
    assert cleanup.survivors == ()
    _wait_dead({pid: lab.started[pid] for pid in sleepers}, timeout=0.5)


# -- attacks from the security review (issue 9) ---------------------------------------

#: says it started, then forks and lets its parent exit, as fast as it can: its pid is never the same for long.
#: Every generation holds its stdout, a pipe's write end: a scan of /proc can miss a process that lives
#: microseconds, but the pipe reads end-of-file only once the last generation is gone.
HOPPER = "import os\nos.write(1, b'h')\nwhile True:\n    if os.fork():\n        os._exit(0)\n"


def _live_of_uid(uid: int) -> list[int]:
    return [pid for pid in pids() if real_uid(pid) == uid and (s := read_stat(pid)) and s.state not in ("Z", "X")]


class _HopperPipe:
    """The read end of the hoppers' stdout: `started()` once one wrote, `all_gone()` at end-of-file."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def child_side(self) -> int:
        """The write end, for the hopper's stdout; closed here once the hopper has it."""
        return self.write_end

    def started(self, timeout: float = 10.0) -> bool:
        os.close(self.write_end)
        ready, _, _ = select.select([self.read_end], [], [], timeout)
        return bool(ready) and os.read(self.read_end, 1) == b"h"

    def all_gone(self, timeout: float = 10.0) -> bool:
        try:
            ready, _, _ = select.select([self.read_end], [], [], timeout)
            return bool(ready) and os.read(self.read_end, 1) == b""
        finally:
            os.close(self.read_end)


def test_a_pid_hopping_fork_loop_cannot_outrun_the_uid_sweep(lab):
    job = lab.job()
    pipe = _HopperPipe()
    lab.popen("env", "-i", SYSTEM_PYTHON, "-c", HOPPER, uid=lab.uid, setsid=True, stdout=pipe.child_side())
    try:
        assert pipe.started(), "the hopper did not start"
        time.sleep(0.2)
        cleanup = _kill(job, sweep=True, helper=lab.hook_client, timeout=5)
        assert cleanup.found and {p.tie for p in cleanup.found} == {"uid"}
        assert cleanup.survivors == ()
        assert pipe.all_gone(), "a hopper outran the uid sweep"
        assert _live_of_uid(lab.uid) == []
    finally:
        signal_uid(lab.uid, signal.SIGKILL)


def test_a_pid_hopper_in_the_job_cgroup_is_frozen_and_killed_without_any_other_tie(lab):
    job = lab.job()
    cgroup = lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{job.job_id}" / "step_0")
    join = f"echo $$ > {cgroup}/cgroup.procs && exec setpriv --reuid={lab.uid} --regid={lab.uid} --clear-groups"
    pipe = _HopperPipe()
    lab.popen("sh", "-c", f"{join} env -i {SYSTEM_PYTHON} -c \"{HOPPER}\"", setsid=True, stdout=pipe.child_side())
    try:
        assert pipe.started(), "the hopper did not start"
        _wait("the hopper hops in the job cgroup", lambda: (cgroup / "cgroup.procs").read_text().split())
        time.sleep(0.2)
        cleanup = _kill(job, sweep=False, timeout=5)  # no uid sweep: only the cgroup says it is the job's
        assert cleanup.found and {p.tie for p in cleanup.found} == {"cgroup"}
        assert cleanup.survivors == ()
        assert not cgroup.exists()  # emptied and removed
        assert pipe.all_gone(), "a hopper outran the cgroup's kill"
    finally:
        if cgroup.exists():
            (cgroup / "freezer.state").write_text("FROZEN")
            signal_uid(lab.uid, signal.SIGKILL)
            (cgroup / "freezer.state").write_text("THAWED")


def test_a_forged_slurm_job_id_does_not_shield_from_the_uid_sweep(lab):
    job, live_job = lab.job(), lab.job()
    forged = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=1, setsid=True)  # `env SLURM_JOB_ID=1 ./miner`
    claimed = lab.spawn(SLEEP, "1000", uid=lab.uid, job_id=live_job.job_id, setsid=True)

    found = _find(job, sweep=True, live=(live_job,))
    assert {pid: p.tie for pid, p in found.items()} == {forged: "uid"}
    cleanup = _kill(job, sweep=True, helper=lab.hook_client, live=(live_job,))
    assert {p.pid for p in cleanup.found} == {forged}
    _wait_dead({forged: lab.started[forged]}, timeout=0.5)
    assert _alive(claimed, lab.started[claimed])  # the id of a job that runs here is believed


def test_a_cgroup_merely_named_job_n_does_not_shield_from_the_uid_sweep(lab):
    job, other_job = lab.job(), lab.job()
    lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{other_job.job_id}")  # a real one
    # a cgroup the user may make in a delegated subtree, named like another job's
    fake = lab.mkcgroup(FREEZER / f"procs-test-delegated-{os.getpid()}" / f"job_{other_job.job_id}")
    hidden = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    (fake / "cgroup.procs").write_text(str(hidden))

    assert {pid: p.tie for pid, p in _find(job, sweep=True).items()} == {hidden: "uid"}
    cleanup = _kill(job, sweep=True, helper=lab.hook_client)
    assert {p.pid for p in cleanup.found} == {hidden}
    _wait_dead({hidden: lab.started[hidden]}, timeout=0.5)


def test_a_recycled_pid_is_not_tied_through_a_stale_cgroup_listing(lab, monkeypatch):
    from slurm_ext import cgroupfs
    job = lab.job()
    cgroup = lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{job.job_id}")
    first = lab.popen("sh", "-c", f"echo $$ > {cgroup}/cgroup.procs && exec {SLEEP} 1000")
    lab.settled(first.pid, "sleep")
    stale = cgroupfs.members([cgroup])
    assert stale == {first.pid}
    first.kill()
    first.wait()
    for _ in range(50):  # a root process outside every job takes the same pid
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(first.pid - 1))
        newcomer = lab.popen(SLEEP, "1000")
        if newcomer.pid == first.pid:
            break
        newcomer.kill()
        newcomer.wait()
    assert newcomer.pid == first.pid, "could not recycle the pid"
    lab.settled(newcomer.pid, "sleep")
    real = cgroupfs.members
    monkeypatch.setattr(cgroupfs, "members", lambda dirs: real(dirs) | (stale if cgroup in dirs else set()))

    cleanup = _kill(job, sweep=False)
    assert cleanup.found == ()
    assert _untouched(newcomer.pid, lab.started[newcomer.pid])


def test_family_ties_reach_a_long_chain_in_linear_time():
    from slurm_ext.prolog_epilog.procs import _Found, _Scanner
    from slurm_ext.procfs import ProcStat
    job = JobRecord(job_id=JOB_BASE + 99, uid=4242, gid=4242, user="u", node=f"procs-test-{os.getpid()}", gpus=(),
                    start=0.0, cgroups=())
    scanner = _Scanner(job, False, frozenset(), Path("/proc"), CGROUP, pin=False)
    root = ProcStat(10, "S", 1, 10, 10, 1, "sh")
    scanner.tied[10] = _Found(JobProcess(10, 1, 4242, "sh", "environ"), None)
    scanner.groups |= {10}
    count = 20_000  # each process in a session of its own, child of the one before; newest listed first
    chain = [(ProcStat(100 + i, "S", 100 + i - 1 if i else root.pid, 100 + i, 100 + i, 2, "sleep"), 4242)
             for i in range(count)]
    began = time.monotonic()
    found = scanner._family(list(reversed(chain)))
    took = time.monotonic() - began
    assert len(found) == count and {f.process.tie for f in found} == {"family"}
    assert took < 5.0, f"{count} family ties took {took:.1f}s: not linear"  # a fixed-point re-walk takes minutes


def _in_a_pid_namespace_of_its_own(code: str) -> subprocess.CompletedProcess:
    """Run Python `code` as PID 1 of a new PID namespace (with its own /proc), where a wrong kill(-1) or a pid
    taken for the host's can reach only the namespace's own processes; it must exit 0."""
    result = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result


def test_the_stop_rounds_end_at_the_deadline(lab):
    job = lab.job()
    # another user's process that keeps starting children carrying this job's id: each round finds new ones
    spawner = (f"import os, time\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n"
               f"        os.execve('{SLEEP}', ['sleep', '1000'], {{'SLURM_JOB_ID': '{job.job_id}'}})\n"
               f"    time.sleep(0.001)\n")
    lab.popen("env", "-i", SYSTEM_PYTHON, "-c", spawner, uid=lab.other_uid, setsid=True)
    try:
        _wait("children", lambda: len(_live_of_uid(lab.other_uid)) > 20)
        began = time.monotonic()
        _kill(job, sweep=False, timeout=0.5)
        took = time.monotonic() - began
        assert took < 2.0, f"kill_job took {took:.2f}s with a 0.5s deadline"
    finally:
        signal_uid(lab.other_uid, signal.SIGSTOP)
        signal_uid(lab.other_uid, signal.SIGKILL)


def test_nvml_pids_are_not_judged_inside_a_pid_namespace_of_its_own(lab):
    """In a pod's PID namespace NVML's host pid N is another local process: never the job's by number."""
    job = lab.job()
    code = (f"import subprocess, sys\n"
            f"from slurm_ext.prolog_epilog.jobrecord import JobRecord\n"
            f"from slurm_ext.prolog_epilog.procs import gpu_process_of, protected_pids\n"
            f"from slurm_ext.procfs import read_stat\n"
            f"subprocess.run(['true'])\n"  # pid 2 is taken: kthreadd's number is never judged
            f"child = subprocess.Popen(['setpriv', '--reuid={lab.uid}', '--regid={lab.uid}', '--clear-groups', "
            f"'{SLEEP}', '1000'])\n"
            f"import time\n"
            f"while read_stat(child.pid).comm != 'sleep': time.sleep(0.01)\n"
            f"job = JobRecord({job.job_id}, {lab.uid}, {lab.uid}, 'u', '{job.node}', (0,), 0.0, ())\n"
            f"print(child.pid, gpu_process_of(job, child.pid, protected_pids()), flush=True)\n"
            f"child.kill()\n")
    result = _in_a_pid_namespace_of_its_own(code)
    local_pid, judged = result.stdout.split(maxsplit=1)
    assert int(local_pid) < 10 and judged.strip() == "None", result.stdout


def test_a_job_cgroup_that_does_not_empty_is_reported_whatever_the_scan_made_of_it(lab):
    """A member the judge will not touch (here a protected pid moved into the job's cgroup): the Epilog does
    not call the job clean, it reports the member, so the node is drained rather than reused as it is."""
    job = lab.job()
    cgroup = lab.mkcgroup(FREEZER / f"slurm_{job.node}" / f"uid_{job.uid}" / f"job_{job.job_id}")
    guard = lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid, setsid=True)
    (cgroup / "cgroup.procs").write_text(str(guard))
    cleanup = _kill(job, sweep=False, timeout=0.5, protected=protected_pids((guard,)))
    assert [(p.pid, p.tie) for p, _ in cleanup.survivors] == [(guard, "cgroup")]
    assert cleanup.cgroups_removed == 0 and cgroup.is_dir()
    assert _untouched(guard, lab.started[guard])  # thawed, untouched


# -- signalling every process of a uid from a thread (issue 10) -------------------------


def _cap_eff() -> str:
    """This thread's effective capabilities, as the kernel shows them."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return line.split()[1]
    raise AssertionError("no CapEff line in /proc/thread-self/status")


def _dumpable() -> int:
    import ctypes
    return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE


def _senders(lab) -> dict[str, Callable[[int, int], bool]]:
    """signal_uid's two ways: the hook client's signal-uid, and a forked child where there is no client."""
    return {"helper": lambda uid, signum: signal_uid(uid, signum, lab.hook_client),
            "child": lambda uid, signum: signal_uid(uid, signum)}


@pytest.mark.parametrize("way", ["helper", "child"])
def test_signal_uid_reaches_every_process_of_the_uid_and_never_root_or_another_user(lab, way):
    send = _senders(lab)[way]
    mine = [lab.spawn(SLEEP, "1000", uid=lab.uid, setsid=True), lab.spawn("env", "-i", SLEEP, "1000", uid=lab.uid)]
    spared = [lab.spawn(SLEEP, "1000", uid=lab.other_uid, setsid=True),  # another user
              lab.spawn(SLEEP, "1000", setsid=True),  # root, a session of its own
              lab.spawn(SLEEP, "1000")]  # root, in pytest's session (SIGCONT may cross within a session)
    before = (os.getresuid(), os.getresgid(), _cap_eff(), _dumpable())

    assert send(lab.uid, signal.SIGSTOP) is True
    for pid in mine:
        _wait(f"pid {pid} of the uid stopped", lambda: read_stat(pid).state == "T")
    for pid in spared:
        assert read_stat(pid).state in ("S", "R"), read_stat(pid)
    # the sender has a session of its own: a stopped root process in the caller's session stays stopped
    os.kill(spared[-1], signal.SIGSTOP)
    _wait("root's sleeper in pytest's session stopped", lambda: read_stat(spared[-1]).state == "T")
    assert send(lab.uid, signal.SIGCONT) is True
    for pid in mine:
        _wait(f"pid {pid} of the uid continued", lambda: read_stat(pid).state == "S")
    assert read_stat(spared[-1]).state == "T", read_stat(spared[-1])
    os.kill(spared[-1], signal.SIGCONT)
    # with CAP_KILL still effective, or a real uid of 0 left, root's sleepers would die here
    assert send(lab.uid, signal.SIGKILL) is True
    _wait_dead({pid: lab.started[pid] for pid in mine})
    time.sleep(0.1)
    for pid in spared:
        assert _untouched(pid, lab.started[pid]), read_stat(pid)
    # this process: its credentials, capabilities and dumpable mark as they were
    assert (os.getresuid(), os.getresgid(), _cap_eff(), _dumpable()) == before
    # no process of the uid left: kill(-1) as the uid still reaches others it may not signal, so not ESRCH
    assert send(lab.uid, 0) is True


def test_signal_uid_never_changes_the_credentials_of_this_process(lab):
    """A thread of the hook service running as the user could be killed by the user: the uid is taken
    by the helper alone, and no thread of the caller is ever seen with another uid."""
    seen: set[tuple[int, int, int]] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.add(os.getresuid())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(100):
            signal_uid(lab.uid, signal.SIGCONT, lab.hook_client)
    finally:
        stop.set()
        watcher.join()
    assert seen == {(0, 0, 0)}


def test_signal_uid_refuses_root_and_bad_arguments_in_the_helper(lab):
    for args in (["0", "9"], ["-1", "9"], ["x", "9"], [str(lab.uid), "99"], [str(lab.uid), "KILL"]):
        result = subprocess.run([lab.hook_client, "signal-uid", *args], capture_output=True, text=True, timeout=10)
        assert result.returncode == 2 and "slurm-ext-hook: signal-uid:" in result.stderr, (args, result)
    # a user running it gets nothing: it cannot take another uid
    result = subprocess.run(["setpriv", f"--reuid={lab.other_uid}", f"--regid={lab.other_uid}", "--clear-groups",
                             lab.hook_client, "signal-uid", str(lab.uid), "0"], capture_output=True, text=True,
                            timeout=10)
    assert result.returncode == 3 and "cannot take uid" in result.stderr, result


@pytest.mark.parametrize("way", ["helper", "child"])
def test_signal_uid_sends_nothing_when_the_uid_would_keep_capabilities(lab, way):
    """SECBIT_NO_SETUID_FIXUP keeps capabilities when the euid leaves 0 (and is inherited by children and
    across exec): with CAP_KILL, kill(-1) would reach every process. The sender checks and sends nothing.
    Run in a PID namespace of its own, so that a broken check can only reach the namespace's processes."""
    helper = lab.hook_client if way == "helper" else None
    code = (f"import ctypes, signal, subprocess, sys, time\n"
            f"from slurm_ext.prolog_epilog.procs import signal_uid\n"
            f"mine = subprocess.Popen(['setpriv', '--reuid={lab.uid}', '--regid={lab.uid}', '--clear-groups', "
            f"'{SLEEP}', '1000'])\n"
            f"root = subprocess.Popen(['{SLEEP}', '1000'])\n"
            f"time.sleep(0.3)\n"
            f"libc = ctypes.CDLL(None, use_errno=True)\n"
            f"assert libc.prctl(28, 1 << 2, 0, 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECUREBITS\n"
            f"sent = signal_uid({lab.uid}, signal.SIGKILL, {helper!r})\n"
            f"time.sleep(0.3)\n"
            f"print(sent, mine.poll(), root.poll(), flush=True)\n"
            f"mine.kill(); root.kill()\n")
    result = _in_a_pid_namespace_of_its_own(code)
    assert result.stdout.split() == ["True", "None", "None"], result.stdout  # sent nothing: both still run
    assert "capabilities kept as the uid, nothing sent" in result.stderr, result.stderr


def test_a_setuid_root_program_of_the_user_is_found_by_its_real_uid(lab):
    """A program the user started that runs with root's effective uid (passwd, a setuid helper): /proc/PID is
    root's, so its real uid is read from status, and neither the uid sweep nor the environment misses it."""
    job = lab.job()

    def setuid_root(uid: int) -> str:
        return f"import os, signal; os.setresuid({uid}, 0, 0); signal.pause()"

    swept = lab.spawn("env", "-i", SYSTEM_PYTHON, "-c", setuid_root(lab.uid), setsid=True, comm="python3")
    carried = lab.spawn(SYSTEM_PYTHON, "-c", setuid_root(lab.other_uid), job_id=job.job_id, setsid=True,
                        comm="python3")
    stranger = lab.spawn("env", "-i", SYSTEM_PYTHON, "-c", setuid_root(lab.other_uid), setsid=True, comm="python3")
    for pid, uid in ((swept, lab.uid), (carried, lab.other_uid), (stranger, lab.other_uid)):
        _wait(f"pid {pid} runs as real uid {uid}", lambda: real_uid(pid) == uid)
        assert os.stat(f"/proc/{pid}").st_uid == 0  # the entry is root's: its owner is the effective uid

    assert {pid: p.tie for pid, p in _find(job, sweep=True).items()} == {swept: "uid", carried: "environ"}
    cleanup = _kill(job, sweep=True, helper=lab.hook_client)
    assert {p.pid for p in cleanup.found} == {swept, carried}
    _wait_dead({pid: lab.started[pid] for pid in (swept, carried)}, timeout=0.5)
    assert _untouched(stranger, lab.started[stranger])

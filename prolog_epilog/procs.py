"""Find what is left of a job at kernel level, and kill it without races.

By the Epilog, slurmd has already signalled and killed the job's steps: what
is still there escaped Slurm's tracking -- a `setsid nohup` daemon, a double
fork re-parented to PID 1, a process that dropped its environment with
`env -i`. Three kinds of evidence tie a process to the job, combined:

1. Slurm's job cgroups, on every hierarchy. Under proctrack/linuxproc the
   task/cgroup directories (memory, cpuset, devices) still hold escapees.
2. SLURM_JOB_ID=<job> in /proc/PID/environ, inherited by every descendant
   that did not clear its environment.
3. Family, for processes of the job's user only: a parent, session or
   process group that a tied process has; and, when the user has no other job
   on the node and the uid is at least `min_uid`, every process of that uid.

(1) ties a process whatever its uid (a job may run setuid helpers); (2) any
uid but root's: /proc/PID/environ is the process's own memory, and a root
daemon that an admin job-start script started inherits SLURM_JOB_ID without
being the job's; (3) never reaches root or another user. A process that sits
in another job's cgroup (one of Slurm's, not any path named job_N) is that
job's, unless it is in this job's cgroup; one that carries another job's
SLURM_JOB_ID is that job's only when it is another job of the same user that
runs on this node: anyone can write `SLURM_JOB_ID=1`, or the id of another
user's job from squeue, into their environment to hide from the uid sweep. Never touched: PID 1, the caller and its ancestors (the
hook, slurmd), the `protected` pids (the agent), and root processes running
slurmd or slurmstepd.

Killing: first make sure nothing can fork out of reach. With the uid sweep,
kill(-1, SIGSTOP) is sent with the job user's credentials (by a process
of its own, see `signal_uid`): the kernel stops
every process of the uid in one pass that a fork cannot outrun (a process
that forks and lets its parent exit every few milliseconds is never in one
/proc snapshot). Job cgroups that have members are frozen (v1 freezer.state, v2
cgroup.freeze; not one that still holds a slurmstepd): a non-empty job
cgroup means something escaped, whatever a scan saw. Then scan, SIGSTOP every
other process found and re-scan until a scan finds nothing new or the
deadline passes. Then SIGKILL each through a pidfd checked against the
process's start time (a recycled pid is never hit; a cgroup tie is confirmed
in /proc/PID/cgroup after the pidfd pins the pid), cgroup.kill where the
kernel has it, thaw, wait, and scan again until the job's cgroups are empty.
What the uid stop stopped and was not the job's is continued. What still
lives at the deadline is in uninterruptible sleep (state D): it is reported,
not waited on forever.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import cgroupfs
from slurm_ext.procfs import PROC, ProcStat, pids, read_stat, read_whole, real_uid

from .jobrecord import JobRecord, cgroup_places

__all__ = ["JobProcess", "Cleanup", "find_job_processes", "kill_job", "protected_pids", "gpu_process_of",
           "kill_process", "signal_uid", "in_initial_pid_namespace"]

logger = logging.getLogger("prolog_epilog")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_KTHREADD = 2
_SLURM_BINARIES = frozenset({"slurmd", "slurmstepd"})
#: stop rounds: each round stops what the last scan found new; a fork bomb cannot outrun this forever
_MAX_STOP_ROUNDS = 50
_POLL = 0.005
#: a job cgroup of Slurm's in a /proc/PID/cgroup line ("4:freezer:/slurm_n1/uid_5/job_42/step_0"): v1
#: slurm[_<node>]/uid_<uid>/job_<id>, v2 system.slice/[<node>_]slurmstepd.scope/job_<id>. Anchored at the
#: start of the path: a user may name a cgroup of a delegated subtree job_42.
#: A pattern, not a compiled one: compiled (once, by re's cache) only when another job has cgroups here.
_JOB_IN_CGROUP = \
    rb"(?m)^[^:\n]*:[^:\n]*:/(?:slurm(?:_[^/\n]+)?/uid_\d+|system\.slice/(?:[^/\n]+_)?slurmstepd\.scope)/job_(\d+)(?:/|$)"
#: the inode of the first PID namespace (PROC_PID_INIT_INO): NVML's pids are pids in it
_INIT_PID_NAMESPACE = "pid:[4026531836]"
#: what the exit statuses of `slurm-ext-hook signal-uid` (hook.c) and of signal_uid's forked child from 2 up
#: mean (0: sent, 1: no process to signal)
_SENDER_EXITS = {2: "bad arguments", 3: "the uid could not be taken",
                 4: "capabilities kept as the uid, nothing sent", 5: "kill failed", 6: "no child process to be had"}


@dataclass(frozen=True, slots=True)
class JobProcess:
    pid: int
    #: with the pid, names this process even after the pid is recycled
    starttime: int
    uid: int
    comm: str
    #: the evidence that made it the job's: cgroup, environ, family or uid
    tie: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.comm}, uid {self.uid}, by {self.tie})"


@dataclass(frozen=True, slots=True)
class Cleanup:
    #: every process found and killed (or tried)
    found: tuple[JobProcess, ...]
    #: (process, its state letter) still alive at the deadline
    survivors: tuple[tuple[JobProcess, str], ...]
    seconds: float
    #: job cgroup directories removed once empty
    cgroups_removed: int


def protected_pids(extra: tuple[int, ...] = (), proc: Path = PROC) -> frozenset[int]:
    """PID 1, this process, `extra` (the hook, the agent), and all their ancestors."""
    keep = {1}
    for start in (os.getpid(), *extra):
        pid = start
        while pid > 1 and pid not in keep:
            keep.add(pid)
            stat = read_stat(pid, proc)
            pid = stat.ppid if stat else 0
    return frozenset(keep)


def find_job_processes(job: JobRecord, *, sweep_uid: bool, protected: frozenset[int],
                       live_jobs: frozenset[int] = frozenset(), proc: Path = PROC,
                       cgroup_root: Path = CGROUP_ROOT) -> list[JobProcess]:
    """Every live process tied to `job` now (one pass over /proc).

    `live_jobs`: ids of the same user's other jobs that run on this node; a
    SLURM_JOB_ID naming one of them is believed, any other is not.
    """
    scanner = _Scanner(job, sweep_uid, protected, proc, cgroup_root, live_jobs, pin=False)
    return [found.process for found in scanner.scan(everything=True)]


@dataclass(slots=True, eq=False)  # never compared; eq costs the Python Epilog ~0.3 ms to create
class _Found:
    process: JobProcess
    #: a pidfd naming exactly this process (signals through it can never hit a recycled pid); None if none
    fd: int | None


class _Scanner:
    """Scans /proc for the job's processes, remembering what it has judged.

    A first scan judges every process; later ones look only at pids not seen
    yet: the kernel hands out pids in increasing order, so a process forked
    meanwhile has a new pid (until pid_max wraps, which one Epilog never
    sees). Newest pids are judged first: a process that keeps forking is most
    likely still alive right after the listing. `scan(everything=True)`
    judges all again, for the verification.

    Most of a node's processes are root's or other users' daemons: they are
    ruled out by their uid (and, for other users, their environment) before
    anything else is read or a pidfd opened. A process that may be the
    job's is pinned first and then judged on reads made after the pin.
    """

    def __init__(self, job: JobRecord, sweep_uid: bool, protected: frozenset[int], proc: Path, cgroup_root: Path,
                 live_jobs: frozenset[int] = frozenset(), pin: bool = True):
        self.job, self.sweep_uid, self.protected, self.pin = job, sweep_uid, protected, pin
        self.proc = os.fspath(proc)  # a string: it is joined with every pid, several times
        places = cgroup_places(job.job_id, job.uid, job.node, cgroup_root)
        self.cgroups = _job_cgroups(job, places)
        #: the job's cgroups as /proc/PID/cgroup names them, to confirm a member once its pid is pinned
        self.cgroup_names = {_cgroup_name(d, cgroup_root) for d in self.cgroups}
        #: whether any other job has cgroups here: if not, no process needs its cgroup file read
        self.other_jobs = _other_job_cgroups(places)
        #: other jobs' ids that a SLURM_JOB_ID may claim: the same user's that run here (anyone can read
        #: another user's job ids in squeue; claiming one must not hide a process from the uid sweep)
        self.trusted = frozenset(live_jobs) - {job.job_id}
        self.seen: set[int] = set()
        self.tied: dict[int, _Found] = {}
        self.groups: set[int] = set()
        self.protected_groups = {g for pid in protected if (st := read_stat(pid, proc)) for g in (st.session, st.pgrp)}

    def scan(self, everything: bool = False) -> list[_Found]:
        """Newly tied processes (with `everything`: every tied process alive now)."""
        in_cgroup = cgroupfs.members(self.cgroups)
        found: list[_Found] = []
        family: list[tuple[ProcStat, int]] = []  # the job user's processes not tied (yet), with their uid
        for pid in sorted(pids(self.proc), reverse=True):
            if pid in self.seen and not everything:
                continue
            self.seen.add(pid)
            if not self._may_be_tied(pid, in_cgroup):
                continue
            fd = _pidfd(pid) if self.pin else None  # first: then the reads below are of this very process
            judged = self._judge(pid, in_cgroup)
            if judged is not None and judged[2] == "cgroup" and fd is not None and not self._member(pid):
                judged = None  # the pid was recycled after the cgroup was read: not the process that was there
            if judged is None or judged[2] == "family":
                if fd is not None:
                    os.close(fd)
                if judged is not None:
                    family.append(judged[:2])
                continue
            found += self._tie(*judged, fd=fd)
        return found + self._family(family)

    def _family(self, candidates: list[tuple[ProcStat, int]]) -> list[_Found]:
        """Tie the candidates whose parent, session or process group is tied, to a fixed point.

        Breadth first over indexes by parent and group, so each candidate is
        looked at a bounded number of times (a list re-walked until nothing
        changes is quadratic in a user's thousands of processes).
        """
        by_parent: dict[int, list[tuple[ProcStat, int]]] = {}
        by_group: dict[int, list[tuple[ProcStat, int]]] = {}
        for entry in candidates:
            by_parent.setdefault(entry[0].ppid, []).append(entry)
            for group in {entry[0].session, entry[0].pgrp}:
                by_group.setdefault(group, []).append(entry)
        queue = [entry for entry in candidates if entry[0].ppid in self.tied or entry[0].session in self.groups
                 or entry[0].pgrp in self.groups]
        found: list[_Found] = []
        done: set[int] = set()
        while queue:
            stat, uid = queue.pop()
            if stat.pid in done:
                continue
            done.add(stat.pid)
            if self._in_other_job_cgroup(stat.pid):
                continue
            fresh = {stat.session, stat.pgrp} - self.groups
            tied = self._tie(stat, uid, "family")
            if not tied:
                continue
            found += tied
            queue += by_parent.pop(stat.pid, [])
            for group in fresh & self.groups:
                queue += by_group.pop(group, [])
        return found

    def _may_be_tied(self, pid: int, in_cgroup: set[int]) -> bool:
        """False for a process that cannot be the job's, told by the cheapest reads (`_judge` decides)."""
        if pid in self.protected or pid == _KTHREADD:
            return False
        if pid in in_cgroup:
            return True
        uid = real_uid(pid, self.proc)
        if uid is None or uid == 0:
            return False  # gone, or root: root is the job's only by its cgroup
        return uid == self.job.uid or _environ_job(pid, self.proc) == self.job.job_id

    def _judge(self, pid: int, in_cgroup: set[int]) -> tuple[ProcStat, int, str] | None:
        """(stat, uid, tie) of a process that is, or may through family be, the job's; else None."""
        if pid in self.protected or pid == _KTHREADD:
            return None
        stat = read_stat(pid, self.proc)
        if stat is None or stat.state in ("Z", "X") or stat.ppid == _KTHREADD:
            return None
        uid = real_uid(pid, self.proc)
        if uid is None:
            return None
        if pid in in_cgroup:
            return None if uid == 0 and _runs_slurm_daemon(pid, self.proc) else (stat, uid, "cgroup")
        if uid == 0:
            return None  # root is the job's only by its cgroup
        job = self.job
        env_job = _environ_job(pid, self.proc)
        if env_job == job.job_id:
            return None if self._in_other_job_cgroup(pid) else (stat, uid, "environ")
        if uid != job.uid or env_job in self.trusted:
            return None
        if self.sweep_uid and not self._in_other_job_cgroup(pid):
            return stat, uid, "uid"
        return stat, uid, "family"

    def _member(self, pid: int) -> bool:
        """Whether the (pinned) process is in one of the job's cgroups, by its own /proc/PID/cgroup."""
        data = read_whole(pid, "cgroup", self.proc)
        for line in data.decode(errors="surrogateescape").splitlines():
            name = line.split(":", 2)[-1]
            if any(name == own or name.startswith(own + "/") for own in self.cgroup_names):
                return True
        return False

    def _in_other_job_cgroup(self, pid: int) -> bool:
        return self.other_jobs and _in_other_job_cgroup(pid, self.job.job_id, self.proc)

    def _tie(self, stat: ProcStat, uid: int, tie: str, fd: int | None = None) -> list[_Found]:
        known = self.tied.get(stat.pid)
        if known is not None and known.process.starttime == stat.starttime:
            if fd is not None:
                os.close(fd)
            return [known]
        if known is not None and known.fd is not None:  # that one is gone and its pid taken again
            os.close(known.fd)
        found = _Found(JobProcess(stat.pid, stat.starttime, uid, stat.comm, tie), fd)
        if self.pin and fd is None:
            found.fd = _pin(found.process, self.proc)
            if found.fd is None and not _alive(found.process, self.proc):
                return []  # gone between the two reads
        self.tied[stat.pid] = found
        self.groups |= {stat.session, stat.pgrp} - self.protected_groups
        return [found]

    def close(self) -> None:
        for found in self.tied.values():
            if found.fd is not None:
                os.close(found.fd)
                found.fd = None


def kill_job(job: JobRecord, *, sweep_uid: bool, protected: frozenset[int], timeout: float,
             live_jobs: frozenset[int] = frozenset(), signal_helper: str | None = None, proc: Path = PROC,
             cgroup_root: Path = CGROUP_ROOT) -> Cleanup:
    """Stop, kill and verify every process of `job`; remove its emptied cgroups.

    `live_jobs` as for `find_job_processes`; `signal_helper` as `signal_uid`'s helper.
    """
    started = time.monotonic()
    deadline = started + timeout
    _raise_fd_limit()
    scanner = _Scanner(job, sweep_uid, protected, proc, cgroup_root, live_jobs)
    frozen: list[Path] = []
    uid_stopped = False
    try:
        # nothing of the uid can fork from here on
        uid_stopped = sweep_uid and job.uid != 0 and signal_uid(job.uid, signal.SIGSTOP, signal_helper)
        occupied = [d for d in scanner.cgroups if cgroupfs.members([d])]
        # a job cgroup that still holds a slurmstepd (the extern step ending) is not ours to freeze or kill
        whole = [d for d in occupied if not _holds_slurm_daemon(d, proc)]
        frozen = [d for d in whole if cgroupfs.freeze(d, True)]
        new = scanner.scan(everything=True)
        if not new and not occupied:  # the usual Epilog: nothing escaped (Slurm removes empty job cgroups)
            return Cleanup(found=(), survivors=(), seconds=time.monotonic() - started, cgroups_removed=0)
        cannot_fork = cgroupfs.members(frozen)
        for _ in range(_MAX_STOP_ROUNDS):
            for found in new:
                if found.process.pid not in cannot_fork:
                    _send(found, signal.SIGSTOP, proc)
            new = scanner.scan()
            if not new or time.monotonic() >= deadline:
                break
        for found in scanner.tied.values():
            _send(found, signal.SIGKILL, proc)
        for directory in whole:
            cgroupfs.write(directory / "cgroup.kill", "1")
        for directory in frozen:
            cgroupfs.freeze(directory, False)
        frozen = []
        alive = _wait_gone(list(scanner.tied.values()), deadline, proc)
        while not alive:  # verify: nothing of the job is left, its cgroups are empty
            again = scanner.scan(everything=True)
            if (not again and not cgroupfs.members(whole)) or time.monotonic() >= deadline:
                alive = again
                break
            for found in again:
                _send(found, signal.SIGKILL, proc)
            for directory in whole:
                cgroupfs.write(directory / "cgroup.kill", "1")
            alive = _wait_gone(again, deadline, proc) if again else (time.sleep(_POLL) or [])
        survivors = [(f.process, _state(f.process, proc)) for f in alive if _alive(f.process, proc)]
        survivors += _cgroup_survivors(whole, {p.pid for p, _ in survivors}, proc)
        return Cleanup(found=tuple(f.process for f in scanner.tied.values()), survivors=tuple(survivors),
                       seconds=time.monotonic() - started,
                       cgroups_removed=0 if survivors else _remove_cgroups(scanner.cgroups))
    finally:
        for directory in frozen:  # an error on the way must not leave the job's cgroups frozen
            cgroupfs.freeze(directory, False)
        scanner.close()
        if uid_stopped:
            signal_uid(job.uid, signal.SIGCONT, signal_helper)  # what of the uid was not the job's runs on


def _cgroup_survivors(directories: list[Path], known: set[int], proc: Path | str) -> list[tuple[JobProcess, str]]:
    """What is still in the job's cgroups at the end and not reported yet: a job cgroup that does not
    empty leaves the node unfit, whatever the scan made of its members."""
    left = []
    for pid in sorted(cgroupfs.members(directories) - known):
        stat = read_stat(pid, proc)
        if stat is not None and stat.state not in ("Z", "X"):
            left.append((JobProcess(pid, stat.starttime, real_uid(pid, proc) or 0, stat.comm, "cgroup"), stat.state))
    return left


def signal_uid(uid: int, signum: int, helper: str | None = None) -> bool:
    """Send `signum` to every process of `uid` at once: kill(-1) with the credentials of `uid`.

    The kernel signals all of them in one pass that a fork cannot escape (a
    child forked meanwhile is either in the pass or never created), which no
    scan of /proc can promise. Returns False only when kill(-1) said ESRCH,
    which Linux says only when no process but the sender exists (in a PID
    namespace of its own): processes it may not signal count too. True also
    when nothing could be sent, so callers look rather than assume.

    Who sends: a process of its own that takes the uid, never this process
    (a thread of the hook service running as the user could be sent a fatal
    signal by the user, and the service would die with it). `helper` is the
    hook client (`slurm-ext-hook signal-uid UID SIGNUM`, hook.c, whose path
    the client passes in SLURM_EXT_HOOK), started with posix_spawn: the child
    shares this process's memory until it executes, so it costs the hook
    service, NVML loaded, no more than the small Python hook. Without one a
    forked child does the same. Either runs in a session of its own
    (kill(-1, SIGCONT) also reaches the sender's session, whatever the uid).
    As the uid, with no capability left (the helper checks), only processes
    whose real or saved uid is `uid` are reached: never root's, never
    another user's, never the sender.
    """
    code = _spawn_helper(helper, uid, signum) if helper else None
    if code is None:
        code = _signal_uid_from_child(uid, signum)
    if code >= 2:
        logger.warning("kill(-1, %s) as uid %d not sent: %s (%s exited %d)", signal.Signals(signum).name, uid,
                       _SENDER_EXITS.get(code, "unknown status"), helper or "a forked child", code)
    return code != 1


def _spawn_helper(helper: str, uid: int, signum: int) -> int | None:
    """The helper's exit status; None when it cannot be started (then a forked child does its work)."""
    try:
        pid = os.posix_spawn(helper, [helper, "signal-uid", str(uid), str(signum)], {}, setsid=True)
    except OSError as err:
        logger.warning("cannot start %s to signal uid %d: %s; forking instead", helper, uid, err.strerror or err)
        return None
    return _exit_status(pid)


def _signal_uid_from_child(uid: int, signum: int) -> int:
    """signal_uid without the helper: kill(-1) from a forked child running as `uid`; the helper's exit status."""
    try:
        child = os.fork()
    except OSError:  # no memory or pids left for a child: look with scans alone
        return 6
    if child == 0:  # the child: system calls only, then _exit
        code = 3
        try:
            os.setsid()
            os.setgroups([])
            os.setresgid(uid, uid, uid)  # a gid none of root's; kill looks at uids only
            os.setresuid(uid, uid, uid)
            code = 4
            if not _capabilities_kept():
                code = 5
                os.kill(-1, signum)
                code = 0
        except ProcessLookupError:
            code = 1
        finally:
            os._exit(code)
    return _exit_status(child)


def _capabilities_kept() -> bool:
    """This process still has effective capabilities (or cannot tell): see hook.c's signal_uid."""
    fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        status = os.read(fd, 16384)
    finally:
        os.close(fd)
    for line in status.splitlines():
        if line.startswith(b"CapEff:"):
            return int(line.split()[1], 16) != 0
    return True


def _exit_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # EINTR is retried by Python itself (PEP 475)


def _wait_gone(waiting: list[_Found], deadline: float, proc: Path | str) -> list[_Found]:
    """Wait until each has exited (a pidfd turns readable then) or the deadline; those still alive."""
    poller = select.poll()
    by_fd = {}
    rest = []
    for found in waiting:
        if found.fd is not None:
            poller.register(found.fd, select.POLLIN)
            by_fd[found.fd] = found
        else:
            rest.append(found)
    while True:
        rest = [f for f in rest if _alive(f.process, proc)]
        if not by_fd and not rest:
            return []
        left = deadline - time.monotonic()
        if left <= 0:
            return list(by_fd.values()) + rest
        for fd, _ in poller.poll(min(left, _POLL if rest else left) * 1000):
            poller.unregister(fd)
            del by_fd[fd]


def gpu_process_of(job: JobRecord, pid: int, protected: frozenset[int], live_jobs: frozenset[int] = frozenset(),
                   proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> JobProcess | None:
    """`pid`, listed by NVML on one of the job's GPUs, when it is the job's.

    Slurm gives a job its GPUs alone (gres), so a process of the job's user on
    one of them is the job's, unless it sits in another job's cgroup or
    carries the id of another job that runs here; cgroup and environ tie it
    as anywhere. NVML's pids are pids of the host's first PID namespace: in a
    pod's own namespace the same number is another process, so there no pid
    is judged (None: the GPU stays held and is reported, never a wrong kill).
    """
    if not in_initial_pid_namespace(proc):
        return None
    # the scanner's judgement with the uid sweep on: the job's user holds the GPU, so it is the job's
    scanner = _Scanner(job, True, protected, proc, cgroup_root, live_jobs, pin=False)
    judged = scanner._judge(pid, cgroupfs.members(scanner.cgroups))
    if judged is None or judged[2] == "family":  # "family" here: in another job's cgroup
        return None
    stat, uid, tie = judged
    return JobProcess(pid, stat.starttime, uid, stat.comm, "gpu" if tie == "uid" else tie)


def in_initial_pid_namespace(proc: Path = PROC) -> bool:
    """Whether /proc shows the host's first PID namespace, the one whose pids NVML reports."""
    try:
        return os.readlink(proc / "self" / "ns" / "pid") == _INIT_PID_NAMESPACE
    except OSError:
        return False


def kill_process(process: JobProcess, proc: Path = PROC) -> bool:
    """SIGKILL the very process that was found; False when it is already gone."""
    return _send(_Found(process, None), signal.SIGKILL, proc)


# -- evidence ------------------------------------------------------------------------


def _job_cgroups(job: JobRecord, places: list[str]) -> list[Path]:
    """The job's cgroup directories that exist: recorded at the Prolog, or `places` computed now."""
    return [Path(p) for p in dict.fromkeys([*job.cgroups, *places]) if os.path.isdir(p)]


def _environ_job(pid: int, proc: Path | str) -> int | None:
    """The SLURM_JOB_ID in the process's environment, if it has one."""
    data = b"\0" + read_whole(pid, "environ", proc)
    at = data.find(b"\0SLURM_JOB_ID=")
    if at < 0:
        return None
    value = data[at + 14:data.find(b"\0", at + 1) if data.find(b"\0", at + 1) > 0 else None]
    return int(value) if value.isdigit() else None


def _holds_slurm_daemon(directory: Path, proc: Path | str) -> bool:
    return any(real_uid(pid, proc) == 0 and _runs_slurm_daemon(pid, proc) for pid in cgroupfs.members([directory]))


def _other_job_cgroups(places: list[str]) -> bool:
    """Whether a job other than the one of `places` (its cgroup_paths) has a cgroup directory here."""
    for place in places:
        parent, own = os.path.split(place)
        if parent.endswith(".scope"):  # v2: .../<scope>/job_<id>
            jobs = [parent]
        else:  # v1: .../slurm[_<node>]/uid_<uid>/job_<id>
            top = os.path.dirname(parent)
            jobs = [f"{top}/{name}" for name in _names(top) if name.startswith("uid_")]
        if any(name.startswith("job_") and name != own for directory in jobs for name in _names(directory)):
            return True
    return False


def _names(directory: str) -> list[str]:
    """The entries of a directory; none when it is missing (the usual case) or unreadable."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _cgroup_name(directory: Path, cgroup_root: Path) -> str:
    """A cgroup directory as /proc/PID/cgroup writes it: its path below its hierarchy's mount."""
    relative = directory.relative_to(cgroup_root).parts
    if not (cgroup_root / "cgroup.controllers").is_file():
        relative = relative[1:]  # v1 or hybrid: the first part is the hierarchy (freezer, unified, ...)
    return "/" + "/".join(relative)


def _in_other_job_cgroup(pid: int, job_id: int, proc: Path | str) -> bool:
    data = read_whole(pid, "cgroup", proc)
    return any(int(found) != job_id for found in re.findall(_JOB_IN_CGROUP, data))


def _runs_slurm_daemon(pid: int, proc: Path | str) -> bool:
    try:
        exe = os.readlink(f"{os.fspath(proc)}/{pid}/exe")
    except OSError:
        return False
    return os.path.basename(exe.removesuffix(" (deleted)")) in _SLURM_BINARIES


# -- acting ------------------------------------------------------------------------


def _alive(process: JobProcess, proc: Path | str) -> bool:
    stat = read_stat(process.pid, proc)
    return stat is not None and stat.starttime == process.starttime and stat.state not in ("Z", "X")


def _state(process: JobProcess, proc: Path | str) -> str:
    stat = read_stat(process.pid, proc)
    return stat.state if stat else "gone"


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _pin(process: JobProcess, proc: Path | str) -> int | None:
    """A pidfd for the very process that was found, or None when it is gone (or pidfds are unavailable)."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:
        return None
    stat = read_stat(process.pid, proc)  # the pidfd pins the pid: check it is still the same process
    if stat is None or stat.starttime != process.starttime or stat.state in ("Z", "X"):
        os.close(fd)
        return None
    return fd


def _send(found: _Found, signum: int, proc: Path | str) -> bool:
    """Signal a found process through its pidfd (or a fresh, checked one); False when it is gone."""
    if found.fd is not None:
        try:
            signal.pidfd_send_signal(found.fd, signum)
            return True
        except OSError:
            return False
    fd = _pin(found.process, proc)
    if fd is None:
        return False
    try:
        signal.pidfd_send_signal(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _raise_fd_limit() -> None:
    """One pidfd per process found: let a job's thousand leftovers fit (soft limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass


def _remove_cgroups(directories: list[Path]) -> int:
    """rmdir the job's emptied cgroup trees, deepest first (Slurm leaves them when escapees held them)."""
    removed = 0
    for top in directories:
        for directory, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):
            try:
                os.rmdir(directory)
                removed += 1
            except OSError:
                pass
    return removed

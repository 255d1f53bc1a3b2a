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

(1) and (2) tie a process whatever its uid (a job may run setuid helpers);
(3) never reaches root or another user. A process that carries another job's
SLURM_JOB_ID or sits in another job's cgroup is that job's, unless it is in
this job's cgroup. Never touched: PID 1, the caller and its ancestors (the
hook, slurmd), the `protected` pids (the agent), and root processes running
slurmd or slurmstepd.

Killing: freeze the job's cgroups that can freeze (v1 freezer.state, v2
cgroup.freeze) and SIGSTOP every other process found, re-scanning until a
scan finds nothing new: once all are stopped none can fork or respawn a
child. Then SIGKILL each through a pidfd checked against the process's start
time (a recycled pid is never hit), cgroup.kill where the kernel has it,
thaw, wait, and scan once more. What still lives at the deadline is in
uninterruptible sleep (state D): it is reported, not waited on forever.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.procfs import PROC, ProcStat, pids, read_stat, real_uid

from .jobrecord import JobRecord, cgroup_paths

__all__ = ["JobProcess", "Cleanup", "find_job_processes", "kill_job", "protected_pids", "gpu_process_of",
           "kill_process"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_KTHREADD = 2
_SLURM_BINARIES = frozenset({"slurmd", "slurmstepd"})
#: stop rounds: each round stops what the last scan found new; a fork bomb cannot outrun this forever
_MAX_STOP_ROUNDS = 50
_POLL = 0.005
_JOB_IN_CGROUP = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)


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


def find_job_processes(job: JobRecord, *, sweep_uid: bool, protected: frozenset[int], proc: Path = PROC,
                       cgroup_root: Path = CGROUP_ROOT) -> list[JobProcess]:
    """Every live process tied to `job` now (one pass over /proc)."""
    in_cgroup = _cgroup_members(_job_cgroups(job, cgroup_root))
    tied: dict[int, JobProcess] = {}
    family: list[tuple[int, ProcStat, int]] = []  # (pid, stat, uid): the job user's processes not tied yet
    for pid in pids(proc):
        if pid in protected or pid == _KTHREADD:
            continue
        stat = read_stat(pid, proc)
        if stat is None or stat.state in ("Z", "X") or stat.ppid == _KTHREADD:
            continue
        uid = real_uid(pid, proc)
        if uid is None:
            continue
        if uid == 0 and _runs_slurm_daemon(pid, proc):
            continue
        env_job = _environ_job(pid, proc)
        if pid in in_cgroup:
            tie = "cgroup"
        elif env_job == job.job_id and not _in_other_job_cgroup(pid, job.job_id, proc):
            tie = "environ"
        elif env_job is None and uid == job.uid and uid != 0:
            if sweep_uid and not _in_other_job_cgroup(pid, job.job_id, proc):
                tie = "uid"
            else:
                family.append((pid, stat, uid))
                continue
        else:
            continue
        tied[pid] = JobProcess(pid, stat.starttime, uid, stat.comm, tie)
    _add_family(tied, family, job, protected, proc)
    return list(tied.values())


def _add_family(tied: dict[int, JobProcess], family: list, job: JobRecord, protected: frozenset[int],
                proc: Path) -> None:
    """Tie the job user's processes whose parent, session or group is the job's (to a fixed point)."""
    if not family or not tied:
        return
    protected_groups = set()
    for pid in protected:
        stat = read_stat(pid, proc)
        if stat:
            protected_groups |= {stat.session, stat.pgrp}
    groups = set()
    for process in tied.values():
        stat = read_stat(process.pid, proc)
        if stat:
            groups |= {stat.session, stat.pgrp} - protected_groups
    changed = True
    while changed and family:
        changed = False
        for entry in list(family):
            pid, stat, uid = entry
            if stat.ppid in tied or stat.session in groups or stat.pgrp in groups:
                family.remove(entry)
                if _in_other_job_cgroup(pid, job.job_id, proc):
                    continue
                tied[pid] = JobProcess(pid, stat.starttime, uid, stat.comm, "family")
                groups |= {stat.session, stat.pgrp} - protected_groups
                changed = True


def kill_job(job: JobRecord, *, sweep_uid: bool, protected: frozenset[int], timeout: float, proc: Path = PROC,
             cgroup_root: Path = CGROUP_ROOT) -> Cleanup:
    """Stop, kill and verify every process of `job`; remove its emptied cgroups."""
    started = time.monotonic()
    deadline = started + timeout

    def scan() -> list[JobProcess]:
        return find_job_processes(job, sweep_uid=sweep_uid, protected=protected, proc=proc,
                                  cgroup_root=cgroup_root)

    cgroups = _job_cgroups(job, cgroup_root)
    frozen = [d for d in cgroups if _freeze(d, True)]
    stopped: dict[int, JobProcess] = {}
    for _ in range(_MAX_STOP_ROUNDS):
        new = [p for p in scan() if p.pid not in stopped]
        if not new:
            break
        for process in new:
            if _signal(process, signal.SIGSTOP, proc):
                stopped[process.pid] = process
    for process in stopped.values():
        _signal(process, signal.SIGKILL, proc)
    for directory in cgroups:
        _write(directory / "cgroup.kill", "1")
    for directory in frozen:
        _freeze(directory, False)
    alive = list(stopped.values())
    while True:
        alive = [p for p in alive if _alive(p, proc)]
        if not alive:
            again = scan()
            if not again:
                break
            for process in again:
                stopped[process.pid] = process
                _signal(process, signal.SIGKILL, proc)
            alive = again
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    survivors = tuple((p, _state(p, proc)) for p in alive if _alive(p, proc))
    return Cleanup(found=tuple(stopped.values()), survivors=survivors, seconds=time.monotonic() - started,
                   cgroups_removed=0 if survivors else _remove_cgroups(cgroups))


def gpu_process_of(job: JobRecord, pid: int, protected: frozenset[int], proc: Path = PROC,
                   cgroup_root: Path = CGROUP_ROOT) -> JobProcess | None:
    """`pid`, listed by NVML on one of the job's GPUs, when it is the job's.

    Slurm gives a job its GPUs alone (gres), so a process of the job's user on
    one of them is the job's, unless it carries another job's SLURM_JOB_ID or
    sits in another job's cgroup; cgroup and environ tie it as anywhere.
    """
    stat = read_stat(pid, proc)
    uid = real_uid(pid, proc)
    if pid in protected or stat is None or uid is None or stat.state in ("Z", "X"):
        return None
    if uid == 0 and _runs_slurm_daemon(pid, proc):
        return None
    env_job = _environ_job(pid, proc)
    if pid in _cgroup_members(_job_cgroups(job, cgroup_root)):
        tie = "cgroup"
    elif env_job == job.job_id and not _in_other_job_cgroup(pid, job.job_id, proc):
        tie = "environ"
    elif env_job is None and uid == job.uid and uid != 0 and not _in_other_job_cgroup(pid, job.job_id, proc):
        tie = "gpu"
    else:
        return None
    return JobProcess(pid, stat.starttime, uid, stat.comm, tie)


def kill_process(process: JobProcess, proc: Path = PROC) -> bool:
    """SIGKILL the very process that was found; False when it is already gone."""
    return _signal(process, signal.SIGKILL, proc)


# -- evidence ------------------------------------------------------------------------


def _job_cgroups(job: JobRecord, cgroup_root: Path) -> list[Path]:
    """The job's cgroup directories that exist, recorded at the Prolog or computed now."""
    places = dict.fromkeys([*map(Path, job.cgroups), *cgroup_paths(job.job_id, job.uid, job.node, cgroup_root)])
    return [p for p in places if p.is_dir()]


def _cgroup_members(directories: list[Path]) -> set[int]:
    members: set[int] = set()
    for top in directories:
        for directory, _, _ in os.walk(top):
            try:
                with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                    members.update(int(line) for line in f.read().split())
            except (OSError, ValueError):
                continue
    return members


def _environ_job(pid: int, proc: Path) -> int | None:
    """The SLURM_JOB_ID in the process's environment, if it has one."""
    try:
        with open(f"{os.fspath(proc)}/{pid}/environ", "rb") as f:
            data = b"\0" + f.read()
    except OSError:
        return None
    at = data.find(b"\0SLURM_JOB_ID=")
    if at < 0:
        return None
    value = data[at + 14:data.find(b"\0", at + 1) if data.find(b"\0", at + 1) > 0 else None]
    return int(value) if value.isdigit() else None


def _in_other_job_cgroup(pid: int, job_id: int, proc: Path) -> bool:
    try:
        data = (proc / str(pid) / "cgroup").read_bytes()
    except OSError:
        return False
    return any(int(found) != job_id for found in _JOB_IN_CGROUP.findall(data))


def _runs_slurm_daemon(pid: int, proc: Path) -> bool:
    try:
        exe = os.readlink(proc / str(pid) / "exe")
    except OSError:
        return False
    return os.path.basename(exe.removesuffix(" (deleted)")) in _SLURM_BINARIES


# -- acting ------------------------------------------------------------------------


def _alive(process: JobProcess, proc: Path) -> bool:
    stat = read_stat(process.pid, proc)
    return stat is not None and stat.starttime == process.starttime and stat.state not in ("Z", "X")


def _state(process: JobProcess, proc: Path) -> str:
    stat = read_stat(process.pid, proc)
    return stat.state if stat else "gone"


def _signal(process: JobProcess, signum: int, proc: Path) -> bool:
    """Signal the very process that was found; False when it is gone."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:
        return False
    try:
        stat = read_stat(process.pid, proc)  # the pidfd pins the pid: check it is still the same process
        if stat is None or stat.starttime != process.starttime or stat.state in ("Z", "X"):
            return False
        signal.pidfd_send_signal(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _freeze(directory: Path, frozen: bool) -> bool:
    """Freeze (or thaw) a cgroup; False when it cannot freeze."""
    if (directory / "cgroup.freeze").exists():
        return _write(directory / "cgroup.freeze", "1" if frozen else "0")
    state = directory / "freezer.state"
    if not state.exists() or not _write(state, "FROZEN" if frozen else "THAWED"):
        return False
    deadline = time.monotonic() + 1.0  # FREEZING settles in milliseconds; never wait on it for long
    while frozen and time.monotonic() < deadline:
        try:
            if state.read_text().strip() == "FROZEN":
                break
        except OSError:
            break
        time.sleep(_POLL)
    return True


def _write(path: Path, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


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

"""What the Epilog needs to know about a job and cannot learn once the job is gone.

The Prolog writes one record per job into `<node.state_dir>/jobs/<id>.json`
(atomically: a crash never leaves half a record); the Epilog reads it and
removes it when it is done. By the Epilog, Slurm has already torn down the
job's cgroups and its processes may have dropped SLURM_JOB_ID from their
environment, so the uid, the GPUs and the cgroup paths must be kept from the
start.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from slurm_ext.errors import SlurmExtError
from slurm_ext.fileio import atomic_write
from slurm_ext.procfs import PROC, pids

__all__ = ["JobRecord", "JobEnvironmentError", "from_environ", "job_id_of", "write", "read", "remove", "other_jobs",
           "cgroup_paths", "cgroup_places", "uid_lock", "recorded_jobs", "gpu_jobs", "running_jobs", "STARTING_GRACE"]

#: a record younger than this counts as a live job even before its steps run (seconds)
STARTING_GRACE = 300.0
#: how often a waiter for the uid lock tries again (seconds)
_LOCK_POLL = 0.005


class JobEnvironmentError(SlurmExtError):
    """The hook's environment lacks, or garbles, a variable slurmd always sets."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: int
    uid: int
    gid: int
    user: str
    node: str
    #: node-local GPU indexes allocated to the job (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES)
    gpus: tuple[int, ...]
    #: seconds since the epoch, when the Prolog ran
    start: float
    #: where the job's cgroup directories are, or will be, on this host
    cgroups: tuple[str, ...]


#: the record's fields, in the order the dataclass defines them (what `write` stores)
_FIELDS = tuple(f.name for f in fields(JobRecord))


def from_environ(env: dict[str, str], cgroup_root: Path = Path("/sys/fs/cgroup"),
                 now: float | None = None) -> JobRecord:
    """The record of the job whose Prolog runs with environment `env`.

    Raises:
        JobEnvironmentError: SLURM_JOB_ID, SLURM_JOB_UID or SLURM_JOB_GID is
            missing or not a number (the hook was not started by slurmd).
    """
    job_id, uid, gid = (_integer(env, name) for name in ("SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_GID"))
    node = env.get("SLURMD_NODENAME", "")
    gpus_text = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    try:
        gpus = tuple(int(g) for g in gpus_text.split(",") if g.strip())
    except ValueError:
        raise JobEnvironmentError(f"SLURM_JOB_GPUS={gpus_text!r}: expected GPU indexes such as 0,1") from None
    return JobRecord(job_id=job_id, uid=uid, gid=gid, user=env.get("SLURM_JOB_USER", str(uid)), node=node,
                     gpus=gpus, start=time.time() if now is None else now,
                     cgroups=tuple(_places(_hierarchies(cgroup_root), job_id, uid, node)))


def job_id_of(env: dict[str, str]) -> int:
    """SLURM_JOB_ID of a hook's environment.

    Raises:
        JobEnvironmentError: missing or not a number.
    """
    return _integer(env, "SLURM_JOB_ID")


def _integer(env: dict[str, str], name: str) -> int:
    value = env.get(name)
    if value is None or not value.isdigit():
        raise JobEnvironmentError(f"{name}={value!r}: slurmd sets it to a number for every Prolog and Epilog; "
                                  "was this hook started by hand?")
    return int(value)


def cgroup_paths(job_id: int, uid: int, node: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """Where Slurm puts (or has put) the job's cgroups on this host's hierarchies.

    With PrologFlags=Contain the Prolog runs before the extern step makes
    them, so these are the places to look, existing or not: for each cgroup v1
    hierarchy <controller>/slurm_<node>/uid_<uid>/job_<id> (Debian builds with
    MULTIPLE_SLURMD) and <controller>/slurm/uid_<uid>/job_<id>; for a cgroup v2
    hierarchy system.slice/<node>_slurmstepd.scope/job_<id> (MULTIPLE_SLURMD) and
    system.slice/slurmstepd.scope/job_<id>.
    """
    return [Path(p) for p in cgroup_places(job_id, uid, node, cgroup_root)]


def cgroup_places(job_id: int, uid: int, node: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """cgroup_paths as plain strings, for the Epilog's hot path (a Path costs more than the stat of it)."""
    return _places(_hierarchies(cgroup_root), job_id, uid, node)


def _hierarchies(cgroup_root: Path) -> list[tuple[str, bool]]:
    """(mount, is cgroup v2) of each cgroup hierarchy under `cgroup_root`, in name order.

    Plain strings and one directory listing, not pathlib: every Prolog and
    Epilog asks, and a v1 host has a dozen hierarchies.
    """
    root = os.fspath(cgroup_root)
    if os.path.isfile(f"{root}/cgroup.controllers"):
        return [(root, True)]  # pure v2: its subdirectories are cgroups, not hierarchies
    try:
        with os.scandir(root) as entries:  # v1 or hybrid: one per mount
            mounts = sorted(entry.path for entry in entries if entry.is_dir())
    except OSError:
        return []
    found = []
    for mount in mounts:
        if os.path.isfile(f"{mount}/cgroup.controllers"):
            found.append((mount, True))
        elif os.path.isfile(f"{mount}/cgroup.procs"):
            found.append((mount, False))
    return found


def _places(hierarchies: list[tuple[str, bool]], job_id: int, uid: int, node: str) -> list[str]:
    """cgroup_paths as strings, for hierarchies already found."""
    found = []
    for mount, v2 in hierarchies:
        if v2:
            found += [f"{mount}/system.slice/{node}_slurmstepd.scope/job_{job_id}",
                      f"{mount}/system.slice/slurmstepd.scope/job_{job_id}"]
        else:
            found += [f"{mount}/slurm_{node}/uid_{uid}/job_{job_id}", f"{mount}/slurm/uid_{uid}/job_{job_id}"]
    return found


def _path(state_dir: str, job_id: int) -> str:
    return f"{state_dir}/jobs/{job_id}.json"


def write(record: JobRecord, state_dir: str) -> Path:
    """Write the record atomically; the directory is root's only.

    No fsync: the record must outlive a crash of the hook service (or of
    the Python hook) between the Prolog and the Epilog, and once write()
    and rename() have returned it is in the kernel's page cache, which a
    process crash does not touch. Only a kernel crash or a power loss can
    lose it, and either reboots the node, which ends every job on it: all
    records are stale then (older than the boot, `other_jobs` drops them),
    and an empty or missing one reads as no record. An fsync would cost a
    disk flush on every job start for nothing. A full disk still fails the
    write itself (local filesystems reserve the blocks at write()).
    """
    path = _path(state_dir, record.job_id)
    text = json.dumps({name: getattr(record, name) for name in _FIELDS}, sort_keys=True) + "\n"
    try:
        return atomic_write(path, text, mode=0o600, fsync="none")
    except FileNotFoundError:  # the first record on this node: make the directory, once
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        return atomic_write(path, text, mode=0o600, fsync="none")


def read(job_id: int, state_dir: str) -> JobRecord | None:
    """The job's record, or None when the Prolog left none (or it is unreadable)."""
    try:
        with open(_path(state_dir, job_id), "rb") as f:
            data = json.loads(f.read())
        return JobRecord(**{**data, "gpus": tuple(data["gpus"]), "cgroups": tuple(data["cgroups"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def remove(job_id: int, state_dir: str) -> None:
    try:
        os.unlink(_path(state_dir, job_id))
    except FileNotFoundError:
        pass


def other_jobs(record: JobRecord, state_dir: str, since: float = 0.0, *,
               alive: Callable[[JobRecord], bool] | None = None, now: float | None = None,
               cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[list[int], list[int]]:
    """(live, stale): ids of the other jobs of the same user on this node, and of dead jobs' records.

    Live: a record younger than STARTING_GRACE (its steps may not run yet),
    or one whose job `alive` says runs here (default: it has a slurmstepd or
    a cgroup on this node; with PrologFlags=Contain every running job has its
    extern step); and a job of the uid that has a cgroup here but no record
    (its Prolog could not write one). Stale: records older than `since` (the
    kernel's boot: a reboot ended the job before its Epilog) or of jobs that
    are gone; they are removed, so one lost Epilog does not turn the user's
    uid sweep off until the next reboot.
    """
    now = time.time() if now is None else now
    running: set[int] | None = None
    hierarchies = _hierarchies(cgroup_root)  # once for every record

    def runs_here(other: JobRecord) -> bool:  # the cgroup first; /proc is read once, and only if needed
        nonlocal running
        if any(os.path.isdir(p) for p in _places(hierarchies, other.job_id, other.uid, other.node)):
            return True
        if running is None:
            running = running_jobs()
        return other.job_id in running

    alive = alive or runs_here
    live, stale = set(), []
    for job_id in recorded_jobs(state_dir) - {record.job_id}:
        other = read(job_id, state_dir)
        if other is None or other.uid != record.uid:
            continue
        if other.start >= since and (now - other.start < STARTING_GRACE or alive(other)):
            live.add(other.job_id)
        else:
            remove(other.job_id, state_dir)
            stale.append(other.job_id)
    live |= _uid_job_cgroups(record, hierarchies)
    return sorted(live), sorted(stale)


def gpu_jobs(state_dir: str) -> dict[int, list[int]]:
    """GPU index -> the jobs recorded here that hold it (what a GPU fault is attributed to); -1 -> every job."""
    held: dict[int, list[int]] = {-1: []}
    for job_id in sorted(recorded_jobs(state_dir)):
        record = read(job_id, state_dir)
        if record is None:
            continue
        held[-1].append(job_id)
        for gpu in record.gpus:
            held.setdefault(gpu, []).append(job_id)
    return held


def recorded_jobs(state_dir: str) -> set[int]:
    """Ids of the jobs that have a record here."""
    try:
        names = os.listdir(f"{state_dir}/jobs")
    except OSError:
        return set()
    return {int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()}


def running_jobs(job_ids: set[int] | None = None, proc: Path = PROC) -> set[int]:
    """Ids of the jobs that have a slurmstepd on this node now (of `job_ids` only, when given).

    slurmstepd names itself `slurmstepd: [<job>.<step>]` in its command line;
    anyone can name a process so (`exec -a`), so only root's processes whose
    program is slurmstepd count.
    """
    found = set()
    for pid in pids(proc):
        base = f"{os.fspath(proc)}/{pid}"
        try:
            fd = os.open(f"{base}/cmdline", os.O_RDONLY | os.O_CLOEXEC)  # not open(): once per process
            try:
                head = os.read(fd, 64)
            finally:
                os.close(fd)
            if not head.startswith(b"slurmstepd: ["):
                continue
            if os.stat(base).st_uid != 0 or \
                    os.path.basename(os.readlink(f"{base}/exe").removesuffix(" (deleted)")) != "slurmstepd":
                continue
        except OSError:
            continue
        job = head[13:].split(b".", 1)[0].split(b"]", 1)[0]
        if job.isdigit() and (job_ids is None or int(job) in job_ids):
            found.add(int(job))
    return found


def _uid_job_cgroups(record: JobRecord, hierarchies: list[tuple[str, bool]]) -> set[int]:
    """Other jobs of the uid by their v1 cgroups (slurm[_<node>]/uid_<uid>/job_<id>), record or not."""
    found = set()
    for mount, v2 in hierarchies:
        if v2:
            continue
        for top in (f"{mount}/slurm_{record.node}", f"{mount}/slurm"):
            try:
                names = os.listdir(f"{top}/uid_{record.uid}")
            except OSError:  # missing, the usual case
                continue
            found.update(int(name[4:]) for name in names if name.startswith("job_") and name[4:].isdigit())
    return found - {record.job_id}


@contextlib.contextmanager
def uid_lock(state_dir: str, uid: int, timeout: float) -> Iterator[bool]:
    """Hold the uid's lock: the Prolog while it writes its record, the Epilog while it decides
    and does what "the user has no other job here" allows (the uid sweep, removing every IPC
    object). Without it a Prolog of the same user can start a job between the Epilog's look at
    the records and its sweep, and that job loses its processes and its shared memory.

    Yields True when held, False when it could not be had within `timeout` (or the lock file
    cannot be made: a full disk) -- the caller goes on, a lost lock must not wedge the node.
    """
    directory = f"{state_dir}/jobs"
    try:
        fd = _open_lock(f"{directory}/.uid-{uid}.lock")
    except FileNotFoundError:  # the first hook on this node
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = _open_lock(f"{directory}/.uid-{uid}.lock")
        except OSError:
            fd = None
    except OSError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(_LOCK_POLL)
        yield held
    finally:
        os.close(fd)  # closing releases the lock


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

"""What the Epilog needs to know about a job and cannot learn once the job is gone.

The Prolog writes one record per job into `<node.state_dir>/jobs/<id>.json`
(atomically: a crash never leaves half a record); the Epilog reads it and
removes it when it is done. By the Epilog, Slurm has already torn down the
job's cgroups and its processes may have dropped SLURM_JOB_ID from their
environment, so the uid, the GPUs and the cgroup paths must be kept from the
start.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_ext.errors import SlurmExtError

__all__ = ["JobRecord", "JobEnvironmentError", "from_environ", "job_id_of", "write", "read", "remove", "other_jobs",
           "cgroup_paths"]


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
                     cgroups=tuple(str(p) for p in cgroup_paths(job_id, uid, node, cgroup_root)))


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
    if (cgroup_root / "cgroup.controllers").is_file():
        hierarchies = [cgroup_root]  # pure v2: its subdirectories are cgroups, not hierarchies
    elif cgroup_root.is_dir():
        hierarchies = sorted(p for p in cgroup_root.iterdir() if p.is_dir())  # v1 or hybrid: one per mount
    else:
        hierarchies = []
    found: list[Path] = []
    for hierarchy in hierarchies:
        if (hierarchy / "cgroup.controllers").is_file():
            found += [hierarchy / "system.slice" / f"{node}_slurmstepd.scope" / f"job_{job_id}",
                      hierarchy / "system.slice" / "slurmstepd.scope" / f"job_{job_id}"]
        elif (hierarchy / "cgroup.procs").is_file():
            found += [hierarchy / f"slurm_{node}" / f"uid_{uid}" / f"job_{job_id}",
                      hierarchy / "slurm" / f"uid_{uid}" / f"job_{job_id}"]
    return found


def _path(state_dir: str, job_id: int) -> Path:
    return Path(state_dir) / "jobs" / f"{job_id}.json"


def write(record: JobRecord, state_dir: str) -> Path:
    """Write the record atomically (temp file, fsync, rename); the directory is root's only."""
    path = _path(state_dir, record.job_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(asdict(record), sort_keys=True).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read(job_id: int, state_dir: str) -> JobRecord | None:
    """The job's record, or None when the Prolog left none (or it is unreadable)."""
    try:
        data = json.loads(_path(state_dir, job_id).read_text())
        return JobRecord(**{**data, "gpus": tuple(data["gpus"]), "cgroups": tuple(data["cgroups"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def remove(job_id: int, state_dir: str) -> None:
    _path(state_dir, job_id).unlink(missing_ok=True)


def other_jobs(record: JobRecord, state_dir: str, since: float = 0.0) -> list[int]:
    """Ids of the other jobs of the same user on this node, by their records.

    Records older than `since` (the kernel's boot) are left by jobs that a
    reboot ended before their Epilog: they do not count.
    """
    found = []
    for path in (Path(state_dir) / "jobs").glob("*.json"):
        if not path.stem.isdigit() or int(path.stem) == record.job_id:
            continue
        other = read(int(path.stem), state_dir)
        if other is not None and other.uid == record.uid and other.start >= since:
            found.append(other.job_id)
    return sorted(found)

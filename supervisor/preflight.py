"""What a worker container needs before slurmd can join: checked at start, each lack said with its remedy.

slurmd itself says `fatal: auth/slurm: cannot stat '/etc/slurm/slurm.key'` and exits, and under a
supervisor that restarts it the container's log fills with the same line. The agent says once, as an
event, what is missing and which mount or flag provides it; it still starts slurmd (whose own words
follow) and keeps retrying, so a key mounted late is picked up without a new pod.
"""

from __future__ import annotations

import stat
from pathlib import Path

__all__ = ["problems"]

#: auth/slurm's key (Slurm >= 23.11) and munged's socket: slurmd needs one of them to say anything
SLURM_KEY = Path("/etc/slurm/slurm.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def problems(root: Path = Path("/"), daemon: str = "slurmd", munged_here: bool = False) -> list[str]:
    """One line per thing `daemon` lacks to authenticate; [] when it has it.

    `munged_here`: the agent runs munged itself, whose socket appears only once it has started.
    """
    key = root / SLURM_KEY.relative_to("/")
    munge = root / MUNGE_SOCKET.relative_to("/")
    try:
        info = key.stat()
    except FileNotFoundError:
        if munged_here or munge.exists():
            return []
        return [f"no Slurm authentication for {daemon}: {SLURM_KEY} is missing (auth/slurm: mount the cluster's "
                f"key there, owner slurm, mode 0600; Slinky: the slurmKeyRef Secret; Docker: -v "
                f"KEY:{SLURM_KEY}:ro) and munged's socket {MUNGE_SOCKET} is not there (auth/munge: mount the "
                "host's /run/munge, or run munged here: [supervisor.workers.munged] roles = [ROLE])"]
    except OSError as err:
        return [f"{daemon} cannot use {SLURM_KEY}: {err.strerror}; check the mount that provides it"]
    if not stat.S_ISREG(info.st_mode):
        return [f"{SLURM_KEY} is not a regular file: mount the key file itself, not a directory"]
    if info.st_mode & 0o077:
        return [f"{SLURM_KEY} has mode {stat.S_IMODE(info.st_mode):04o}: Slurm refuses a key others can read; "
                "make it 0600 (a Kubernetes Secret volume: defaultMode: 0600)"]
    return []

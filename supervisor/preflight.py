"""What a worker container needs before slurmd can join: checked at start, each lack said with its remedy.

slurmd itself says `fatal: auth/slurm: cannot stat '/etc/slurm/slurm.key'` and exits, and under a
supervisor that restarts it the container's log fills with the same line. The agent says once, as an
event, what is missing and which mount or flag provides it; it still starts slurmd (whose own words
follow) and keeps retrying, so a key mounted late is picked up without a new pod.

A key that is there but guessable (`key_refusal`: shorter than 32 bytes, or an example's placeholder
such as the REPLACE-ME... once shipped in the Slinky manifests) is refused instead where it is what
authenticates (auth/slurm): with it anyone can forge Slurm credentials as root on every node, so the
daemon is not started until the key is replaced. Beside munge such a key is unused, and only warned of.
"""

from __future__ import annotations

import stat
from pathlib import Path

from slurm_ext.weaksecret import weakness

__all__ = ["problems", "key_refusal", "MIN_KEY_BYTES"]

#: auth/slurm's key (Slurm >= 23.11) and munged's socket: slurmd needs one of them to say anything
SLURM_KEY = Path("/etc/slurm/slurm.key")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
#: the shortest slurm.key taken: 256 bits (Slurm's docs make 1 KiB of random bytes)
MIN_KEY_BYTES = 32
#: more than any key: what is read of the file to judge it
_READ_AT_MOST = 1 << 20


def problems(root: Path = Path("/"), daemon: str = "slurmd", munged_here: bool = False) -> list[str]:
    """One line per thing `daemon` lacks to authenticate, or a guessable slurm.key that munge makes unused; [] when
    it has what it needs.

    `munged_here`: the agent runs munged itself, whose socket appears only once it has started.
    """
    key = root / SLURM_KEY.relative_to("/")
    try:
        info = key.stat()
    except FileNotFoundError:
        if _munge_authenticates(root, munged_here):
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
    why = _key_weakness(root)
    if why is not None and _munge_authenticates(root, munged_here):
        return [f"{SLURM_KEY} {why}; it is not used while munge authenticates, but anyone who knows it could forge "
                f"Slurm credentials as root if AuthType became auth/slurm: remove it, or make a new one (`head -c "
                f"1024 /dev/urandom > slurm.key`)"]
    return []


def key_refusal(root: Path = Path("/"), daemon: str = "slurmd", munged_here: bool = False) -> str | None:
    """Why `daemon` must not start with the slurm.key there (too short, or a placeholder) when that key is what
    authenticates (auth/slurm: no munged socket, and the agent runs no munged); None when it may, or when there is
    no key to judge. Beside munge a weak key is unused: problems() warns of it, and a site with a stale
    placeholder key is not kept from starting slurmd."""
    why = _key_weakness(root)
    if why is None or _munge_authenticates(root, munged_here):
        return None
    return (f"{SLURM_KEY} {why}: anyone who knows it can forge Slurm credentials as root on every node; {daemon} "
            f"is not started with it. Make a new key (`head -c 1024 /dev/urandom > slurm.key`; Slinky: the "
            f"slurm-key Secret, containers/slinky/create-secrets.sh) and give it to every node and the controller")


def _munge_authenticates(root: Path, munged_here: bool) -> bool:
    """Whether munge is there to authenticate: the agent runs munged, or its socket is mounted in."""
    return munged_here or (root / MUNGE_SOCKET.relative_to("/")).exists()


def _key_weakness(root: Path) -> str | None:
    """What makes the slurm.key there guessable (weaksecret.weakness); None when it is not, or there is no key that
    can be read (problems() says what is missing)."""
    key = root / SLURM_KEY.relative_to("/")
    try:
        if not key.is_file():  # missing, or not a file: problems() says so
            return None
        with open(key, "rb") as f:
            text = f.read(_READ_AT_MOST)
    except OSError:  # unreadable: problems() says so, and slurmd will too
        return None
    return weakness(text, MIN_KEY_BYTES)

"""The durability guard: `slurm-ext accounting check-storage`, a start step before mariadbd and slurmctld.

The failure it exists to prevent is quiet: a pod rescheduled onto an empty
volume, or a volume mounted a moment too late, and MariaDB initialises a new
empty database (or slurmctld a new StateSaveLocation) where the history was.
Everything works, and months of accounting are gone. So before either
daemon starts, each guarded directory must be

- on storage that outlives the container: not tmpfs/ramfs (memory), not the
  container's own overlay layer;
- writable, with an fsync that works (MariaDB and slurmctld's dbd.messages
  rely on it), and with `min_free` MiB free;
- the same volume as before: its identity marker (cluster, creation time, a
  random id), written at first initialisation, is there whenever its data is,
  names this cluster, and agrees with the other guarded volume's when this
  host sees both (the database's and StateSaveLocation: one id for the pair,
  so a database restored or re-created out of step with slurmctld's state,
  Slurm's CLUSTER ID MISMATCH, is caught before slurmctld meets it).

A database marker with no database beside it, or an empty volume whose
partner says it was initialised, is refused: it is a volume that was replaced or lost, and the
fix (mount the right one, or restore a backup) is the operator's to make.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import secrets
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from slurm_ext import fileio, procfs
from slurm_ext.errors import SlurmExtError

log = logging.getLogger("accounting")

__all__ = ["MARKER_NAME", "MEMORY_FS", "EPHEMERAL_NOTE", "Volume", "Identity", "StorageCheck", "StorageRefused", "check",
           "commit", "filesystem_of", "free_mib", "SpaceWatch"]

#: the identity marker's file name, at the top of each guarded volume
MARKER_NAME = "slurm-ext-volume.json"
#: file systems whose content dies with the host's memory or with the container
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
_CONTAINER_FS = frozenset({"overlay", "aufs", "fuse-overlayfs"})
#: what every line of a guard told to accept ephemeral storage starts with
EPHEMERAL_NOTE = "EPHEMERAL STORAGE ALLOWED (allow_ephemeral, for demos): accounting history is lost with it"
_VOLUME_HINT = "mount a persistent volume there (Docker: -v NAME:{path}; Kubernetes: a PersistentVolumeClaim)"


class StorageRefused(SlurmExtError):
    """A guarded directory is not fit to hold accounting data; the message says what and how to fix it."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class Identity:
    """A volume's identity marker: which cluster, when first initialised, and the pair's random id."""

    cluster: str
    id: str
    created: str
    #: database or state
    kind: str
    #: marked together with its partner (one host saw both): an empty partner is then a replaced one, not a
    #: first start (a controller may mark StateSaveLocation before the database exists)
    paired: bool = False

    def describe(self) -> str:
        return f"cluster {self.cluster!r}, id {self.id}, initialised {self.created}"


@dataclass(frozen=True, slots=True)
class Volume:
    """A guarded directory: the database's volume (its datadir inside) or slurmctld's StateSaveLocation."""

    #: database or state
    kind: str
    path: Path
    marker: Path
    #: files or directories whose presence means the volume holds data
    data: tuple[Path, ...]

    @property
    def name(self) -> str:
        return "the accounting database volume" if self.kind == "database" else "StateSaveLocation"

    def has_data(self) -> bool:
        return any(p.exists() for p in self.data)


@dataclass
class StorageCheck:
    """What check() found: notes to log, and the markers commit() writes once the start goes ahead."""

    notes: list[str] = field(default_factory=list)
    #: (volume, identity) still to be written: first initialisation, or a volume that predates the guard
    to_mark: list[tuple[Volume, Identity]] = field(default_factory=list)
    #: every guarded volume's identity, once committed
    identities: dict[str, Identity] = field(default_factory=dict)


def check(volumes: list[Volume], cluster: str, min_free_mib: int, allow_ephemeral: bool = False,
          mountinfo: Path = Path("/proc/self/mountinfo")) -> StorageCheck:
    """Check every volume in `volumes` (those this host has), and their markers against each other.

    Writes nothing but a probe file (removed again) and the directories themselves when missing.

    Raises:
        StorageRefused: the first thing found wrong, with what to do about it.
    """
    verdict = StorageCheck()
    prefix = f"{EPHEMERAL_NOTE}: " if allow_ephemeral else ""
    for volume in volumes:
        _check_filesystem(volume, allow_ephemeral, mountinfo, verdict, prefix)
        _check_writes(volume)
        _check_free(volume, min_free_mib)
    markers = {v.kind: _read_marker(v) for v in volumes}
    for volume in volumes:
        _check_marker(volume, markers[volume.kind], cluster)
    if len(volumes) == 2 and all(markers.values()) and markers["database"].id != markers["state"].id:
        one, two = volumes
        raise StorageRefused(
            f"the accounting database and StateSaveLocation disagree: {one.marker} says "
            f"{markers[one.kind].describe()}, {two.marker} says {markers[two.kind].describe()}. One of them was "
            f"re-created or restored without the other (slurmctld would stop on CLUSTER ID MISMATCH, or reuse job "
            f"ids): mount the pair that belongs together, or restore both from the same point")
    _plan_markers(volumes, markers, cluster, verdict, prefix)
    for volume in volumes:
        verdict.notes.append(f"{prefix}{volume.name} {volume.path}: OK ({filesystem_of(volume.path, mountinfo)})")
    return verdict


def _check_marker(volume: Volume, found: Identity | None, cluster: str) -> None:
    if found is None:
        return
    if found.cluster != cluster:
        raise StorageRefused(
            f"{volume.name} {volume.path} belongs to another cluster: its marker {volume.marker} says "
            f"{found.describe()}, this is cluster {cluster!r}. Two clusters must not share a database or a "
            f"StateSaveLocation: mount this cluster's volume, or fix accounting.cluster / ClusterName")
    # StateSaveLocation is marked before slurmctld first writes to it: only the database (initialised
    # before its marker is written) has data whenever it has a marker
    if volume.kind == "database" and not volume.has_data():
        raise StorageRefused(
            f"{volume.name} {volume.path} was initialised before ({found.describe()}) but its data is gone "
            f"(no {', '.join(p.name for p in volume.data)}): the volume was replaced, emptied or mounted wrong. "
            f"Refusing to initialise an empty one over the history: mount the right volume; to start over on "
            f"purpose, remove {volume.marker}")


def _plan_markers(volumes: list[Volume], markers: dict[str, Identity | None], cluster: str, verdict: StorageCheck,
                  prefix: str) -> None:
    """The markers to write: a new one takes the pair's id (its partner's, or one made for both now), and is
    paired when this host sees both volumes; a partner marked alone becomes paired too."""
    both = len(volumes) == 2
    shared = next((m for m in markers.values() if m is not None), None)
    for volume in volumes:
        found = markers[volume.kind]
        if found is not None:
            verdict.identities[volume.kind] = found
            if both and not found.paired:
                verdict.to_mark.append((volume, dataclasses.replace(found, paired=True)))
            continue
        partner = next((v for v in volumes if v is not volume), None)
        if not volume.has_data() and partner is not None and (known := markers[partner.kind]) and known.paired:
            raise StorageRefused(
                f"{volume.name} {volume.path} is empty, but {partner.name} {partner.path} was initialised with it "
                f"({known.describe()}): this volume was replaced by an empty one or lost. Refusing to initialise "
                f"it: mount the right volume (to start this one over on purpose, remove {partner.marker}: the "
                f"pair is then marked anew)")
        identity = Identity(cluster, shared.id if shared else secrets.token_hex(8),
                            shared.created if shared else _now(), volume.kind, paired=both)
        shared = shared or identity
        verdict.to_mark.append((volume, identity))
        verdict.notes.append(f"{prefix}{volume.name} {volume.path}: "
                             + ("holds data from before slurm-ext guarded it: marking it as "
                                if volume.has_data() else "first initialisation: marking it as ")
                             + identity.describe())


def commit(verdict: StorageCheck) -> None:
    """Write the markers check() decided on (after the database's first initialisation succeeded).

    Raises:
        StorageRefused: a marker cannot be written.
    """
    # StateSaveLocation's first: a database marker alone would make the next start take the unmarked
    # state for a replaced one
    for volume, identity in sorted(verdict.to_mark, key=lambda pair: pair[0].kind != "state"):
        try:
            fileio.atomic_write(volume.marker, json.dumps(asdict(identity), indent=1) + "\n", mode=0o644)
        except OSError as err:
            raise StorageRefused(f"cannot write the identity marker {volume.marker}: {err.strerror}") from None
        verdict.identities[volume.kind] = identity
    verdict.to_mark = []


def _read_marker(volume: Volume) -> Identity | None:
    try:
        data = json.loads(volume.marker.read_text())
        return Identity(**{k: str(data[k]) for k in ("cluster", "id", "created", "kind")},
                        paired=data.get("paired") is True)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StorageRefused(f"cannot read the identity marker {volume.marker}: {err.strerror}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise StorageRefused(f"the identity marker {volume.marker} is damaged ({err}): it should hold cluster, "
                             f"id, created and kind as JSON. Restore it from the other volume's marker "
                             f"(the same id) or from a backup's manifest") from None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# -- the file system ----------------------------------------------------------------------


def filesystem_of(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str:
    """The type of the file system `path` (or its nearest existing parent) is on, from mountinfo."""
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    real = os.path.realpath(target)
    best, fstype = "", "unknown"
    try:
        found = procfs.mounts(mountinfo)
    except OSError:
        return fstype
    for mount in found:
        point = mount.point
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, fstype = point, mount.fstype
    return fstype


def _check_filesystem(volume: Volume, allow_ephemeral: bool, mountinfo: Path, verdict: StorageCheck, prefix: str) -> None:
    try:
        volume.path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageRefused(f"{volume.name} {volume.path}: cannot create it: {err.strerror}") from None
    fstype = filesystem_of(volume.path, mountinfo)
    problem = ""
    if fstype in MEMORY_FS:
        problem = f"is on {fstype}, which lives in memory: everything in it is lost when the host or pod restarts"
    elif fstype in _CONTAINER_FS:
        problem = (f"is on the container's own layer ({fstype}): everything in it is lost when the container is "
                   f"re-created")
    if not problem:
        return
    if allow_ephemeral:
        verdict.notes.append(f"{prefix}{volume.name} {volume.path} {problem}")
        return
    raise StorageRefused(f"{volume.name} {volume.path} {problem}; {_VOLUME_HINT.format(path=volume.path)} "
                         f"(for a demo: allow_ephemeral = true / --allow-ephemeral)")


def _check_writes(volume: Volume) -> None:
    """Write and fsync a probe: read-only mounts, full disks and a broken fsync show here. An unnamed file
    (O_TMPFILE) where the file system has them, so that a guard killed midway leaves nothing behind."""
    probe = volume.path / f".slurm-ext-probe-{secrets.token_hex(4)}"
    step = "create a file in it"
    try:
        try:
            fd = os.open(volume.path, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            step = "write to it"
            os.write(fd, b"\0" * 4096)
            step = "fsync a file in it"
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as err:
        raise StorageRefused(f"{volume.name} {volume.path}: cannot {step}: {_why(err)}") from None


def _why(err: OSError) -> str:
    if err.errno == errno.EROFS:
        return "it is mounted read-only; mount it read-write (Kubernetes: readOnly: false; Docker: without :ro)"
    if err.errno == errno.ENOSPC:
        return "no space left on the device; free space on the volume or grow it"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; the agent runs as root: check the volume's mount options and ownership"
    if err.errno in (errno.EINVAL, errno.EIO, errno.ENOTSUP):
        return (f"{err.strerror}: this file system cannot make writes durable; put the volume on one that can "
                f"(ext4, xfs, a block PersistentVolume)")
    return err.strerror or str(err)


def free_mib(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize // (1024 * 1024)


def _check_free(volume: Volume, min_free_mib: int) -> None:
    free = free_mib(volume.path)
    if free < min_free_mib:
        raise StorageRefused(f"{volume.name} {volume.path}: only {free} MiB free, {min_free_mib} MiB needed "
                             f"(accounting.min_free): free space on the volume or grow it")


class SpaceWatch(threading.Thread):
    """While the daemons run: free space on each guarded volume, read every `interval` seconds.

    A full volume does not stop MariaDB or slurmctld with a clear word: MariaDB waits for space, slurmdbd's
    writes hang and the records pile up in slurmctld's memory. This says which volume, once, when its free
    space falls below `min_free_mib` (storage-low), and again when it is back (storage-ok)."""

    def __init__(self, volumes: list[Volume], min_free_mib: int, emit, interval: float = 30.0):
        super().__init__(name="storage-watch", daemon=True)
        self.volumes, self.min_free, self.emit, self.interval = volumes, min_free_mib, emit, interval
        self.low: set[str] = set()
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.is_set():
            for volume in self.volumes:
                if not volume.path.is_dir():  # not made yet (slurmctld makes its own at first start)
                    continue
                try:
                    self.look(volume)
                except OSError as err:
                    log.warning("%s %s: cannot read its free space: %s", volume.name, volume.path, err.strerror)
            self._stopped.wait(self.interval)

    def look(self, volume: Volume) -> None:
        free = free_mib(volume.path)
        key = str(volume.path)
        if free < self.min_free and key not in self.low:
            self.low.add(key)
            self.emit("storage-low", f"{volume.name} {volume.path}: {free} MiB free, below accounting.min_free "
                      f"({self.min_free} MiB): free space or grow the volume now; when it is full the database "
                      f"stops writing and slurmctld holds every accounting record in memory", severity="error",
                      volume=key, free_mib=free)
        elif free >= self.min_free and key in self.low:
            self.low.discard(key)
            self.emit("storage-ok", f"{volume.name} {volume.path}: {free} MiB free again", volume=key, free_mib=free)

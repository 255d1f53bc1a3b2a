"""The secrets of a worker that runs as another user than root: copied for it by the agent, read by it from there.

What systemd's LoadCredential= does, for the node agent's workers: right before it starts a worker that runs as
another user (WorkerSpec.user, the page's web.user), the agent (root) copies each secret file the worker needs
(WorkerSpec.credentials: the settings that name them, `node.agent_credential`) into a folder of its own,
`<node.runtime_dir>/credentials/<worker>/` (owner the worker's user, 0500; each copy 0400, named by its setting),
and gives the worker that folder in $CREDENTIALS_DIRECTORY. The worker reads its copies (`adopt` points its
config's settings at them) and nothing of root's: the originals stay root's only. The copies are made again at
each start of the worker (a rotated secret takes effect at its next start) and removed when the agent stops.
Each original is read with every check of slurm_ext.secretfile before it is copied.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from .config import Config
from .secretfile import SecretFileError, read_secret

__all__ = ["ENV", "folder_of", "copy_for", "remove_all", "adopt", "setting_value", "state_folder"]

#: the environment variable a worker finds its copies' folder in (systemd's name for the same)
ENV = "CREDENTIALS_DIRECTORY"


def folder_of(runtime_dir: str | os.PathLike, worker: str) -> Path:
    return Path(runtime_dir) / "credentials" / worker


def setting_value(config: Config, key: str) -> str:
    """The value of the setting `key` ("section.name") in `config`."""
    section, name = key.split(".", 1)
    return getattr(getattr(config, section), name)


def copy_for(config: Config, worker: str, uid: int, gid: int, keys: tuple[str, ...]) -> Path:
    """Copy the file each of `keys` names (those set) into the worker's own folder, for `uid`; returns the folder.

    A copy left from the worker's last start is replaced: the folder is made anew each time.

    Raises:
        SecretFileError: an original is refused by read_secret (the message names the setting and the file).
        OSError: the folder cannot be made.
    """
    folder = folder_of(config.node.runtime_dir, worker)
    parent = folder.parent
    parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chown(parent, 0, 0)
    os.chmod(parent, 0o711)  # workers pass through to their own folder; none lists the others'
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    for key in keys:
        path = setting_value(config, key)
        if not path:
            continue
        try:  # a Kubernetes Secret's mount is a link into its ..data folder: followed only in folders of root's
            content = read_secret(path, follow_link=True, check_folders=True).content
        except SecretFileError as err:
            raise SecretFileError(err.path, err.kind, f"{key}: {err.problem} (not copied for worker {worker})",
                                  err.info, err.folder) from None
        copy = folder / key
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
        try:
            os.write(fd, content)
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
    os.chown(folder, uid, gid)
    os.chmod(folder, 0o500)
    return folder


def state_folder(config: Config, worker: str, uid: int, gid: int) -> Path:
    """The worker's own folder of state, `<node.state_dir>/<worker>/`, made (or taken over) for `uid`, 0700: what
    systemd's StateDirectory= does. [node] state_dir is root's; a worker run as another user keeps there what must
    outlive its restarts (the page's sessions ended by logout). A link in its place is refused (root must not chown
    what a link points at).

    Raises:
        OSError: the folder cannot be made, or a link or a file is in its place.
    """
    folder = Path(config.node.state_dir) / worker
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return folder


def remove_all(runtime_dir: str | os.PathLike, workers: list[str] | tuple[str, ...]) -> None:
    """Remove the copies of `workers` (the agent that runs them stops): only theirs, since agents of other roles on
    the same host may share the runtime directory (a controller and an accounting agent, the dev cluster's first
    node), and their workers' copies are theirs to remove."""
    for worker in workers:
        shutil.rmtree(folder_of(runtime_dir, worker), ignore_errors=True)
    try:
        (Path(runtime_dir) / "credentials").rmdir()  # the last agent's stop leaves no folder behind
    except OSError:
        pass  # another agent's workers' copies are still in it


def adopt(config: Config, environ: dict[str, str]) -> Config:
    """`config` with each setting whose copy lies in $CREDENTIALS_DIRECTORY pointed at the copy (unchanged when
    the variable is not set: a worker run as root, or by hand)."""
    folder = environ.get(ENV, "")
    if not folder:
        return config
    changes: dict[str, dict] = {}
    for copy in sorted(Path(folder).iterdir()):
        section, _, name = copy.name.partition(".")
        if name:
            changes.setdefault(section, {})[name] = str(copy)
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)
                                          for section, fields in changes.items()})

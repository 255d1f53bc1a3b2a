"""slurm_ext.credentials: the copies of root's secrets the agent makes for a worker that runs as another user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_ext import credentials
from slurm_ext.config import Config, NodeSection
from slurm_ext.secretfile import SecretFileError

NOBODY = 65534


def _config(tmp_path: Path, credential: Path) -> Config:
    return Config(node=NodeSection(runtime_dir=str(tmp_path / "run"), agent_credential=str(credential)))


def test_the_copy_is_the_workers_alone_and_the_original_stays_roots(tmp_path):
    original = tmp_path / "agent-credential"
    original.write_text("c" * 64 + "\n")
    original.chmod(0o600)
    folder = credentials.copy_for(_config(tmp_path, original), "web", NOBODY, NOBODY, ("node.agent_credential",))
    copy = folder / "node.agent_credential"
    assert copy.read_text() == original.read_text()
    assert (copy.stat().st_uid, copy.stat().st_mode & 0o777) == (NOBODY, 0o400)
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (NOBODY, 0o500)
    assert (original.stat().st_uid, original.stat().st_mode & 0o777) == (0, 0o600)


def test_a_link_in_a_folder_others_can_change_is_not_followed_to_copy_roots_file(tmp_path):
    """The review of 28.21: the secret's path followed as a link wherever it lay, so whoever could write its
    folder could point it at any file of root's (0600) and have the agent copy that file for the page's user."""
    roots = tmp_path / "shadow-like"
    roots.write_text("root's own secret\n")
    roots.chmod(0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "agent-credential").symlink_to(roots)
    with pytest.raises(SecretFileError, match="can be changed by others"):
        credentials.copy_for(_config(tmp_path, theirs / "agent-credential"), "web", NOBODY, NOBODY,
                             ("node.agent_credential",))
    copies = credentials.folder_of(tmp_path / "run", "web")
    assert not (copies / "node.agent_credential").exists()


def test_an_agent_removes_only_its_own_workers_copies(tmp_path):
    """Two agents share a runtime directory (a controller and an accounting agent on one host, the dev cluster's
    first node and its controller): the one that stops takes only its own workers' copies."""
    original = tmp_path / "agent-credential"
    original.write_bytes(b"s" * 32)
    original.chmod(0o600)
    for worker in ("web", "health"):
        credentials.copy_for(_config(tmp_path, original), worker, NOBODY, NOBODY, ("node.agent_credential",))
    credentials.remove_all(tmp_path / "run", ["health"])
    assert not credentials.folder_of(tmp_path / "run", "health").exists()
    assert (credentials.folder_of(tmp_path / "run", "web") / "node.agent_credential").exists()

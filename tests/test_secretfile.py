"""The one reader of secret files (slurm_ext.secretfile): its refusals on real files, and a reader that is not root
(the page's user reading the copies the agent made for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ext.secretfile import SecretFileError, read_secret
from tests.helpers.files import temp_dir

NOBODY = 65534


def _secret(folder: Path, name: str = "secret", mode: int = 0o600, owner: int = 0, text: str = "s" * 32) -> Path:
    path = folder / name
    path.write_text(text + "\n")
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def test_a_file_of_roots_only_is_read(tmp_path):
    path = _secret(tmp_path)
    assert read_secret(path).content == b"s" * 32 + b"\n"
    path.chmod(0o400)
    assert read_secret(path).content.strip() == b"s" * 32


@pytest.mark.parametrize("mode, allowed", [(0o604, False), (0o640, False), (0o620, False), (0o640, True),
                                           (0o660, True), (0o644, True), (0o610, True)])
def test_bits_for_others_and_for_the_group_unless_allowed_are_refused(tmp_path, mode, allowed):
    path = _secret(tmp_path, mode=mode)
    reader_group = 0 if allowed else None  # _secret makes the file's group root's
    taken = mode in (0o640,) and allowed
    if taken:
        assert read_secret(path, reader_group=reader_group).content
        return
    with pytest.raises(SecretFileError, match=f"mode {mode:04o} lets others read or change it") as refused:
        read_secret(path, reader_group=reader_group)
    assert refused.value.kind == "mode" and refused.value.path == str(path)


def test_a_file_another_group_may_read_is_refused_to_a_reader_who_allows_its_own(tmp_path):
    """The review of 28.21: a reader that lets its group read (the page and its token hashes) took a file of
    any group's: root:users 0640 is readable by every user."""
    path = _secret(tmp_path, mode=0o640)
    os.chown(path, 0, 100)
    with pytest.raises(SecretFileError, match="mode 0640 lets others read or change it"):
        read_secret(path, reader_group=NOBODY)
    os.chown(path, 0, NOBODY)
    assert read_secret(path, reader_group=NOBODY).content.strip() == b"s" * 32


def test_a_link_is_refused_even_to_a_file_of_roots_unless_the_caller_follows_links(tmp_path):
    target = _secret(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(SecretFileError, match="is a symbolic link: refused") as refused:
        read_secret(link)
    assert refused.value.kind == "link"
    assert read_secret(link, follow_link=True, check_folders=True).content.strip() == b"s" * 32


def test_another_users_file_is_refused(tmp_path):
    path = _secret(tmp_path, owner=NOBODY)
    with pytest.raises(SecretFileError, match=f"owned by uid {NOBODY} with mode 0600") as refused:
        read_secret(path)
    assert refused.value.kind == "owner"


def test_a_file_larger_than_the_bound_is_refused_unread(tmp_path):
    path = _secret(tmp_path, text="x" * 5000)
    with pytest.raises(SecretFileError, match="5001 bytes \\(expected at most 4096\\)") as refused:
        read_secret(path, max_bytes=4096)
    assert refused.value.kind == "size"


def test_what_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opened without blocking, never read
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    for path in (fifo, folder):
        with pytest.raises(SecretFileError, match="not a regular file") as refused:
            read_secret(path)
        assert refused.value.kind == "not-regular"
    with pytest.raises(SecretFileError) as missing:
        read_secret(tmp_path / "none")
    assert missing.value.kind == "missing"


def test_a_folder_others_can_change_is_refused_when_asked(tmp_path):
    folder = tmp_path / "etc"
    folder.mkdir()
    path = _secret(folder)
    folder.chmod(0o777)
    assert read_secret(path).content  # the folder is not looked at unless asked
    with pytest.raises(SecretFileError, match=f"its folder {folder} \\(mode 0777, uid 0\\) can be changed") as bad:
        read_secret(path, check_folders=True)
    assert bad.value.kind == "folder" and bad.value.folder == str(folder)
    folder.chmod(0o1777)  # sticky and root's: only root replaces root's file
    assert read_secret(path, check_folders=True).content


_READ_AS = """import sys
from slurm_ext.web.secretfile import SecretFile, SecretFileError
try:
    print(SecretFile(sys.argv[1], "web.proxy_secret_file").read().decode().strip())
except SecretFileError as err:
    print("refused:", err)
"""


def _read_as(uid: int, path: Path) -> str:
    """The page's SecretFile read in a process of `uid` (a real user, no groups)."""
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-I",
                           "-c", _READ_AS, str(path)], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_pages_user_reads_its_own_copy_and_never_another_users_or_a_loose_one():
    """The agent copies the page's secrets for its user (owner that user, 0400): read as that user, the copy is
    taken (before the one reader, the page took only files of root's, and its own copies were refused); a file of
    another user, or its own that others may read, is not."""
    folder = temp_dir(owner=NOBODY, mode=0o700)
    own = _secret(folder, "own", mode=0o400, owner=NOBODY)
    assert _read_as(NOBODY, own) == "s" * 32
    loose = _secret(folder, "loose", mode=0o444, owner=NOBODY)
    assert _read_as(NOBODY, loose).startswith(f"refused: web.proxy_secret_file {loose}: owned by uid {NOBODY} "
                                              "with mode 0444")
    other = _secret(folder, "other", mode=0o444, owner=NOBODY - 1)
    assert f"owned by uid {NOBODY - 1}" in _read_as(NOBODY, other)


def test_a_link_in_the_middle_of_the_chain_in_another_users_folder_is_refused(tmp_path):
    """The review of 1555dc7: root's link -> a link in nobody's folder -> a file of root's 0600 elsewhere was
    taken (only the first and last folders were checked): whoever owns the middle folder chooses the file."""
    mine = tmp_path / "etc"
    mine.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    key = _secret(private, "id_rsa", text="root's private key")
    (theirs / "cred").symlink_to(key)
    (mine / "agent-credential").symlink_to(theirs / "cred")
    with pytest.raises(SecretFileError, match=f"its folder {theirs} .* can be changed by others"):
        read_secret(mine / "agent-credential", follow_link=True, check_folders=True)

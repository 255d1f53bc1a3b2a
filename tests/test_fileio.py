"""fileio.atomic_write on real files: no reader sees half a file, an error leaves the old one, no link is followed."""

from __future__ import annotations

import multiprocessing
import os
import stat

import pytest

from slurm_ext import fileio
from slurm_ext.fileio import atomic_write


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_it_writes_text_and_bytes_with_the_exact_mode(tmp_path):
    old_umask = os.umask(0o077)
    try:
        atomic_write(tmp_path / "a.conf", "é\n", mode=0o644)
        atomic_write(tmp_path / "b.bin", b"\x00\x01", mode=0o755, fsync="file")
        atomic_write(tmp_path / "c", b"", mode=0o600, fsync="none")
    finally:
        os.umask(old_umask)
    assert (tmp_path / "a.conf").read_bytes() == "é\n".encode()
    assert stat.S_IMODE((tmp_path / "a.conf").stat().st_mode) == 0o644  # the umask does not apply
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o755
    assert (tmp_path / "c").read_bytes() == b"" and leftovers(tmp_path) == []


def test_the_file_is_replaced_by_rename_not_rewritten(tmp_path):
    path = tmp_path / "gres.conf"
    atomic_write(path, "old\n")
    inode = path.stat().st_ino
    with open(path) as reader:  # a reader that opened the old file keeps reading the old content
        atomic_write(path, "new\n")
        assert reader.read() == "old\n"
    assert path.read_text() == "new\n" and path.stat().st_ino != inode


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "target"
    path.mkdir()
    (path / "inside").write_text("x")  # a non-empty directory cannot be renamed over
    with pytest.raises(OSError):
        atomic_write(path, "data")
    assert (path / "inside").read_text() == "x" and leftovers(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "file", "data")


def test_a_planted_link_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    monkeypatch.setattr(fileio.os, "urandom", lambda n: b"\x00" * n)  # a name someone could guess
    planted = tmp_path / f".record.{'00' * 6}.tmp"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError, match="temporary names"):
        atomic_write(tmp_path / "record", "mine\n")
    assert victim.read_text() == "root's\n" and planted.is_symlink()
    assert not (tmp_path / "record").exists()


def test_an_unknown_fsync_is_a_callers_bug(tmp_path):
    with pytest.raises(ValueError, match="fsync='always'"):
        atomic_write(tmp_path / "f", "x", fsync="always")
    assert not (tmp_path / "f").exists()


def _rewrite(path: str, letter: str, rounds: int) -> None:
    for _ in range(rounds):
        atomic_write(path, letter * 200_000, fsync="none")


def test_concurrent_writers_and_a_reader_never_see_a_mix(tmp_path):
    path = tmp_path / "shared"
    atomic_write(path, "a" * 200_000)
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_rewrite, args=(str(path), letter, 150)) for letter in "bcd"]
    for writer in writers:
        writer.start()
    seen = set()
    while any(writer.is_alive() for writer in writers):
        text = path.read_text()
        assert len(text) == 200_000 and len(set(text)) == 1, "a reader saw half of one file and half of another"
        seen.add(text[0])
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    assert len(seen) > 1 and leftovers(tmp_path) == []


def test_mtime_is_set_before_the_rename_for_readers_that_watch_it(tmp_path):
    path = tmp_path / "gpus.json"
    atomic_write(path, "{}\n", mtime_ns=1_700_000_000_123_456_789)
    assert path.stat().st_mtime_ns == 1_700_000_000_123_456_789
    atomic_write(path, "{}\n")
    assert path.stat().st_mtime_ns > 1_700_000_000_123_456_789  # not given: the time of the write

"""clean_ipc against real IPC objects, made by spare uids through setpriv (needs root and util-linux).

The uids are unique to this run, so an exclusive cleanup here can only meet
this run's objects; every object, holder process and mount is undone by the
fixtures even when a test fails.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from slurm_ext.prolog_epilog import ipc


@pytest.fixture(autouse=True)
def _prerequisites():
    """Root and util-linux's setpriv, ipcmk and ipcrm: on CI they are there, so missing ones fail."""
    missing = [tool for tool in ("setpriv", "ipcmk", "ipcrm") if not shutil.which(tool)]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"tests/test_ipc.py needs root and util-linux (missing: {', '.join(missing) or 'root'})")


USER = 2_000_000 + (os.getpid() % 400_000) * 2  # the job's user: no passwd entry needed
OTHER = USER + 1  # some other user on the node
TAG = f"slurmext-test-ipc-{os.getpid()}"
SHM = Path("/dev/shm")
IPCMK = {"shm": ["-M", "4096"], "sem": ["-S", "1"], "msg": ["-Q"]}
IPCRM = {"shm": "-m", "sem": "-s", "msg": "-q"}
ID_COLUMN = {"shm": "shmid", "sem": "semid", "msg": "msqid"}

SHMAT = """
import ctypes
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
address = libc.shmat({ident}, None, 0)
assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
"""
MSGSND = """
import ctypes
libc = ctypes.CDLL("libc.so.6", use_errno=True)
message = ctypes.create_string_buffer(b"\\x01\\0\\0\\0\\0\\0\\0\\0x")  # long mtype = 1, then one byte
assert libc.msgsnd({ident}, message, 1, 0) == 0, ctypes.get_errno()
"""

MMAP = """
import ctypes, os
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open({path!r}, os.O_RDONLY)
address = libc.mmap(None, 4, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED (Python's mmap would keep a dup of the fd)
assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)
"""


def as_uid(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def sysv_table(kind: str) -> dict[int, dict[str, str]]:
    """/proc/sysvipc/<kind> now, by id, each row by header name."""
    lines = Path("/proc/sysvipc", kind).read_text().splitlines()
    header = lines[0].split()
    rows = [dict(zip(header, line.split())) for line in lines[1:] if line.strip()]
    return {int(row[ID_COLUMN[kind]]): row for row in rows}


def mounted_fstype(path: str) -> str | None:
    fstype = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == path:
            fstype = fields[2]
    return fstype


class Maker:
    """Makes IPC objects and holder processes as a given uid, and undoes them all."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.sysv: list[tuple[str, int]] = []
        self.holders: list[subprocess.Popen] = []
        self.count = 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"{TAG}-{what}-{self.count}"

    def run_as(self, uid: int, code: str) -> None:
        subprocess.run([*as_uid(uid), sys.executable, "-c", code], check=True, capture_output=True, cwd="/",
                       timeout=30)

    def file(self, uid: int, directory: Path = SHM, content: str = "data") -> Path:
        path = directory / self.name("file")
        self.paths.append(path)
        self.run_as(uid, f"open({str(path)!r}, 'w').write({content!r})")
        return path

    def queue(self, uid: int, directory: Path) -> Path:
        """A POSIX message queue: creating a file in an mqueue filesystem creates one."""
        path = directory / self.name("queue")
        self.paths.append(path)
        self.run_as(uid, f"import os; os.close(os.open({str(path)!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))")
        return path

    def symlink(self, uid: int, target: Path, directory: Path = SHM) -> Path:
        path = directory / self.name("link")
        self.paths.append(path)
        self.run_as(uid, f"import os; os.symlink({str(target)!r}, {str(path)!r})")
        return path

    def directory(self, uid: int, link_to: Path) -> Path:
        """A directory of `uid` in /dev/shm holding a file, a subdirectory and a symlink to `link_to`."""
        path = SHM / self.name("dir")
        self.paths.append(path)
        self.run_as(uid, textwrap.dedent(f"""
            import os
            top = {str(path)!r}
            os.makedirs(top + "/sub")
            open(top + "/sub/f", "w").write("x")
            os.symlink({str(link_to)!r}, top + "/link")
        """))
        return path

    def ipc(self, uid: int, kind: str) -> int:
        out = subprocess.run([*as_uid(uid), "ipcmk", *IPCMK[kind]], check=True, capture_output=True, text=True,
                             cwd="/", timeout=30).stdout
        ident = int(re.search(r"id: (\d+)", out)[1])
        self.sysv.append((kind, ident))
        return ident

    def holder(self, uid: int, code: str) -> subprocess.Popen:
        """A process of `uid` that runs `code`, says so, and sleeps until killed."""
        child = subprocess.Popen(
            [*as_uid(uid), sys.executable, "-c", code + "\nimport time\nprint('ready', flush=True)\ntime.sleep(600)"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        self.holders.append(child)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        return child

    def stop(self, child: subprocess.Popen) -> None:
        child.kill()
        child.wait(timeout=10)

    def undo(self) -> None:
        for child in self.holders:
            if child.poll() is None:
                self.stop(child)
        for kind, ident in self.sysv:
            row = sysv_table(kind).get(ident)
            if row is not None and int(row["uid"]) in (USER, OTHER):  # still ours, not a reused id
                subprocess.run(["ipcrm", IPCRM[kind], str(ident)], capture_output=True)
        for path in reversed(self.paths):
            if path.is_symlink() or not path.is_dir():
                path.unlink(missing_ok=True)
            else:
                shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make():
    maker = Maker()
    yield maker
    maker.undo()


@pytest.fixture(scope="module")
def mqueue_dir():
    """/dev/mqueue when mqueue is mounted there, else a private mqueue mount of this run."""
    if mounted_fstype("/dev/mqueue") == "mqueue":
        yield Path("/dev/mqueue")
        return
    directory = tempfile.mkdtemp(prefix=f"{TAG}-mqueue-")
    mount = subprocess.run(["mount", "-t", "mqueue", "none", directory], capture_output=True, text=True)
    if mount.returncode != 0:
        os.rmdir(directory)
        pytest.fail(f"cannot mount an mqueue filesystem to test POSIX message queues: {mount.stderr.strip()}")
    try:
        yield Path(directory)
    finally:
        subprocess.run(["umount", directory], check=True)
        os.rmdir(directory)


@pytest.fixture
def root_files(tmp_path):
    """A root-owned file and directory outside /dev/shm, for links to point at."""
    target = tmp_path / "root-owned"
    target.write_text("root's")
    target_dir = tmp_path / "root-dir"
    target_dir.mkdir()
    (target_dir / "keep").write_text("root's too")
    return target, target_dir


def shm_label(ident: int) -> str:
    return f"sysv shm id {ident} key 0x"


def test_exclusive_removes_every_kind_even_when_held(make, mqueue_dir, root_files):
    target, target_dir = root_files
    plain = make.file(USER)
    held = make.file(USER)
    directory = make.directory(USER, link_to=target_dir)
    link = make.symlink(USER, target)
    queue = make.queue(USER, mqueue_dir)
    ids = {kind: make.ipc(USER, kind) for kind in ("shm", "sem", "msg")}
    attached = make.ipc(USER, "shm")
    make.holder(USER, f"f = open({str(held)!r})")
    attacher = make.holder(USER, SHMAT.format(ident=attached))

    result = ipc.clean_ipc(USER, exclusive=True, mqueue_dir=mqueue_dir)

    assert result.errors == () and result.kept == ()
    for path in (plain, held, directory, link, queue):
        assert not os.path.lexists(path), path
    assert target.read_text() == "root's" and (target_dir / "keep").read_text() == "root's too"
    for kind, ident in ids.items():
        assert ident not in sysv_table(kind), (kind, ident)
    row = sysv_table("shm")[attached]  # removed while attached: marked, freed at the last detach
    assert int(row["perms"], 8) & 0o1000 and int(row["nattch"]) == 1
    make.stop(attacher)
    assert attached not in sysv_table("shm")
    removed = "\n".join(result.removed)
    for line in (str(plain), str(held), f"{directory} (directory)", f"{link} (symlink to {target})",
                 f"mqueue {queue}", shm_label(ids["shm"]), shm_label(attached),
                 f"sysv sem id {ids['sem']}\n", f"sysv msg id {ids['msg']}"):
        assert line in removed + "\n", line
    assert any(line.startswith(shm_label(attached)) and "1 attached" in line for line in result.removed)


def test_other_uids_and_root_objects_are_untouched(make, mqueue_dir):
    theirs = [make.file(OTHER), make.queue(OTHER, mqueue_dir), make.symlink(OTHER, Path("/etc/hostname"))]
    their_ids = {kind: make.ipc(OTHER, kind) for kind in ("shm", "sem", "msg")}
    roots = SHM / make.name("root")
    make.paths.append(roots)
    roots.write_text("root's")
    mine = make.file(USER)

    result = ipc.clean_ipc(USER, exclusive=True, mqueue_dir=mqueue_dir)

    assert result.removed == (str(mine),) and result.errors == ()
    assert not mine.exists()
    assert all(os.path.lexists(path) for path in theirs) and roots.read_text() == "root's"
    for kind, ident in their_ids.items():
        assert int(sysv_table(kind)[ident]["uid"]) == OTHER


def test_symlinks_are_unlinked_and_never_followed(make, root_files):
    target, target_dir = root_files
    link = make.symlink(USER, target)
    dir_link = make.symlink(USER, target_dir)
    directory = make.directory(USER, link_to=target_dir)
    before = (os.stat(target), os.stat(target_dir))

    result = ipc.clean_ipc(USER, exclusive=True)

    assert result.errors == ()
    assert not os.path.lexists(link) and not os.path.lexists(dir_link) and not os.path.lexists(directory)
    assert target.read_text() == "root's" and (target_dir / "keep").read_text() == "root's too"
    after = (os.stat(target), os.stat(target_dir))
    for old, new in zip(before, after):
        assert (old.st_uid, old.st_mode, old.st_mtime_ns) == (new.st_uid, new.st_mode, new.st_mtime_ns)


def test_not_exclusive_keeps_held_and_older_objects(make, mqueue_dir):
    old_file = make.file(USER)
    old_shm = make.ipc(USER, "shm")
    now = time.time()
    time.sleep(math.ceil(now) - now + 0.05)  # SysV times are whole seconds: start the job in a new one
    since = float(math.floor(time.time()))
    new_file, open_file, mapped_file = make.file(USER), make.file(USER), make.file(USER)
    new_queue, open_queue = make.queue(USER, mqueue_dir), make.queue(USER, mqueue_dir)
    new_shm, attached_shm = make.ipc(USER, "shm"), make.ipc(USER, "shm")
    sem = make.ipc(USER, "sem")
    new_msg, used_msg = make.ipc(USER, "msg"), make.ipc(USER, "msg")
    opener = make.holder(USER, f"f = open({str(open_file)!r})\nq = open({str(open_queue)!r})")
    mapper = make.holder(USER, MMAP.format(path=str(mapped_file)))
    attacher = make.holder(USER, SHMAT.format(ident=attached_shm))
    sender = make.holder(USER, MSGSND.format(ident=used_msg))

    result = ipc.clean_ipc(USER, exclusive=False, since=since, mqueue_dir=mqueue_dir)

    assert result.errors == ()
    assert not new_file.exists() and not new_queue.exists()
    assert new_shm not in sysv_table("shm") and new_msg not in sysv_table("msg")
    assert old_file.exists() and open_file.exists() and mapped_file.exists() and open_queue.exists()
    assert old_shm in sysv_table("shm") and attached_shm in sysv_table("shm")
    assert sem in sysv_table("sem") and used_msg in sysv_table("msg")
    kept = "\n".join(result.kept) + "\n"
    for line in (f"{old_file}: predates the job", f"{open_file}: open by pid {opener.pid}\n",
                 f"{mapped_file}: mapped by pid {mapper.pid}\n", f"mqueue {open_queue}: open by pid {opener.pid}\n",
                 "bytes): predates the job", "(4096 bytes): attached by 1 process\n",
                 f"sysv sem id {sem}: semaphore sets record no holder",
                 f"sysv msg id {used_msg}: last sender pid {sender.pid} is alive\n"):
        assert line in kept, line
    assert len(result.kept) == 8
    assert sorted(result.removed) == sorted([str(new_file), f"mqueue {new_queue}", f"sysv msg id {new_msg}",
                                             *(line for line in result.removed if line.startswith(shm_label(new_shm)))])
    assert len(result.removed) == 4

    # once the holders are gone, a second Epilog pass takes what was held but keeps what is older
    for child in (opener, mapper, attacher, sender):
        make.stop(child)
    again = ipc.clean_ipc(USER, exclusive=False, since=since, mqueue_dir=mqueue_dir)
    assert again.errors == ()
    assert not open_file.exists() and not mapped_file.exists() and not open_queue.exists()
    assert attached_shm not in sysv_table("shm") and used_msg not in sysv_table("msg")
    assert old_file.exists() and old_shm in sysv_table("shm") and sem in sysv_table("sem")


def test_objects_removed_meanwhile_are_notes_not_errors(make, tmp_path, monkeypatch):
    ids = {kind: make.ipc(USER, kind) for kind in ("shm", "sem", "msg")}
    fake_proc = tmp_path / "proc"  # /proc/sysvipc as the Epilog read it, before someone else removed all three
    (fake_proc / "sysvipc").mkdir(parents=True)
    for kind in ids:
        (fake_proc / "sysvipc" / kind).write_text(Path("/proc/sysvipc", kind).read_text())
    for kind, ident in ids.items():
        subprocess.run(["ipcrm", IPCRM[kind], str(ident)], check=True)

    raced = make.file(USER)
    real_unlink = os.unlink

    def unlink_after_someone_else(path, *args, **kwargs):
        real_unlink(path)  # the user's last process removes it between the scan and our unlink
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(ipc.os, "unlink", unlink_after_someone_else)
    result = ipc.clean_ipc(USER, exclusive=True, proc=fake_proc)
    monkeypatch.undo()

    assert result.errors == () and result.removed == () and result.kept == ()
    notes = "\n".join(result.notes)
    assert f"{raced}: already gone" in notes
    for kind, ident in ids.items():
        assert f"sysv {kind} id {ident}" in notes and ident not in sysv_table(kind)


def test_sysv_columns_are_found_by_header_name(make, tmp_path):
    ident = make.ipc(USER, "shm")
    row = sysv_table("shm")[ident]
    fake = tmp_path / "proc" / "sysvipc"
    fake.mkdir(parents=True)
    order = ["uid", "shmid", "ctime", "nattch", "perms", "size", "key", "extra"]  # a kernel of another layout
    (fake / "shm").write_text(" ".join(order) + "\n" + " ".join(row.get(name, "7") for name in order) + "\n")
    (fake / "sem").write_text("key semid perms\n1 2\n")  # garbled: one error line, nothing raised
    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=tmp_path / "none", mqueue_dir=tmp_path / "none",
                           proc=tmp_path / "proc")
    assert ident not in sysv_table("shm")
    assert len(result.removed) == 1 and result.removed[0].startswith(shm_label(ident))
    assert result.removed[0].endswith("(4096 bytes)")
    assert len(result.errors) == 1 and "sysvipc/sem: cannot read: no column" in result.errors[0]
    assert any("sysvipc/msg: missing" in note for note in result.notes)


def test_mqueue_dir_without_mqueue_mount_is_skipped(tmp_path):
    not_mqueue = tmp_path / "mqueue"
    not_mqueue.mkdir()
    stray = not_mqueue / "q"
    stray.write_text("")
    os.chown(stray, USER, USER)
    shm = tmp_path / "shm"
    shm.mkdir()
    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=shm, mqueue_dir=not_mqueue)
    assert stray.exists() and result.removed == () and result.errors == ()
    assert f"{not_mqueue}: no mqueue filesystem mounted there" in "\n".join(result.notes)
    assert "POSIX message queues not checked" in "\n".join(result.notes)


def test_uid_zero_is_never_cleaned(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "daemon").write_text("root's")
    result = ipc.clean_ipc(0, exclusive=True, shm_dir=shm, mqueue_dir=tmp_path)
    assert (shm / "daemon").exists() and result.removed == () and "uid 0" in result.notes[0]

"""clean_ipc against real IPC objects, made by spare uids through setpriv (needs root, util-linux and, for
the stalled-filesystem test, /dev/fuse: its FUSE server is a few lines of Python here, no package).

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
import json
import signal
import textwrap
import time
from pathlib import Path

import pytest

from slurm_ext.prolog_epilog import ipc


@pytest.fixture(autouse=True)
def _prerequisites():
    """Root and util-linux's setpriv, ipcmk, ipcrm, unshare and nsenter: on CI they are there, so missing ones
    fail."""
    missing = [tool for tool in ("setpriv", "ipcmk", "ipcrm", "unshare", "nsenter") if not shutil.which(tool)]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"tests/test_ipc.py needs root and util-linux (missing: {', '.join(missing) or 'root'})")


USER = 2_000_000 + (os.getpid() % 400_000) * 2  # the job's user: no passwd entry needed
OTHER = USER + 1  # some other user on the node
TAG = f"slurmext-test-ipc-{os.getpid()}"
SHM = Path("/dev/shm")
KINDS = ("shm", "sem", "msg")
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


SYSV_GIVE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_SET, IPC_STAT = 0o1000, 1, 2
MAKE = {"shm": lambda: libc.shmget(0, 4096, IPC_CREAT | 0o600), "sem": lambda: libc.semget(0, 1, IPC_CREAT | 0o600),
        "msg": lambda: libc.msgget(0, IPC_CREAT | 0o600)}
CTL = {"shm": libc.shmctl, "msg": libc.msgctl, "sem": lambda ident, cmd, buf: libc.semctl(ident, 0, cmd, buf)}
owner = int(sys.argv[1])
for kind, ident in (arg.split("=") for arg in sys.argv[2:]):
    ident = MAKE[kind]() if ident == "new" else int(ident)
    assert ident >= 0, ctypes.get_errno()
    ds = ctypes.create_string_buffer(512)  # shmid_ds, semid_ds and msqid_ds open with ipc_perm: key, uid, gid, cuid
    assert CTL[kind](ident, IPC_STAT, ds) == 0, ctypes.get_errno()
    ctypes.c_uint32.from_buffer(ds, 4).value = owner
    assert CTL[kind](ident, IPC_SET, ds) == 0, ctypes.get_errno()
    print(kind, ident)
"""

MQ_OPEN = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mq_open({name!r}, os.O_RDWR) >= 0, ctypes.get_errno()  # through the kernel's own mqueue mount
"""

# A FUSE filesystem with one file, "held", served from /dev/fuse by a child process; run in a mount namespace
# of its own, so that nothing of the node sees the mount. The parent holds the file open, has the mount as its
# working directory, holds the file named in argv[2] open too, and waits for the server; the test stops the
# server (SIGSTOP) to stall the filesystem and kills it (which aborts the connection) to end. A watchdog kills
# the server after two minutes if the test never does.
FUSE_HOLDER = """
import ctypes, errno, os, signal, struct, sys
mount_point, also_held = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
device = os.open("/dev/fuse", os.O_RDWR)
options = f"fd={device},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"slurmext-test", mount_point.encode(), b"fuse", 0x6, options) != 0:  # MS_NOSUID | MS_NODEV
    sys.exit(f"mount fuse: {os.strerror(ctypes.get_errno())}")

def attr(node):  # struct fuse_attr; node 1 is the root directory, node 2 the file
    mode, size = (0o40755, 0) if node == 1 else (0o100444, 4)
    return struct.pack("<QQQQQQIIIIIIIIII", node, size, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)

def serve():
    while True:
        try:
            request = os.read(device, 1 << 20)
        except OSError as err:
            if err.errno == errno.ENODEV:  # unmounted
                os._exit(0)
            raise
        length, opcode, unique, node = struct.unpack_from("<IIQQ", request)
        body, error = None, 0
        if opcode == 26:  # INIT: protocol 7.31, max_write 128 KiB
            body = struct.pack("<IIIIHHIIHHI", 7, 31, 0, 0, 0, 0, 1 << 17, 1, 0, 0, 0) + bytes(28)
        elif opcode == 1:  # LOOKUP; attributes valid for 0 s, so every stat asks this server
            if request[40:length].rstrip(b"\\0") == b"held":
                body = struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2)
            else:
                error = errno.ENOENT
        elif opcode == 3:  # GETATTR
            body = struct.pack("<QII", 0, 0, 0) + attr(node)
        elif opcode in (14, 27):  # OPEN, OPENDIR
            body = struct.pack("<QII", 0, 0, 0)
        elif opcode in (2, 42):  # FORGET, BATCH_FORGET: no answer
            continue
        else:
            error = errno.ENOSYS
        body = body or b""
        os.write(device, struct.pack("<IiQ", 16 + len(body), -error, unique) + body)

server = os.fork()
if server == 0:
    serve()
os.close(device)  # the server's copy is the last: killing it aborts the connection
held = os.open(os.path.join(mount_point, "held"), os.O_RDONLY)
other = os.open(also_held, os.O_RDONLY)
os.chdir(mount_point)
signal.signal(signal.SIGALRM, lambda *_: os.kill(server, signal.SIGKILL))
signal.alarm(120)
print("ready", server, flush=True)
os.waitpid(server, 0)
"""

CLEAN_NOT_EXCLUSIVE = """
import json, sys
from pathlib import Path
from slurm_ext.prolog_epilog import ipc
uid, since, shm_dir, mqueue_dir = sys.argv[1:]
result = ipc.clean_ipc(int(uid), exclusive=False, since=float(since), shm_dir=Path(shm_dir),
                       mqueue_dir=Path(mqueue_dir))
print(json.dumps({"removed": result.removed, "kept": result.kept, "errors": result.errors}))
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
        self.sysv: list[tuple[str, int, str]] = []  # kind, id, creator uid
        self.holders: list[subprocess.Popen] = []
        self.count = 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"{TAG}-{what}-{self.count}"

    def run_as(self, uid: int, code: str, *args: str) -> str:
        return subprocess.run([*as_uid(uid), sys.executable, "-c", code, *args], check=True, capture_output=True,
                              text=True, cwd="/", timeout=30).stdout

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

    def directory(self, uid: int, link_to: Path, parent: Path = SHM) -> Path:
        """A directory of `uid` in `parent` holding a file, a subdirectory and a symlink to `link_to`."""
        path = parent / self.name("dir")
        self.paths.append(path)
        self.run_as(uid, textwrap.dedent(f"""
            import os
            top = {str(path)!r}
            os.makedirs(top + "/sub")
            open(top + "/sub/f", "w").write("x")
            os.symlink({str(link_to)!r}, top + "/link")
        """))
        return path

    def shared(self, uid: int, parent: Path, name: str = "") -> Path:
        """A directory of `uid` in which anyone may create files (mode 1777), like an MPI library's in /dev/shm."""
        path = parent / (name or self.name("shared"))
        self.paths.append(path)
        self.run_as(uid, f"import os; os.mkdir({str(path)!r}); os.chmod({str(path)!r}, 0o1777)")
        return path

    def ipc(self, uid: int, kind: str) -> int:
        out = subprocess.run([*as_uid(uid), "ipcmk", *IPCMK[kind]], check=True, capture_output=True, text=True,
                             cwd="/", timeout=30).stdout
        ident = int(re.search(r"id: (\d+)", out)[1])
        self.sysv.append((kind, ident, str(uid)))
        return ident

    def give_away(self, uid: int, owner: int, **objects: int | str) -> dict[str, int]:
        """As `uid`, set the owner of SysV objects to `owner` with IPC_SET: {kind: id}, or {kind: "new"} for one
        that this same process creates first (the creator keeps its rights on what it gives away)."""
        out = self.run_as(uid, SYSV_GIVE, str(owner), *(f"{kind}={ident}" for kind, ident in objects.items()))
        given = {kind: int(ident) for kind, ident in (line.split() for line in out.splitlines())}
        self.sysv += [(kind, given[kind], str(uid)) for kind, ident in objects.items() if ident == "new"]
        return given

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
        for kind, ident, creator in self.sysv:
            row = sysv_table(kind).get(ident)
            if row is not None and row["cuid"] == creator:  # still ours, not a reused id
                subprocess.run(["ipcrm", IPCRM[kind], str(ident)], capture_output=True)
        for path in reversed(self.paths):
            if path.is_symlink() or not path.is_dir():
                path.unlink(missing_ok=True)
            else:
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)  # rmtree fails on deep trees


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
        real_unlink(path, *args, **kwargs)  # the user's last process removes it between the scan and our unlink
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
    order = ["uid", "shmid", "ctime", "cuid", "nattch", "perms", "size", "key", "extra"]  # another kernel's layout
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


# --- issue 9, item 4: SysV objects given away with IPC_SET ---------------------------------------------------

@pytest.fixture
def nowhere(tmp_path):
    """An empty stand-in for /dev/shm and /dev/mqueue, for tests about SysV objects only."""
    path = tmp_path / "empty"
    path.mkdir()
    return path


def test_sysv_objects_given_away_with_ipc_set_are_still_removed(make, nowhere):
    # the attack: a process of the user makes a segment, a semaphore set and a queue, sets their owner to root
    # with IPC_SET (its creator's rights stay) and exits; they now look like root's
    given = make.give_away(USER, owner=0, shm="new", sem="new", msg="new")
    for kind, ident in given.items():
        row = sysv_table(kind)[ident]
        assert (row["uid"], row["cuid"]) == ("0", str(USER)), (kind, row)
    handed = make.give_away(0, owner=USER, **{kind: make.ipc(0, kind) for kind in KINDS})  # root's, given to the user
    roots = {kind: make.ipc(0, kind) for kind in KINDS}  # root's own
    theirs = make.give_away(OTHER, owner=0, shm="new", sem="new", msg="new")  # another user's, given away

    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=nowhere, mqueue_dir=nowhere)

    assert result.errors == () and result.kept == ()
    for kind in KINDS:
        assert given[kind] not in sysv_table(kind) and handed[kind] not in sysv_table(kind), kind
        assert roots[kind] in sysv_table(kind) and theirs[kind] in sysv_table(kind), kind
    removed = "\n".join(result.removed) + "\n"
    for line in (f"sysv shm id {given['shm']} key 0x00000000 (4096 bytes) (owner uid 0, creator uid {USER})\n",
                 f"sysv sem id {given['sem']} (owner uid 0, creator uid {USER})\n",
                 f"sysv msg id {given['msg']} (owner uid 0, creator uid {USER})\n",
                 f"sysv msg id {handed['msg']} (owner uid {USER}, creator uid 0)\n"):
        assert line in removed, line
    assert len(result.removed) == 6


def test_given_away_sysv_objects_follow_the_rules_when_not_exclusive(make, nowhere):
    old = make.give_away(USER, owner=0, shm="new")["shm"]
    now = time.time()
    time.sleep(math.ceil(now) - now + 0.05)  # SysV times are whole seconds: start the job in a new one
    since = float(math.floor(time.time()))
    new = make.give_away(USER, owner=0, shm="new", sem="new", msg="new")
    attached = make.give_away(USER, owner=0, shm="new")["shm"]
    used = make.give_away(USER, owner=0, msg="new")["msg"]
    make.holder(USER, SHMAT.format(ident=attached))  # as its creator, the user still attaches to it
    sender = make.holder(USER, MSGSND.format(ident=used))

    result = ipc.clean_ipc(USER, exclusive=False, since=since, shm_dir=nowhere, mqueue_dir=nowhere)

    assert result.errors == ()
    assert new["shm"] not in sysv_table("shm") and new["msg"] not in sysv_table("msg")
    assert old in sysv_table("shm") and attached in sysv_table("shm")
    assert new["sem"] in sysv_table("sem") and used in sysv_table("msg")
    kept = "\n".join(result.kept) + "\n"
    given = f"(owner uid 0, creator uid {USER})"
    for line in (f"sysv shm id {old} key 0x00000000 (4096 bytes) {given}: predates the job",
                 f"sysv shm id {attached} key 0x00000000 (4096 bytes) {given}: attached by 1 process\n",
                 f"sysv sem id {new['sem']} {given}: semaphore sets record no holder",
                 f"sysv msg id {used} {given}: last sender pid {sender.pid} is alive\n"):
        assert line in kept, line
    assert len(result.kept) == 4 and len(result.removed) == 2


# --- issue 9, item 18: removal through directory fds, shared sticky directories ------------------------------

@pytest.fixture
def shm_dir():
    """A stand-in for /dev/shm: root's, sticky and world-writable, in a place every test uid can reach."""
    path = Path(tempfile.mkdtemp(prefix=f"{TAG}-shm-"))
    path.chmod(0o1777)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)  # rmtree fails on too deep trees


def test_a_directory_too_deep_to_remove_does_not_stop_the_rest(make, shm_dir, nowhere):
    deep = make.directory(USER, link_to=nowhere, parent=shm_dir)
    make.run_as(USER, textwrap.dedent(f"""
        import os
        fd = os.open({str(deep)!r}, os.O_RDONLY)
        for _ in range(1500):  # deeper than Python's recursion limit
            os.mkdir("d", dir_fd=fd)
            fd = os.open("d", os.O_RDONLY, dir_fd=fd)
    """))
    after = make.file(USER, shm_dir)  # listed after the directory

    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=shm_dir, mqueue_dir=nowhere)

    assert result.removed == (str(after),) and not after.exists()
    assert len(result.errors) == 1
    assert result.errors[0].startswith(f"{deep} (directory): cannot remove all of it: too deep for shutil.rmtree")


def test_user_files_in_shared_sticky_directories_are_removed(make, shm_dir, nowhere):
    shared = make.shared(0, shm_dir)  # root's, like an MPI library's
    mine, theirs = make.file(USER, shared), make.file(OTHER, shared)
    their_shared = make.shared(OTHER, shm_dir)  # another user's
    mine_in_theirs, theirs_in_theirs = make.file(USER, their_shared), make.file(OTHER, their_shared)
    deep, deep_files = shm_dir, []  # shared directories in shared directories: searched four levels down
    for level in range(1, 6):
        deep = make.shared(0, deep, name=f"level{level}")
        deep_files.append(make.file(USER, deep))
    *searched, too_deep = deep_files
    private = shm_dir / "private"  # root's, not writable by others: the user's files there are root's business
    private.mkdir(mode=0o755)
    (private / "f").write_text("x")
    os.chown(private / "f", USER, USER)
    elsewhere = make.shared(0, Path(tempfile.gettempdir()))  # a shared directory outside, which only a link leads to
    outside = make.file(USER, elsewhere)
    make.symlink(OTHER, elsewhere, directory=shm_dir)

    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=shm_dir, mqueue_dir=nowhere)

    assert result.errors == ()
    assert sorted(result.removed) == sorted(str(path) for path in (mine, mine_in_theirs, *searched))
    assert not any(path.exists() for path in (mine, mine_in_theirs, *searched))
    assert theirs.exists() and theirs_in_theirs.exists() and shared.is_dir() and their_shared.is_dir()
    assert too_deep.exists() and (private / "f").exists() and outside.exists()


def test_shared_sticky_directories_follow_the_rules_when_not_exclusive(make, shm_dir, nowhere):
    shared = make.shared(OTHER, shm_dir)
    old = make.file(USER, shared)
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    new, held = make.file(USER, shared), make.file(USER, shared)
    opener = make.holder(USER, f"f = open({str(held)!r})")

    result = ipc.clean_ipc(USER, exclusive=False, since=since, shm_dir=shm_dir, mqueue_dir=nowhere)

    assert result.errors == () and result.removed == (str(new),)
    assert not new.exists() and old.exists() and held.exists()
    kept = "\n".join(result.kept) + "\n"
    assert f"{old}: predates the job" in kept and f"{held}: open by pid {opener.pid}\n" in kept


def test_an_entry_replaced_after_its_check_is_not_removed(make, shm_dir, nowhere, monkeypatch):
    # the race: between root's check of the user's entry and its removal, another file takes its name; here
    # root's file and directory, and another user's file in a shared directory of that user (whose owner may
    # replace any entry in it). Done by a hook on the step between the two, so that it happens every time.
    mine = make.file(USER, shm_dir)
    my_dir = make.directory(USER, link_to=shm_dir, parent=shm_dir)
    their_shared = make.shared(OTHER, shm_dir)
    mine_in_theirs = make.file(USER, their_shared)
    roots = shm_dir / "root-file"
    roots.write_text("root's")
    root_dir = shm_dir / "root-dir"
    root_dir.mkdir()
    (root_dir / "keep").write_text("root's too")
    theirs = make.file(OTHER, their_shared, content="theirs")
    swaps = {mine.name: lambda: os.rename(roots, mine),
             my_dir.name: lambda: (os.rename(my_dir, shm_dir / "moved"), os.rename(root_dir, my_dir)),
             mine_in_theirs.name: lambda: make.run_as(OTHER, f"import os; os.rename({str(theirs)!r}, "
                                                            f"{str(mine_in_theirs)!r})")}
    real_clean_entry = ipc._clean_entry

    def clean_entry_after_a_swap(place, name, st, rules, tally):
        swaps.pop(name)()
        return real_clean_entry(place, name, st, rules, tally)

    monkeypatch.setattr(ipc, "_clean_entry", clean_entry_after_a_swap)
    result = ipc.clean_ipc(USER, exclusive=True, shm_dir=shm_dir, mqueue_dir=nowhere)
    monkeypatch.undo()

    assert swaps == {} and result.removed == ()
    assert mine.read_text() == "root's" and (my_dir / "keep").read_text() == "root's too"
    assert mine_in_theirs.read_text() == "theirs"
    errors = "\n".join(result.errors)
    for label in (str(mine), f"{my_dir} (directory)", str(mine_in_theirs)):
        assert f"{label}: not removed: replaced since it was checked" in errors, label
    assert len(result.errors) == 3


# --- issue 9, item 13: the holder scan never stats through /proc/PID/fd and cwd ------------------------------

def test_not_exclusive_keeps_directories_in_use(make, shm_dir, nowhere, root_files):
    _, target_dir = root_files
    since = time.time() - 1
    cwd_dir, open_dir, mapped_dir, free_dir = (make.directory(USER, link_to=target_dir, parent=shm_dir)
                                               for _ in range(4))
    in_cwd = make.holder(USER, f"import os\nos.chdir({str(cwd_dir / 'sub')!r})")
    opener = make.holder(USER, f"f = open({str(open_dir / 'sub' / 'f')!r})")
    mapper = make.holder(USER, MMAP.format(path=str(mapped_dir / "sub" / "f")))

    result = ipc.clean_ipc(USER, exclusive=False, since=since, shm_dir=shm_dir, mqueue_dir=nowhere)

    assert result.errors == () and result.removed == (f"{free_dir} (directory)",)
    assert set(result.kept) == {f"{cwd_dir} (directory): working directory of pid {in_cwd.pid}",
                                f"{open_dir} (directory): open by pid {opener.pid}",
                                f"{mapped_dir} (directory): mapped by pid {mapper.pid}"}
    assert not free_dir.exists() and (target_dir / "keep").exists()


def test_not_exclusive_keeps_a_queue_held_through_mq_open(make, mqueue_dir, nowhere):
    held, free = make.queue(USER, mqueue_dir), make.queue(USER, mqueue_dir)
    opener = make.holder(USER, MQ_OPEN.format(name=f"/{held.name}".encode()))  # its fd reads "/<name>"

    result = ipc.clean_ipc(USER, exclusive=False, since=time.time() - 60, shm_dir=nowhere, mqueue_dir=mqueue_dir)

    assert result.errors == () and result.removed == (f"mqueue {free}",)
    assert result.kept == (f"mqueue {held}: open by pid {opener.pid}",) and held.exists()


def test_holder_scan_does_not_block_on_a_stalled_fuse_mount(make, shm_dir, nowhere, tmp_path):
    # a process holds a file of a FUSE filesystem open and has it as its working directory, and the server
    # stops answering (like a hung NFS server); the Epilog's holder scan must go on. The candidate that makes
    # it scan is a new file of the user, held open by that same process.
    if not os.path.exists("/dev/fuse"):
        pytest.fail("tests/test_ipc.py needs /dev/fuse (the fuse kernel module) to stall a filesystem")
    candidate = make.file(USER, shm_dir)
    mount_point = tmp_path / "fuse"
    mount_point.mkdir()
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", FUSE_HOLDER,
                               str(mount_point), str(candidate)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    server = None
    try:
        ready = holder.stdout.readline()
        assert ready.startswith("ready "), holder.stderr.read()
        server = int(ready.split()[1])
        os.kill(server, signal.SIGSTOP)
        # from the node's mount namespace only the holder's fd and cwd links lead to the mount; from the
        # holder's, /proc/self/mounts names it too
        for enter in ([], ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt"]):
            try:
                run = subprocess.run([*enter, sys.executable, "-c", CLEAN_NOT_EXCLUSIVE, str(USER),
                                      str(time.time() - 60), str(shm_dir), str(nowhere)],
                                     capture_output=True, text=True, cwd="/", timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"clean_ipc {' '.join(enter) or 'on the node'} blocked on the stalled FUSE mount")
            assert run.returncode == 0, run.stderr
            result = json.loads(run.stdout)
            assert result == {"removed": [], "kept": [f"{candidate}: open by pid {holder.pid}"], "errors": []}, enter
    finally:
        if server is not None:
            os.kill(server, signal.SIGKILL)  # the last /dev/fuse fd: the connection is aborted, the holder ends
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(timeout=30)
    assert candidate.exists()

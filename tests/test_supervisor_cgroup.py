"""leave_root_cgroup on real cgroups: no mocks.

A fresh cgroup under the cgroup2 mount at /sys/fs/cgroup/unified stands in
for a container's root cgroup. Only processes the tests start (sleep, sh) are
put into it. The pytest process never is, so it never leaves its own cgroup.
This project's CI has that mount, so a missing one is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_ext.supervisor.cgroup import CgroupError, leave_root_cgroup

UNIFIED = Path("/sys/fs/cgroup/unified")
FORKER = ["sh", "-c", "while :; do sleep 0.01 & done"]


def _fstype(mountpoint: Path) -> str | None:
    """The filesystem type mounted at `mountpoint` (the last mount wins), or None."""
    found = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(mountpoint):
            found = fields[2]
    return found


def _pids(cgroup: Path) -> set[int]:
    return {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}


def _words(path: Path) -> set[str]:
    return set(path.read_text().split())


def _cgroups_under(root: Path) -> list[Path]:
    """`root` and every cgroup below it, deepest first."""
    return [Path(d) for d, _, _ in os.walk(root, topdown=False)]


class Sandbox:
    """A stand-in container root cgroup and the processes the test put in it."""

    def __init__(self, root: Path):
        self.root = root
        self.leaf = root / "supervisor"
        self.procs: list[subprocess.Popen] = []

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        """Start `argv` and move it into the stand-in root (one pid per write)."""
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.procs.append(proc)
        (self.root / "cgroup.procs").write_text(str(proc.pid))
        return proc


@contextlib.contextmanager
def _sandbox() -> Iterator[Sandbox]:
    if _fstype(UNIFIED) != "cgroup2":
        pytest.fail(
            f"{UNIFIED} is not a cgroup2 mount (found {_fstype(UNIFIED)}); these tests need "
            "the hybrid layout's cgroup2 hierarchy there, as this project's CI has"
        )
    own_cgroups = Path("/proc/self/cgroup").read_text()
    box = Sandbox(UNIFIED / f"slurm-ext-test-{secrets.token_hex(4)}")
    box.root.mkdir()
    try:
        yield box
    finally:
        for proc in box.procs:  # only what this test started, by pid
            proc.kill()
            proc.wait(timeout=10)
        # Orphans of the forker (sleep 0.01) end by themselves; wait for them.
        deadline = time.monotonic() + 10
        left = {}
        while time.monotonic() < deadline:
            left = {str(c): _pids(c) for c in _cgroups_under(box.root) if _pids(c)}
            if not left:
                break
            time.sleep(0.05)
        for cgroup in _cgroups_under(box.root):
            with contextlib.suppress(OSError):  # EBUSY if a process is left: reported below
                cgroup.rmdir()
        assert not left, f"processes still in the test cgroups: {left}"
        assert not box.root.exists(), f"{box.root} was left behind"
        assert Path("/proc/self/cgroup").read_text() == own_cgroups, "pytest itself was moved"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with _sandbox() as box:
        yield box


@pytest.fixture
def host_controller() -> Iterator[str]:
    """A controller enabled at the cgroup2 mount's root, so the stand-in root has one.

    The mount's root is the host's real root cgroup, which the no-internal-process
    rule exempts. Whatever this fixture enables there it disables again afterwards.
    """
    if _fstype(UNIFIED) != "cgroup2":
        pytest.fail(f"{UNIFIED} is not a cgroup2 mount (found {_fstype(UNIFIED)})")
    available = (UNIFIED / "cgroup.controllers").read_text().split()
    if not available:
        pytest.fail(f"{UNIFIED} offers no controller (cgroup.controllers is empty); this project's machines "
                    "have hugetlb there, which no v1 hierarchy mounts")
    name = available[0]
    control = UNIFIED / "cgroup.subtree_control"
    added = name not in _words(control)
    if added:
        control.write_text(f"+{name}")
    try:
        yield name
    finally:
        if added:
            control.write_text(f"-{name}")


@pytest.fixture
def sandbox_with_controller(host_controller: str) -> Iterator[Sandbox]:
    with _sandbox() as box:
        yield box


def test_moves_every_process_into_the_leaf(sandbox: Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    pids = {sandbox.spawn(["sleep", "60"]).pid for _ in range(3)}
    assert _pids(sandbox.root) == pids

    with caplog.at_level(logging.INFO, logger="supervisor"):
        leaf = leave_root_cgroup(sandbox.root, pid=sandbox.procs[1].pid)

    assert leaf == sandbox.leaf
    assert _pids(sandbox.root) == set()
    assert _pids(sandbox.leaf) == pids
    assert os.getpid() not in pids
    assert (
        f"moved 3 processes from {sandbox.root} into {sandbox.leaf}: the root cgroup is empty "
        "so slurmd can enable controllers"
    ) in caplog.messages


def test_empty_root_is_left_alone(sandbox: Sandbox) -> None:
    assert leave_root_cgroup(sandbox.root, pid=os.getpid()) is None
    assert not sandbox.leaf.exists()


def test_cgroup_v1_directory_is_left_alone() -> None:
    freezer = Path("/sys/fs/cgroup/freezer")
    assert _fstype(freezer) == "cgroup", f"{freezer} is not a cgroup v1 mount"
    assert (freezer / "cgroup.procs").is_file() and not (freezer / "cgroup.controllers").exists()
    before = sorted(p.name for p in freezer.iterdir())
    leaf = f"slurm-ext-test-{secrets.token_hex(4)}"

    assert leave_root_cgroup(freezer, leaf=leaf) is None

    assert sorted(p.name for p in freezer.iterdir()) == before


def test_hybrid_tmpfs_root_is_left_alone() -> None:
    """The default root: on a hybrid host /sys/fs/cgroup is a tmpfs, not a cgroup."""
    if _fstype(Path("/sys/fs/cgroup")) != "tmpfs":
        pytest.fail("/sys/fs/cgroup is not the hybrid layout's tmpfs that this project's machines have")
    before = sorted(p.name for p in Path("/sys/fs/cgroup").iterdir())
    own = Path("/proc/self/cgroup").read_text()

    assert leave_root_cgroup() is None

    assert sorted(p.name for p in Path("/sys/fs/cgroup").iterdir()) == before
    assert Path("/proc/self/cgroup").read_text() == own


@pytest.mark.parametrize("first", ["forker", "other"])
def test_a_process_forking_meanwhile_still_ends_in_the_leaf(sandbox: Sandbox, first: str) -> None:
    forker = sandbox.spawn(FORKER)
    other = sandbox.spawn(["sleep", "60"])
    time.sleep(0.2)  # let the forker's children fill the root
    assert len(_pids(sandbox.root)) > 2

    leaf = leave_root_cgroup(sandbox.root, pid=(forker if first == "forker" else other).pid)

    assert leaf == sandbox.leaf
    assert _pids(sandbox.root) == set()
    assert {forker.pid, other.pid} <= _pids(sandbox.leaf)
    # New children start in their parent's cgroup: the root stays empty.
    time.sleep(0.2)
    assert _pids(sandbox.root) == set()
    assert forker.poll() is None


def test_subtree_control_without_controllers(sandbox: Sandbox) -> None:
    sandbox.spawn(["sleep", "60"])
    available = _words(sandbox.root / "cgroup.controllers")

    assert leave_root_cgroup(sandbox.root, pid=sandbox.procs[0].pid) == sandbox.leaf

    assert _words(sandbox.root / "cgroup.subtree_control") == available


def test_controllers_are_enabled_once_the_root_is_empty(
    sandbox_with_controller: Sandbox, host_controller: str
) -> None:
    box = sandbox_with_controller
    box.spawn(["sleep", "60"])
    assert host_controller in _words(box.root / "cgroup.controllers")
    # Issue 238 itself: a cgroup that holds processes cannot enable a controller.
    with pytest.raises(OSError) as busy:
        (box.root / "cgroup.subtree_control").write_text(f"+{host_controller}")
    assert busy.value.errno == errno.EBUSY

    assert leave_root_cgroup(box.root, pid=box.procs[0].pid) == box.leaf

    assert host_controller in _words(box.root / "cgroup.subtree_control")
    assert host_controller in _words(box.leaf / "cgroup.controllers")
    assert _pids(box.leaf) == {box.procs[0].pid}


def test_pid_outside_the_root_moves_nothing(sandbox: Sandbox) -> None:
    sleeper = sandbox.spawn(["sleep", "60"])

    with pytest.raises(RuntimeError, match=f"pid {os.getpid()} is not in"):
        leave_root_cgroup(sandbox.root, pid=os.getpid())

    assert _pids(sandbox.root) == {sleeper.pid}
    assert not sandbox.leaf.exists()


def test_write_errors_name_the_file_and_the_consequence(sandbox: Sandbox) -> None:
    sleeper = sandbox.spawn(["sleep", "60"])
    (sandbox.root / "cgroup.max.descendants").write_text("0")  # mkdir fails: EAGAIN

    with pytest.raises(CgroupError) as failed:
        leave_root_cgroup(sandbox.root, pid=sleeper.pid)

    assert isinstance(failed.value, RuntimeError)
    message = str(failed.value)
    assert str(sandbox.leaf) in message
    assert os.strerror(errno.EAGAIN) in message
    assert "slurmd will not be able to enable cgroup controllers" in message
    assert "issue 238" in message
    assert _pids(sandbox.root) == {sleeper.pid}


def test_make_writable_remounts_only_read_only_cgroups_below_the_root_and_names_the_flags(tmp_path):
    """Parsed from a mountinfo of our making: the one read-only cgroup below the root is remounted, which
    fails here (the directory is no mount point), and the error names the flags that provide it."""
    from slurm_ext.supervisor.cgroup import CgroupError, make_writable
    root = tmp_path / "cgroup"
    (root / "cpu").mkdir(parents=True)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"85 84 0:45 / {root} rw,nosuid - tmpfs tmpfs rw\n"
        f"86 85 0:29 / {root}/cpu ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu\n"
        f"87 85 0:30 / {tmp_path}/elsewhere ro,nosuid - cgroup cgroup rw,memory\n"
        "garbage line\n")
    with pytest.raises(CgroupError, match=r"cannot remount .*/cpu read-write.*--cap-add SYS_ADMIN.*--cgroupns private"):
        make_writable(root, mountinfo)
    mountinfo.write_text(f"86 85 0:29 / {root}/cpu rw,nosuid - cgroup cgroup rw,cpu\n")
    assert make_writable(root, mountinfo) == []


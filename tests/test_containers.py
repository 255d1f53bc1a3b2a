"""slurm-ext's images in a real Docker engine (issue 11): built from the checkout, the agent as PID 1.

The suite starts an engine of its own (tests/docker_engine.py) and builds every image with
containers/build.py from a debootstrap base, as a user without a registry would (conftest's `engine`
and `images`, which mark a test `containers`). Containers run on `--network host` only. The cluster made
of them: test_container_cluster.py.

What the build trusts (issue 28, item 18), without an engine or a network: every dependency's wheel is
pinned by its sha256 (containers/requirements.lock), checked by build.py and again by pip's own
--require-hashes in the image; a registry base image must be named by its digest; apt keeps checking
that the mirror's Release files are current, within a bound given for a snapshot.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers.files import temp_dir
from helpers.wait import wait_for
from slurm_ext.config import Config

REPO = Path(__file__).resolve().parents[1]
#: image -> (the role its agent runs, the agent's port with the image's own config)
IMAGES = {"worker": ("worker", 9810), "controller": ("controller", 9811), "accounting": ("accounting", 9812),
          "login": ("login", 9813), "mariadb": ("accounting", 9814)}


def _pid1(container) -> list[str]:
    code, out = container.exec_run(["cat", "/proc/1/cmdline"])
    return out.decode().split("\0")[:-1] if code == 0 else []


@pytest.mark.parametrize("image", IMAGES)
def test_every_image_runs_the_agent_as_pid_1_and_it_answers_its_probe(engine, images, image):
    role, port = IMAGES[image]
    container = engine.client.containers.run(images[image], detach=True, network_mode="host")
    try:
        argv = wait_for(f"{image}: PID 1 to be seen", lambda: _pid1(container), timeout=30)
        assert argv[1:] == ["/opt/slurm-ext/bin/slurm-ext", "supervise", "--role", role, "--"], argv
        assert Path(argv[0]).name.startswith("python3"), argv
        # the agent lives and answers /livez, whatever its workers do without a cluster to join
        if image != "mariadb":  # the image runs with every default; mariadb's has a port of its own
            assert port == Config().supervisor.port(role)

        def live() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as reply:
                    return reply.status == 200
            except OSError:
                return False

        assert wait_for(f"{image}: /livez on port {port}", live, timeout=30)
        container.reload()
        assert container.status == "running", container.logs()[-2000:]
    finally:
        container.remove(force=True, v=True)


_ORPHAN_MAKER = """
import os, time
for _ in range(50):
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(2.0)
        os._exit(0)
time.sleep(100000)
"""


def test_orphans_made_inside_a_container_are_reaped_by_pid_1(engine, images):
    """A worker's children whose parent exits are re-parented to PID 1, the agent, which reaps them: no
    zombie piles up, as under a PID 1 that reaps nothing (slurmd as PID 1 leaves [slurmstepd] <defunct>).
    (A `docker exec`'d process would not do: its orphans go to the engine's shim, a subreaper outside.)"""
    etc = temp_dir()
    try:
        (etc / "slurm-ext.toml").write_text(
            '[supervisor.workers.orphans]\nroles = ["login"]\nrestart = "never"\n'
            f'command = ["python3", "-c", {json.dumps(_ORPHAN_MAKER)}]\n')
        container = engine.client.containers.run(images["login"], detach=True, network_mode="host",
                                                 volumes={str(etc): {"bind": "/etc/slurm-ext", "mode": "ro"}})
        try:
            def orphans() -> list[str]:
                """State letters of the processes whose parent is PID 1, other than the agent's workers."""
                _, listing = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null; true"])
                found = []
                for line in listing.decode().splitlines():
                    pid_comm, _, rest = line.rpartition(") ")
                    fields = rest.split()
                    if pid_comm.endswith("(python3") and len(fields) > 1 and fields[1] == "1":
                        found.append(fields[0])
                return found

            # the worker (a child of PID 1 too) sleeps on: 51 children of PID 1, 50 of them orphans
            seen = wait_for("the 50 orphans, children of PID 1", lambda: len(found := orphans()) == 51 and found,
                            timeout=30, interval=0.1)
            assert seen.count("S") == 51, seen
            wait_for("every orphan gone and reaped, no zombie", lambda: orphans() == ["S"], timeout=15)
            container.reload()
            assert container.status == "running"
        finally:
            container.remove(force=True, v=True)
    finally:
        shutil.rmtree(etc)


# -- what the build trusts (issue 28, item 18) -----------------------------------------------------------------

sys.path.insert(0, str(REPO / "containers"))
import build  # noqa: E402  (containers/build.py)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The wheels build.py makes for the images (the checkout's, and its dependencies' from the package index
    this host's pip is configured with: no network needed here), in a directory of the test's own; built from a
    copy of the checkout, as setuptools writes build/ and *.egg-info into the tree it builds, and the suite's
    image build may be building the checkout itself meanwhile."""
    tree = tmp_path_factory.mktemp("checkout") / "slurm-ext"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", "*.so", "*.so.1"))
    dist = tmp_path_factory.mktemp("dist")
    build.build_wheels(dist, tree)
    return dist


def _pip_install_dry_run(dist: Path, requirements: Path) -> subprocess.CompletedProcess:
    """What the Dockerfile runs, without installing: pip resolves every requirement from `dist` only and checks
    each wheel's sha256."""
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
                           "--disable-pip-version-check", "--no-index", "--only-binary=:all:", "--find-links",
                           str(dist), "--require-hashes", "-r", str(requirements)],
                          capture_output=True, text=True, timeout=300, env={"PIP_CONFIG_FILE": "/dev/null",
                                                                            "PATH": "/usr/bin:/bin"})


def test_the_lock_pins_every_dependency_and_pip_installs_them_by_hash(wheels):
    build.check_locked(wheels)  # every third-party wheel fetched now is the reviewed one
    assert build.lock_text(wheels) == build.LOCK.read_text(), "the lock is stale: containers/build.py --lock"
    requirements = build.write_requirements(wheels)
    text = requirements.read_text()
    assert text.startswith(build.LOCK.read_text()) and re.search(r"^slurm-ext==\S+ \\$", text, re.M)
    done = _pip_install_dry_run(wheels, requirements)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Would install" in done.stdout and "slurm-ext" in done.stdout


def test_a_wheel_changed_on_its_way_is_refused_by_the_build_and_by_pip(wheels, tmp_path):
    """A wheel with one byte more (a mirror's, an index's, a proxy's) under the same name: build.py says which and
    stops; the image's pip refuses it too."""
    dist = tmp_path / "dist"
    shutil.copytree(wheels, dist)
    requirements = build.write_requirements(dist)
    [victim] = dist.glob("click-*.whl")
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match=rf"{victim.name} \(sha256 [0-9a-f]{{64}}\) is not in .*its hash is not"):
        build.check_locked(dist)
    done = _pip_install_dry_run(dist, requirements)
    assert done.returncode != 0 and "DO NOT MATCH THE HASHES" in done.stdout + done.stderr, done.stdout + done.stderr
    victim.unlink()  # and one the lock never named
    (dist / "click-9.9.9-py3-none-any.whl").write_bytes(b"PK\5\6" + b"\0" * 18)
    with pytest.raises(SystemExit, match="that version is not the reviewed one"):
        build.check_locked(dist)


def _tiny_wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    """A real, minimal wheel of `name` `version` (metadata only), as an index would serve it."""
    import zipfile
    wheel = directory / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        archive.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return wheel


def test_the_constraints_build_py_gives_pip_name_exactly_the_locked_versions():
    """Issue 28 review of 28.18: pip wheel resolved setup.cfg's unpinned requirements to the newest versions, which
    the lock then refused: a clean clone's image build broke at any dependency's next release."""
    locked = {f"{name}=={version}" for name, version in build._locked(build.LOCK.read_text())}
    assert locked and build.constraints_text(build.LOCK).splitlines() == sorted(locked)


def test_the_wheel_build_takes_the_locked_version_when_the_index_has_a_newer_one(tmp_path, monkeypatch):
    """A real pip wheel of a checkout that requires `tinydep` unpinned, from an index that has 1.0 (locked) and 2.0
    (released since): the build takes 1.0 and the lock check passes; before, pip took 2.0 and the build stopped."""
    index = tmp_path / "index"
    index.mkdir()
    old = _tiny_wheel(index, "tinydep", "1.0")
    _tiny_wheel(index, "tinydep", "2.0")
    checkout = tmp_path / "slurm-ext"
    checkout.mkdir()
    (checkout / "setup.py").write_text("from setuptools import setup\n"
                                       "setup(name='slurm-ext', version='0.0.1', install_requires=['tinydep'])\n")
    lock = tmp_path / "requirements.lock"
    lock.write_text(build._requirement("tinydep", "1.0", [build.hashlib.sha256(old.read_bytes()).hexdigest()]))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    dist = tmp_path / "dist"
    build.build_wheels(dist, checkout, lock)
    assert sorted(wheel.name for wheel in dist.glob("tinydep-*")) == [old.name]
    build.check_locked(dist, lock)


def test_a_compiled_wheel_of_another_machine_is_refused_with_how_to_lock_it(tmp_path):
    """The lock holds the compiled wheels (MarkupSafe's) of the machine that wrote it: a build host of another
    machine is told to lock its own there, and --lock keeps the hashes the lock has for the same versions."""
    dist = tmp_path / "dist"
    dist.mkdir()
    [(name, version)] = [key for key in build._locked(build.LOCK.read_text()) if key[0] == "markupsafe"]
    foreign = _tiny_wheel(dist, name, version, "cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64")
    with pytest.raises(SystemExit, match=r"(?s)its hash is not.*aarch64.*`containers/build.py --lock` there"):
        build.check_locked(dist)
    relocked = build._locked(build.lock_text(dist))
    assert relocked[(name, version)] == (build._locked(build.LOCK.read_text())[(name, version)]
                                         | {build.hashlib.sha256(foreign.read_bytes()).hexdigest()})


@pytest.mark.parametrize("base", ["debian:sid", "debian", "registry.example.com/debian:trixie",
                                  "debian@sha256:abc", "debian:sid@sha512:" + "a" * 128])
def test_the_build_refuses_a_base_image_without_a_digest_before_it_builds_anything(base, tmp_path):
    """Refused before the wheels, the engine or the base: the command exits with the reason and builds nothing."""
    done = subprocess.run([sys.executable, str(REPO / "containers" / "build.py"), "--base", base],
                          capture_output=True, text=True, timeout=120, env={"DOCKER_HOST": "unix:///nonexistent",
                                                                            "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.returncode != 0 and f"--base {base} is not pinned by digest" in done.stderr, done.stderr
    build.check_base(base, allow_unpinned=True)  # a development build may
    build.check_base("debian@sha256:" + "0" * 64, allow_unpinned=False)
    build.check_base("registry.example.com:5000/debian:sid@sha256:" + "f" * 64, allow_unpinned=False)
    build.check_base(None, allow_unpinned=False)  # the debootstrap base, made here from signed packages


def _run_lines(dockerfile: str) -> list[str]:
    """The Dockerfile's RUN instructions, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_the_dockerfile_installs_by_hash_and_keeps_apts_release_check():
    dockerfile = (REPO / "containers" / "Dockerfile").read_text()
    runs = _run_lines(dockerfile)
    [pip] = [run for run in runs if "pip install" in run]
    for option in ("--require-hashes", "--no-index", "--only-binary=:all:",
                   "-r /tmp/slurm-ext-dist/requirements.txt"):
        assert option in pip, option
    assert "Check-Valid-Until \"false\"" not in dockerfile and "Check-Valid-Until \"true\"" in dockerfile
    # the snapshot's allowance is a bound, and only where the build is told one
    assert "ARG APT_RELEASE_MAX_AGE=0" in dockerfile
    [apt] = [run for run in runs if "Min-ValidTime" in run]
    assert '[ "$APT_RELEASE_MAX_AGE" -gt 0 ]' in apt
    from helpers.images import APT_RELEASE_MAX_AGE_DAYS
    assert 0 < APT_RELEASE_MAX_AGE_DAYS <= 400
    # every stage starts from the base the build checked
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${BASE}"] + ["base"] * (len(
        re.findall(r"^FROM ", dockerfile, re.M)) - 1)

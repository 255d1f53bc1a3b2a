#!/usr/bin/env python3
"""Build slurm-ext's images from this checkout: `python3 containers/build.py [--suite sid|trixie|resolute]`.

Steps, each skipped when its result is there already:
  1. wheels of the checkout and its dependencies into containers/dist/ (what the images install:
     what users get), each dependency's sha256 checked against containers/requirements.lock, and
     dist/requirements.txt, from which the images install with pip --require-hashes;
  2. the base image `slurm-ext-base:<suite>`: a `debootstrap --variant=minbase` root file system
     imported into the engine (no registry is needed), unless --base names a registry image, which
     must be pinned by its digest (NAME@sha256:...; --allow-unpinned: a tag, for development only);
  3. one image per role from containers/Dockerfile, and MariaDB's: slurm-ext-<role>:<suite>.
The engine is the one DOCKER_HOST names (the Docker SDK's default otherwise). Needs root for
debootstrap, and the `docker` Python package (pip install docker).

Dependencies are fetched at the lock's versions (pip constraints), so a release since the lock was written
changes nothing. `--lock` writes containers/requirements.lock from the wheels fetched now, keeping the
hashes it had for the same versions: on a build host of another machine (aarch64: the lock holds the
compiled wheels, MarkupSafe's, of the machines that ran it), or after a new dependency; to move a
dependency to a new version, delete its lines from the lock first. Review what came, then commit the lock.
A wheel whose hash the lock does not hold is refused: a changed file on an index or a mirror, a new
version nobody reviewed, or a compiled wheel of a machine nobody locked.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
#: the images: one per role, and MariaDB for slurmdbd
IMAGES = ("worker", "controller", "accounting", "login", "restapi", "mariadb")


@dataclass(frozen=True, slots=True)
class Suite:
    """A distribution release the images build on, and so their Slurm."""

    slurm: str
    mirror: str
    #: debootstrap's --components, and the keyring its Release file is checked with ("": debootstrap's own)
    components: str = "main"
    keyring: str = ""
    #: debootstrap's script for it ("": the suite's own name; Debian 12's debootstrap knows no Ubuntu after 23.04,
    #: and every Ubuntu script is gutsy's)
    script: str = ""


#: Slurm in each suite (Slinky 1.2 needs 26.05, 1.0/1.1 need 25.11: sid is the default). Debian has no 25.11
#: (trixie 24.11, sid 26.05); Ubuntu 26.04 (resolute) has 25.11.2, from universe, checked with Ubuntu's keyring
#: (the ubuntu-keyring package: Debian's from trixie on, or Ubuntu's)
SUITES = {
    "sid": Suite("26.05", "http://deb.debian.org/debian"),
    "trixie": Suite("24.11", "http://deb.debian.org/debian"),
    "resolute": Suite("25.11", "http://archive.ubuntu.com/ubuntu", "main,universe",
                      "/usr/share/keyrings/ubuntu-archive-keyring.gpg", "gutsy"),
}
#: the images' third-party wheels, each by its sha256 (`--lock` writes it)
LOCK = HERE / "requirements.lock"
#: a registry image pinned by its content: NAME[:TAG]@sha256:<64 hex digits>
PINNED_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*@sha256:[0-9a-f]{64}$")


def log(message: str) -> None:
    print(f"containers/build.py: {message}", flush=True)


#: the Pythons an image may have (Debian's python3 of the suites it builds on, and the next): a dependency built
#: for one Python only (MarkupSafe, under Flask) is fetched for each of them, and the image's pip takes its own
IMAGE_PYTHONS = ("3.11", "3.12", "3.13", "3.14")


def build_wheels(dist: Path, checkout: Path = CHECKOUT, lock: Path | None = LOCK) -> Path:
    """A wheel of `checkout` and of each dependency in `dist` (replacing older ones); returns ours.

    The image installs from these alone (pip --no-index): its build needs no package index, and no
    trust in whatever TLS interception stands between a build host and PyPI. Most dependencies are
    pure Python or abi3 (psutil), so wheels fetched by this Python fit the image's newer one; a wheel
    made for this Python only is fetched again for each of IMAGE_PYTHONS.

    Each dependency is taken at the version `lock` names (pip's constraints): setup.cfg's requirements are
    unpinned, and the newest version an index has (a release since the lock was written) would be refused by
    check_locked; `--lock` too, so that relocking on a build host of another machine adds its wheels of the same
    versions. None (no lock yet): the newest, for review.
    """
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="slurm-ext-build-") as scratch:
        constraints = []
        if lock is not None:
            (Path(scratch) / "constraints.txt").write_text(constraints_text(lock))
            constraints = ["--constraint", str(Path(scratch) / "constraints.txt")]
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--wheel-dir",
                        str(dist), *constraints, str(checkout)], check=True)
    machine = platform.machine()
    for built in list(dist.glob("*.whl")):
        name, version, *_, python_tag, abi, platform_tag = built.stem.split("-")
        if platform_tag == "any" or abi in ("abi3", "none"):
            continue
        for python in IMAGE_PYTHONS:  # a Python that has no wheel of it is the image build's error, by name
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            "--python-version", python, "--implementation", "cp", "--platform",
                            f"manylinux2014_{machine}", "--platform", f"manylinux_2_28_{machine}", "--dest", str(dist),
                            f"{name}=={version}"], check=False)
    [wheel] = dist.glob("slurm_ext-*.whl")
    return wheel


def _wheel_hashes(dist: Path) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(project, version) -> [(wheel file, sha256)] of the wheels in `dist` (project names normalised as pip's)."""
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for wheel in sorted(dist.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        key = (re.sub(r"[-_.]+", "-", name).lower(), version)
        found.setdefault(key, []).append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    return found


def _requirement(name: str, version: str, hashes: list[str]) -> str:
    return f"{name}=={version}" + "".join(f" \\\n    --hash=sha256:{h}" for h in hashes) + "\n"


def lock_text(dist: Path, lock: Path = LOCK) -> str:
    """containers/requirements.lock for the third-party wheels in `dist`: each version with the sha256 of each of
    its wheels (one per Python for a compiled one), and those `lock` has for the same version already (a compiled
    wheel is per machine: the lock of an x86_64 host, relocked on an aarch64 one, then holds both)."""
    try:
        kept = _locked(lock.read_text())
    except FileNotFoundError:
        kept = {}
    lines = ["# The images' Python dependencies, each wheel by its sha256: containers/build.py refuses any other\n",
             "# wheel, and the images install with pip --require-hashes. Written by `containers/build.py --lock`\n",
             "# after a dependency changed: review what came, then commit it.\n"]
    for (name, version), wheels in _wheel_hashes(dist).items():
        if name != "slurm-ext":
            hashes = {h for _, h in wheels} | kept.get((name, version), set())
            lines.append(_requirement(name, version, sorted(hashes)))
    return "".join(lines)


def constraints_text(lock: Path = LOCK) -> str:
    """pip's constraints for `lock`: each locked project at its locked version (`name==version`), one a line."""
    return "".join(f"{name}=={version}\n" for name, version in sorted(_locked(lock.read_text())))


def _locked(text: str) -> dict[tuple[str, str], set[str]]:
    """(project, version) -> its sha256s, from a lock's text."""
    locked: dict[tuple[str, str], set[str]] = {}
    for requirement in text.replace("\\\n", " ").splitlines():
        words = requirement.split("#", 1)[0].split()
        if words:
            name, version = words[0].split("==")
            locked[(name, version)] = {w.removeprefix("--hash=sha256:") for w in words[1:]}
    return locked


def check_locked(dist: Path, lock: Path = LOCK) -> None:
    """Refuse (SystemExit, naming the wheel) a third-party wheel in `dist` whose version or sha256 `lock` lacks."""
    try:
        locked = _locked(lock.read_text())
    except OSError as err:
        raise SystemExit(f"containers/build.py: cannot read {lock}: {err.strerror}") from None
    for (name, version), wheels in _wheel_hashes(dist).items():
        if name == "slurm-ext":
            continue
        for wheel, digest in wheels:
            if digest not in locked.get((name, version), ()):
                raise SystemExit(f"containers/build.py: {dist / wheel} (sha256 {digest}) is not in {lock}: "
                                 f"{'that version is not' if (name, version) not in locked else 'its hash is not'} "
                                 f"the reviewed one. If the dependency changed on purpose, review it and run "
                                 f"`containers/build.py --lock`; otherwise the index or mirror served another file"
                                 + _machine_note(wheel))


def _machine_note(wheel: str) -> str:
    """For a compiled wheel: the lock holds those of the machines whose build hosts wrote it, and how to add this
    one's."""
    platform_tag = wheel.removesuffix(".whl").split("-")[-1]
    if platform_tag == "any":
        return ""
    return (f". A compiled wheel ({platform_tag}) is locked only for the machines whose build hosts ran --lock: on a "
            f"build host of another machine ({platform.machine()} here, e.g. aarch64), run "
            f"`containers/build.py --lock` there (it keeps the hashes the lock has), review and commit the lock")


def write_requirements(dist: Path, lock: Path = LOCK) -> Path:
    """dist/requirements.txt, what the images install with pip --require-hashes: the lock, and the wheel of the
    checkout by the hash it has now."""
    [(key, wheels)] = [(key, wheels) for key, wheels in _wheel_hashes(dist).items() if key[0] == "slurm-ext"]
    target = dist / "requirements.txt"
    target.write_text(lock.read_text() + _requirement(key[0], key[1], [h for _, h in wheels]))
    return target


def check_base(base: str | None, allow_unpinned: bool) -> None:
    """Refuse a registry base image named by a tag alone: a tag is whatever the registry (or whoever answers for
    it) serves today. Our own debootstrap base (None) is made here from signed Debian packages."""
    if base is None or PINNED_IMAGE.match(base) or allow_unpinned:
        return
    raise SystemExit(f"containers/build.py: --base {base} is not pinned by digest: give NAME@sha256:DIGEST (`docker "
                     f"pull {base}` then `docker inspect --format '{{{{index .RepoDigests 0}}}}' {base}`), or "
                     f"--allow-unpinned for a development build")


def has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_base(client: docker.DockerClient, suite: str, mirror: str = "") -> str:
    """`slurm-ext-base:<suite>` from debootstrap (from `mirror`, the suite's own by default), unless the engine has
    it; returns its name."""
    name = f"slurm-ext-base:{suite}"
    if has_image(client, name):
        return name
    if shutil.which("debootstrap") is None:
        raise SystemExit("containers/build.py: debootstrap is not installed (apt-get install debootstrap), "
                         "or give --base debian:<suite> to start from a registry image")
    known = SUITES[suite]
    if known.keyring and not Path(known.keyring).is_file():
        raise SystemExit(f"containers/build.py: {suite}'s packages are checked with {known.keyring}, which is not "
                         "there: install the ubuntu-keyring package (Debian 13 and later have it)")
    mirror = mirror or known.mirror
    with tempfile.TemporaryDirectory(prefix="slurm-ext-rootfs-") as work:
        root = Path(work) / "root"
        started = time.monotonic()
        log(f"debootstrap --variant=minbase {suite} from {mirror} (about 20 s)")
        subprocess.run(["debootstrap", "--variant=minbase", f"--components={known.components}",
                        *([f"--keyring={known.keyring}"] if known.keyring else []), suite, str(root), mirror,
                        *([f"/usr/share/debootstrap/scripts/{known.script}"] if known.script else [])],
                       check=True, stdout=subprocess.DEVNULL)
        # apt's downloaded lists and packages are not part of a base
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        archive = Path(work) / "root.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(archive), "."], check=True)
        client.api.import_image(src=str(archive), repository="slurm-ext-base", tag=suite)  # streamed from the file
        log(f"{name} imported ({time.monotonic() - started:.0f} s)")
    return name


def build_role(client: docker.DockerClient, role: str, base: str, tag: str, apt_release_max_age: int = 0) -> None:
    started = time.monotonic()
    try:
        client.images.build(path=str(HERE), dockerfile="Dockerfile", target=role, tag=tag,
                            buildargs={"BASE": base, "APT_RELEASE_MAX_AGE": str(apt_release_max_age)},
                            network_mode="host", rm=True, forcerm=True)
    except docker.errors.BuildError as err:
        lines = [chunk.get("stream", chunk.get("error", "")) for chunk in err.build_log]
        raise SystemExit(f"containers/build.py: building {tag} failed: {err}\n{''.join(lines)[-4000:]}") from None
    log(f"{tag} built ({time.monotonic() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="sid",
                        help="the distribution release, and so the Slurm in the images (" +
                        ", ".join(f"{name}: {suite.slurm}" for name, suite in SUITES.items()) + ")")
    parser.add_argument("--base", help="a registry base image pinned by digest (debian@sha256:...) instead of a "
                        "debootstrap one")
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="take a --base named by a tag alone (debian:sid): development builds only")
    parser.add_argument("--mirror", default="", help="the mirror debootstrap reads (default: the suite's own, "
                        "deb.debian.org or archive.ubuntu.com)")
    parser.add_argument("--apt-release-max-age", type=int, default=0, metavar="DAYS",
                        help="take the mirror's Release files up to DAYS after their Date even past their Valid-Until "
                             "(a mirror snapshot: sid's Valid-Until is a week); default 0: apt's own check")
    parser.add_argument("--image", action="append", choices=IMAGES, help="build only these images (default: all)")
    parser.add_argument("--lock", action="store_true",
                        help=f"write {LOCK.name} from the wheels fetched now (after a reviewed dependency change)")
    args = parser.parse_args(argv)
    check_base(args.base, args.allow_unpinned)
    if not 0 <= args.apt_release_max_age <= 3650:
        parser.error("--apt-release-max-age: expected 0 to 3650 days")
    dist = HERE / "dist"
    wheel = build_wheels(dist, lock=LOCK if LOCK.exists() else None)
    log(f"wheel {wheel.name}")
    if args.lock:
        LOCK.write_text(lock_text(dist))
        log(f"wrote {LOCK}: review `git diff {LOCK}` before committing it")
        return 0
    check_locked(dist)
    write_requirements(dist)
    client = docker.from_env(timeout=600)
    base = args.base or build_base(client, args.suite, args.mirror)
    for role in args.image or IMAGES:
        build_role(client, role, base, f"slurm-ext-{role}:{args.suite}", args.apt_release_max_age * 86400)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Build slurm-ext's images from this checkout: `python3 containers/build.py [--suite sid|trixie]`.

Steps, each skipped when its result is there already:
  1. wheels of the checkout and its dependencies into containers/dist/ (what the images install:
     what users get);
  2. the base image `slurm-ext-base:<suite>`: a `debootstrap --variant=minbase` root file system
     imported into the engine (no registry is needed), unless --base names a registry image;
  3. one image per role from containers/Dockerfile, and MariaDB's: slurm-ext-<role>:<suite>.
The engine is the one DOCKER_HOST names (the Docker SDK's default otherwise). Needs root for
debootstrap, and the `docker` Python package (pip install docker).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
#: the images: one per role, and MariaDB for slurmdbd
IMAGES = ("worker", "controller", "accounting", "login", "mariadb")
#: Slurm in each suite Debian has (Slinky 1.2 needs 26.05, 1.0/1.1 need 25.11: sid is the default)
SUITES = {"sid": "26.05", "trixie": "24.11"}
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def log(message: str) -> None:
    print(f"containers/build.py: {message}", flush=True)


#: the Pythons an image may have (Debian's python3 of the suites it builds on, and the next): a dependency built
#: for one Python only (MarkupSafe, under Flask) is fetched for each of them, and the image's pip takes its own
IMAGE_PYTHONS = ("3.11", "3.12", "3.13", "3.14")


def build_wheels(dist: Path) -> Path:
    """A wheel of the checkout and of each dependency in `dist` (replacing older ones); returns ours.

    The image installs from these alone (pip --no-index): its build needs no package index, and no
    trust in whatever TLS interception stands between a build host and PyPI. Most dependencies are
    pure Python or abi3 (psutil), so wheels fetched by this Python fit the image's newer one; a wheel
    made for this Python only is fetched again for each of IMAGE_PYTHONS.
    """
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--wheel-dir", str(dist),
                    str(CHECKOUT)], check=True)
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


def has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_base(client: docker.DockerClient, suite: str, mirror: str) -> str:
    """`slurm-ext-base:<suite>` from debootstrap, unless the engine has it; returns its name."""
    name = f"slurm-ext-base:{suite}"
    if has_image(client, name):
        return name
    if shutil.which("debootstrap") is None:
        raise SystemExit("containers/build.py: debootstrap is not installed (apt-get install debootstrap), "
                         "or give --base debian:<suite> to start from a registry image")
    with tempfile.TemporaryDirectory(prefix="slurm-ext-rootfs-") as work:
        root = Path(work) / "root"
        started = time.monotonic()
        log(f"debootstrap --variant=minbase {suite} from {mirror} (about 20 s)")
        subprocess.run(["debootstrap", "--variant=minbase", suite, str(root), mirror], check=True,
                       stdout=subprocess.DEVNULL)
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


def build_role(client: docker.DockerClient, role: str, base: str, tag: str) -> None:
    started = time.monotonic()
    try:
        client.images.build(path=str(HERE), dockerfile="Dockerfile", target=role, tag=tag, buildargs={"BASE": base},
                            network_mode="host", rm=True, forcerm=True)
    except docker.errors.BuildError as err:
        lines = [chunk.get("stream", chunk.get("error", "")) for chunk in err.build_log]
        raise SystemExit(f"containers/build.py: building {tag} failed: {err}\n{''.join(lines)[-4000:]}") from None
    log(f"{tag} built ({time.monotonic() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="sid",
                        help="Debian suite, and so the Slurm in the images (sid: 26.05, trixie: 24.11)")
    parser.add_argument("--base", help="a registry base image (e.g. debian:sid) instead of a debootstrap one")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror for debootstrap")
    parser.add_argument("--image", action="append", choices=IMAGES, help="build only these images (default: all)")
    args = parser.parse_args(argv)
    client = docker.from_env(timeout=600)
    wheel = build_wheels(HERE / "dist")
    log(f"wheel {wheel.name}")
    base = args.base or build_base(client, args.suite, args.mirror)
    for role in args.image or IMAGES:
        build_role(client, role, base, f"slurm-ext-{role}:{args.suite}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Debian packages the dev cluster needs, checked and installed with apt-get."""

import logging
import os
import subprocess

from slurm_ext.errors import DevClusterError

__all__ = ["PACKAGES", "missing_packages", "install_command", "install", "require", "require_root"]

log = logging.getLogger("dev")

#: exactly what `dev up` runs: Slurm's daemons and clients with the cgroup and
#: munge plugins, munge, MariaDB, and a C compiler for the fake NVML library
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "slurm-client",
    "slurm-wlm-basic-plugins",
    "munge",
    "mariadb-server",
    "mariadb-client",
    "gcc",
    "libc6-dev",
)


def missing_packages(packages=None) -> list[str]:
    """Packages of `packages` (default: PACKAGES) that dpkg does not list as installed."""
    packages = PACKAGES if packages is None else packages
    result = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *packages],
                            capture_output=True, text=True, timeout=30)
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in packages if p not in installed]


def install_command(packages=None) -> str:
    packages = PACKAGES if packages is None else packages
    return "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y " + " ".join(packages)


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise DevClusterError(f"{what} must run as root (it starts Slurm's daemons, munge and MariaDB, "
                              f"and makes device files); try: sudo slurm-ext dev ...")


def require() -> None:
    """Raises DevClusterError with the install command when a package is missing."""
    missing = missing_packages()
    if missing:
        raise DevClusterError(f"missing Debian packages: {' '.join(missing)}; install them with "
                              f"`slurm-ext dev install-deps` or: {install_command(missing)}")


def install() -> None:
    """apt-get install every package the dev cluster needs (no-op when all are there)."""
    require_root("dev install-deps")
    missing = missing_packages()
    if not missing:
        log.info("all needed packages are installed: %s", " ".join(PACKAGES))
        return
    log.info("installing %s", " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(cmd, env=env).returncode != 0:
            raise DevClusterError(f"{' '.join(cmd)} failed (see its output above)")

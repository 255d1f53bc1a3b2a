"""Where everything of the dev cluster lives, under one state directory.

Removing the state directory (after `dev down`) removes the cluster: its
configs, logs, database, Slurm state, fake GPUs and the fake NVML library.
"""

import socket
from dataclasses import dataclass
from pathlib import Path

from .settings import DevSection

__all__ = ["Layout"]


@dataclass(frozen=True, slots=True)
class Layout:
    settings: DevSection

    @property
    def root(self) -> Path:
        return Path(self.settings.state_dir)

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def bin(self) -> Path:
        """Hook wrappers that give slurmd's hooks their environment back."""
        return self.root / "bin"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def accounting(self) -> Path:
        """The accounting database's volume ([accounting] volume): MariaDB's datadir, tmpdir and logs."""
        return self.root / "accounting"

    @property
    def ctld_state(self) -> Path:
        return self.root / "state" / "ctld"

    @property
    def slurmd_spool(self) -> Path:
        return self.root / "state" / "d"

    @property
    def node_state(self) -> Path:
        """slurm-ext's own node-local state dir ([node] state_dir of the hooks)."""
        return self.root / "state" / "node"

    @property
    def dev(self) -> Path:
        """Fake GPU character devices (nvidia<minor>)."""
        return self.root / "dev"

    @property
    def lib(self) -> Path:
        """The fake libnvidia-ml.so.1."""
        return self.root / "lib"

    @property
    def out(self) -> Path:
        """Job output, writable by every user."""
        return self.root / "out"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def db_password(self) -> Path:
        """The accounting database's password ([accounting] password_file)."""
        return self.etc / "db-password"

    @property
    def slurm_ext_conf(self) -> Path:
        """The slurm-ext config that the cluster's hooks and agents read."""
        return self.etc / "slurm-ext.toml"

    @property
    def gpu_spec(self) -> Path:
        """The fake GPUs' description (SLURM_EXT_FAKE_NVML); edit it to inject faults."""
        return self.root / "gpus.json"

    @property
    def kernel_log(self) -> Path:
        """The worker's kernel log (health.kernel_log): a file of its own unless [dev] kernel_log names another."""
        return Path(self.settings.kernel_log) if self.settings.kernel_log else self.root / "kmsg"

    @property
    def jobcomp_log(self) -> Path:
        """slurmctld's jobcomp/filetxt log, the witness of every job end (`slurm-ext accounting reconcile`)."""
        return self.ctld_state / "jobcomp.log"

    @property
    def runtime_dir(self) -> Path:
        """The agents' [supervisor] runtime_dir: notify sockets, the hook service's socket, MariaDB's files."""
        return self.root / "slurm-ext-run"

    @property
    def hook_socket(self) -> Path:
        """Where the worker agent's hook service listens for slurm-ext-hook."""
        return self.runtime_dir / "hooks.sock"

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    @property
    def host(self) -> str:
        """Short host name: slurmctld only acts as primary on the host SlurmctldHost names."""
        return socket.gethostname().split(".")[0]

    def gpu_devices(self) -> list[Path]:
        return [self.dev / f"nvidia{minor}" for minor in range(self.settings.gpu_count)]

    def daemon_environ(self) -> dict[str, str]:
        """Environment of every daemon and hook: the same config, Slurm and GPUs everywhere."""
        return {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.slurm_conf),
            "SLURM_EXT_CONFIG": str(self.slurm_ext_conf),
            "LD_LIBRARY_PATH": str(self.lib),
            "SLURM_EXT_FAKE_NVML": str(self.gpu_spec),
            # a job sees only the GPUs its devices cgroup lets it open, as with the real driver
            "SLURM_EXT_FAKE_NVML_DEV_DIR": str(self.dev),
        }

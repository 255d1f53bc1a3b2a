"""A Docker engine of the suite's own: Debian's dockerd with its own data root, no bridge, no iptables.

Containers on it use `--network host` only (the project's network rule). Started and stopped by its
PID; what dockerd leaves mounted at its exec root (the default netns) is unmounted at the stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import docker

DOCKERD = "/usr/sbin/dockerd"


class Engine:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slurm-ext-docker-"))
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log = self.root / "dockerd.log"
        self.process: subprocess.Popen | None = None
        self.client: docker.DockerClient | None = None

    def start(self, timeout: float = 60.0) -> Engine:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [DOCKERD, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                 "--pidfile", str(self.root / "dockerd.pid"), "-H", self.host, "--bridge=none", "--iptables=false",
                 "--ip-masq=false", "--ip6tables=false"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            if self.socket.exists():
                try:
                    self.client = docker.DockerClient(base_url=self.host, timeout=600)
                    self.client.ping()
                    return self
                except docker.errors.DockerException:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"dockerd did not answer within {timeout}s: {self.log.read_text()[-2000:]}")

    @classmethod
    def existing(cls, host: str) -> Engine:
        """An engine someone else runs (SLURM_EXT_TEST_DOCKER_HOST, to keep its image cache between runs while
        working on the images): used as it is, its containers left to the tests' own clean-up, never stopped."""
        engine = cls.__new__(cls)
        engine.root = engine.socket = engine.log = engine.process = None
        engine.host = host
        engine.client = docker.DockerClient(base_url=host, timeout=600)
        engine.client.ping()
        return engine

    def environ(self) -> dict[str, str]:
        """The environment that points docker tools (the SDK, containers/build.py) at this engine."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def stop(self) -> None:
        if self.root is None:  # not ours
            self.client.close()
            return
        if self.client is not None:
            for container in self.client.containers.list(all=True):
                container.remove(force=True, v=True)
            self.client.close()
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for mount in reversed(_mounts_under(self.root)):
            subprocess.run(["umount", "-l", mount], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=False)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    return mounts

"""slurm-ext's images in a real Docker engine (issue 11): built from the checkout, the agent as PID 1.

The suite starts an engine of its own (tests/docker_engine.py) and builds every role's image with
containers/build.py from a debootstrap base, as a user without a registry would. Containers run on
`--network host` only.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_for
from docker_engine import Engine
from slurm_ext.config import Config

pytestmark = pytest.mark.containers

REPO = Path(__file__).resolve().parents[1]
ROLES = ("worker", "controller", "accounting", "login")
SUITE = "sid"


@pytest.fixture(scope="module")
def engine():
    engine = Engine()
    try:
        yield engine.start()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def images(engine) -> dict[str, str]:
    """role -> image tag, built by containers/build.py into the suite's engine."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "containers" / "build.py"), "--suite", SUITE],
                          env=engine.environ(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"images built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return {role: f"slurm-ext-{role}:{SUITE}" for role in ROLES}


def _pid1(container) -> list[str]:
    code, out = container.exec_run(["cat", "/proc/1/cmdline"])
    return out.decode().split("\0")[:-1] if code == 0 else []


@pytest.mark.parametrize("role", ROLES)
def test_every_image_runs_the_agent_as_pid_1_and_it_answers_its_probe(engine, images, role):
    container = engine.client.containers.run(images[role], detach=True, network_mode="host")
    try:
        argv = wait_for(f"{role}: PID 1 to be seen", lambda: _pid1(container), timeout=30)
        assert argv[1:] == ["/opt/slurm-ext/bin/slurm-ext", "supervise", "--role", role, "--"], argv
        assert Path(argv[0]).name.startswith("python3"), argv
        # the agent lives and answers /livez, whatever its workers do without a cluster to join
        port = Config().supervisor.port(role)  # the image runs with every default

        def live() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as reply:
                    return reply.status == 200
            except OSError:
                return False

        assert wait_for(f"{role}: /livez on port {port}", live, timeout=30)
        container.reload()
        assert container.status == "running", container.logs()[-2000:]
    finally:
        container.remove(force=True)

"""slurm-ext's images in a real Docker engine (issue 11): built from the checkout, the agent as PID 1.

The suite starts an engine of its own (tests/docker_engine.py) and builds every image with
containers/build.py from a debootstrap base, as a user without a registry would (conftest's `engine`
and `images`). Containers run on `--network host` only. The cluster made of them:
test_container_cluster.py.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from helpers.files import temp_dir
from helpers.wait import wait_for
from slurm_ext.config import Config

pytestmark = pytest.mark.containers

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

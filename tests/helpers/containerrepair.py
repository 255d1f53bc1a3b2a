"""The repair tests' cluster on slurm-ext's images: Slurm 26.05 (Debian sid; the suite's images, so 24.11 with
SLURM_EXT_TEST_IMAGE_SUITE=trixie) as Slinky runs it, beside the host's.

Four workers (configless dynamic nodes, two fake GPUs each, cgroup/v1), slurmctld with the controller agent's
repair service, slurmdbd on MariaDB (containers/cluster.py), and Slurm's reboot of a worker played by restarting
its container as a booted node. It offers what the host's RepairCluster (helpers/cluster.py) offers, so that one
test body runs on both: Slurm through `docker exec` into the controller, the CLI as the controller's, a kernel log
file per worker in its /etc/slurm-ext (root/ext-n<i> here, written from here), jobs as the cluster's user.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from slurm_ext import command
from slurm_ext.config import SlurmSection
from slurm_ext.slurm import Job, SlurmClient

from .cluster import Gate, RepairSteps
from .wait import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "containers"))
from cluster import STATE_DIR, ContainerCluster, Ports  # noqa: E402 (containers/cluster.py)

#: its ports, clear of the suite's other clusters
PORTS = Ports(ctld=26917, dbd=26919, mariadb=23317, slurmd=26920, worker_agent=29920, controller_agent=29915,
              accounting_agent=29916, mariadb_agent=29917, restapi=26918)
#: the workers' kernel log: a file in each one's /etc/slurm-ext (the host's ext-n<i>), which the tests append the
#: kernel's lines to
KERNEL_LOG = "/etc/slurm-ext/kmsg"
#: the controller agent's repair service, as the host's repair cluster has it (devcluster/render.py)
REPAIR_CONF = """interval = "1s"
guard_percent = 50
cooldown = "0s"
drain_deadline = "10m"
boot_timeout = "90s"
verify_timeout = "2m"
"""
#: the cluster page, in the controller agent
WEB_PORT = 29918
CONTROLLER_CONF = f"""[web]
enabled = true
listen = "127.0.0.1:{WEB_PORT}"
token_file = "{STATE_DIR}/web-tokens"
"""
WORKER_CONF = f"""[health]
interval = "1s"
kernel_log = "{KERNEL_LOG}"
"""


def exec_runner(engine, container: str):
    """A SlurmClient runner that runs each command in `container` (`docker exec -i`: sbatch's script on its standard
    input too), as its root."""
    def run(argv, timeout, env=None, input=None, check=True) -> command.CommandResult:
        return command.run(["/usr/bin/docker", "-H", engine.host, "exec", "-i", container, *argv], timeout,
                           input=input, check=check)
    return run


class ContainerRepairCluster(RepairSteps):
    def __init__(self, engine, images: dict[str, str]) -> None:
        self.engine = engine
        self.containers = ContainerCluster(engine.client, images, "cgroup-v1", ports=PORTS, prefix="twin",
                                           workers=tuple((i, 2) for i in range(1, 6)), repair_conf=REPAIR_CONF,
                                           worker_conf=WORKER_CONF, controller_conf=CONTROLLER_CONF, reboot=True,
                                           own_database=True,
                                           slurm_conf="ResumeTimeout=60\nSlurmdTimeout=30\n")
        self.nodes = [self.containers.node_name(i) for i in range(1, 5)]
        #: the fifth worker, stopped once registered: its agent drained it on the way out, its slurmd is gone
        self.down_node = self.containers.node_name(5)
        self.kind = "images"
        self.url = f"http://127.0.0.1:{WEB_PORT}/"
        #: an operator token of alice's for the page (start() makes it)
        self.token = ""

    def start(self) -> ContainerRepairCluster:
        for index in range(1, len(self.nodes) + 2):  # there before the monitor starts
            self._kernel_log(index).parent.mkdir(parents=True, exist_ok=True)
            self._kernel_log(index).touch()
        self.containers.start()
        self.containers.containers["n5"].stop(timeout=30)
        wait_for(f"{self.down_node} drained by its stopping agent",
                 lambda: self.client().node(self.down_node).reason.startswith("slurm-ext: node agent stopping"), 60,
                 interval=0.5)
        added = self.repair_cli("web", "add-token", "alice")
        assert added.returncode == 0, added.stderr
        self.token = added.stdout.strip()
        return self

    def _kernel_log(self, index: int) -> Path:
        return self.containers.root / f"ext-n{index}" / "kmsg"

    def stop(self) -> None:
        self.containers.stop()

    # -- what RepairSteps asks ------------------------------------------------------------

    def client(self, timeout: float = 30.0) -> SlurmClient:
        return SlurmClient(SlurmSection(timeout=timeout), runner=self._in_controller())

    def _in_controller(self):
        return exec_runner(self.engine, self.containers.containers["controller"].name)

    def repair_cli(self, *args: str, user: str = "alice", node: str | None = None) -> subprocess.CompletedProcess:
        """`slurm-ext ARGS` as the controller's (or node `node`'s) root, invoked by sudo from `user`."""
        name = f"n{self.nodes.index(node) + 1}" if node else "controller"
        done = subprocess.run(["/usr/bin/docker", "-H", self.engine.host, "exec", "-e", f"SUDO_USER={user}",
                               self.containers.containers[name].name, "slurm-ext", *args],
                              capture_output=True, text=True, timeout=300)
        return done

    def all_records(self, node: str) -> list[dict]:
        code = ("import dataclasses, json; from slurm_ext import config; from slurm_ext.repair.store import open_store; "
                "store = open_store(config.load('/etc/slurm-ext/slurm-ext.toml')); "
                f"print(json.dumps([dataclasses.asdict(r) for r in store.records(node={node!r})]))")
        _, out = self.containers.exec("controller", "/opt/slurm-ext/bin/python", "-c", code)
        return json.loads(out.strip().splitlines()[-1])

    def sbatch(self, *args: str) -> int:
        return self.containers.sbatch("--chdir=/tmp", "-o", "/dev/null", *args)

    def gate(self, node: str) -> Gate:
        name = f"gate-{uuid.uuid4().hex[:8]}"
        return Gate(f"{STATE_DIR}/{name}", self.containers.volume_path(node) / name)

    def inject_xid(self, node: str, xid: int = 79) -> None:
        """The kernel line of Xid `xid` on the node's GPU 1, appended to its kernel log."""
        index = self.nodes.index(node) + 1
        spec = json.loads((self.containers.root / f"ext-n{index}" / "gpus.json").read_text())
        bus = spec["gpus"][1]["pci_bus_id"][4:-2]
        with open(self._kernel_log(index), "a") as log:
            log.write(f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, GPU has fallen off "
                      "the bus.\n")

    def reboots_seen(self, node: str) -> tuple[int, int]:
        """(reboots of `node` slurmctld queued, boots of its container after the RebootProgram) so far, by their
        logs (every run of a container's)."""
        return (self.containers.logs("controller").count(f"reboot request queued for nodes {node}"),
                self.containers.logs(f"n{self.nodes.index(node) + 1}").count("booting after the RebootProgram"))

    def run(self, *cmd: str, timeout: float = 30.0, check: bool = True) -> command.CommandResult:
        return self._in_controller()(list(cmd), timeout, check=check)

    def wait_accounted(self, job_id: int, timeout: float = 60.0) -> Job:
        return self.client().wait_accounted(job_id, timeout)


"""The repair tests' cluster on slurm-ext's images: Slurm 26.05 (Debian sid; the suite's images, so 24.11 with
SLURM_EXT_TEST_IMAGE_SUITE=trixie) as Slinky runs it, beside the host's.

Four workers (configless dynamic nodes, two fake GPUs each, cgroup/v1), slurmctld with the controller agent's
repair service, slurmdbd on MariaDB (containers/cluster.py), and Slurm's reboot of a worker played by restarting
its container as a booted node. It offers what the host's RepairCluster (helpers/cluster.py) offers, so that one
test body runs on both: Slurm through `docker exec` into the controller, the CLI as the controller's, a kernel log
file per worker in its /etc/slurm-ext (root/ext-n<i> here, written from here), jobs as the cluster's user. Every test
on it runs with the reconcile test's jobcomp witness and MinJobAge=2 (a finished job leaves `scontrol show job` within
about a minute: ask sacct).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import psutil

from slurm_ext import command
from slurm_ext.config import SlurmSection
from slurm_ext.slurm import POWER_ACTION_SINCE, Job, SlurmClient, version_tuple

from .cluster import Gate, RepairSteps
from .wait import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "containers"))
from build import SUITES  # noqa: E402 (containers/build.py)
from cluster import REBOOT_PROGRAM, STATE_DIR, ContainerCluster, Ports  # noqa: E402 (containers/cluster.py)

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
#: the PowerAction a repair's reboot runs where Slurm has them (26.05: sid's images), instead of RebootProgram: the
#: same restart, its name in the boot's line (containers/cluster.py power_action)
POWER_ACTION = "power-cycle"
#: the cluster page, in the controller agent
WEB_PORT = 29918
CONTROLLER_CONF = f"""[web]
enabled = true
listen = "127.0.0.1:{WEB_PORT}"
token_file = "{STATE_DIR}/web-tokens"
"""
#: the host's accounting cluster's witness and MinJobAge (tests/test_accounting_cluster.py): slurmctld forgets a
#: finished job within a purge cycle (about a minute), so what one killed while slurmdbd is away loses is exactly
#: its queue
JOBCOMP_LOG = "/var/spool/slurmctld/jobcomp.log"
SLURM_CONF = f"""ResumeTimeout=60
SlurmdTimeout=30
JobCompType=jobcomp/filetxt
JobCompLoc={JOBCOMP_LOG}
MinJobAge=2
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
        #: Slurm >= 26.05 (sid's images): the repair reboots by PowerAction POWER_ACTION (`scontrol reboot action=`)
        slurm = version_tuple(SUITES[images["controller"].rsplit(":", 1)[1]].slurm)
        self.power_action = POWER_ACTION if slurm >= POWER_ACTION_SINCE else ""
        repair_conf = REPAIR_CONF + (f'reboot_action = "{self.power_action}"\n' if self.power_action else "")
        self.containers = ContainerCluster(engine.client, images, "cgroup-v1", ports=PORTS, prefix="twin",
                                           workers=tuple((i, 2) for i in range(1, 6)), repair_conf=repair_conf,
                                           worker_conf=WORKER_CONF, controller_conf=CONTROLLER_CONF, reboot=True,
                                           power_action=self.power_action, own_database=True, slurm_conf=SLURM_CONF)
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
        """(reboots of `node` slurmctld queued, boots of its container after the RebootProgram, or after the
        PowerAction where the repair names one) so far, by their logs (every run of a container's)."""
        # the program's arguments in the boot's line: the PowerAction's own (no node name: slurmd sets SLURM_NODE_NAME)
        boot = f"booting after the RebootProgram ({REBOOT_PROGRAM} {self.power_action})"
        return (self.containers.logs("controller").count(f"reboot request queued for nodes {node}"),
                self.containers.logs(f"n{self.nodes.index(node) + 1}").count(boot))

    def reboot_step(self, node: str) -> str:
        """What the repair's history says of its reboot of `node`."""
        return f"scontrol reboot {f'action={self.power_action} ' if self.power_action else ''}{node}"

    def run(self, *cmd: str, timeout: float = 30.0, check: bool = True) -> command.CommandResult:
        return self._in_controller()(list(cmd), timeout, check=check)

    def wait_accounted(self, job_id: int, timeout: float = 60.0) -> Job:
        return self.client().wait_accounted(job_id, timeout)


    # -- what the reconcile test asks (tests/test_accounting_cluster.py) -------------------------------

    @contextlib.contextmanager
    def slurmdbd_away(self):
        """slurmdbd's container stopped for the block (MariaDB, with the repair history, stays), then started
        again and answering."""
        self.containers.containers["accounting"].stop(timeout=120)
        try:
            yield
        finally:
            self.containers.containers["accounting"].start()
            wait_for("slurmdbd answering again", lambda: self.run("sacctmgr", "-n", "show", "cluster",
                                                                  check=False).returncode == 0, 120, interval=1.0)

    def signal_slurmctld(self, signum: int) -> None:
        """Send the controller agent's slurmctld `signum` (found as the child of the container's first process, by
        its PID); the agent starts it again."""
        self.containers.containers["controller"].reload()
        agent = psutil.Process(self.containers.containers["controller"].attrs["State"]["Pid"])
        [slurmctld] = [c for c in agent.children() if c.name() == "slurmctld" and c.status() != psutil.STATUS_ZOMBIE]
        os.kill(slurmctld.pid, signum)

    def saved_state(self, name: str) -> bool:
        """slurmctld's StateSaveLocation holds file `name`."""
        return self.containers.exec("controller", "test", "-e", f"/var/spool/slurmctld/{name}", check=False)[0] == 0

    def witness_jobs(self) -> set[int]:
        """The job ids slurmctld's jobcomp/filetxt log holds."""
        _, text = self.containers.exec("controller", "cat", JOBCOMP_LOG, check=False)
        return {int(line.split()[0].removeprefix("JobId=")) for line in text.splitlines() if line.startswith("JobId=")}

    def job_state_saved(self) -> float:
        """When slurmctld last saved its job state (StateSaveLocation/job_state), in the container's clock."""
        _, text = self.containers.exec("controller", "stat", "-c", "%Y", "/var/spool/slurmctld/job_state")
        return float(text.strip())

    def reconcile(self, *args: str) -> subprocess.CompletedProcess:
        """`slurm-ext accounting reconcile ARGS` as the controller's root (its witness: slurm.conf's JobCompLoc)."""
        return self.repair_cli("accounting", "reconcile", *args)

    def controller_metric(self, name: str) -> float | None:
        """A sample of the controller agent's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{PORTS.controller_agent}/metrics", timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    return float(line.rsplit(" ", 1)[1])
        return None

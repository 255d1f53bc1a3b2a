"""The real single-host Slurm cluster the tests run on, made by slurm-ext's own dev code.

The cluster uses its own ports, node name and cluster name, so it never meets a `slurm-ext dev up` cluster or a
production Slurm on the same host. Its state directory is made with mkdtemp (mode 755: MariaDB runs as mysql and
must reach its datadir) and removed after `dev down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_ext import command, config, devcluster as dev
from slurm_ext.devcluster.layout import Layout
from slurm_ext.devcluster.settings import DevSection
from slurm_ext.slurm import Job, SlurmClient

from .cli import cli
from .wait import wait_for

TEST_CLUSTER = dict(
    cluster_name="slurmexttest",
    node_name="testnode1",
    slurmctld_port=16817,
    slurmd_port=16818,
    slurmdbd_port=16819,
    mariadb_port=13307,
    controller_probe_port=19811,
    worker_probe_port=19810,
    accounting_probe_port=19812,
    web_port=19813,
    gpu_count=4,
    gpu_type="h200",
    # the session cluster's health monitor reads a kernel log of its own, <state_dir>/.../kmsg, and polls every
    # second: tests append the kernel's records to it (user space cannot write a record of facility kernel into
    # /dev/kmsg, and the monitor judges no other)
    kernel_log="",
    health_interval=1.0,
    # the collector asks the agent every second: what its journal says is in `history` and the page at once
    history_interval=1.0,
    # pings a quiet slurmd after 10 s: a stopped one is NOT_RESPONDING within ~20 s (the health slurmd check's test)
    slurmd_timeout=30,
    up_timeout=60.0,
)


@dataclass
class Cluster:
    """The running test cluster and the few things tests do with it."""

    settings: DevSection

    @property
    def layout(self) -> Layout:
        return Layout(self.settings)

    @property
    def node(self) -> str:
        return self.settings.node_name

    @property
    def env(self) -> dict[str, str]:
        return self.layout.daemon_environ()

    @property
    def config_file(self) -> Path:
        """A slurm-ext.toml whose [dev] section is this cluster, for CLI tests."""
        path = self.layout.root / "test-cli.toml"
        if not path.exists():
            lines = ["[dev]", f'state_dir = "{self.settings.state_dir}"']
            for key, value in TEST_CLUSTER.items():
                lines.append(f'{key} = "{value:g}s"' if isinstance(value, float) else
                             f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"')
            path.write_text("\n".join(lines) + "\n")
        return path

    def client(self, timeout: float = 10.0, json: str = "auto") -> SlurmClient:
        return dev.client(self.settings, timeout, json)

    def run(self, *cmd: str, timeout: float = 30.0, check: bool = True) -> command.CommandResult:
        return command.run(list(cmd), timeout, env=self.env, check=check)

    def sbatch(self, *args: str) -> int:
        out = self.run("sbatch", "--parsable", f"--output={self.layout.out}/%j.out",
                       f"--chdir={self.layout.out}", *args).stdout
        return int(out.strip().split(";")[0])

    def wait_accounted(self, job_id: int, timeout: float = 60.0) -> Job:
        return self.client().wait_accounted(job_id, timeout)

    def wait_idle(self, timeout: float = 60.0):
        slurm = self.client()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = slurm.node(self.node)
            if node.idle:
                return node
            time.sleep(0.2)
        raise AssertionError(f"node not idle after {timeout}s: {slurm.node(self.node)}")


@contextlib.contextmanager
def cluster_of_its_own(prefix: str, **settings) -> Iterator[DevSection]:
    """A dev cluster with its own state directory (and the ports, names and settings given), up for the block."""
    state_dir = tempfile.mkdtemp(prefix=prefix)
    os.chmod(state_dir, 0o755)  # MariaDB runs as mysql and must reach its datadir
    own = DevSection(state_dir=state_dir, **settings)
    try:
        dev.up(own)
        yield own
    finally:
        dev.down(own)
        shutil.rmtree(state_dir, ignore_errors=True)


class RepairSteps:
    """What the repair tests do with a cluster, on the host's (RepairCluster) or on the images' (helpers/
    containerrepair.py): the same test body on both. Each kind gives `nodes` (running, idle between tests),
    `down_node` (one whose slurmd does not answer), `kind`, client(), run() (a Slurm command line as root),
    repair_cli(), all_records(), sbatch(), gate(), inject_xid(), reboots_seen(), reboot_step() and wait_accounted()."""

    def records(self) -> list[dict]:
        done = self.repair_cli("repair", "list", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["records"]

    def record(self, node: str, *states: str, timeout: float = 30.0) -> dict:
        def found():
            return next((r for r in self.records() if r["node"] == node and (not states or r["state"] in states)),
                        None)
        return wait_for(f"{node}: a record in {states}", found, timeout, interval=0.5)

    def slurm_node(self, node: str):
        return self.client().node(node)

    def history(self, node: str, *agent_said: str, timeout: float = 60.0) -> list[dict]:
        """The node's history; with `agent_said`, once its agent's entries hold each of those texts (in `event:
        message`): the controller's collector takes an agent's journal within its interval, not at once."""
        def entries() -> list[dict]:
            done = self.repair_cli("history", "--node", node, "--since", "1h", "--json")
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)["entries"]
        if not agent_said:
            return entries()

        def holding():
            found = entries()
            lines = [f"{e['event']}: {e['message']}" for e in found if e["source"] == "agent"]
            return found if all(any(text in line for line in lines) for text in agent_said) else None
        return wait_for(f"{node}'s agent's {', '.join(agent_said)} in the history", holding, timeout, interval=1.0)

    def repair_with_reboot(self, node: str) -> dict:
        """A fault, its recommendation approved, the repair through to its end."""
        self.inject_xid(node)
        record = self.record(node, "recommended")
        assert self.repair_cli("repair", "approve", node).returncode == 0
        return wait_for(f"{node}: repair done", lambda: next(
            (r for r in self.all_records(node) if r["id"] == record["id"] and r["state"] in ("done", "failed")), None),
            120, interval=1.0)

    def settle(self, nodes: list[str]) -> None:
        """The cluster idle, every fault cleared and nothing open (a test's teardown: one failure does not fail
        the tests after it)."""
        self.heal_drills()
        self.cancel_all()
        slurm = self.client()
        for node in slurm.nodes():
            if node.name in nodes and node.drained:
                if node.reason_is_ours:
                    self.repair_cli("health", "clear", node=node.name)  # lifted by its monitor (a repair's: the flow)
                else:
                    self.resume(node.name)

        last = {}

        def settled():
            last["open"] = [f"{r['node']} {r['state']}" for r in self.records()
                            if r["state"] in ("recommended", "approved", "running")]
            states = {n.name: n for n in slurm.nodes()}
            # a node just resumed shows no boot time until it registers again (recorded in tests/data/slurm/)
            last["unsettled"] = [f"{n} {states[n].state}+{'+'.join(sorted(states[n].flags))} boot {states[n].boot_time}"
                                 for n in nodes if not (states[n].idle and states[n].boot_time)]
            return not last["open"] and not last["unsettled"]
        try:
            wait_for("the cluster settled", settled, 120, interval=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}: open records {last.get('open')}, nodes {last.get('unsettled')}") from None

    def heal_drills(self) -> None:
        """Undo the faults `drill` made (a kind without drills has none)."""

    def cancel_all(self) -> None:
        slurm = self.client()
        slurm.cancel([j.job_id for j in slurm.jobs()])

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


@dataclass(frozen=True)
class Gate:
    """A file a job waits for (`while [ ! -e PATH ]`), made by the test when the job may end: `path` as the job
    sees it, `host_path` here."""

    path: str
    host_path: Path

    def open(self) -> None:
        self.host_path.touch()
        self.host_path.chmod(0o644)


class RepairCluster(Cluster, RepairSteps):
    """A dev cluster of several nodes with the repair service: faults to inject, recommendations, repairs."""

    kind = "host"

    @property
    def nodes(self) -> list[str]:
        return [node.name for node in self.layout.nodes]

    @property
    def down_node(self) -> str | None:
        """The first node slurm.conf defines that does not run (defined_nodes), if any."""
        from slurm_ext.devcluster.layout import node_names
        defined = node_names(self.settings)
        return defined[self.settings.nodes] if len(defined) > self.settings.nodes else None

    def repair_cli(self, *args: str, user: str = "alice", node: str | None = None):
        conf = self.layout.node(node).slurm_ext_conf if node else self.layout.slurm_ext_conf
        return cli("--config", str(conf), *args, env={"SUDO_USER": user})

    def drill(self, node: str, fault: str, gpu: int | None = None) -> str:
        """`slurm-ext dev inject NODE FAULT [--gpu N]`, as an operator rehearses (the page's screenshots come from
        these); `settle` heals it. Its output."""
        done = cli("--config", str(self.layout.dev_conf), "dev", "inject", node, fault,
                   *(("--gpu", str(gpu)) if gpu is not None else ()), timeout=60)
        assert done.returncode == 0, done.stderr
        self.drilled = getattr(self, "drilled", set()) | {node}
        return done.stdout

    def heal_drills(self) -> None:
        for drilled in sorted(getattr(self, "drilled", ())):
            healed = cli("--config", str(self.layout.dev_conf), "dev", "heal", drilled, timeout=60)
            assert healed.returncode == 0, healed.stderr
        self.drilled = set()

    def inject_xid(self, node: str, xid: int = 79) -> None:
        """The kernel line of Xid `xid` on the node's GPU 1, appended to its kernel log."""
        spec = json.loads(self.layout.node(node).gpu_spec.read_text())
        bus = spec["gpus"][1]["pci_bus_id"][4:-2]  # 00000000:18:00.0 -> 0000:18:00, as the driver writes it
        with open(self.layout.node(node).kernel_log, "a") as log:
            log.write(f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, GPU has fallen off "
                      "the bus.\n")

    def gate(self, node: str) -> Gate:
        path = Path(tempfile.mkdtemp(prefix="gate-", dir=self.layout.root)) / "open"
        path.parent.chmod(0o755)
        return Gate(str(path), path)

    def reboots_seen(self, node: str) -> tuple[int, int]:
        """(reboots of `node` slurmctld queued, times slurmd ran the RebootProgram) so far, by their logs (at the dev
        cluster's SlurmdDebug): counted, for a test to tell its own reboot from an earlier test's."""
        return ((self.layout.log / "slurmctld.log").read_text().count(f"reboot request queued for nodes {node}"),
                self.layout.slurmd_log(node).read_text().count("Node reboot request being processed"))

    def reboot_step(self, node: str) -> str:
        """What the repair's history says of its reboot of `node` (RebootProgram: 22.05 has no PowerAction)."""
        return f"scontrol reboot {node}"

    def all_records(self, node: str) -> list[dict]:
        """Every record of `node`, closed ones too, from the store."""
        with self.store() as store:
            return [asdict(r) for r in store.records(node=node)]

    @contextlib.contextmanager
    def store(self):
        from slurm_ext.repair.store import open_store
        store = open_store(config.load(self.layout.slurm_ext_conf))
        try:
            yield store
        finally:
            store.close()

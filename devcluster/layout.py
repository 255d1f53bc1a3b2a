"""Where everything of the dev cluster lives, under one state directory.

Removing the state directory (after `dev down`) removes the cluster: its
configs, logs, database, Slurm state, fake GPUs and the fake NVML library.

Each simulated node (`NodeLayout`) has its own slurmd, worker agent, hook
service, fake GPUs and kernel log. The first node's files sit at the top of
the state directory, beside the cluster's; every other node's under
nodes/<name>/, in the same shape. A node's etc/ holds its own slurm-ext.toml
and the gres.conf its agent writes from NVML; slurm.conf and cgroup.conf
there are links to the cluster's (slurmd reads gres.conf beside the
slurm.conf it was given).
"""

import hashlib
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from .settings import DevSection

__all__ = ["Layout", "NodeLayout", "node_names", "netns_prefix"]


def netns_prefix(root: Path) -> str:
    """`slurm-ext-<digest>-`: the start of the names of the network namespaces of the cluster in state directory
    `root`. Named after the state directory, so two clusters on one host never share one."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:8]
    return f"slurm-ext-{digest}-"


def node_names(settings: DevSection) -> list[str]:
    """Every node slurm.conf defines, the ones that run first: node_name, then the same stem counted on
    (node1, node2, ...; gpu, gpu2, ...)."""
    stem, digits = re.fullmatch(r"(.*?)(\d*)", settings.node_name).groups()
    first = int(digits) if digits else 1
    count = max(settings.nodes, settings.defined_nodes)
    width = len(digits)  # node01 -> node02: the padding kept
    return [settings.node_name] + [f"{stem}{first + i:0{width}d}" for i in range(1, count)]


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
    def slurmd_spools(self) -> Path:
        """SlurmdSpoolDir's parent: each slurmd spools in <name>/ below it (%n)."""
        return self.root / "state" / "d"

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
    def page_db_password(self) -> Path:
        """The password of the page's own database account ([accounting] page_password_file): the page runs as
        slurm-ext-web and is never given slurmdbd's."""
        return self.etc / "page-db-password"

    @property
    def agent_credential(self) -> Path:
        """The cluster's agent credential (node.agent_credential): the same file for every node and the controller,
        as a real cluster installs one secret everywhere."""
        return self.etc / "agent-credential"

    @property
    def web_tokens(self) -> Path:
        """The cluster page's operator tokens ([web] token_file; `slurm-ext web add-token USER` adds one)."""
        return self.etc / "web-tokens"

    @property
    def jobcomp_log(self) -> Path:
        """slurmctld's jobcomp/filetxt log, the witness of every job end (`slurm-ext accounting reconcile`)."""
        return self.ctld_state / "jobcomp.log"

    @property
    def node_hook(self) -> Path:
        """Prolog=/Epilog= of a cluster of several nodes: hands the hook to the node's own (SLURMD_NODENAME)."""
        return self.root / "bin" / "slurm-ext-node-hook"

    @property
    def accept_program(self) -> Path:
        """[acceptance] job_command of every node: `accept cluster`'s job on a node hands itself to that node's own
        `slurm-ext accept run` (its config, its fake GPUs), by SLURMD_NODENAME, as node_hook does the hooks."""
        return self.root / "bin" / "slurm-ext-accept"

    @property
    def reboot_program(self) -> Path:
        """RebootProgram=: `scontrol reboot` ends here, and restarts the node's agent and slurmd."""
        return self.root / "bin" / "slurm-ext-reboot"

    @property
    def nvidia_smi(self) -> Path:
        """The nodes' `nvidia-smi` for GPU resets (health.gpu_reset_command): devcluster/fakesmi.py, which resets a
        GPU in the node's fake NVML spec."""
        return self.root / "bin" / "nvidia-smi"

    @property
    def drills(self) -> Path:
        """What `dev inject` did and `dev heal` undoes, per node (devcluster/drills.py)."""
        return self.root / "drills.json"

    @property
    def dev_conf(self) -> Path:
        """The [dev] settings `dev up` ran with, for the reboot program's `dev reboot-node`."""
        return self.etc / "dev.toml"

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log / f"slurmd-{node}.log"

    @property
    def host(self) -> str:
        """Short host name: slurmctld only acts as primary on the host SlurmctldHost names."""
        return socket.gethostname().split(".")[0]

    @property
    def nodes(self) -> list["NodeLayout"]:
        """The nodes that run (a slurmd and a worker agent each), the first one first."""
        return [NodeLayout(self, name, index) for index, name in enumerate(node_names(self.settings)[
            :self.settings.nodes])]

    @property
    def defined_nodes(self) -> list["NodeLayout"]:
        """Every node slurm.conf defines: the ones that run, then those beyond [dev] nodes (their agents' ports are
        kept for them, and `dev fleet` plays their agents)."""
        return [NodeLayout(self, name, index) for index, name in enumerate(node_names(self.settings))]

    def node(self, name: str) -> "NodeLayout":
        """A running node by name. Raises KeyError for a name that is not one."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def first(self) -> "NodeLayout":
        return NodeLayout(self, self.settings.node_name, 0)

    # The first node's files, which the single-node cluster's users (and most tests) name through the cluster.
    @property
    def bin(self) -> Path:
        return self.first.bin

    @property
    def node_state(self) -> Path:
        return self.first.node_state

    @property
    def netns_prefix(self) -> str:
        """What the names of this cluster's network namespaces start with (NodeLayout.netns): `dev down` removes
        every namespace so named, a node's of an earlier up with more nodes included."""
        return netns_prefix(self.root)

    @property
    def dev(self) -> Path:
        return self.first.dev

    @property
    def slurm_ext_conf(self) -> Path:
        return self.first.slurm_ext_conf

    @property
    def gpu_spec(self) -> Path:
        return self.first.gpu_spec

    @property
    def kernel_log(self) -> Path:
        return self.first.kernel_log

    @property
    def runtime_dir(self) -> Path:
        return self.first.runtime_dir

    @property
    def hook_socket(self) -> Path:
        return self.first.hook_socket

    def gpu_devices(self) -> list[Path]:
        return self.first.gpu_devices()

    def daemon_environ(self) -> dict[str, str]:
        return self.first.daemon_environ()


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """One simulated node: its slurmd's and worker agent's files and ports."""

    cluster: Layout
    name: str
    #: 0 for the first node
    index: int

    @property
    def base(self) -> Path:
        return self.cluster.root if self.index == 0 else self.cluster.root / "nodes" / self.name

    @property
    def etc(self) -> Path:
        """slurm-ext.toml and gres.conf of this node; slurm.conf and cgroup.conf (links, for all but the first)."""
        return self.base / "etc"

    @property
    def slurm_conf(self) -> Path:
        """The path this node's slurmd and agent are given: gres.conf is read beside it."""
        return self.etc / "slurm.conf"

    @property
    def slurm_ext_conf(self) -> Path:
        """The config of this node's agent and hooks (the first node's is also the controller's and accounting's)."""
        return self.etc / "slurm-ext.toml"

    @property
    def bin(self) -> Path:
        """Hook wrappers that give slurmd's hooks their environment back."""
        return self.base / "bin"

    @property
    def node_state(self) -> Path:
        """slurm-ext's own node-local state dir ([node] state_dir of the agent and hooks)."""
        return self.base / "state" / "node"

    @property
    def dev(self) -> Path:
        """Fake GPU character devices (nvidia<minor>)."""
        return self.base / "dev"

    @property
    def boot_id(self) -> Path:
        """The node's boot id ([node] boot_id_file): `dev reboot-node` gives it a new one, as a reboot would."""
        return self.base / "boot_id"

    @property
    def gpu_spec(self) -> Path:
        """The fake GPUs' description (SLURM_EXT_FAKE_NVML); edit it to inject faults."""
        return self.base / "gpus.json"

    @property
    def drill_fs(self) -> Path:
        """A directory among the node's health.paths: `dev inject NODE fs-full` mounts a small tmpfs of the
        cluster's own on it and fills it (never a file system of the host's)."""
        return self.base / "drill-fs"

    @property
    def netns(self) -> str:
        """The network namespace whose `lo` is the node's watched interface (health.interfaces): `dev inject NODE
        link-down` takes that `lo` down, never an interface of the host. Named after the state directory, so two
        clusters on one host never share one."""
        return f"{self.cluster.netns_prefix}{self.name}"

    @property
    def kernel_log(self) -> Path:
        """The node's kernel log (health.kernel_log): a file of its own unless [dev] kernel_log names another
        (for the first node)."""
        if self.index == 0 and self.cluster.settings.kernel_log:
            return Path(self.cluster.settings.kernel_log)
        return self.base / "kmsg"

    @property
    def runtime_dir(self) -> Path:
        """This node's node.runtime_dir: notify sockets, the hook service's socket (and on the first node,
        MariaDB's files)."""
        return self.base / "slurm-ext-run"

    @property
    def hook_socket(self) -> Path:
        """Where the worker agent's hook service listens for slurm-ext-hook."""
        return self.runtime_dir / "hooks.sock"

    @property
    def agent(self) -> str:
        """The name of this node's worker agent among the cluster's daemons (and of its pidfile)."""
        return "supervise-worker" if self.index == 0 else f"supervise-worker-{self.name}"

    @property
    def slurmd_port(self) -> int:
        s = self.cluster.settings
        return s.slurmd_port if self.index == 0 else s.node_port_base + 2 * self.index

    @property
    def probe_port(self) -> int:
        """The worker agent's HTTP port (probes, metrics, events)."""
        s = self.cluster.settings
        return s.worker_probe_port if self.index == 0 else s.node_port_base + 2 * self.index + 1

    def gpu_devices(self) -> list[Path]:
        return [self.dev / f"nvidia{minor}" for minor in range(self.cluster.settings.gpu_count)]

    def daemon_environ(self) -> dict[str, str]:
        """Environment of this node's agent, slurmd and hooks (the first node's: of every daemon and client)."""
        return {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.slurm_conf),
            "SLURM_EXT_CONFIG": str(self.slurm_ext_conf),
            "LD_LIBRARY_PATH": str(self.cluster.lib),
            "SLURM_EXT_FAKE_NVML": str(self.gpu_spec),
            # a job sees only the GPUs its devices cgroup lets it open, as with the real driver
            "SLURM_EXT_FAKE_NVML_DEV_DIR": str(self.dev),
        }

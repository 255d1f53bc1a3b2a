"""The dev cluster's config files, as text. Pure functions of the layout.

Recipe and gotchas: a single host on 127.0.0.1, munge on its default socket
(slurmdbd ignores AuthInfo=socket=), DefMemPerCPU so that jobs share the node,
slurmdbd started before slurmctld, every listener on loopback. slurmdbd.conf
and MariaDB's files are the accounting agent's to write ([accounting] here).
"""

import re
from dataclasses import dataclass

from .layout import Layout, NodeLayout

__all__ = ["Topology", "parse_topology", "slurm_conf", "host_ranges", "cgroup_conf", "slurm_ext_toml", "hook_wrapper",
           "node_hook", "reboot_program", "nvidia_smi", "accept_program"]

_HEADER = "# written by `slurm-ext dev up`; edits are overwritten at the next `dev up`\n"


@dataclass(frozen=True, slots=True)
class Topology:
    """This host's CPUs and memory as slurmd itself detects them (`slurmd -C`)."""

    cpus: int
    boards: int
    sockets_per_board: int
    cores_per_socket: int
    threads_per_core: int
    #: MiB
    real_memory: int


def parse_topology(text: str) -> Topology:
    """Read `slurmd -C` output.

    Raises:
        ValueError: a field is missing.
    """
    fields = dict(re.findall(r"(\w+)=(\S+)", text))
    try:
        return Topology(
            cpus=int(fields["CPUs"]),
            boards=int(fields.get("Boards", 1)),
            sockets_per_board=int(fields.get("SocketsPerBoard", 1)),
            cores_per_socket=int(fields["CoresPerSocket"]),
            threads_per_core=int(fields.get("ThreadsPerCore", 1)),
            real_memory=int(fields["RealMemory"]),
        )
    except KeyError as err:
        raise ValueError(f"slurmd -C printed no {err.args[0]}= in {text.strip()!r}") from None


def slurm_conf(layout: Layout, topology: Topology, hook: str) -> str:
    s = layout.settings
    gres = f" Gres=gpu:{s.gpu_type}:{s.gpu_count}" if s.gpu_count else ""
    # Leave Slurm 500 MiB short of the host so that the daemons keep room.
    memory = max(topology.real_memory - 500, 100)
    # a line and a port for each node that runs; the ones that never run (defined_nodes) in a few ranged lines, as a
    # real cluster's slurm.conf names its nodes: every Slurm command parses this file (10,000 lines of one node each
    # cost every sinfo, squeue and sacctmgr 0.3 s here). They share one port: no slurmd listens on it.
    running = layout.nodes
    idle_port = s.node_port_base + 2 * len(running)
    nodes = "\n".join([f"NodeName={node.name} NodeHostname={layout.host} NodeAddr=127.0.0.1 Port={node.slurmd_port}"
                       for node in running] +
                      [f"NodeName={names} NodeHostname={layout.host} NodeAddr=127.0.0.1 Port={idle_port}"
                       for names in host_ranges([node.name for node in layout.defined_nodes[len(running):]])])
    return _HEADER + f"""\
ClusterName={s.cluster_name}
SlurmctldHost={layout.host}(127.0.0.1)
SlurmctldPort={s.slurmctld_port}
SlurmdPort={s.slurmd_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={layout.ctld_state}
SlurmdSpoolDir={layout.slurmd_spools}/%n
SlurmctldPidFile={layout.pidfile("slurmctld")}
SlurmdPidFile={layout.pidfile("slurmd-%n")}
SlurmctldLogFile={layout.log}/slurmctld.log
SlurmdLogFile={layout.slurmd_log("%n")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/{s.proctrack}
TaskPlugin=task/cgroup,task/affinity
PrologFlags=Contain
Prolog={hook}
Epilog={hook}
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={max(memory // max(topology.cpus, 1) // 2, 100)}
ReturnToService=2
MpiDefault=none
GresTypes=gpu
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={s.slurmdbd_port}
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/filetxt
JobCompLoc={layout.jobcomp_log}
MinJobAge={s.min_job_age}
SlurmdTimeout={s.slurmd_timeout}
RebootProgram={layout.reboot_program}
ResumeTimeout={s.resume_timeout}
NodeName=DEFAULT CPUs={topology.cpus} \
Boards={topology.boards} SocketsPerBoard={topology.sockets_per_board} \
CoresPerSocket={topology.cores_per_socket} ThreadsPerCore={topology.threads_per_core} \
RealMemory={memory}{gres} State=UNKNOWN
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def host_ranges(names: list[str]) -> list[str]:
    """`names` as Slurm host lists, each run of numbers counted on with the same stem and digit count in one:
    ["gpu2", ..., "gpu9", "gpu10", "gpu11"] -> ["gpu[2-9]", "gpu[10-11]"] (a name without a number alone)."""
    ranges: list[list] = []  # [stem, digits, first, last]
    for name in names:
        stem, digits = re.fullmatch(r"(.*?)(\d*)", name).groups()
        last = ranges[-1] if ranges else None
        if digits and last and last[:2] == [stem, len(digits)] and int(digits) == last[3] + 1:
            last[3] += 1
        else:
            ranges.append([stem, len(digits), int(digits) if digits else None, int(digits) if digits else None])
    return [stem if first is None else f"{stem}{first:0{width}d}" if first == last else
            f"{stem}[{first:0{width}d}-{last:0{width}d}]" for stem, width, first, last in ranges]


def cgroup_conf() -> str:
    # CgroupPlugin is left to autodetect: v1 on hybrid hosts like this one.
    # ConstrainDevices: a job may open only its GPUs' device files, so NVML in
    # the job (the fake, given the dev dir, like the driver) lists only those.
    return _HEADER + """\
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
"""


def slurm_ext_toml(layout: Layout, node: NodeLayout | None = None) -> str:
    """The config of a node's hooks and worker agent (slurmd); the first node's is also the config of the
    agents of MariaDB and slurmdbd (accounting) and of slurmctld (controller)."""
    s = layout.settings
    node = node or layout.first
    log_name = "slurm-ext.log" if node.index == 0 else f"slurm-ext-{node.name}.log"
    return _HEADER + f"""\
[node]
name = "{node.name}"
state_dir = "{node.node_state}"
runtime_dir = "{node.runtime_dir}"
boot_id_file = "{node.boot_id}"
agent_credential = "{layout.agent_credential}"
# the fake NVML as the node's agent sees it: `slurm-ext health check` or `gres inventory` with this config see it too
environment = {{{_fake_nvml_environment(node)}}}

[log]
file = "{layout.log}/{log_name}"

[slurm]
conf = "{node.slurm_conf}"

[supervisor.ports]
worker = {node.probe_port}
controller = {s.controller_probe_port}
accounting = {s.accounting_probe_port}

[accounting]
volume = "{layout.accounting}"
run_database = true
cluster = "{s.cluster_name}"
db_port = {s.mariadb_port}
password_file = "{layout.db_password}"
page_password_file = "{layout.page_db_password}"
memory = 512
dbd_addr = "127.0.0.1"
dbd_port = {s.slurmdbd_port}
state_save_location = "{layout.ctld_state}"
witness = "{layout.jobcomp_log}"
min_free = 256
backup_dir = "{layout.root}/backups"
backup_key = "{layout.etc}/backup.key"

[gres]
dev_dir = "{node.dev}"
types = {{"{s.gpu_name}" = "{s.gpu_type}"}}
expected = {s.gpu_count}

[health]
interval = "{s.health_interval:g}s"
kernel_log = "{node.kernel_log}"
paths = ["{node.node_state}", "{node.drill_fs}"]
# lo of the node's own network namespace (`dev up` makes it): the link checks and the cluster page's network panel
# have an interface on any machine, and `dev inject {node.name} link-down` can take it down without touching the host's
interfaces = ["lo"]
network_namespace = "{node.netns}"
# a GPU reset of an approved reset-gpu repair: the dev cluster's nvidia-smi resets the GPU in the node's fake NVML spec
gpu_reset_command = ["{layout.nvidia_smi}", "--gpu-reset", "-i", "{{gpu}}"]

[repair]
interval = "{s.repair_interval:g}s"
# every node's agent, those that do not run too (`dev fleet` plays them)
agents = {{{", ".join(f'{n.name} = "127.0.0.1:{n.probe_port}"' for n in layout.defined_nodes)}}}
guard_percent = 50
cooldown = "0s"
drain_deadline = "10m"
boot_timeout = "{s.resume_timeout + 30}s"
verify_timeout = "2m"

[history]
interval = "{s.history_interval:g}s"
# an agent stopped by a test or a drill is asked again within a few intervals once it is back
retry_max = "{max(4 * s.history_interval, 1.0):g}s"

[acceptance]
# `accept cluster`'s job runs this node's own `slurm-ext accept run`: the nodes share one host, so one program hands
# the job to its node's config and fake GPUs (SLURMD_NODENAME)
job_command = ["{layout.accept_program}"]

[web]
enabled = {"true" if s.web_port else "false"}
listen = "127.0.0.1:{s.web_port or 9820}"
token_file = "{layout.web_tokens}"

[supervisor.workers.slurmctld]
stop_grace = "10s"

[supervisor.workers.slurmd]
command = ["slurmd", "-D", "-N", "{node.name}"]
stop_grace = "10s"
"""


def _fake_nvml_environment(node: NodeLayout) -> str:
    """The node's fake-NVML variables as a TOML inline table's body."""
    env = node.daemon_environ()
    return ", ".join(f'{name} = "{env[name]}"' for name in ("LD_LIBRARY_PATH", "SLURM_EXT_FAKE_NVML",
                                                            "SLURM_EXT_FAKE_NVML_DEV_DIR"))


def hook_wrapper(node: NodeLayout, entry_point: str) -> str:
    """A tiny sh script for Prolog=/Epilog=: slurmd runs hooks with an
    environment of its own making, so the wrapper restores the node's."""
    exports = "\n".join(f"export {k}='{v}'" for k, v in node.daemon_environ().items())
    return f"#!/bin/sh\n{_HEADER}{exports}\nexec '{entry_point}' \"$@\"\n"


def node_hook(layout: Layout, hooks: dict[str, str]) -> str:
    """Prolog=/Epilog= of a cluster of several nodes: slurm.conf names one program for all of them, and each
    node's hook client talks to that node's agent; slurmd gives the hook its node's name (SLURMD_NODENAME)."""
    cases = "".join(f"  {name}) exec '{hook}' \"$@\" ;;\n" for name, hook in hooks.items())
    return (f"#!/bin/sh\n{_HEADER}case \"$SLURMD_NODENAME\" in\n{cases}"
            f"  *) echo \"slurm-ext-node-hook: node '$SLURMD_NODENAME' is not one of the dev cluster's\" >&2; exit 1 ;;\n"
            "esac\n")


def nvidia_smi(python: str) -> str:
    """The nodes' `nvidia-smi` (health.gpu_reset_command): a GPU reset played on the node's fake NVML spec
    (devcluster/fakesmi.py), which the node agent's environment names."""
    return f"#!{python}\n{_HEADER}from slurm_ext.devcluster.fakesmi import main\n\nraise SystemExit(main())\n"


def reboot_program(layout: Layout, slurm_ext: str) -> str:
    """RebootProgram=: slurmd runs it (as root, through sh -c, with its own environment: the node's
    SLURM_EXT_CONFIG says which node) when slurmctld sends the node's reboot; it hands the "reboot" to `slurm-ext
    dev reboot-node` in a session of its own (stopping the node's agent stops slurmd, and the agent ends its
    slurmd's session) and returns at once, as a real reboot command does."""
    cases = "".join(f"    '{node.slurm_ext_conf}') node={node.name} ;;\n" for node in layout.nodes)
    return (f"#!/bin/sh\n{_HEADER}case \"$SLURM_EXT_CONFIG\" in\n{cases}"
            "    *) echo \"slurm-ext-reboot: no node of the dev cluster has config '$SLURM_EXT_CONFIG'\" >&2; exit 1 ;;\n"
            f"esac\nexec setsid -f '{slurm_ext}' --config '{layout.dev_conf}' dev reboot-node \"$node\" "
            f">> '{layout.log}/reboot.out' 2>&1 < /dev/null\n")


def accept_program(layout: Layout, slurm_ext: str) -> str:
    """[acceptance] job_command of the dev cluster: slurm.conf's nodes share this host and every job inherits the
    submitter's environment, so `accept cluster`'s job on a node finds that node by SLURMD_NODENAME (slurmd sets it
    in every job) and runs `slurm-ext accept run` with the node's environment: its config and its fake GPUs."""
    cases = "".join(f"  {node.name})\n" + "".join(f"    export {k}='{v}'\n" for k, v in node.daemon_environ().items())
                    + f"    exec '{slurm_ext}' accept run \"$@\" ;;\n" for node in layout.nodes)
    return (f"#!/bin/sh\n{_HEADER}case \"$SLURMD_NODENAME\" in\n{cases}"
            f"  *) echo \"slurm-ext-accept: node '$SLURMD_NODENAME' is not one of the dev cluster's\" >&2; exit 2 ;;\n"
            "esac\n")

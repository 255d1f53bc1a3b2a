"""The dev cluster's config files, as text. Pure functions of the layout.

Recipe and gotchas: a single host on 127.0.0.1, munge on its default socket
(slurmdbd ignores AuthInfo=socket=), DefMemPerCPU so that jobs share the node,
slurmdbd started before slurmctld, every listener on loopback. slurmdbd.conf
and MariaDB's files are the accounting agent's to write ([accounting] here).
"""

import re
from dataclasses import dataclass

from .layout import Layout

__all__ = ["Topology", "parse_topology", "slurm_conf", "cgroup_conf", "slurm_ext_toml", "hook_wrapper"]

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
SlurmdSpoolDir={layout.slurmd_spool}
SlurmctldPidFile={layout.pidfile("slurmctld")}
SlurmdPidFile={layout.pidfile("slurmd")}
SlurmctldLogFile={layout.log}/slurmctld.log
SlurmdLogFile={layout.log}/slurmd.log
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
NodeName={s.node_name} NodeHostname={layout.host} NodeAddr=127.0.0.1 CPUs={topology.cpus} \
Boards={topology.boards} SocketsPerBoard={topology.sockets_per_board} \
CoresPerSocket={topology.cores_per_socket} ThreadsPerCore={topology.threads_per_core} \
RealMemory={memory}{gres} State=UNKNOWN
PartitionName=debug Nodes={s.node_name} Default=YES MaxTime=INFINITE State=UP
"""


def cgroup_conf() -> str:
    # CgroupPlugin is left to autodetect: v1 on hybrid hosts like this one.
    # ConstrainDevices: a job may open only its GPUs' device files, so NVML in
    # the job (the fake, given the dev dir, like the driver) lists only those.
    return _HEADER + """\
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
"""


def slurm_ext_toml(layout: Layout) -> str:
    """The config of the cluster's hooks and of its three node agents: MariaDB and slurmdbd (accounting),
    slurmctld (controller) and slurmd (worker)."""
    s = layout.settings
    return _HEADER + f"""\
[node]
name = "{layout.settings.node_name}"
state_dir = "{layout.node_state}"

[log]
file = "{layout.log}/slurm-ext.log"

[slurm]
conf = "{layout.slurm_conf}"

[supervisor]
runtime_dir = "{layout.runtime_dir}"

[supervisor.ports]
worker = {s.worker_probe_port}
controller = {s.controller_probe_port}
accounting = {s.accounting_probe_port}

[accounting]
volume = "{layout.accounting}"
run_database = true
cluster = "{s.cluster_name}"
db_port = {s.mariadb_port}
password_file = "{layout.db_password}"
memory = 512
dbd_addr = "127.0.0.1"
dbd_port = {s.slurmdbd_port}
state_save_location = "{layout.ctld_state}"
witness = "{layout.jobcomp_log}"
min_free = 256
backup_dir = "{layout.root}/backups"

[gres]
dev_dir = "{layout.dev}"
types = {{"{s.gpu_name}" = "{s.gpu_type}"}}
expected = {s.gpu_count}

[health]
interval = "{s.health_interval:g}s"
kernel_log = "{layout.kernel_log}"
paths = ["{layout.node_state}"]

[supervisor.workers.slurmctld]
stop_grace = "10s"

[supervisor.workers.slurmd]
command = ["slurmd", "-D", "-N", "{s.node_name}"]
stop_grace = "10s"
"""


def hook_wrapper(layout: Layout, entry_point: str) -> str:
    """A tiny sh script for Prolog=/Epilog=: slurmd runs hooks with an
    environment of its own making, so the wrapper restores the cluster's."""
    exports = "\n".join(f"export {k}='{v}'" for k, v in layout.daemon_environ().items())
    return f"#!/bin/sh\n{_HEADER}{exports}\nexec '{entry_point}' \"$@\"\n"

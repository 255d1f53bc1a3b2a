"""The dev cluster's config: [dev] (the section keeps its short name: `slurm-ext dev`).

Declared by the component and registered with the core
(`slurm_ext.config.register_section`), which imports this module by name
when a config needs the section.
"""

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["DevSection"]


@dataclass(frozen=True, slots=True)
class DevSection:
    """The local development cluster (`slurm-ext dev ...`): one host, loopback only."""

    state_dir: str = setting("/var/lib/slurm-ext/dev", "everything of the dev cluster: configs, logs, database, state",
                             "path")
    cluster_name: str = setting("dev", "Slurm ClusterName", "str", pattern=r"^[a-z][a-z0-9_]*$")
    node_name: str = setting("node1", "the first node's NodeName (slurmd -N); the others count on from it (node2, "
                             "node3, ...)", "str", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")
    nodes: int = setting(1, "nodes that run, each with its own slurmd, worker agent, state, fake GPUs and kernel log "
                         "(`dev up --nodes N`)", "int", minimum=1, maximum=64)
    defined_nodes: int = setting(0, "nodes slurm.conf defines (0: as many as run); the ones beyond `nodes` never "
                                 "start, for trying tools on a large cluster's size", "int", minimum=0, maximum=10000)
    node_port_base: int = setting(20000, "node k after the first (k = 1, 2, ...) has its slurmd on node_port_base + 2k "
                                  "and its agent's HTTP listener on the next port (a node that never runs has only "
                                  "its agent's: slurm.conf gives them all one slurmd port, where none listens)", "int",
                                  minimum=1024, maximum=40000)
    gpu_count: int = setting(4, "fake GPUs on the node", "int", minimum=0, maximum=64)
    gpu_name: str = setting("NVIDIA H200", "the fake GPUs' NVML name", "str", pattern=r"^[A-Za-z0-9 ._-]+$")
    gpu_type: str = setting("h200", "the fake GPUs' Slurm GRES type", "str", pattern=r"^[a-z0-9_]+$")
    slurmctld_port: int = setting(6817, "slurmctld's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    slurmd_port: int = setting(6818, "the first node's slurmd's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    slurmdbd_port: int = setting(6819, "slurmdbd's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    controller_probe_port: int = setting(9811, "HTTP port of slurmctld's agent (probes, metrics) on 127.0.0.1",
                                         "int", minimum=1, maximum=65535)
    accounting_probe_port: int = setting(9812, "HTTP port of the agent of MariaDB and slurmdbd (probes, metrics) on "
                                         "127.0.0.1", "int", minimum=1, maximum=65535)
    worker_probe_port: int = setting(9810, "HTTP port of the first node's agent (probes, metrics) on 127.0.0.1", "int",
                                     minimum=1, maximum=65535)
    web_port: int = setting(9820, "the cluster page's port on 127.0.0.1 (the controller agent's `web` worker); 0: no "
                            "page", "int", minimum=0, maximum=65535)
    mariadb_port: int = setting(3307, "MariaDB's TCP port on 127.0.0.1 (not 3306: leaves a system MariaDB alone)",
                                "int", minimum=1, maximum=65535)
    proctrack: str = setting("cgroup", "Slurm's ProctrackType: cgroup, or linuxproc to watch the Epilog clean up "
                             "where Slurm's own cgroup tracking is unavailable (as in pods); `dev up --proctrack` "
                             "overrides it", "choice",
                             choices=("cgroup", "linuxproc"))
    min_job_age: int = setting(300, "Slurm's MinJobAge: seconds a finished job stays in slurmctld's memory and state "
                               "files (a lower value shows sooner what a slurmctld killed during a database outage "
                               "loses)", "int", minimum=2, maximum=86400)
    slurmd_timeout: int = setting(300, "Slurm's SlurmdTimeout: seconds without an answer before slurmctld sets a "
                                  "node DOWN; it pings a quiet slurmd after a third of it and flags it NOT_RESPONDING "
                                  "when that ping times out (a lower value shows the health monitor's slurmd check "
                                  "sooner)", "int", minimum=6, maximum=86400)
    resume_timeout: int = setting(60, "Slurm's ResumeTimeout: a node told to reboot that has not registered again "
                                  "within this many seconds is set DOWN", "int", minimum=5, maximum=86400)
    kernel_log: str = setting("", "the first node's health.kernel_log: empty for a file of its own, <state_dir>/kmsg "
                              "(append kernel lines to it to inject faults), or /dev/kmsg", "path", empty_ok=True)
    health_interval: float = setting(10.0, "the workers' health.interval", "duration", minimum=0.1, maximum=3600.0)
    repair_interval: float = setting(5.0, "the controller's repair.interval", "duration", minimum=0.1,
                                     maximum=3600.0)
    history_interval: float = setting(5.0, "the controller's history.interval: how often its collector asks each "
                                      "agent for its journal", "duration", minimum=0.5, maximum=3600.0)
    up_timeout: float = setting(60.0, "longest wait in `dev up` for each daemon and for the node to be idle",
                                "duration", minimum=1.0, maximum=3600.0)


register_section("dev", DevSection)

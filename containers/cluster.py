#!/usr/bin/env python3
"""A local Slurm cluster made of slurm-ext's images: `python3 containers/cluster.py up|down|status`.

MariaDB and slurmdbd (accounting), slurmctld (configless, dynamic nodes) and two workers that join as
Slinky's NodeSet pods do (`-Z --conf-server ... --conf ...`), each worker with its own fake GPUs: real
character devices made with mknod, passed with --device, and the fake libnvidia-ml inside the image,
selected by environment. Every container is on the host network (no bridge), every daemon on 127.0.0.1
with ports of its own (26817 slurmctld, 26819 slurmdbd, 23307 MariaDB, 2682<n> the slurmd of worker n,
2981x/2982<n> the agents), clear of `slurm-ext dev`'s and of the defaults.

Two modes, as users run workers: `cgroup-v1` (Slurm's cgroup plugins; a private cgroup namespace and
SYS_ADMIN, which the agent uses to make the cgroup mounts writable) and `linuxproc` (CgroupPlugin=disabled,
proctrack/linuxproc, a plain container: the pod where Slurm cannot use cgroups, and slurm-ext's Epilog is
all that finds a job's escaped processes). A worker's state dir is a Docker volume named after its node, so
a container recreated for the same node finds the GPUs it had before. The tests drive the same class
(tests/test_container_cluster.py) on an engine of their own.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker

from slurm_ext.agentapi import create_credential
from slurm_ext.devcluster import fakenvml
from slurm_ext.devcluster.daemons import wait_for
from slurm_ext.fileio import atomic_write

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build import IMAGES  # noqa: E402  containers/build.py, beside this file
CLUSTER = "ctest"
CTLD_PORT, DBD_PORT, MARIADB_PORT = 26817, 26819, 23307
AGENT_PORTS = {"controller": 29811, "accounting": 29812, "mariadb": 29814}
#: worker i: slurmd on SLURMD_PORT + i, its agent on WORKER_AGENT_PORT + i
SLURMD_PORT, WORKER_AGENT_PORT = 26820, 29820
#: the jobs' user, made in every container that runs or submits jobs
USER, UID = "ctuser", 2101
SLURM_UID = 64030  # the Debian package's slurm user, in every image
FAKE_NVML_LIB = "/usr/local/lib/slurm-ext-fakenvml"
GPU_NAME, GPU_TYPE = "NVIDIA H200", "h200"
MODES = ("cgroup-v1", "linuxproc")


@dataclass(frozen=True, slots=True)
class Ports:
    """A cluster's ports on 127.0.0.1 (every container is on the host network): two clusters side by side need
    two sets."""

    ctld: int = CTLD_PORT
    dbd: int = DBD_PORT
    mariadb: int = MARIADB_PORT
    #: worker i's slurmd listens on slurmd + i, its agent on worker_agent + i
    slurmd: int = SLURMD_PORT
    worker_agent: int = WORKER_AGENT_PORT
    controller_agent: int = AGENT_PORTS["controller"]
    accounting_agent: int = AGENT_PORTS["accounting"]
    mariadb_agent: int = AGENT_PORTS["mariadb"]
    #: slurmrestd's (the restapi image), when the cluster runs one
    restapi: int = 26818

#: a worker's state directory: the node's volume
STATE_DIR = "/var/lib/slurm-ext"
#: RebootProgram of a cluster made with reboot=True, in each worker's /etc/slurm-ext
REBOOT_PROGRAM = "/etc/slurm-ext/reboot"
#: what slurmd runs for `scontrol reboot` in such a cluster: a container cannot reboot its host, so it is restarted
#: (its agent, PID 1, stops on SIGTERM; the engine starts it again) and its start plays the boot (_BOOT)
_REBOOT = f"""#!/bin/sh
echo "$*" > {STATE_DIR}/rebooting
kill -TERM 1
"""
#: a worker's entry point in such a cluster: after the reboot program, a new boot id (the agent's
#: node.boot_id_file: a sticky finding ends with the boot) and slurmd told it has just booted (-b: Slurm's boot time
#: is now), so slurmctld sees the reboot it asked for completed, as on a host
_BOOT = f"""#!/bin/sh
[ -s {STATE_DIR}/boot_id ] || cat /proc/sys/kernel/random/uuid > {STATE_DIR}/boot_id
if [ -e {STATE_DIR}/rebooting ]; then
    echo "slurm-ext: booting after the RebootProgram ({REBOOT_PROGRAM} $(cat {STATE_DIR}/rebooting)):" \\
        "a new boot id, slurmd -b" >&2
    rm -f {STATE_DIR}/rebooting
    cat /proc/sys/kernel/random/uuid > {STATE_DIR}/boot_id
    set -- "$@" -b
fi
exec slurm-ext supervise --role worker -- "$@"
"""

#: the images a cluster runs: all of containers/build.py's
IMAGE_NAMES = IMAGES
#: the label on every container and volume of a cluster: its prefix
LABEL = "slurm-ext.container-cluster"

_SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmctldParameters=enable_configless
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/slurm
CredType=auth/slurm
SlurmUser=slurm
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
Prolog=/usr/local/libexec/slurm-ext/slurm-ext-hook
Epilog=/usr/local/libexec/slurm-ext/slurm-ext-hook
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
ReturnToService=2
GresTypes=gpu
MaxNodeCount=16
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd}
AccountingStorageTRES=gres/gpu
{mode}
NodeSet=fake Feature=fake
PartitionName=debug Nodes=fake Default=YES MaxTime=INFINITE State=UP
"""

_MODE_CONF = {
    "cgroup-v1": ("ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\nPrologFlags=Contain\n"
                  "JobAcctGatherType=jobacct_gather/cgroup",
                  "ConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=yes\n"),
    "linuxproc": ("ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/linux",
                  "CgroupPlugin=disabled\n"),
}

_SLURMDBD_CONF = """\
AuthType=auth/slurm
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd}
CommunicationParameters=NoInAddrAny
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={mariadb}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
"""


@dataclass
class Worker:
    index: int
    node: str
    gpus: int
    container: object
    #: the engine's start time of the container (time.time() seconds)
    started: float
    #: when slurmctld was first seen showing it registered and idle (time.time() seconds; 0: not yet)
    registered: float = 0.0
    #: its agent's port
    agent_port: int = 0


class ContainerCluster:
    def __init__(self, client: docker.DockerClient, images: dict[str, str], mode: str, root: Path | None = None,
                 *, ports: Ports = Ports(), prefix: str = "", workers: tuple[tuple[int, int], ...] = ((1, 2), (2, 1)),
                 slurm_conf: str = "", slurmdbd_conf: str = "", repair_conf: str = "", worker_conf: str = "",
                 controller_conf: str = "", reboot: bool = False, power_action: str = "", own_database: bool = False):
        """`images`: image name (build.py's IMAGES) -> tag; `root`: where the cluster's files go (a new
        temporary directory by default; removed by stop()). `ports`, `prefix` (of its containers' and volumes'
        names; default ct-<mode>): another cluster's beside the default one; `workers`: (index, GPUs) of the
        workers start() starts; `slurm_conf`, `slurmdbd_conf`: lines added to those files (auth/jwt's: files the
        lines name are put in root/etc and root/dbd before start()); `repair_conf`: lines of the controller agent's
        [repair]; `worker_conf`, `controller_conf`: TOML tables added to every worker agent's config (its [node] is the
        cluster's) and to the controller agent's (its [repair] is the cluster's); `own_database`: the repair store
        and the page in slurm-ext's own MariaDB database, each as its own account, as Slinky's manifests have them
        (containers/slinky/controller.yaml); `reboot`: Slurm's reboot of a worker
        restarts its container as a booted node (REBOOT_PROGRAM); `power_action` (with `reboot`, Slurm >= 26.05): a
        PowerAction of that name that does the same, its name the program's first argument (in the boot's line)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}; one of {', '.join(MODES)}")
        self.client, self.images, self.mode = client, images, mode
        # root's only: it holds the cluster's key, the database password and GPU device nodes (a major 195
        # device is a real GPU on a machine that has one); the containers see only what is mounted
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="slurm-ext-containers-"))
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self.prefix = prefix or f"ct-{mode}"
        self.ports, self.start_workers = ports, workers
        self.slurm_conf_extra, self.slurmdbd_conf_extra = slurm_conf, slurmdbd_conf
        self.repair_conf, self.worker_conf, self.reboot = repair_conf, worker_conf, reboot
        self.controller_conf, self.own_database = controller_conf, own_database
        if reboot:
            self.slurm_conf_extra += f"RebootProgram={REBOOT_PROGRAM}\n"
            if power_action:
                self.slurm_conf_extra += (f'PowerAction={power_action} Location=slurmd Program="{REBOOT_PROGRAM} '
                                          f'{power_action}"\n')
        self.containers: dict[str, object] = {}
        self.workers: dict[str, Worker] = {}
        self.volumes: set[str] = set()
        self._db_password = secrets.token_hex(12)

    # -- files --------------------------------------------------------------------------

    def _write_files(self) -> None:
        key = secrets.token_bytes(1024)
        slurm_conf, cgroup_conf = _MODE_CONF[self.mode]
        etc = self.root / "etc"
        etc.mkdir(exist_ok=True)
        ports = self.ports
        (etc / "slurm.conf").write_text(_SLURM_CONF.format(cluster=CLUSTER, ctld=ports.ctld, slurmd=ports.slurmd,
                                                           dbd=ports.dbd, mode=slurm_conf) + self.slurm_conf_extra)
        (etc / "cgroup.conf").write_text(cgroup_conf)
        # each node's GPUs, from the file its agent writes from NVML (slurmd_args.CONFIGLESS_GRES)
        (etc / "gres.conf").write_text("Include /etc/slurm-local/gres.conf\n")
        dbd = self.root / "dbd"
        dbd.mkdir(exist_ok=True)
        (dbd / "slurmdbd.conf").write_text(_SLURMDBD_CONF.format(password=self._db_password, dbd=ports.dbd,
                                                                 mariadb=ports.mariadb) + self.slurmdbd_conf_extra)
        for directory in (etc, dbd):
            (directory / "slurm.key").write_bytes(key)
            for name in ("slurm.key", "slurmdbd.conf"):
                if (directory / name).exists():
                    os.chown(directory / name, SLURM_UID, SLURM_UID)
                    (directory / name).chmod(0o600)
        # the cluster's agent credential, one secret in every container (Slinky: one Secret mounted into every pod)
        create_credential(self.root / "agent-credential")
        # the repair service and `slurm-ext history` find each worker's agent on its own port
        agents = ", ".join(f'{self.node_name(i)} = "127.0.0.1:{ports.worker_agent + i}"' for i in range(1, 10))
        accounts = database = store = ""
        if self.own_database:  # one password per account, in the files of both agents that use it
            accounts = "".join(f'{role}_password_file = "/etc/slurm-ext/{role}-password"\n'
                               for role in ("repair", "page"))
            database = 'database = "mariadb"\n'
            store = f'[accounting]\ndb_host = "127.0.0.1"\ndb_port = {ports.mariadb}\ncluster = "{CLUSTER}"\n{accounts}'
        controller = self._agent_config("controller", f"[supervisor.ports]\ncontroller = {ports.controller_agent}\n"
                                        f"[repair]\nagents = {{{agents}}}\n{database}{self.repair_conf}"
                                        # the collector takes the workers' journals every 2 s: `history` and the
                                        # page's timeline show what a test just did
                                        f"[history]\ninterval = \"2s\"\nretry_max = \"10s\"\n{store}"
                                        f"{self.controller_conf}")
        self._agent_config("accounting", f"[supervisor.ports]\naccounting = {ports.accounting_agent}\n")
        mariadb = self._agent_config("mariadb", (HERE / "mariadb" / "slurm-ext.toml").read_text()
                                     .replace("accounting = 9814", f"accounting = {ports.mariadb_agent}")
                                     .replace("db_port = 3306", f'db_port = {ports.mariadb}\ncluster = "{CLUSTER}"\n'
                                              f"memory = 512\n{accounts}"))
        if self.own_database:
            for role in ("repair", "page"):
                secret = secrets.token_hex(16).encode()
                for directory in (controller, mariadb):
                    atomic_write(directory / f"{role}-password", secret, mode=0o400)

    def _agent_config(self, name: str, text: str) -> Path:
        """Agent `name`'s /etc/slurm-ext (root/ext-<name>): its config, the cluster's agent credential; the
        directory."""
        directory = self.root / f"ext-{name}"
        directory.mkdir(exist_ok=True)
        (directory / "slurm-ext.toml").write_text(text)
        credential = directory / "agent-credential"  # node.agent_credential's default path, root's only
        # 0600 from its first byte, never readable by others for a moment
        atomic_write(credential, (self.root / "agent-credential").read_bytes(), mode=0o600)
        return directory

    def node_name(self, index: int) -> str:
        """The Slurm name of worker `index`."""
        return f"c{self.mode[0]}n{index}"

    # -- containers ------------------------------------------------------------------------

    def _run(self, name: str, image: str, args: list[str] = (), **options):
        full = f"{self.prefix}-{name}"
        container = self.client.containers.run(self.images[image], list(args), name=full, detach=True,
                                               network_mode="host", labels={LABEL: self.prefix}, **options)
        self.containers[name] = container
        return container

    def start(self) -> ContainerCluster:
        self._write_files()
        self._volume("mariadb")
        self.start_accounting()
        self._run("controller", "controller", volumes={
            str(self.root / "etc"): {"bind": "/etc/slurm", "mode": "ro"},
            str(self.root / "ext-controller"): {"bind": "/etc/slurm-ext", "mode": "ro"}})
        self.add_user("controller")
        wait_for("slurmctld to answer", lambda: self.exec("controller", "scontrol", "ping", check=False)[0] == 0,
                 timeout=60, interval=0.2)
        for index, gpus in self.start_workers:
            self.start_worker(index, gpus)
        self.wait_registered(list(self.workers.values()))
        return self

    def start_accounting(self) -> None:
        """MariaDB on the cluster's database volume (made by start()) and slurmdbd: also to re-create them."""
        self._run("mariadb", "mariadb", volumes={
            f"{self.prefix}-mariadb": {"bind": "/var/lib/slurm-ext/accounting", "mode": "rw"},
            str(self.root / "ext-mariadb"): {"bind": "/etc/slurm-ext", "mode": "ro"}},
            environment={"SLURM_EXT_CONFIG": "/etc/slurm-ext/slurm-ext.toml",
                         "SLURM_EXT_DB_PASSWORD": self._db_password})
        self._run("accounting", "accounting", volumes={
            str(self.root / "dbd"): {"bind": "/etc/slurm", "mode": "ro"},
            str(self.root / "ext-accounting"): {"bind": "/etc/slurm-ext", "mode": "ro"}})

    def wait_registered(self, workers: list[Worker], timeout: float = 30) -> None:
        """Poll slurmctld for all `workers` at once, noting when each was first seen idle."""
        def all_idle() -> bool:
            for worker in workers:
                if not worker.registered and _idle(self.node(worker.node)):
                    worker.registered = time.time()
            return all(worker.registered for worker in workers)
        wait_for(f"nodes {', '.join(w.node for w in workers)} idle", all_idle, timeout=timeout, interval=0.05)

    def _volume(self, name: str) -> str:
        full = f"{self.prefix}-{name}"
        self.client.volumes.create(full, labels={LABEL: self.prefix})
        self.volumes.add(full)
        return full

    def start_worker(self, index: int, gpus: int, *, extra_args: tuple[str, ...] = (), devices: bool = True,
                     key: bool = True, environment: dict[str, str | None] | None = None, **options) -> Worker:
        """Start the container of node `<prefix>-n<index>` with `gpus` fake GPUs (any old container of
        that node must be gone). Its state dir is the node's volume: kept across containers.

        For bad-input runs: `devices` False passes no GPU device, `key` False no slurm.key; `environment`
        is merged over the fake NVML's (a None value removes a variable); `options` go to the engine
        (cap_add=[] takes SYS_ADMIN away)."""
        node = self.node_name(index)
        boot_id = f'boot_id_file = "{STATE_DIR}/boot_id"\n' if self.reboot else ""
        # [node] name: on the host network a container has the host's name, not the pod's
        ext = self._agent_config(f"n{index}", f"[supervisor.ports]\nworker = {self.ports.worker_agent + index}\n"
                                 f'[gres]\ntypes = {{"{GPU_NAME}" = "{GPU_TYPE}"}}\n'
                                 f'[node]\nname = "{node}"\n{boot_id}{self.worker_conf}')
        spec = fakenvml.default_gpus(gpus, GPU_NAME, cpus=os.cpu_count())
        fakenvml.write_spec(ext / "gpus.json", spec)
        dev = self.root / f"dev-n{index}"
        dev.mkdir(exist_ok=True)
        device_list = [f"{fakenvml.make_device(dev / f'nvidia{m}', m)}:/dev/nvidia{m}:rwm" for m in range(gpus)]
        volumes = {str(ext): {"bind": "/etc/slurm-ext", "mode": "ro"},
                   self._volume(f"state-{node}"): {"bind": STATE_DIR, "mode": "rw"}}
        if self.reboot:
            for name, text in (("boot", _BOOT), ("reboot", _REBOOT)):
                (ext / name).write_text(text)
                (ext / name).chmod(0o755)
            options = {"entrypoint": ["/etc/slurm-ext/boot"], "restart_policy": {"Name": "unless-stopped"},
                       **options}
        if key:
            volumes[str(self.root / "etc" / "slurm.key")] = {"bind": "/etc/slurm/slurm.key", "mode": "ro"}
        if self.mode == "cgroup-v1":
            options = {"cgroupns": "private", "cap_add": ["SYS_ADMIN"], **options}
        args = ["-Z", "--conf-server", f"127.0.0.1:{self.ports.ctld}", "--conf",
                f"Features=fake Port={self.ports.slurmd + index}", "-N", node, *extra_args]
        env = {"LD_LIBRARY_PATH": FAKE_NVML_LIB, fakenvml.SPEC_ENV: "/etc/slurm-ext/gpus.json",
               fakenvml.DEV_DIR_ENV: "/dev", **(environment or {})}
        env = {name: value for name, value in env.items() if value is not None}
        container = self._run(f"n{index}", "worker", args, volumes=volumes,
                              devices=device_list if devices else [],
                              environment=env, **options)
        container.reload()
        worker = Worker(index, node, gpus, container, _engine_time(container.attrs["State"]["StartedAt"]),
                        agent_port=self.ports.worker_agent + index)
        self.workers[node] = worker
        self.add_user(f"n{index}")
        return worker

    def start_restapi(self) -> object:
        """slurmrestd (the restapi image) on 127.0.0.1:<ports.restapi>, as its own unprivileged user, on auth/jwt:
        it reads slurm.conf (and the files it names) from the controller's etc."""
        container = self._run("restapi", "restapi", [f"127.0.0.1:{self.ports.restapi}"], volumes={
            str(self.root / "etc"): {"bind": "/etc/slurm", "mode": "ro"}})
        wait_for(f"slurmrestd on 127.0.0.1:{self.ports.restapi}", lambda: self._answers(self.ports.restapi),
                 timeout=30, interval=0.1)
        return container

    def _answers(self, port: int) -> bool:
        import socket
        if not self._running("restapi"):
            raise AssertionError(f"slurmrestd exited: {self.logs('restapi')[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def remove(self, name: str) -> None:
        container = self.containers.pop(name)
        container.remove(force=True)
        self.workers = {node: w for node, w in self.workers.items() if w.container is not container}

    def add_user(self, name: str) -> None:
        """The jobs' user, with the same uid in every container that runs or submits its jobs."""
        wait_for(f"{name}: running", lambda: self._running(name), timeout=30, interval=0.05)
        self.exec(name, "sh", "-c", f"id {USER} >/dev/null 2>&1 || useradd -u {UID} -m {USER}")

    def restart(self, name: str, timeout: float = 60) -> None:
        """Restart the container `name`: its daemon starts again and reads its files as they are now (slurmdbd
        reads its JWKS only when it starts)."""
        self.containers[name].restart(timeout=30)
        wait_for(f"{name}: running again", lambda: self._running(name), timeout=timeout, interval=0.1)

    def _running(self, name: str) -> bool:
        self.containers[name].reload()
        return self.containers[name].status == "running"

    def stop(self) -> None:
        """Remove its containers and volumes (found by label: also those of an earlier `up`) and its files."""
        remove(self.client, self.prefix)
        self.containers.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- talking to it ------------------------------------------------------------------------

    def exec(self, name: str, *argv: str, user: str = "root", check: bool = True) -> tuple[int, str]:
        code, out = self.containers[name].exec_run(list(argv), user=user, workdir="/tmp" if user != "root" else "/")
        text = out.decode(errors="replace")
        if check and code != 0:
            raise AssertionError(f"{name}: {' '.join(argv)} exited {code}: {text[-2000:]}")
        return code, text

    def node(self, node: str) -> dict:
        """The node as slurmctld shows it (scontrol --json): state flags, reason, gres."""
        code, text = self.exec("controller", "scontrol", "--json", "show", "node", node, check=False)
        if code != 0:
            return {}
        try:  # the exec's output holds stderr too: a line of scontrol's (a node re-registering) before the JSON
            nodes = json.loads(text[text.find("{"):] if "{" in text else text).get("nodes", [])
        except ValueError:
            return {}  # an answer that is not the node (yet): the callers wait for one that is
        return nodes[0] if nodes else {}

    def state(self, node: str) -> set[str]:
        return set(self.node(node).get("state", ()))

    def wait_idle(self, node: str, timeout: float = 30) -> dict:
        return wait_for(f"node {node} idle", lambda: _idle(self.node(node)), timeout=timeout, interval=0.1)

    def put(self, name: str, path: str, text: str, mode: int = 0o755) -> None:
        """Write `text` to `path` in container `name`."""
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            info = tarfile.TarInfo(Path(path).name)
            info.size, info.mode = len(text.encode()), mode
            tar.addfile(info, io.BytesIO(text.encode()))
        assert self.containers[name].put_archive(str(Path(path).parent), data.getvalue())

    def sbatch(self, *args: str) -> int:
        _, text = self.exec("controller", "sbatch", "--parsable", *args, user=USER)
        return int(text.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        _, text = self.exec("controller", "scontrol", "--json", "show", "job", str(job_id))
        return json.loads(text)["jobs"][0]

    def wait_job(self, job_id: int, states=("COMPLETED",), timeout: float = 60) -> dict:
        def done():
            job = self.job(job_id)
            return job if set(job["job_state"]) & set(states) else None
        return wait_for(f"job {job_id} {'/'.join(states)}", done, timeout=timeout, interval=0.2)

    def events(self, name: str, event: str | None = None) -> list[dict]:
        """The journal of the agent in container `name`, as JSON records."""
        argv = ["slurm-ext", "events", "--json"] + (["--event", event] if event else [])
        _, text = self.exec(name, *argv, check=False)
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def live(self, worker: Worker) -> bool:
        """The worker's agent answers /livez."""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{worker.agent_port}/livez", timeout=5) as reply:
                return reply.status == 200
        except OSError:
            return False

    def volume_path(self, node: str) -> Path:
        """Where worker `node`'s state volume (STATE_DIR in its container) is on this host: to write what the node
        reads there and read what it keeps."""
        return Path(self.client.volumes.get(f"{self.prefix}-state-{node}").attrs["Mountpoint"])

    def logs(self, name: str) -> str:
        return self.containers[name].logs().decode(errors="replace")

    def metric(self, of: Worker, name: str, **labels: str) -> float | None:
        """One sample of the worker's agent's /metrics, by name and labels."""
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{of.agent_port}/metrics", timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        for line in lines:
            key, _, value = line.rpartition(" ")
            if key.partition("{")[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
                return float(value)
        return None


def _idle(node: dict) -> dict | None:
    """The node when slurmctld shows it idle and fit (registered, responding, not drained)."""
    states = set(node.get("state", ()))
    return node if "IDLE" in states and not states & {"DRAIN", "NOT_RESPONDING", "INVALID_REG"} else None


def _engine_time(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds ('2026-12-01T14:39:42.123456789Z') as epoch seconds."""
    from datetime import datetime, timezone
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return seconds + float("0." + (fraction or "0"))


def remove(client: docker.DockerClient, prefix: str) -> list[str]:
    """Remove every container and volume labelled as cluster `prefix`'s; returns their names."""
    gone = []
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}={prefix}"}):
        container.remove(force=True, v=True)
        gone.append(container.name)
    for volume in client.volumes.list(filters={"label": f"{LABEL}={prefix}"}):
        volume.remove(force=True)
        gone.append(volume.name)
    return gone


#: where `up` keeps a cluster's files (slurm.conf, keys, fake GPUs), so that `down` can remove them;
#: under /var/lib (root's), made anew by each `up`, never a directory someone else could have made first
STATE = Path("/var/lib/slurm-ext/container-cluster")


def _images(suite: str) -> dict[str, str]:
    return {name: f"slurm-ext-{name}:{suite}" for name in IMAGE_NAMES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--mode", choices=MODES, default="cgroup-v1",
                        help="workers with Slurm's cgroup/v1 plugins, or CgroupPlugin=disabled + proctrack/linuxproc")
    parser.add_argument("--suite", default="sid", help="the images' suite (containers/build.py --suite)")
    args = parser.parse_args(argv)
    client = docker.from_env(timeout=600)
    prefix = f"ct-{args.mode}"
    if args.action == "down":
        gone = remove(client, prefix)
        shutil.rmtree(STATE / args.mode, ignore_errors=True)
        print(f"removed {len(gone)} containers and volumes of {prefix}: {' '.join(gone) or 'none'}")
        return 0
    if args.action == "up":
        remove(client, prefix)
        shutil.rmtree(STATE / args.mode, ignore_errors=True)
        cluster = ContainerCluster(client, _images(args.suite), args.mode, root=STATE / args.mode)
        subprocess.run([sys.executable, str(HERE / "build.py"), "--suite", args.suite], check=True)
        started = time.monotonic()
        cluster.start()
        print(f"cluster {CLUSTER} up in {time.monotonic() - started:.1f} s ({args.mode}); submit as {USER}:\n"
              f"  docker exec -u {USER} -w /tmp {prefix}-controller sbatch --gres=gpu:1 --wrap 'nvidia-smi || env'\n"
              f"  docker exec {prefix}-controller sinfo -N -o '%N %T %G %E'\n"
              f"stop it: {sys.executable} containers/cluster.py down --mode {args.mode}")
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}={prefix}"}):
        print(f"{container.name}: {container.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

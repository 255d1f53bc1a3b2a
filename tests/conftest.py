"""Shared fixtures: the real single-host Slurm cluster, made by slurm-ext's own dev code, and the
node agent run by a test (`AgentProcess`, the `agents` fixture).

The cluster uses its own ports, node name and cluster name, so it never meets
a `slurm-ext dev up` cluster or a production Slurm on the same host. Its state
directory is made with mkdtemp (mode 755: MariaDB runs as mysql and must reach
its datadir) and removed after `dev down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

# an event name missing from the catalogue is an error in the tests (and in the agents they start)
os.environ["SLURM_EXT_STRICT_EVENTS"] = "1"

from slurm_ext import command, config, devcluster as dev
from slurm_ext.devcluster.settings import DevSection
from slurm_ext.devcluster.layout import Layout
from slurm_ext.slurm import Job, SlurmClient

# hooks: under CI=true a skipped test fails the run
from helpers.ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

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


@pytest.fixture(scope="session")
def hook_client() -> str:
    """slurm-ext-hook, compiled once: the Epilog's uid sweep runs it as `signal-uid` (procs.signal_uid)."""
    from slurm_ext.prolog_epilog import build_hook
    directory = temp_dir()
    yield str(build_hook(directory / "slurm-ext-hook", str(directory / "hooks.sock"), "/bin/false", "/bin/false"))
    shutil.rmtree(directory)


@pytest.fixture(scope="session")
def cluster_settings() -> DevSection:
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-test-")
    os.chmod(state_dir, 0o755)
    yield DevSection(state_dir=state_dir, **TEST_CLUSTER)
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(cluster_settings) -> Cluster:
    """The real cluster, up for the whole session; tests that stop parts of it bring it back."""
    dev.up(cluster_settings)
    yield Cluster(cluster_settings)
    dev.down(cluster_settings)


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


class RepairCluster(Cluster):
    """A dev cluster of several nodes with the repair service: faults to inject, recommendations, repairs."""

    def repair_cli(self, *args: str, user: str = "alice", node: str | None = None):
        conf = self.layout.node(node).slurm_ext_conf if node else self.layout.slurm_ext_conf
        return cli("--config", str(conf), *args, env={"SUDO_USER": user})

    def records(self) -> list[dict]:
        done = self.repair_cli("repair", "list", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["records"]

    def record(self, node: str, *states: str, timeout: float = 30.0) -> dict:
        def found():
            return next((r for r in self.records() if r["node"] == node and (not states or r["state"] in states)),
                        None)
        return wait_for(f"{node}: a record in {states}", found, timeout, interval=0.5)

    def inject_xid(self, node: str, xid: int = 79) -> None:
        """The kernel line of Xid `xid` on the node's GPU 1, appended to its kernel log."""
        spec = json.loads(self.layout.node(node).gpu_spec.read_text())
        bus = spec["gpus"][1]["pci_bus_id"][4:-2]  # 00000000:18:00.0 -> 0000:18:00, as the driver writes it
        with open(self.layout.node(node).kernel_log, "a") as log:
            log.write(f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, GPU has fallen off "
                      "the bus.\n")

    def slurm_node(self, node: str):
        return self.client().node(node)

    def history(self, node: str) -> list[dict]:
        done = self.repair_cli("history", "--node", node, "--since", "1h", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["entries"]

    def repair_with_reboot(self, node: str) -> dict:
        """A fault, its recommendation approved, the repair through to its end."""
        self.inject_xid(node)
        record = self.record(node, "recommended")
        assert self.repair_cli("repair", "approve", node).returncode == 0
        return wait_for(f"{node}: repair done", lambda: next(
            (r for r in self.all_records(node) if r["id"] == record["id"] and r["state"] in ("done", "failed")), None),
            120, interval=1.0)

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

    def settle(self, nodes: list[str]) -> None:
        """The cluster idle, every fault cleared and nothing open (a test's teardown: one failure does not fail
        the tests after it)."""
        slurm = self.client()
        jobs = [str(j.job_id) for j in slurm.jobs() if not j.finished]
        if jobs:
            self.run("scancel", *jobs, check=False)
        for node in slurm.nodes():
            if node.name in nodes and node.drained:
                if node.reason_is_ours:
                    self.repair_cli("health", "clear", node=node.name)  # lifted by its monitor (a repair's: the flow)
                else:
                    self.run("scontrol", "update", f"nodename={node.name}", "state=resume", check=False)

        def settled():
            if [r for r in self.records() if r["state"] in ("recommended", "approved", "running")]:
                return False
            states = {n.name: n for n in slurm.nodes()}
            return all(states[n].idle for n in nodes)
        wait_for("the cluster settled", settled, 120, interval=0.5)


@pytest.fixture
def running_cluster(cluster) -> Cluster:
    """The cluster, brought back up (idempotent) and idle before the test: a job an
    earlier test left behind is cancelled, so one failure does not fail the rest."""
    dev.up(cluster.settings)
    leftovers = [str(job.job_id) for job in cluster.client().jobs() if not job.finished]
    if leftovers:
        cluster.run("scancel", *leftovers, check=False)
    cluster.wait_idle()
    return cluster


def fake_sysfs(root: Path, cpus: dict[int, tuple], online: str | None = None) -> Path:
    """A fake /sys CPU topology under `root`: cpus maps OS cpu id -> (package, core_id) or
    (package, die, core_id); `online` defaults to every cpu given."""
    from slurm_ext.gres.topology import ranges
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text((online if online is not None else ranges(cpus)) + "\n")
    for cpu, place in cpus.items():
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{place[0]}\n")
        (topology / "core_id").write_text(f"{place[-1]}\n")
        if len(place) == 3:
            (topology / "die_id").write_text(f"{place[1]}\n")
    return root


def temp_dir(owner: int = 0, mode: int = 0o755) -> Path:
    """mkdtemp under /tmp (not pytest's tmp_path, which other uids cannot enter; /tmp is root-owned and
    sticky, an ancestor script validation accepts), chowned and chmodded."""
    path = Path(tempfile.mkdtemp(prefix="slurm-ext-test-"))
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def script(directory: Path, name: str, text: str, mode: int = 0o755, owner: int = 0) -> Path:
    """A lifecycle script or user hook: written, chowned and chmodded (its directory made as needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def wait_for(what: str, test, timeout: float = 15.0, interval: float = 0.02):
    """Poll `test` until it returns something true, and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = test()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout}s")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `slurm-ext` CLI in a child process."""
    return subprocess.run([sys.executable, "-m", "slurm_ext.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def cli_as_nobody(*args: str) -> tuple[int, str]:
    """Run the CLI's main() as user nobody; return (exit status, standard error).

    It runs in a forked child: root bypasses file permissions, and nobody
    cannot reach a Python installed under /root to start a new one.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody, run the CLI, report on the pipe
        code = 99
        try:
            os.dup2(write_end, 2)
            os.setgid(65534)
            os.setuid(65534)
            from slurm_ext import cli as slurm_ext_cli
            sys.stderr = os.fdopen(2, "w", closefd=False)
            code = slurm_ext_cli.main(list(args))
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        stderr = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr


# -- the node agent, run by a test ---------------------------------------------------------

PORT = 19870


class AgentProcess:
    """`slurm-ext supervise` run by a test, with its log and journal at hand."""

    def __init__(self, tmp_path: Path, body: str, role: str = "login", port: int = PORT, prefix: list[str] = (),
                 slurm: str = ""):
        self.dir = tmp_path
        self.slurm = slurm
        self.config = tmp_path / "slurm-ext.toml"
        self.port = port
        self.prefix = list(prefix)
        self.write_config(body)
        self.log = tmp_path / "agent.log"
        self.out = open(self.log, "ab")
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "slurm_ext.cli", "--config", str(self.config),
                                      "supervise", "--role", role, "--port", str(port)],
                                     stdout=self.out, stderr=self.out)

    def write_config(self, body: str) -> None:
        self.config.write_text(textwrap.dedent(f"""\
            [node]
            name = "testnode"
            state_dir = "{self.dir}/state"
            [slurm]
            timeout = "2s"
            {self.slurm}
            [supervisor]
            runtime_dir = "{self.dir}/run"
            """) + textwrap.dedent(body))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def journal(self) -> list[dict]:
        path = self.dir / "state" / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_log(self, pattern: str, timeout: float = 10.0, count: int = 1) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.text())
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} x{count} not in the agent's log:\n{self.text()[-3000:]}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metric(self, name: str, **labels) -> float:
        _, text = self.get("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {name}{{{want}}} in /metrics")

    @property
    def pid(self) -> int:
        """The agent's PID (under `unshare --fork` it is unshare's child, PID 1 inside)."""
        if not self.prefix:
            return self.proc.pid
        return int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()[0])

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()


@pytest.fixture
def agents(tmp_path):
    started: list[AgentProcess] = []

    def start(body: str, **kwargs) -> AgentProcess:
        agent = AgentProcess(tmp_path, body, **kwargs)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:  # a test that failed midway: stop it as SIGTERM does, workers and all
            try:
                os.kill(agent.pid, signal.SIGTERM)
                agent.proc.wait(15)
            except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
                pass
        if agent.proc.poll() is None:
            if agent.prefix:  # unshare does not pass signals on: kill the agent itself
                os.kill(agent.pid, signal.SIGKILL)
            agent.proc.kill()
            agent.proc.wait()
        agent.out.close()


#: the Debian suite the container tests build on (sid: Slurm 26.05, what Slinky 1.2 needs); trixie
#: (Slurm 24.11) with SLURM_EXT_TEST_IMAGE_SUITE=trixie
IMAGE_SUITE = os.environ.get("SLURM_EXT_TEST_IMAGE_SUITE", "sid")


class _ImageBuild:
    """The suite's Docker engine (tests/docker_engine.py; with SLURM_EXT_TEST_DOCKER_HOST, that engine instead,
    left running) and the images built into it from this checkout, from a debootstrap base, as a user without a
    registry would.

    The build takes about two minutes, mostly downloads and disk: `pytest_collection_finish` starts it in the
    background when a selected test needs the images, so the tests that run meanwhile (the accounting clusters,
    first in the order, mostly waiting on Slurm and MariaDB) hide its time. Stopped at the session's end.
    """

    def __init__(self) -> None:
        self.engine = None
        self.process: subprocess.Popen | None = None
        self.output = None
        self.started = 0.0
        #: under xdist: this worker collected a test that needs the images (started by the side's first test)
        self.wanted = False

    def start_engine(self):
        if self.engine is None:
            from docker_engine import Engine
            host = os.environ.get("SLURM_EXT_TEST_DOCKER_HOST")
            self.engine = Engine.existing(host) if host else Engine().start()
        return self.engine

    def start(self) -> None:
        if self.process is None:
            engine = self.start_engine()
            self.output = tempfile.TemporaryFile()
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).parents[1] / "containers" / "build.py"), "--suite", IMAGE_SUITE],
                env=engine.environ(), stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True)

    def images(self) -> dict[str, str]:
        """image name (containers/build.py's IMAGES) -> tag, once the build has ended well."""
        self.start()
        code = self.process.wait(timeout=1200)
        self.output.seek(0)
        said = self.output.read().decode(errors="replace")
        assert code == 0, said[-6000:]
        print(f"images built in {time.monotonic() - self.started:.0f} s (in the background from the start)",
              file=sys.stderr)
        sys.path.insert(0, str(Path(__file__).parents[1] / "containers"))
        from build import IMAGES  # containers/build.py
        return {name: f"slurm-ext-{name}:{IMAGE_SUITE}" for name in IMAGES}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:  # the session ended before it did
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.output is not None:
            self.output.close()
        if self.engine is not None:
            self.engine.stop()


_image_build = _ImageBuild()

#: modules run beside the rest under `pytest -n 2 --dist loadgroup` (the README's test command): each brings up
#: clusters of its own on ports of its own, and they mostly wait on Slurm's timers, MariaDB and Docker, so the two
#: halves share the two cores well; everything else (the session cluster's tests, the timing ones) is the other half
SIDE_MODULES = frozenset({"test_accounting_cluster", "test_container_cluster", "test_containers",
                          "test_repair_cluster", "test_web_cluster"})
#: the suite's own munged (see pytest_sessionstart)
_munged = []


def _worker(config) -> bool:
    """This process runs tests for pytest-xdist's controller (not the controller, not a plain run)."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """One munged for the whole run, started before any cluster (when none answers): a cluster that started its
    own would stop it at its `dev down` while the clusters of the other half still use it."""
    if not _worker(session.config):
        state_dir = tempfile.mkdtemp(prefix="slurm-ext-munged-")
        os.chmod(state_dir, 0o755)  # munged runs as munge and must reach its key and log
        try:
            daemon = dev.shared_munged(DevSection(state_dir=state_dir, **TEST_CLUSTER))
        except BaseException:
            shutil.rmtree(state_dir, ignore_errors=True)
            raise
        _munged.append((daemon, state_dir))


def pytest_collection_finish(session):
    if _worker(session.config) and session.items and "@" not in session.items[0].nodeid:
        raise pytest.UsageError("under pytest-xdist this suite runs with `--dist loadgroup` (and pytest < 9, whose "
                                "node ids xdist 3.8 can group): otherwise both workers start the same clusters")
    # under xdist each worker collects every test: the build starts with the first test of the half that runs the
    # image tests (the side), not in both
    if any("images" in getattr(item, "fixturenames", ()) for item in session.items):
        if _worker(session.config):
            _image_build.wanted = True
        else:
            _image_build.start()


def pytest_runtest_setup(item):
    if _image_build.wanted and item.module.__name__ in SIDE_MODULES:
        _image_build.start()


def pytest_sessionfinish(session):
    _image_build.stop()
    for daemon, state_dir in _munged:
        if daemon is not None:
            from slurm_ext.devcluster import daemons
            daemons.stop(daemon)
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def engine():
    """The suite's Docker engine (see _ImageBuild)."""
    return _image_build.start_engine()


@pytest.fixture(scope="session")
def images(engine) -> dict[str, str]:
    """image name -> tag, built from this checkout into the suite's engine (see _ImageBuild)."""
    return _image_build.images()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """Every test that needs the real cluster carries the `cluster` marker, however it reaches the fixture
    (`-m "not cluster"` runs the rest, with no Slurm at all); each test is in one of the two halves that
    `-n 2 --dist loadgroup` runs side by side (SIDE_MODULES)."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        item.add_marker(pytest.mark.xdist_group("side" if item.module.__name__ in SIDE_MODULES else "main"))


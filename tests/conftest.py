"""The suite's fixtures and hooks: the real single-host Slurm cluster for the session, the node agent run by a test
(the `agents` fixture), the images and their engine, the suite's one munged, and the two halves that `-n 2
--dist loadgroup` runs side by side. What the tests share besides fixtures is in tests/helpers/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile

import pytest

# an event name missing from the catalogue is an error in the tests (and in the agents they start)
os.environ["SLURM_EXT_STRICT_EVENTS"] = "1"

from slurm_ext import devcluster as dev
from slurm_ext.devcluster.settings import DevSection

# hooks: under CI=true a skipped test fails the run
from helpers.ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from helpers.agent import AgentProcess
from helpers.cluster import TEST_CLUSTER, Cluster
from helpers.files import temp_dir
from helpers.images import ImageBuild


@pytest.fixture(scope="session", autouse=True)
def nothing_left_on_the_host():
    """The session leaves no network namespace of a dev cluster behind (each `dev down` removes its cluster's), and
    no page user it made (`dev up` makes slurm-ext-web where the host lacks it). First, the namespaces of test
    clusters a killed run left are removed: their state directory (a slurm-ext-* temporary directory) is still
    there, no daemon of its runs, and nothing touched it for 10 minutes (a cluster another session is starting is
    never one)."""
    from slurm_ext.devcluster import cluster as devcluster, nodenet
    for name in _killed_runs_namespaces():
        nodenet.remove(name)
    yield
    left = sorted(name for name in nodenet.MADE if name in nodenet.listed())
    for name in left:
        nodenet.remove(name)
    for user in sorted(devcluster.USERS_MADE):  # refused while another session's page runs as it: it stays then
        subprocess.run(["userdel", user], capture_output=True, timeout=60)
    assert not left, f"the session left network namespaces behind (removed now): {left}"


def _killed_runs_namespaces() -> list[str]:
    import time
    from pathlib import Path

    from slurm_ext.devcluster import nodenet
    from slurm_ext.devcluster.layout import netns_prefix
    from slurm_ext.procfs import pid_alive
    roots = {netns_prefix(d): d for d in Path(tempfile.gettempdir()).glob("slurm-ext-*") if d.is_dir()}
    found = []
    for name in nodenet.listed():
        root = next((d for prefix, d in roots.items() if name.startswith(prefix)), None)
        if root is None:
            continue
        pids = []
        for pidfile in (root / "run").glob("*.pid"):
            try:
                pids.append(int(pidfile.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        touched = max((p.stat().st_mtime for p in (root, root / "run") if p.exists()), default=0.0)
        if not any(pid_alive(pid) for pid in pids) and time.time() - touched > 600:
            found.append(name)
    return found


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

_image_build = ImageBuild()
#: Slurm 24.11's images (Debian trixie), for the one module that runs on them (test_images_trixie): built into the
#: same engine once the suite's are, while the side's other tests run
_trixie_build = ImageBuild("trixie", engine_of=_image_build)

#: modules run beside the rest under `pytest -n 2 --dist loadgroup` (the README's test command): each brings up
#: clusters of its own on ports of its own, and they mostly wait on Slurm's timers, MariaDB and Docker, so the two
#: halves share the two cores well; everything else (the session cluster's tests, the timing ones) is the other half
SIDE_MODULES = frozenset({"test_accounting_cluster", "test_container_cluster", "test_containers",
                          "test_images_trixie", "test_oidc_slurm_images", "test_repair_cluster", "test_web_cluster"})
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
    _trixie_build.wanted = any("trixie_images" in getattr(item, "fixturenames", ()) for item in session.items)


def pytest_runtest_setup(item):
    if _image_build.wanted and item.module.__name__ in SIDE_MODULES:
        _image_build.start()


def pytest_sessionfinish(session):
    _trixie_build.stop()
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
    built = _image_build.images()
    if _trixie_build.wanted:
        _trixie_build.start()
    return built


@pytest.fixture(scope="session")
def trixie_images(engine) -> dict[str, str]:
    """Slurm 24.11's images (Debian trixie), tag by name: the one module of the suite that runs on them."""
    return _trixie_build.images()


@pytest.fixture(scope="session")
def twin(engine, images):
    """The repair tests' cluster on the images (Slurm 26.05 from sid, the suite's default: helpers/containerrepair.py),
    for every module of the
    side that runs a test body on both clusters: started once, at the first test that asks."""
    from helpers.containerrepair import ContainerRepairCluster
    cluster = ContainerRepairCluster(engine, images)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


#: the fixtures that run a test body on the host's cluster or on the images' twin, by their parameter
TWIN_FIXTURES = ("either", "books", "page")


def _on_twin(item) -> bool:
    """The item is a test body's run on the images' twin."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(params.get(name) == "images" for name in TWIN_FIXTURES)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """Every test that needs a real Slurm cluster carries the `cluster` marker, whether it reaches the session's
    fixture or its module brings up clusters of its own (`*_cluster.py`), and every test that needs the images
    the `containers` marker: `-m "not cluster and not containers"` runs the unit tests, with no Slurm and no
    Docker. Each test is in one of the two halves that `-n 2 --dist loadgroup` runs side by side (SIDE_MODULES)."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "cluster" in fixtures or item.module.__name__.endswith("_cluster"):
            item.add_marker(pytest.mark.cluster)
        if {"images", "engine", "twin", "trixie_images"} & set(fixtures):
            item.add_marker(pytest.mark.containers)
        item.add_marker(pytest.mark.xdist_group("side" if item.module.__name__ in SIDE_MODULES else "main"))
    # the tests on the images' twin (a test body parametrized "images" beside "host") last, in their order: the twin
    # starts at the first and stays up to the session's end, and its seven containers would otherwise share the
    # cores with every container test after it (their modules' own fixtures, such as the page's browser, are set up
    # a second time for them)
    items.sort(key=_on_twin)


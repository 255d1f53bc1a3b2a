"""Slurm 24.11 (Debian trixie's images), the one module of the suite that runs on them: the images still build on
trixie, and the container cluster's bodies that say most about a Slurm between 22.05 and 26.05 hold there
(tests/test_container_cluster.py, collected here too with this module's `ccluster`).

The rest of the suite runs on the images of SLURM_EXT_TEST_IMAGE_SUITE (sid, Slurm 26.05); every Slurm call the
client makes is replayed from 24.11's recorded answers in tests/test_slurm_answers.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the bodies, run here on trixie's cluster: pytest collects them in this module, with its `ccluster`
# (in this order, as there: the last one replaces a worker's container)
from test_container_cluster import test_workers_register_as_dynamic_nodes_with_their_gpus_from_nvml  # noqa: F401
from test_container_cluster import test_jobs_see_only_their_gpus_and_the_epilog_kills_an_escaped_daemon  # noqa: F401
from test_container_cluster import (  # noqa: F401
    test_a_stopped_slurmd_makes_its_agent_unready_by_slurmds_own_readyz_before_slurmctld_notices)
from test_container_cluster import (  # noqa: F401
    test_docker_stop_drains_the_node_before_slurmd_stops_and_a_new_container_clears_it)
from test_container_cluster import WORKER_CONF

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))
from cluster import ContainerCluster  # noqa: E402 (containers/cluster.py, not a package)

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def ccluster(engine, trixie_images):
    """trixie's cluster, with Slurm's cgroup/v1 plugins (the mode Slinky's workers run), on the container tests'
    ports: the modules run one after the other."""
    cluster = ContainerCluster(engine.client, trixie_images, "cgroup-v1", prefix="trixie", worker_conf=WORKER_CONF)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_the_cluster_runs_slurm_24_11(ccluster):
    _, said = ccluster.exec("controller", "sinfo", "--version")
    assert said.split()[-1].startswith("24.11."), said  # "slurm-wlm 24.11.5": Debian's name
    for worker in ccluster.workers.values():
        assert ccluster.node(worker.node)["version"].startswith("24.11."), ccluster.node(worker.node)

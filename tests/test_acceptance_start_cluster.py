"""Acceptance at node start on a 2-node dev cluster with [acceptance] enabled: real slurmctld, slurmd and worker agents,
the agents' start step running the quick level through the fake libnvidia-ml and libcuda before slurmd registers.

- the node whose GPU 1 has a stuck memory bit (`dev inject stuck-bit`) registers drained, the reason ours and naming
  the GPU and the address range, and the repair service recommends a GPU reset for it;
- the healthy node passes and registers idle;
- `history` and the cluster page (/api/acceptance) show both runs with their figures.

Run with `flock /tmp/slurm-ext-cluster-tests.lock`."""

from __future__ import annotations

import json
import urllib.request

import pytest

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

START_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextaccstart", "node_name": "anode1", "nodes": 3,
                 "defined_nodes": 3, "slurmctld_port": 19217, "slurmd_port": 19218, "slurmdbd_port": 19219,
                 "mariadb_port": 13343, "controller_probe_port": 19911, "worker_probe_port": 19910,
                 "accounting_probe_port": 19912, "web_port": 19913, "node_port_base": 31200, "gpu_count": 2,
                 "kernel_log": "", "health_interval": 1.0, "repair_interval": 1.0}
#: anode1, whose agent shares the controller's runtime directory in the dev cluster, is left as it started: rebooting
#: it would take the page's copies of its credentials with it
HEALTHY, FAULTY = "anode2", "anode3"


def _enable(path) -> None:
    """[acceptance] on in a node's config as `dev up` wrote it, the gpu area's quick level at start."""
    text = path.read_text()
    keys = 'enabled = true\nareas = ["gpu"]\nat_start = "quick"\n'
    path.write_text(text.replace("\n[acceptance]\n", f"\n[acceptance]\n{keys}", 1) if "\n[acceptance]\n" in text
                    else f"{text}\n[acceptance]\n{keys}")


@pytest.fixture(scope="module")
def cluster():
    with cluster_of_its_own("slurm-ext-accstart-", **START_CLUSTER) as settings:
        made = RepairCluster(settings)
        for node in (HEALTHY, FAULTY):
            _enable(made.layout.node(node).slurm_ext_conf)
        made.drill(FAULTY, "stuck-bit", gpu=1)
        for node in (HEALTHY, FAULTY):  # a new boot: the agent's start step runs the at-start level
            booted = cli("--config", str(made.layout.dev_conf), "dev", "reboot-node", node, timeout=180)
            assert booted.returncode == 0, booted.stderr
        yield made


def test_a_stuck_bit_registers_drained_naming_the_gpu_and_range_and_a_reset_is_recommended(cluster):
    node = wait_for(f"{FAULTY} drained by its acceptance", lambda: (  # past the reboot's own "agent stopping"
        lambda n: n if n.drained and "acceptance" in n.reason else None)(cluster.slurm_node(FAULTY)), 120, interval=0.5)
    assert node.reason.startswith("slurm-ext: acceptance quick failed: gpu-memory gpu 1: "), node.reason
    assert "0x100000-0x100000" in node.reason and node.reason.endswith("action=reset-gpu"), node.reason
    record = cluster.record(FAULTY, "recommended", timeout=60)
    assert (record["signature"], record["action"]) == ("acceptance/gpu-memory", "reset-gpu"), record
    shown = cli("--config", str(cluster.layout.node(FAULTY).slurm_ext_conf), "accept", "show", "--json")
    run = json.loads(shown.stdout)
    assert (run["trigger"], run["verdict"], run["level"]) == ("start", "fail", "quick") and shown.returncode == 1


def test_the_healthy_node_passes_and_registers_idle(cluster):
    node = wait_for(f"{HEALTHY} idle", lambda: (lambda n: n if n.idle and not n.drained else None)(
        cluster.slurm_node(HEALTHY)), 120, interval=0.5)
    assert not node.reason
    shown = cli("--config", str(cluster.layout.node(HEALTHY).slurm_ext_conf), "accept", "show", "--json")
    run = json.loads(shown.stdout)
    assert (run["trigger"], run["verdict"]) == ("start", "pass") and shown.returncode == 0
    tests = {r["test"] for r in run["results"]}
    assert {"gpu-inventory", "gpu-nvlink", "gpu-memory", "gpu-bandwidth"} <= tests


def test_history_and_the_page_show_both_runs_with_their_figures(cluster):
    wait_for(f"{FAULTY} drained", lambda: "acceptance" in cluster.slurm_node(FAULTY).reason, 120, interval=0.5)
    healthy = wait_for("the healthy node's run in history", lambda: next(
        (e for e in cluster.history(HEALTHY) if str(e.get("event")).endswith("acceptance-done")), None), 90, interval=1.0)
    assert ": pass: " in healthy["message"], healthy
    lines = "\n".join(healthy.get("lines") or ())
    assert "gpu-bandwidth gpu 0: pass: h2d_gbps 55.4 GB/s (>= 48)" in lines, healthy
    faulty = wait_for("the faulty node's run in history", lambda: next(
        (e for e in cluster.history(FAULTY) if str(e.get("event")).endswith("acceptance-done")), None), 90, interval=1.0)
    assert "gpu-memory gpu 1: fail:" in "\n".join(faulty.get("lines") or ()) and "0x100000" in faulty["message"]

    def page(node: str) -> dict:
        url = f"http://127.0.0.1:{START_CLUSTER['web_port']}/api/acceptance?node={node}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as answer:
            return json.loads(answer.read())

    def run_of(node: str):
        nodes = page(node)["nodes"]
        found = nodes.get(node) if isinstance(nodes, dict) else next((n for n in nodes if n.get("node") == node), None)
        return found and (found.get("run") or found.get("lines") and found)

    try:
        shown = wait_for("the page's runs", lambda: (run_of(HEALTHY), run_of(FAULTY)) if run_of(HEALTHY) and
                         run_of(FAULTY) else None, 90, interval=1.0)
    except AssertionError as err:
        logs = "".join(f"\n== {p}\n" + p.read_text()[-3000:] for p in sorted(cluster.layout.log.glob("*"))
                       if p.is_file() and ("web" in p.name or "controller" in p.name))
        raise AssertionError(f"{err}; the page's last answer: {page(FAULTY)}{logs}") from None
    text = json.dumps(shown)
    assert "h2d_gbps" in text and "memory_bad_bytes" in text and "0x100000" in text

"""Issue 29 item 6: `health clear` records who cleared what, and is offered from the controller. On a 4-node dev
cluster of its own (real slurmctld and slurmd, an agent and fake NVML GPUs per node, the repair service and the page
in the controller agent): a clear on the node names the invoking user; `slurm-ext health clear NODE` on the
controller, with an operator token, has the page ask the node's agent (the agent credential) and names the token's
operator; neither without a token nor with a wrong one is anything cleared."""

from __future__ import annotations

import json

import pytest

from selenium.webdriver.common.by import By

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for
from test_web_cluster import browser, text_of, until  # noqa: F401 (browser: the fixture, one Chromium per module)

pytestmark = pytest.mark.cluster

CLEAR_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextclear", "node_name": "cnode1", "nodes": 4,
                 "defined_nodes": 4, "slurmctld_port": 19017, "slurmd_port": 19018, "slurmdbd_port": 19019,
                 "mariadb_port": 13314, "controller_probe_port": 19861, "worker_probe_port": 19860,
                 "accounting_probe_port": 19862, "web_port": 19863, "node_port_base": 29000, "kernel_log": "",
                 "health_interval": 1.0, "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["cnode1", "cnode2", "cnode3", "cnode4"]


@pytest.fixture(scope="module")
def site():
    with cluster_of_its_own("slurm-ext-clear-", **CLEAR_CLUSTER) as settings:
        cluster = RepairCluster(settings)
        added = cli("--config", str(cluster.layout.slurm_ext_conf), "web", "add-token", "alice")
        assert added.returncode == 0, added.stderr
        cluster.token = added.stdout.strip()
        yield cluster


@pytest.fixture
def clear(site):
    yield site
    site.settle(NODES)


def _journal(cluster: RepairCluster, node: str) -> list[dict]:
    path = cluster.layout.node(node).node_state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _drained_for_xid(cluster: RepairCluster, node: str):
    cluster.inject_xid(node)
    return wait_for(f"{node} drained for its Xid", lambda: (n := cluster.slurm_node(node)).reason.startswith(
        "slurm-ext: xid 79") and n, 30, interval=0.3)


def _cleared(cluster: RepairCluster, node: str, after: int) -> dict:
    """The node's first operator's health-cleared event past the first `after` lines of its journal."""
    return wait_for(f"{node}'s health-cleared event", lambda: next(
        (e for e in _journal(cluster, node)[after:] if e["event"] == "health-cleared" and e.get("why") == "operator"),
        None), 20, interval=0.3)


def test_a_clear_on_the_node_records_the_invoking_user_with_the_check_gpu_and_signature(clear):
    _drained_for_xid(clear, "cnode2")
    seen = len(_journal(clear, "cnode2"))
    done = clear.repair_cli("health", "clear", "--check", "xid", node="cnode2", user="dave")
    assert done.returncode == 0, done.stderr
    event = _cleared(clear, "cnode2", seen)
    assert (event["by"], event["check"], event["gpu"], event["signature"]) == ("dave", "xid", 1, "xid/79"), event
    assert "by dave" in event["message"], event["message"]
    wait_for("cnode2 resumed", lambda: not clear.slurm_node("cnode2").drained, 30, interval=0.3)


def test_a_clear_from_the_controller_needs_an_operator_token_and_records_its_operator(clear):
    conf = str(clear.layout.slurm_ext_conf)  # the controller's
    _drained_for_xid(clear, "cnode3")
    without = cli("--config", conf, "health", "clear", "cnode3", "--check", "xid", env={"SLURM_EXT_TOKEN": ""})
    assert without.returncode == 2 and "SLURM_EXT_TOKEN" in without.stderr, without
    wrong = cli("--config", conf, "health", "clear", "cnode3", "--check", "xid",
                env={"SLURM_EXT_TOKEN": "not-a-token-of-anyone-at-all"})
    assert wrong.returncode == 1 and "401" in wrong.stderr, wrong
    unknown = cli("--config", conf, "health", "clear", "cnode9", env={"SLURM_EXT_TOKEN": clear.token})
    assert unknown.returncode == 1 and "cnode9" in unknown.stderr, unknown
    assert not [e for e in _journal(clear, "cnode3") if e["event"] == "health-cleared"]
    assert clear.slurm_node("cnode3").drained

    seen = len(_journal(clear, "cnode3"))
    done = cli("--config", conf, "health", "clear", "cnode3", "--check", "xid", "--gpu", "1",
               env={"SLURM_EXT_TOKEN": clear.token, "SUDO_USER": "mallory"})
    assert done.returncode == 0, done
    assert "cnode3" in done.stdout and "alice" in done.stdout, done.stdout
    event = _cleared(clear, "cnode3", seen)
    assert (event["by"], event["check"], event["gpu"], event["signature"]) == ("alice", "xid", 1, "xid/79"), event
    operations = [e for e in _journal(clear, "cnode1") if e["event"] == "web-operation" and e.get("operation") ==
                  "clear"]
    assert [(e["node"], e["user"]) for e in operations] == [("cnode3", "alice")], operations
    wait_for("cnode3 resumed", lambda: not clear.slurm_node("cnode3").drained, 30, interval=0.3)


def test_the_agent_refuses_a_clear_without_the_agent_credential(clear):
    """The agent's POST /health/clear is guarded as /health/check is: a job's user cannot clear its node's findings."""
    import http.client
    node = next(n for n in clear.layout.nodes if n.name == "cnode4")
    connection = http.client.HTTPConnection("127.0.0.1", node.probe_port, timeout=10)
    try:
        connection.request("POST", "/health/clear?check=xid&by=mallory", body=b"")
        assert connection.getresponse().status == 401
    finally:
        connection.close()


def test_a_rejection_is_reopened_from_the_page_with_the_operators_name(clear):
    """The page's reopen operation beside its reject: the rejected recommendation awaits approval again, recorded
    with the token's operator."""
    from slurm_ext.pageclient import PageClient, PageRefused
    _drained_for_xid(clear, "cnode4")
    clear.record("cnode4", "recommended")
    assert clear.repair_cli("repair", "reject", "cnode4", "--why", "vendor on Monday", user="bob").returncode == 0
    page = PageClient(f"http://127.0.0.1:{CLEAR_CLUSTER['web_port']}", clear.token)
    said = page.operate("cnode4", "reopen", {})
    assert "reopened reboot of node cnode4" in said["message"] and said["user"] == "alice", said
    record = clear.record("cnode4", "recommended")
    assert (record["decided_by"], record["note"]) == ("", ""), record
    with clear.store() as store:
        reopened = store.events(record=record["id"])[-1]
    assert (reopened.event, reopened.user) == ("repair-reopened", "alice") and "rejected by bob" in reopened.message
    with pytest.raises(PageRefused, match="HTTP 409: node cnode4: its reboot awaits approval already"):
        page.operate("cnode4", "reopen", {})


def test_the_page_clears_an_open_finding_and_reopens_a_rejection_with_the_operators_name(clear, browser):
    """In a real Chromium: the Health checks tab's open finding has a Clear button, the Repair tab's rejected
    recommendation a Reopen button; each asks as the tab's operator."""
    url = f"http://127.0.0.1:{CLEAR_CLUSTER['web_port']}/"
    _drained_for_xid(clear, "cnode2")
    _drained_for_xid(clear, "cnode4")
    clear.record("cnode4", "recommended")
    assert clear.repair_cli("repair", "reject", "cnode4", "--why", "vendor on Monday", user="bob").returncode == 0
    browser.get(url)
    browser.execute_script("sessionStorage.setItem('slurm-ext-token', arguments[0])", clear.token)
    browser.get(url + "#health")
    seen = len(_journal(clear, "cnode2"))
    button = "#open-findings tr[data-node=cnode2][data-check=xid] button.op-clear"
    until(browser, "cnode2's open Xid finding with its Clear button", lambda b: b.find_elements(By.CSS_SELECTOR, button))
    browser.find_element(By.CSS_SELECTOR, button).click()
    # the row's finding alone, by its subject (the review of 29: not every xid finding of the node)
    until(browser, "the clear said", lambda b: "cnode2's health monitor cleared its open findings (check xid subject "
                                                "'" in text_of(b, "#message") and "/xid79') for alice" in
          text_of(b, "#message"))
    event = _cleared(clear, "cnode2", seen)
    assert (event["by"], event["check"], event["gpu"]) == ("alice", "xid", 1), event
    wait_for("cnode2 resumed", lambda: not clear.slurm_node("cnode2").drained, 30, interval=0.3)

    browser.get(url + "#repair")
    reopen = "#recommendations tr[data-node=cnode4] button.op-reopen"
    until(browser, "cnode4's rejection with its Reopen button", lambda b: b.find_elements(By.CSS_SELECTOR, reopen))
    browser.find_element(By.CSS_SELECTOR, reopen).click()
    until(browser, "the reopen said", lambda b: "reopened reboot of node cnode4" in text_of(b, "#message"))
    assert clear.record("cnode4", "recommended")["decided_by"] == ""

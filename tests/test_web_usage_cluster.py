"""The page answers "is it being used?" and "health now" on a real 4-node dev cluster, in a real headless Chromium.

Real slurmctld and slurmd with GPU jobs (sbatch --gres=gpu), the nodes' agents with fake NVML GPUs whose load the
test sets, and the page standalone (`slurm-ext web`) with a refresh of 1 s and a short idle window, so that an
allocated idle GPU is flagged within seconds. What the page shows is held to what squeue and `scontrol show job -d`
say; the check table to a fault drilled with `slurm-ext dev inject`; the health history to a finding that a real
repair's reboot ended (the monitor writes no event for it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from slurm_ext.devcluster import fakenvml
from slurm_ext.slurm import expand_hostlist, gpu_indexes

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for
from test_web_cluster import browser, text_of, until  # noqa: F401 (browser: the fixture, one Chromium per module)

pytestmark = pytest.mark.cluster

USAGE_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextusage", "node_name": "unode1", "nodes": 4,
                 "defined_nodes": 4, "slurmctld_port": 18927, "slurmd_port": 18928, "slurmdbd_port": 18929,
                 "mariadb_port": 13320, "controller_probe_port": 19861, "worker_probe_port": 19860,
                 "accounting_probe_port": 19862, "web_port": 19863, "node_port_base": 25100, "kernel_log": "",
                 "health_interval": 1.0, "repair_interval": 1.0, "resume_timeout": 30}
#: the page of these tests, standalone: refreshed every second, a held GPU idle after 2 s under 5 %
PAGE_PORT = 19864
#: each node's GPUs' utilization (percent): unode2's are idle
LOAD = {"unode1": 60, "unode2": 0, "unode3": 70, "unode4": 80}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with cluster_of_its_own("slurm-ext-usage-", **USAGE_CLUSTER) as settings:
        cluster = RepairCluster(settings)
        for node, percent in LOAD.items():
            path = cluster.layout.node(node).gpu_spec
            spec = json.loads(path.read_text())
            for gpu in spec["gpus"]:  # no memory in use: the Prolog drains a node whose GPU memory no process holds
                gpu.update(utilization_gpu=percent)
            fakenvml.write_spec(path, spec)
        folder = tmp_path_factory.mktemp("usage-page")
        conf = folder / "page.toml"
        conf.write_text(cluster.layout.slurm_ext_conf.read_text().replace(
            "[web]\n", '[web]\nrefresh = "1s"\nidle_gpu_below = "5%"\nidle_gpu_after = "2s"\n'))
        log = (folder / "web.out").open("w")
        page = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "--listen",
                                 f"127.0.0.1:{PAGE_PORT}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            cluster.url = f"http://127.0.0.1:{PAGE_PORT}/"
            wait_for("the page", lambda: _get("/api/session") is not None, 30, interval=0.2)
            yield cluster
        finally:
            page.terminate()
            page.wait(30)
            log.close()


def _get(path: str):
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{PAGE_PORT}{path}", timeout=10) as answer:
            return json.loads(answer.read())
    except OSError:
        return None


def _slurm_gpus(cluster) -> dict[tuple[str, int], int]:
    """(node, GPU index) -> job, as `scontrol show job -d` shows the running jobs (Slurm's own words)."""
    held = {}
    out = cluster.run("scontrol", "show", "job", "-d", "--oneliner").stdout
    for line in out.splitlines():
        if "JobState=RUNNING" not in line:
            continue
        job = int(re.search(r"JobId=(\d+)", line).group(1))
        for nodes, detail in re.findall(r"\bNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", line):
            for node in expand_hostlist(nodes):
                for index in gpu_indexes(detail)[1]:
                    held[(node, index)] = job
    return held


def test_the_page_lists_the_jobs_users_and_gpus_slurm_shows_and_flags_an_allocated_idle_gpu(site, browser):
    wait_for("every node idle", lambda: all(n.idle for n in site.client().nodes()), 60, interval=0.3)
    idle_job = site.sbatch("-w", "unode2", "--gres=gpu:2", "--wrap", "sleep 600")
    busy_job = site.sbatch("-w", "unode3", "--gres=gpu:1", "--wrap", "sleep 600")
    waiting = site.sbatch("-w", "unode2", "--gres=gpu:4", "--wrap", "sleep 600")  # 2 of unode2's 4 are taken
    try:
        try:
            wait_for("two jobs running", lambda: {j.job_id for j in site.client().jobs() if j.state == "RUNNING"}
                     == {idle_job, busy_job}, 60, interval=0.3)
        except AssertionError:
            raise AssertionError(site.run("squeue", "--format=%i %T %r %N").stdout
                                 + site.run("sinfo", "-N", "-o", "%N %T %G %E").stdout) from None
        squeue = site.run("squeue", "--noheader", "--format=%i|%u|%P|%T|%N").stdout.split()
        slurm = _slurm_gpus(site)
        assert sorted(set(slurm.values())) == [idle_job, busy_job] and len(slurm) == 3, slurm

        def flagged(view):
            return {(n["name"], g["index"]) for n in view["nodes"] for g in n["gpu_readings"] if g["idle"]}
        wait_for("unode2's two held GPUs flagged idle", lambda: flagged(_get("/api/cluster")) ==
                 {k for k, job in slurm.items() if job == idle_job}, 60, interval=0.5)
        view = _get("/api/cluster")
        # what squeue says, per partition and per node
        shown = sorted(f"{j['job_id']}|{j['user']}|{j['partition']}|RUNNING|{n['name']}"
                       for n in view["nodes"] for j in n["jobs"])
        assert shown == sorted(line for line in squeue if "|RUNNING|" in line), (shown, squeue, view["sources"])
        assert view["queue"]["running"] == 2 and view["queue"]["pending"] == 1
        assert view["queue"]["partitions"] == [{"name": "debug", "running": 2, "pending": 1, "gpus": 3}]
        # each GPU's holder as scontrol shows it, with the GPU's own utilization and memory beside it
        holders = {(n["name"], g["index"]): [h["job_id"] for h in g["holders"]]
                   for n in view["nodes"] for g in n["gpu_readings"] if g["holders"]}
        assert holders == {k: [job] for k, job in slurm.items()}
        assert all(g["utilization"] == LOAD[n["name"]] for n in view["nodes"] for g in n["gpu_readings"])
        assert (view["allocation"]["allocated"], view["allocation"]["gpus"]) == (3, 16)
        assert view["allocation"]["by_type"] == {"h200": {"total": 16, "allocated": 3}}
        assert view["allocation"]["idle"] == 2

        browser.get(site.url + "#overview")
        until(browser, "the allocated share beside the utilization", lambda b:
              text_of(b, "#usage-allocation") == "3 of 16 GPUs (18.8 %)" and "%" in text_of(b, "#usage-utilization"))
        assert "2 allocated GPUs idle (under 5% for 2 s); 2 jobs running, 1 pending" in \
            text_of(browser, "#allocation-detail")
        assert text_of(browser, "#partitions tr[data-partition=debug]").split() == ["debug", "2", "1", "3"]
        assert text_of(browser, "#users tr[data-user=root]").split() == ["root", "2", "1", "3"]
        until(browser, "the sparklines' axes and time span", lambda b: "100 %" in text_of(b, "#panel-utilization")
              and "ago" in text_of(b, "#panel-utilization") and "now" in text_of(b, "#panel-allocation"))

        browser.get(site.url + "#nodes")
        browser.find_element(By.ID, "view-list").click()
        row = "#node-table tr[data-node=unode2]"
        until(browser, "unode2's job and its idle GPUs", lambda b: f"{idle_job} (root, debug" in
              text_of(b, f"{row} td.jobs") and len(b.find_elements(By.CSS_SELECTOR, f"{row} .gpu.idle")) == 2)
        for (node, index), job in slurm.items():
            line = text_of(browser, f"#node-table tr[data-node={node}] .gpu[data-gpu='{index}']")
            assert f"job {job} (root)" in line and f"{LOAD[node]} %, 0.0 GiB" in line, line
            assert ("idle" in line) == (job == idle_job), line
        assert not browser.find_elements(By.CSS_SELECTOR, "#node-table tr[data-node=unode3] .gpu.idle")
    finally:
        site.run("scancel", str(idle_job), str(busy_job), str(waiting), check=False)


def test_the_check_table_shows_a_drilled_fault_on_its_node_and_check_once_and_its_clear_reads_cleared(
        site, browser):
    dev = ("--config", str(site.layout.dev_conf), "dev")
    done = cli(*dev, "inject", "unode3", "ecc", "--gpu", "2", timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        browser.get(site.url + "#health")
        cell = "#check-states tr[data-node=unode3] td[data-check=ecc]"
        until(browser, "unode3's ecc check critical", lambda b: text_of(b, cell) == "critical", timeout=60)
        assert {text_of(browser, f"#check-states tr[data-node={n}] td[data-check=ecc]")
                for n in ("unode1", "unode2", "unode4")} == {"ok"}
        assert text_of(browser, "#check-states tr[data-node=unode3] td[data-check=xid]") == "ok"
        until(browser, "the open finding", lambda b: "unode3 ecc critical 2" in text_of(
            b, "#open-findings tr[data-node=unode3][data-check=ecc]"))

        browser.get(site.url + "#nodes")
        browser.find_element(By.ID, "view-list").click()
        row = "#node-table tr[data-node=unode3]"
        until(browser, "the drain and the fault in unode3's row", lambda b: "slurm-ext:" in text_of(b, row)
              and "ecc: critical" in text_of(b, f"{row} td.checks"), timeout=60)
        findings = browser.find_elements(By.CSS_SELECTOR, f"{row} td")[-2].text.splitlines()
        # each fault once: the drain states a finding already listed, and the GPU is named once per line
        opened = _get("/api/health?node=unode3")["open"]
        assert len(findings) == len(opened) and [line for line in findings if " ecc " in line] == \
            ["critical: ecc gpu 2 double-bit ECC error (volatile)"], findings

        # the Overview's timeline, filtered as the Health tab is: this node's health findings only
        browser.get(site.url + "#overview")
        until(browser, "the timeline's node list", lambda b: len(b.find_elements(By.CSS_SELECTOR,
                                                                                 "#timeline-node option")) == 5)
        Select(browser.find_element(By.ID, "timeline-node")).select_by_visible_text("unode3")
        Select(browser.find_element(By.ID, "timeline-source")).select_by_visible_text("agent")
        browser.find_element(By.ID, "timeline-event").send_keys("health-finding")

        def timeline(b):
            return [(r.get_attribute("data-source"), r.get_attribute("data-severity"), r.text)
                    for r in b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr[data-source]")]
        until(browser, "only unode3's health findings", lambda b: timeline(b) and all(
            source == "agent" and "unode3 agent health/health-finding" in text for source, _, text in timeline(b))
            and any("ecc" in text for _, _, text in timeline(b)))
        # Slurm's drain of the node warns; nothing of the agents under source slurm
        Select(browser.find_element(By.ID, "timeline-source")).select_by_visible_text("slurm")
        browser.find_element(By.ID, "timeline-event").clear()
        Select(browser.find_element(By.ID, "timeline-severity")).select_by_visible_text("warning")
        until(browser, "unode3's drain under slurm and warning", lambda b: timeline(b) and all(
            source == "slurm" and severity == "warning" and " unode3 slurm " in f" {text} "
            for source, severity, text in timeline(b)) and any("slurm-ext:" in text for _, _, text in timeline(b)))

        healed = cli(*dev, "heal", "unode3", timeout=60)
        assert healed.returncode == 0, healed.stderr
        cleared = site.repair_cli("health", "clear", "--check", "ecc", node="unode3")
        assert cleared.returncode == 0, cleared.stderr
        browser.get(site.url + "#health")
        history = "#health-events tr[data-node=unode3][data-check=ecc][data-state=cleared]"
        until(browser, "the clear read as cleared", lambda b: "cleared (operator)" in text_of(b, history), timeout=60)
        assert "critical" not in text_of(browser, history).split()
        until(browser, "the check ok again", lambda b: text_of(b, cell) == "ok", timeout=60)
    finally:
        cli(*dev, "heal", "unode3", timeout=60)
        site.settle(["unode3"])


def test_a_finding_that_a_reboot_ended_reads_cleared_by_the_reboot(site, browser):
    dev = ("--config", str(site.layout.dev_conf), "dev")
    done = cli(*dev, "inject", "unode4", "xid-79", "--gpu", "1", timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        record = site.record("unode4", "recommended", timeout=60)
        healed = cli(*dev, "heal", "unode4", timeout=60)  # the GPU back for the node's next boot
        assert healed.returncode == 0, healed.stderr
        assert site.repair_cli("repair", "approve", "unode4").returncode == 0
        wait_for("unode4's reboot done", lambda: any(r["id"] == record["id"] and r["state"] == "done"
                                                     for r in site.all_records("unode4")), 120, interval=1.0)
        # the monitor of the new boot starts without the finding and writes no health-cleared for it
        journal = [json.loads(line) for line in
                   (site.layout.node("unode4").node_state / "journal.jsonl").read_text().splitlines()]
        assert not [e for e in journal if e.get("event") == "health-cleared" and e.get("check") == "xid"]
        browser.get(site.url + "#health")
        row = "#health-events tr[data-node=unode4][data-check=xid][data-state=cleared]"
        until(browser, "the Xid's cleared row, by the reboot", lambda b: "cleared (reboot)" in text_of(b, row)
              and "the node rebooted" in text_of(b, row), timeout=60)
        assert not browser.find_elements(By.CSS_SELECTOR, "#open-findings tr[data-node=unode4]")
    finally:
        cli(*dev, "heal", "unode4", timeout=60)
        site.settle(["unode4"])

"""The cluster page in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium) over a
4-node dev cluster: real slurmctld and slurmd, an agent and fake NVML GPUs per node, the repair service and the
page in the controller agent. Screenshots of each tab land in the test's temporary directory (and, with
SLURM_EXT_DOCS_SCREENSHOTS=1, in docs/screenshots/ for the README).

The README's test command installs chromium and chromium-driver (apt-get) and selenium (the [test] extra): without
them these tests fail, never skip. Chromium runs with the flags this closed network needs (no background
networking, no component updates) and a profile of its own, and is stopped at the end.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from slurm_ext import devcluster as dev
from slurm_ext.devcluster import daemons, fakenvml
from slurm_ext.devcluster.cluster import cluster_daemons

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

pytestmark = pytest.mark.cluster

WEB_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextweb", "node_name": "wnode1", "nodes": 4, "defined_nodes": 5,
               "slurmctld_port": 18917, "slurmd_port": 18918, "slurmdbd_port": 18919, "mariadb_port": 13310,
               "controller_probe_port": 19851, "worker_probe_port": 19850, "accounting_probe_port": 19852,
               "web_port": 19853, "node_port_base": 25000, "kernel_log": "", "health_interval": 1.0,
               "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["wnode1", "wnode2", "wnode3", "wnode4"]
#: the standalone page of the Slurm-away test, with a trusted proxy header
STANDALONE_PORT = 19854
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
#: each fake GPU's utilization (percent) and memory used (GiB), by index, on every node
GPU_LOAD = {0: (10, 8), 1: (20, 16), 2: (30, 24), 3: (40, 32)}


@pytest.fixture(scope="module")
def site():
    with cluster_of_its_own("slurm-ext-web-", **WEB_CLUSTER) as settings:
        cluster = RepairCluster(settings)
        for node in NODES:  # known load on every GPU: the usage panels must show its sums
            path = cluster.layout.node(node).gpu_spec
            spec = json.loads(path.read_text())
            for index, (percent, gib) in GPU_LOAD.items():
                spec["gpus"][index].update(utilization_gpu=percent, memory_used=gib * 2**30)
            fakenvml.write_spec(path, spec)
        added = cli("--config", str(cluster.layout.slurm_ext_conf), "web", "add-token", "alice")
        assert added.returncode == 0, added.stderr
        cluster.token = added.stdout.strip()
        cluster.url = f"http://127.0.0.1:{settings.web_port}/"
        yield cluster


@pytest.fixture
def web(site):
    yield site
    site.settle(NODES)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--window-size=1500,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.shots = tmp_path_factory.mktemp("screenshots")
    yield driver
    driver.quit()


def shoot(browser, name: str) -> Path:
    """A screenshot of the page as it is, under the test's temporary directory (and docs/ when asked)."""
    path = browser.shots / f"{name}.png"
    assert browser.save_screenshot(str(path))
    if os.environ.get("SLURM_EXT_DOCS_SCREENSHOTS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS / path.name)
    return path


def until(browser, what: str, test, timeout: float = 30.0, also=lambda: ""):
    """Wait for `test(browser)` to be truthy, the page redrawing meanwhile (an element gone stale is tried
    again); `also()` adds what the test knows to the failure (the records behind a button)."""
    def probe(driver):
        try:
            return test(driver)
        except StaleElementReferenceException:
            return False
    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.2).until(probe)
    except Exception as err:
        raise AssertionError(f"{what}: not within {timeout}s; the page says: "
                             f"{browser.find_element(By.TAG_NAME, 'body').text[:1500]}{also()}") from err


def click(browser, what: str, css: str, also=lambda: "") -> None:
    """Click what `css` names once it is drawn: the tables are drawn again at every poll, so a button found a moment
    ago may be gone (drawn again, or not yet drawn in the newest answer) by the time it is clicked."""
    def clicked(driver):
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
        except NoSuchElementException:
            return False
        return True
    until(browser, what, clicked, also=also)


def _journal(cluster) -> list[dict]:
    """The controller's journal (the first node's agent runs the controller)."""
    path = cluster.layout.first.node_state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def text_of(browser, css: str) -> str:
    found = browser.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def counts(browser) -> dict[str, int]:
    return {e.get_attribute("data-state"): int(e.find_element(By.CLASS_NAME, "n").text)
            for e in browser.find_elements(By.CSS_SELECTOR, "#state-counts .count")}


def test_the_overview_shows_the_five_states_the_fake_gpus_usage_and_a_drain_the_test_made(web, browser):
    web.drill("wnode2", "xid-79", gpu=1)  # the README's drill: the screenshots show what an operator rehearses
    web.record("wnode2", "recommended")  # pending
    web.run("scontrol", "update", "nodename=wnode3", "state=drain", "reason=admin: fan replacement")  # paused
    job = web.sbatch("-w", "wnode4", "--wrap", "sleep 300")  # no GPU: every GPU here shows memory in use and no
    # process, which the job-start hook refuses (test_web_usage_cluster allocates GPUs on idle ones)
    wait_for("the job runs", lambda: any(j.job_id == job and j.state == "RUNNING" for j in web.client().jobs()),
             30, interval=0.3)
    web.run("scontrol", "reboot", "wnode4")  # booting: REBOOT_REQUESTED while its job runs
    browser.get(web.url + "#overview")
    expected = {"healthy": 1, "booting": 1, "unhealthy": 1, "pending": 1, "paused": 1}  # wnode5 never runs
    until(browser, "the five states counted", lambda b: counts(b) == expected)
    until(browser, "wnode5's silent agent named", lambda b: "1 node agent not answering: wnode5" in text_of(b, "#banner"))
    # the grid is one canvas (no element per node): its cells as the page laid them out
    cells = {c["name"]: c["state"] for c in browser.execute_script("return slurmExt.cells('state-grid')")}
    assert cells == {"wnode1": "healthy", "wnode2": "pending", "wnode3": "paused", "wnode4": "booting",
                     "wnode5": "unhealthy"}, cells
    # every running node's 4 GPUs at 10, 20, 30, 40 % and 8, 16, 24, 32 GiB of an H200's 141 GiB
    until(browser, "the fake GPUs' utilization", lambda b: text_of(b, "#usage-utilization") == "25.0 % of 16 GPUs")
    until(browser, "no GPU allocated", lambda b: text_of(b, "#usage-allocation").startswith("0 of 20 GPUs"))
    # in use is what is used beyond the driver's reserve (NVML memory v2); the total holds the reserve too
    memory = (f"{sum(gib for _, gib in GPU_LOAD.values()) * len(NODES):.1f} GiB of "
              f"{16 * fakenvml.H200_MEMORY / 2**30:.1f} GiB")
    until(browser, "the fake GPUs' memory", lambda b: text_of(b, "#usage-memory") == memory)
    until(browser, "a bandwidth from two readings", lambda b: text_of(b, "#usage-network").startswith("in "))
    until(browser, "the admin's drain in the timeline", lambda b: any(
        "DRAIN: admin: fan replacement" in row.text and row.get_attribute("data-source") == "slurm"
        for row in b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")), timeout=60)
    config_text = text_of(browser, "#config")
    for fact in ("slurmextweb", "20 h200", "580.159.04 (4 nodes)", "22.05"):  # wnode5 configured too
        assert fact in config_text, config_text
    shoot(browser, "overview")


@pytest.fixture(params=["host", pytest.param("images", marks=pytest.mark.containers)])
def page(request):
    """The page of the host's 4-node dev cluster (Slurm 22.05) and of the images' (Slurm 26.05, or the suite's
    SLURM_EXT_TEST_IMAGE_SUITE: the session's `twin`), settled after the test."""
    cluster = request.getfixturevalue("site" if request.param == "host" else "twin")
    yield cluster
    cluster.settle(cluster.nodes)


def test_an_operator_approves_in_the_browser_and_the_repair_tab_names_her(page, browser):
    node = page.nodes[1]
    page.inject_xid(node)
    record = page.record(node, "recommended")
    browser.get(page.url + "#nodes")
    approve = f"#node-table tr[data-node={node}] button.op-approve"
    until(browser, f"{node}'s approve button", lambda b: b.find_elements(By.CSS_SELECTOR, approve))
    browser.find_element(By.ID, "token").send_keys(page.token)
    browser.find_element(By.ID, "use-token").click()
    until(browser, "the token taken", lambda b: text_of(b, "#who") == "operator: alice (token)")
    click(browser, f"{node}'s approve button", approve)
    until(browser, "the approval", lambda b: f"approved reboot of node {node}" in text_of(b, "#message")
          and "(by alice)" in text_of(b, "#message"))
    done = wait_for("the repair done", lambda: next((r for r in page.all_records(node)
                                                     if r["id"] == record["id"] and r["state"] == "done"), None),
                    120, interval=1.0)
    assert done["decided_by"] == "alice"
    browser.get(page.url + "#repair")
    row = f"#repairs tr[data-record='{record['id']}'][data-state=done]"
    until(browser, "the repair in the Repair tab", lambda b: b.find_elements(By.CSS_SELECTOR, row))
    assert text_of(browser, f"{row} .decided-by") == "alice"
    steps = text_of(browser, f"{row} .steps")
    for step in ("repair-approved", f"drained {node}", page.reboot_step(node), f"{node} is back", "checks pass",
                 "repair-done"):
        assert step in steps, steps


def test_approving_in_the_browser_needs_the_token_and_the_repair_tab_shows_it_with_the_user(web, browser):
    web.drill("wnode2", "xid-79", gpu=1)
    record = web.record("wnode2", "recommended")
    browser.get(web.url + "#nodes")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()  # the page as a tab without a token has it (what it says of its operator too)
    approve = "#node-table tr[data-node=wnode2] button.op-approve"

    def records():
        return f"; wnode2's records: {web.all_records('wnode2')}"
    click(browser, "wnode2's approve button", approve, records)
    until(browser, "the refusal without a token", lambda b: "refused" in text_of(b, "#message")
          and "authenticated operator" in text_of(b, "#message"))
    assert [r["state"] for r in web.all_records("wnode2") if r["id"] == record["id"]] == ["recommended"]

    browser.find_element(By.ID, "token").send_keys(web.token)
    browser.find_element(By.ID, "use-token").click()
    until(browser, "the token taken", lambda b: text_of(b, "#who") == "operator: alice (token)")
    click(browser, "wnode2's approve button", approve, records)
    until(browser, "the approval", lambda b: "approved reboot of node wnode2" in text_of(b, "#message")
          and "(by alice)" in text_of(b, "#message"))
    shoot(browser, "nodes")
    done = wait_for("the repair done", lambda: next((r for r in web.all_records("wnode2")
                                                     if r["id"] == record["id"] and r["state"] == "done"), None),
                    120, interval=1.0)
    assert done["decided_by"] == "alice"
    # the page ran as its own user, and its record of the approval is in root's journal, written by the agent
    [state] = [e for e in _journal(web) if e["event"] == "worker-state" and e.get("worker") == "web"
               and e.get("state") == "running"][-1:]
    page = pwd.getpwnam("slurm-ext-web")
    uids = next(line.split()[1:] for line in Path(f"/proc/{state['pid']}/status").read_text().splitlines()
                if line.startswith("Uid:"))
    assert uids == [str(page.pw_uid)] * 4, uids
    assert [e for e in _journal(web) if e["event"] == "web-operation" and e.get("user") == "alice"
            and e["component"] == "web" and e.get("worker") == "web" and "approved" in e["message"]
            and e.get("node") == "wnode2"], [e for e in _journal(web) if e["event"] == "web-operation"]

    browser.get(web.url + "#repair")
    row = f"#repairs tr[data-record='{record['id']}'][data-state=done]"
    until(browser, "the repair in the Repair tab", lambda b: b.find_elements(By.CSS_SELECTOR, row))
    assert text_of(browser, f"{row} .decided-by") == "alice"
    steps = text_of(browser, f"{row} .steps")
    for step in ("repair-approved", "drained wnode2", "scontrol reboot wnode2", "wnode2 is back", "checks pass",
                 "repair-done"):
        assert step in steps, steps
    shoot(browser, "repair")

    browser.get(web.url + "#nodes")
    check = "#node-table tr[data-node=wnode1] button.op-check"
    until(browser, "wnode1's check button", lambda b: b.find_elements(By.CSS_SELECTOR, check))
    click(browser, "wnode1's check button", check)
    until(browser, "the checks' verdict", lambda b: "health checks of wnode1 (by alice): healthy"
          in text_of(b, "#message"))
    with web.store() as store:
        runs = [e for e in store.events(node="wnode1") if e.event == "health-check-run"]
    assert runs and runs[-1].user == "alice" and runs[-1].message == "health checks asked from the page by alice"
    assert any(e["event"] == "web-operation" and e.get("user") == "alice" and "healthy" in e["message"]
               for e in _journal(web))

    # the list sorted and filtered, the grid, the ssh command
    Select(browser.find_element(By.ID, "node-state")).select_by_visible_text("healthy")
    until(browser, "only healthy nodes", lambda b: {r.get_attribute("data-state") for r in b.find_elements(
        By.CSS_SELECTOR, "#node-table tbody tr")} == {"healthy"})
    Select(browser.find_element(By.ID, "node-state")).select_by_visible_text("all")
    browser.find_element(By.CSS_SELECTOR, "#node-table th[data-sort=name]").click()  # descending now
    until(browser, "sorted by name, descending", lambda b: [r.get_attribute("data-node") for r in b.find_elements(
        By.CSS_SELECTOR, "#node-table tbody tr")] == ["wnode5", "wnode4", "wnode3", "wnode2", "wnode1"])
    browser.find_element(By.ID, "view-grid").click()
    until(browser, "the grid", lambda b: b.find_element(By.CSS_SELECTOR, "#node-grid canvas").get_attribute(
        "data-nodes") == "5")
    browser.find_element(By.ID, "view-list").click()
    click(browser, "wnode3's ssh button", "#node-table tr[data-node=wnode3] button.op-ssh")
    until(browser, "the ssh command copied", lambda b: text_of(b, "#message") == "copied: ssh wnode3")


def test_a_rejection_in_the_browser_and_the_health_checks_tab_filters(web, browser):
    web.drill("wnode3", "xid-79", gpu=1)
    web.record("wnode3", "recommended")
    browser.get(web.url + "#repair")
    browser.refresh()  # what the page says of its operator is what this tab holds (not a test before's)
    ops = "#recommendations tr[data-node=wnode3] .ops"
    until(browser, "wnode3's recommendation", lambda b: b.find_elements(By.CSS_SELECTOR, ops))
    if not text_of(browser, "#who") == "operator: alice (token)":
        browser.find_element(By.ID, "token").send_keys(web.token)
        browser.find_element(By.ID, "use-token").click()
        until(browser, "the token taken", lambda b: text_of(b, "#who") == "operator: alice (token)")
    browser.find_element(By.CSS_SELECTOR, f"{ops} .op-why").send_keys("board swap booked for Monday")
    browser.find_element(By.CSS_SELECTOR, f"{ops} button.op-reject").click()
    until(browser, "the rejection", lambda b: "rejected reboot of node wnode3" in text_of(b, "#message"))
    rejected = [r for r in web.all_records("wnode3") if r["state"] == "rejected"]
    assert [(r["decided_by"], r["note"]) for r in rejected] == [("alice", "board swap booked for Monday")]
    until(browser, "the rejection in the Repair tab", lambda b: "rejected" in text_of(
        b, "#recommendations tr[data-node=wnode3]") and "alice: board swap" in text_of(b, "#recommendations"))

    browser.get(web.url + "#health")
    until(browser, "the node list", lambda b: len(b.find_elements(By.CSS_SELECTOR, "#health-node option")) == 6)

    def rows(b):
        return [(r.get_attribute("data-node"), r.get_attribute("data-check"), r.text)
                for r in b.find_elements(By.CSS_SELECTOR, "#health-events tbody tr[data-node]")]
    until(browser, "wnode3's Xid finding among every node's events", lambda b: any(
        node == "wnode3" and "health-finding" in text and "79 gpu 1" in text for node, _, text in rows(b)))
    shoot(browser, "health")
    Select(browser.find_element(By.ID, "health-node")).select_by_visible_text("wnode3")
    Select(browser.find_element(By.ID, "health-check")).select_by_visible_text("xid")
    Select(browser.find_element(By.ID, "health-severity")).select_by_visible_text("critical")
    until(browser, "only wnode3's critical Xid findings", lambda b: rows(b) and {
        (node, check) for node, check, _ in rows(b)} == {("wnode3", "xid")})
    Select(browser.find_element(By.ID, "health-node")).select_by_visible_text("wnode1")
    until(browser, "nothing of wnode3 under wnode1", lambda b: not any(n == "wnode3" for n, _, _ in rows(b)))


def _request(port: str | int, method: str, path: str, headers: dict, source: str = "127.0.0.1"):
    connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30, source_address=(source, 0))
    try:
        connection.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def test_slurm_stopped_is_said_with_the_last_state_kept_and_the_page_recovers_by_itself(web, browser, tmp_path):
    """The page standalone (`slurm-ext web`), with a trusted proxy header; slurmctld stopped under it."""
    conf = tmp_path / "standalone.toml"
    conf.write_text(web.layout.slurm_ext_conf.read_text().replace(
        "[web]\n", '[web]\nproxy_user_header = "X-Forwarded-User"\ntrusted_proxies = ["127.0.0.1"]\n'
                   'grafana_url = "http://127.0.0.1:3000/d/slurm-ext-health"\n'))
    log = (tmp_path / "web.out").open("w")
    page = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "--listen",
                             f"127.0.0.1:{STANDALONE_PORT}"], stdout=log, stderr=subprocess.STDOUT)
    controller = next(d for d in cluster_daemons(web.layout) if d.name == "supervise-controller")
    try:
        url = f"http://127.0.0.1:{STANDALONE_PORT}/"
        wait_for("the standalone page", lambda: _reachable(url), 30, interval=0.2)
        session = _request(STANDALONE_PORT, "GET", "/api/session", {"X-Forwarded-User": "bob"})[1]
        assert session["user"] == "bob" and session["via"] == "proxy"
        proxied = {"X-Forwarded-User": "bob", "X-CSRF-Token": session["csrf"], "Content-Type": "application/json"}
        status, answer = _request(STANDALONE_PORT, "POST", "/api/nodes/wnode1/check", proxied)
        assert status == 200 and answer["user"] == "bob", answer
        status, answer = _request(STANDALONE_PORT, "POST", "/api/nodes/wnode1/check", proxied, source="127.0.0.2")
        assert status == 403 and "not in web.trusted_proxies" in answer["error"], answer

        browser.get(url + "#overview")
        until(browser, "the standalone page's states", lambda b: sum(counts(b).values()) == 5)
        links = {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, ".panel .grafana")}
        assert links == {"http://127.0.0.1:3000/d/slurm-ext-health"}, links
        before = counts(browser)
        daemons.stop(controller)  # slurmctld, its agent and the agent's own page with it
        until(browser, "Slurm said to be away", lambda b: "slurmctld (the node table) does not answer"
              in text_of(b, "#banner"), timeout=90)
        assert "shown: its last answer" in text_of(browser, "#banner") and counts(browser) == before
        shoot(browser, "slurm-away")
        dev.up(web.settings)
        until(browser, "the page recovered", lambda b: "slurmctld" not in text_of(b, "#banner"), timeout=90)
        # the nodes answer the restarted slurmctld within a ping or two (unhealthy meanwhile)
        until(browser, "the states as before", lambda b: counts(b) == before, timeout=90)
    finally:
        page.terminate()
        page.wait(30)
        log.close()
        dev.up(web.settings)  # the controller back, whatever happened above


def _reachable(url: str) -> bool:
    try:
        import urllib.request
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False

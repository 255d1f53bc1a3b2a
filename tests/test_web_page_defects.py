"""The defects a new operator met on the page (issue 29 item 7), in a real headless Chromium over the real page served
on 127.0.0.1 (waitress, the page's server), its Slurm and agents literal answers (the page's own behaviour is under
test: the page over a real cluster is test_web_cluster.py)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from slurm_ext import config
from helpers.page import stored_journal
from slurm_ext.agentapi import AcceptanceAnswer, HealthAnswer
from slurm_ext.repair.store import open_sqlite
from slurm_ext.slurm import Node
from slurm_ext.web.app import create_app
from slurm_ext.web.auth import token_hash
from slurm_ext.web.watch import Watcher

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "t" * 32
#: the journal of the node in one second, in the order it was written
SAME_SECOND = [("health", "health-finding", "found"), ("nodestate", "drain", "drained"),
               ("health", "health-check-failed", "then"), ("supervisor", "worker-state", "last")]
#: that second: within the page's timeline
SECOND = datetime.fromtimestamp(int(time.time()) - 120, timezone.utc)


class _Slurm:
    """slurmctld's answers as literal records: one node, or `count`."""

    def __init__(self, count: int = 1):
        self.count = count

    def nodes(self):
        return [Node(f"n{i}", "IDLE", gres="gpu:h200:1", addr="127.0.0.1") for i in range(1, self.count + 1)]

    def node_events(self, node, since):
        return []

    def queue(self):
        return []  # no job: the page's job columns are test_web_cluster.py's

    def show_config(self):
        return {"ClusterName": "unit", "SLURM_VERSION": "26.05.0"}


class _Agents:
    """Every node's agent: one GPU, one interface (its journal of events in one second, SAME_SECOND, is stored as
    the collector stores it: `_page`)."""

    def health(self, node, addr="", timeout=None):
        return HealthAnswer.of({"node": node, "boot": "b", "time": 100.0, "monitor": {"driver": "560.35.03", "gpus": [
            {"gpu": {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"}, "utilization": 40, "fb_used_mib": 10.0,
             "fb_free_mib": 90.0, "temperature": 40, "jobs": []}]},
            "facts": {"os": "Debian GNU/Linux 13", "interfaces": [{"name": "ib0", "speed_mbps": 400000,
                                                                   "rx_bytes": 1, "tx_bytes": 1}]}})

    def acceptance(self, node, addr="", trigger="", timeout=None):
        return AcceptanceAnswer(node, "b", False, False, None)  # no run kept


@contextmanager
def _page(tmp_path: Path, web: str, nodes: int = 1):
    """The page on a free port of 127.0.0.1 (werkzeug's threaded server) over the literal answers; its URL."""
    from werkzeug.serving import make_server
    path = tmp_path / "slurm-ext.toml"
    agents = ", ".join(f'n{i} = "127.0.0.1:1"' for i in range(1, nodes + 1))
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\n{web}\n[repair]\nagents = {{ {agents} }}\n')
    loaded = config.load(path)
    store = open_sqlite(str(tmp_path / "repair.db"))
    for i in range(1, nodes + 1):
        stored_journal(store, f"n{i}", "\n".join(
            json.dumps({"time": SECOND.isoformat(), "component": component, "event": event, "severity": "info",
                        "message": message}) for component, event, message in SAME_SECOND))
    watcher = Watcher(loaded, _Slurm(nodes), store, lambda url, timeout: (None, "refused"), _Agents())
    watcher.refresh()
    server = make_server("127.0.0.1", 0, create_app(loaded, watcher, store_opener=lambda: open_sqlite(
        str(tmp_path / "repair.db"))), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        store.close()


def _token_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens"
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


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
    yield driver
    driver.quit()


def until(browser, what: str, test, timeout: float = 20.0):
    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(test)
    except Exception as err:
        raise AssertionError(f"{what}: not within {timeout}s; the page says: "
                             f"{browser.find_element(By.TAG_NAME, 'body').text[:1500]}") from err


def _text(browser, element_id: str) -> str:
    return browser.find_element(By.ID, element_id).text


def cell(browser, name: str, grid: str = "node-grid") -> dict | None:
    """Node `name`'s cell of a grid (`node-grid`, `state-grid`: one canvas each, no element per cell) as the page's
    slurmExt.cellAt says it: its state, the lines written in it, its tooltip, its centre, whether it is drawn."""
    return browser.execute_script("return window.slurmExt ? slurmExt.cellAt(arguments[0], arguments[1]) : null",
                                  name, grid)


def _open(browser, url: str) -> None:
    browser.get("about:blank")
    browser.get(url)
    browser.execute_script("sessionStorage.clear()")
    browser.get(url)
    until(browser, "the page drawn", lambda b: "answering" in _text(b, "status-line"))


def test_after_grid_then_list_the_nodes_tab_shows_the_list_alone(tmp_path, browser):
    """The grid stayed beside the list: `.node-grid { display: flex }` beat the grid's `hidden` attribute."""
    with _page(tmp_path, 'token_file = ""') as url:
        _open(browser, url + "#nodes")
        grid, table = browser.find_element(By.ID, "node-grid"), browser.find_element(By.ID, "node-table")
        browser.find_element(By.ID, "view-grid").click()
        until(browser, "the grid", lambda b: grid.is_displayed() and (cell(b, "n1") or {}).get("drawn"))
        assert not table.is_displayed()
        browser.find_element(By.ID, "view-list").click()
        until(browser, "the list", lambda b: table.is_displayed() and "n1" in table.text)
        assert not grid.is_displayed() and grid.value_of_css_property("display") == "none"


def test_a_fresh_cluster_without_a_token_shows_a_neutral_hint_on_every_tab_never_a_red_error(tmp_path, browser):
    """Before any token existed (the file not made yet), every tab showed the red "the operators' tokens cannot be
    used now"."""
    with _page(tmp_path, f'token_file = "{tmp_path / "tokens"}"') as url:
        _open(browser, url)
        for tab in ("overview", "nodes", "health", "repair"):
            browser.get(url + f"#{tab}")
            until(browser, f"the hint on {tab}", lambda b: "slurm-ext web add-token USER" in _text(b, "message"))
            message = browser.find_element(By.ID, "message")
            assert "error" not in message.get_attribute("class").split(), message.get_attribute("class")
            assert "cannot be used" not in message.text and not browser.find_elements(By.CSS_SELECTOR, ".error")
    # a file that is there and wrong stays an error
    _token_file(tmp_path, f"alice {token_hash(TOKEN)}\n")
    os.chmod(tmp_path / "tokens", 0o644)
    with _page(tmp_path, f'token_file = "{tmp_path / "tokens"}"') as url:
        _open(browser, url)
        until(browser, "the red error", lambda b: "cannot be used" in _text(b, "message"))
        assert "error" in browser.find_element(By.ID, "message").get_attribute("class").split()


def test_the_header_says_whose_token_it_is_and_that_a_wrong_one_is_not_known(tmp_path, browser):
    """After "Use token" the header said "operator token set", a wrong token too, and never the user."""
    _token_file(tmp_path, f"alice {token_hash(TOKEN)}\n")
    with _page(tmp_path, f'token_file = "{tmp_path / "tokens"}"') as url:
        _open(browser, url)
        assert _text(browser, "who") == "viewing"
        for typed, said in (("w" * 32, "this token is not known"), (TOKEN, "operator: alice (token)")):
            browser.find_element(By.ID, "token").send_keys(typed)
            browser.find_element(By.ID, "use-token").click()
            until(browser, f"the header saying {said!r}", lambda b: _text(b, "who") == said)
        browser.refresh()  # the tab keeps the token, and the header its user
        until(browser, "the user after a reload", lambda b: _text(b, "who") == "operator: alice (token)")
        browser.find_element(By.ID, "forget-token").click()
        until(browser, "viewing again", lambda b: _text(b, "who") == "viewing")


def test_one_of_each_count_reads_singular_on_the_page(tmp_path, browser):
    """"1 nodes", "1 GPUs", "(1 nodes)" on the Overview and Nodes tabs."""
    with _page(tmp_path, 'token_file = ""') as url:
        _open(browser, url + "#nodes")
        until(browser, "the count of nodes", lambda b: _text(b, "node-shown") == "1 of 1 node")
        browser.get(url + "#overview")
        until(browser, "the usage", lambda b: _text(b, "usage-utilization") == "40.0 % of 1 GPU")
        until(browser, "the configuration", lambda b: "560.35.03 (1 node)" in _text(b, "config"))
        assert "ib0 (1 node, 400 Gb/s)" in _text(browser, "config")
        assert _text(browser, "usage-allocation") == "0 of 1 GPU (0.0 %)"
        assert "1 of 1 node agent answering" in _text(browser, "status-line")
        browser.get(url + "#nodes")
        browser.find_element(By.ID, "view-grid").click()
        said = lambda b: " ".join((cell(b, "n1") or {}).get("lines", []))  # noqa: E731
        until(browser, "the grid's cell", lambda b: "0/1 GPU" in said(b))
        assert "GPUs" not in said(browser)
        browser.find_element(By.ID, "view-list").click()
    with _page(tmp_path, 'token_file = ""', nodes=2) as url:
        _open(browser, url + "#nodes")
        until(browser, "two nodes", lambda b: _text(b, "node-shown") == "2 of 2 nodes")
        browser.get(url + "#overview")
        until(browser, "two GPUs", lambda b: _text(b, "usage-utilization") == "40.0 % of 2 GPUs")


def test_events_of_one_second_stay_in_the_journals_order_newest_first(tmp_path, browser):
    """The timeline showed a node's events of one second oldest first under a list newest first."""
    newest_first = [f"{component}/{event}" for component, event, _ in reversed(SAME_SECOND)]
    with _page(tmp_path, 'token_file = ""') as url:
        from urllib.request import urlopen
        with urlopen(url + "api/timeline?source=agent", timeout=10) as answer:
            entries = json.load(answer)["entries"]
        assert [e["event"] for e in entries] == newest_first, entries
        _open(browser, url + "#overview")
        until(browser, "the timeline", lambda b: len(b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")) == 4)
        rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr td:nth-child(4)")
        assert [row.text for row in rows] == newest_first
        # one time format, the CLI's: ISO 8601 with the zone's offset (it was `2026-12-01 10:00:00`, no zone)
        shown = browser.find_element(By.CSS_SELECTOR, "#timeline tbody tr td:nth-child(1)").text
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", shown), shown
        assert datetime.fromisoformat(shown) == SECOND, shown


def test_a_wrong_token_the_session_is_asked_about_is_a_refusal_on_record(tmp_path):
    """/api/session tells whose a token is: a wrong one is recorded as web-refused, as an operation with it is (at
    most one such event a minute for an address), so that guessing through it is seen as guessing through a POST."""
    from urllib.request import Request, urlopen
    _token_file(tmp_path, f"alice {token_hash(TOKEN)}\n")
    with _page(tmp_path, f'token_file = "{tmp_path / "tokens"}"') as url:
        def session(token: str) -> dict:
            with urlopen(Request(url + "api/session", headers={"Authorization": f"Bearer {token}"}), timeout=10) as a:
                return json.load(a)
        assert (session(TOKEN)["user"], session(TOKEN)["via"]) == ("alice", "token")
        journal = tmp_path / "state" / "journal.jsonl"
        refused = lambda: [e for e in map(json.loads, journal.read_text().splitlines())  # noqa: E731
                           if e["event"] == "web-refused"] if journal.exists() else []
        assert refused() == []
        for _ in range(3):
            answer = session("w" * 32)
            assert answer["user"] is None and "this operator token is not known" in answer["problem"], answer
        [event] = refused()
        assert "/api/session" in event["message"] and event["address"] == "127.0.0.1", event

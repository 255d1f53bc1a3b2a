"""The cluster page's logic: who may act (token file, proxy header, CSRF), the usage figures from literal agent
answers, and the API's answers to bad input through Flask's test client over a view made by a real refresh (Slurm
and the agents stood in by literal answers here; the real cluster and a real browser: tests/test_web_cluster.py).
The attacks of the security review (issue 28) on a real server: `slurm-ext web` as the page runs, in a process of
its own, or the page's waitress server over a watcher of many stood-in nodes."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from slurm_ext import config
from slurm_ext.agentapi import AgentAnswerError, HealthAnswer
from slurm_ext.errors import SlurmUnreachable
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.slurm import Node, NodeEvent
from slurm_ext.web import usage
from slurm_ext.web.app import create_app
from slurm_ext.web.auth import Csrf, RequestRefused, Tokens, operator_of
from slurm_ext.web.settings import WebSection
from slurm_ext.web.watch import Watcher, drain_owner, gpus_by_type

from helpers.cli import cli
from helpers.page import StandInAgents, journal_lines, stored_journal
from helpers.wait import wait_for

TOKEN = "a" * 24


def _hashed(token: str) -> str:
    """How web.token_file keeps a token: its SHA-256 (the file never holds the token itself)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def _token_file(tmp_path: Path, text: str, mode: int = 0o600, owner: int = 0) -> str:
    path = tmp_path / "tokens"
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, owner, owner)
    return str(path)


# -- who may act ------------------------------------------------------------------------------------------------

def test_a_token_names_its_operator_and_a_file_others_can_read_is_refused_as_a_whole(tmp_path):
    path = _token_file(tmp_path, f"# operators\nalice {_hashed(TOKEN)}\nbob short\n\n")
    tokens = Tokens(path)
    assert tokens.user_of(TOKEN) == "alice" and tokens.user_of("b" * 24) is None
    assert "line(s) 3 ignored" in tokens.problem  # bob's token is too short: named, the rest still works
    os.chmod(path, 0o644)
    assert tokens.user_of(TOKEN) is None and "readable by no one else" in tokens.problem
    os.chmod(path, 0o600)
    os.chown(path, 65534, 65534)
    assert tokens.user_of(TOKEN) is None and "owned by uid 65534" in tokens.problem
    os.chown(path, 0, 0)
    Path(path).write_text(f"carol {_hashed(TOKEN)}\n")  # edited: read again, alice's token is revoked
    assert tokens.user_of(TOKEN) == "carol"
    assert Tokens(str(tmp_path / "missing")).user_of(TOKEN) is None


def test_the_proxy_header_is_believed_only_from_a_trusted_proxy_and_a_bearer_token_otherwise(tmp_path):
    tokens = Tokens(_token_file(tmp_path, f"alice {_hashed(TOKEN)}\n"))
    proxied = WebSection(proxy_user_header="X-Forwarded-User", trusted_proxies=("127.0.0.1",))
    found = operator_of({"X-Forwarded-User": "dana@example.org"}, "127.0.0.1", proxied, tokens)
    assert (found.user, found.via) == ("dana@example.org", "proxy")
    with pytest.raises(RequestRefused, match="not in web.trusted_proxies") as refused:
        operator_of({"X-Forwarded-User": "dana", "Authorization": f"Bearer {TOKEN}"}, "127.0.0.2", proxied, tokens)
    assert refused.value.status == 403  # a forged name is never taken for a missing one, even beside a token
    with pytest.raises(RequestRefused, match="names no valid user"):
        operator_of({"X-Forwarded-User": "bad user; rm"}, "127.0.0.1", proxied, tokens)
    plain = WebSection()  # the header is not configured: it means nothing, the token decides
    assert operator_of({"X-Forwarded-User": "mallory", "Authorization": f"Bearer {TOKEN}"}, "127.0.0.2", plain,
                       tokens).user == "alice"
    with pytest.raises(RequestRefused, match="not known") as unknown:
        operator_of({"Authorization": "Bearer " + "z" * 24}, "127.0.0.1", plain, tokens)
    with pytest.raises(RequestRefused, match="needs an authenticated operator") as nobody:
        operator_of({}, "127.0.0.1", plain, tokens)
    assert unknown.value.status == nobody.value.status == 401


def test_a_csrf_token_is_refused_when_missing_forged_from_another_server_or_stale():
    now = [1_000_000.0]
    csrf = Csrf(max_age=3600, clock=lambda: now[0])
    token = csrf.issue()
    csrf.check(token)
    for bad, why in ((None, "carries no CSRF token"), ("", "carries no CSRF token"),
                     (token[:-1] + ("0" if token[-1] != "0" else "1"), "not issued by this server"),
                     ("x.y", "not issued by this server"), (Csrf().issue(), "not issued by this server")):
        with pytest.raises(RequestRefused, match=why) as refused:
            csrf.check(bad)
        assert refused.value.status == 403
    now[0] += 3601
    with pytest.raises(RequestRefused, match="stale"):
        csrf.check(token)


# -- the page itself --------------------------------------------------------------------------------------------

def test_the_page_fetches_nothing_from_elsewhere_and_no_other_site_may_frame_or_script_it(page):
    import re
    from slurm_ext.web.app import STATIC
    for asset in STATIC.iterdir():  # no CDN, no font, no script of another host: it works air-gapped
        assert not re.search(r"(?:https?:)?//[A-Za-z0-9]", re.sub(r"(?m)^\s*//.*$", "", asset.read_text())), asset
    answer = page.get("/")
    assert answer.status_code == 200 and b'<script src="static/app.js"' in answer.data
    assert answer.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert page.get("/static/app.js").status_code == 200 and page.get("/static/../app.py").status_code == 404


# -- usage ---------------------------------------------------------------------------------------------------------

def _sent(time_: float, utilization=(50, 70), used=(1024.0, 3072.0), rx=1000, tx=2000) -> dict:
    """An agent's /health as it sends it (its health monitor's readings and nodefacts' facts, as JSON)."""
    gpus = [{"gpu": {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H200"}, "utilization": u, "fb_used_mib": m,
             "fb_free_mib": 4096.0 - m, "temperature": 40 + i, "jobs": [7] if i == 0 else []}
            for i, (u, m) in enumerate(zip(utilization, used))]
    return {"node": "n1", "boot": "boot-1", "time": time_, "monitor": {"gpus": gpus, "driver": "560.35.03"},
            "facts": {"os": "Debian GNU/Linux 13 (trixie)", "interfaces": [
                {"name": "ib0", "state": "up", "speed_mbps": 400000, "rx_bytes": rx, "tx_bytes": tx}]}}


def _answer(time_: float, **figures) -> HealthAnswer:
    """That answer as the boundary hands it to the page."""
    return HealthAnswer.of(_sent(time_, **figures))


def test_node_figures_bandwidth_and_the_cluster_sum():
    first, second = usage.node_usage(_answer(100.0)), usage.node_usage(_answer(110.0, rx=11000, tx=2500))
    assert (first.gpus, first.utilization_sum, first.memory_used_mib, first.memory_total_mib) == (2, 120, 4096, 8192)
    assert usage.bandwidth(first, second) == (1000.0, 50.0)
    assert usage.bandwidth(second, usage.node_usage(_answer(120.0, rx=5))) is None  # a counter reset: no rate
    assert usage.bandwidth(None, second) is None and usage.bandwidth(second, second) is None
    other = usage.node_usage(_answer(110.0, utilization=(None, 10), used=(0.0, 0.0)))
    total = usage.cluster_usage([second, other], [(1000.0, 50.0)])
    assert (total.gpus, total.gpu_utilization, total.memory_used_mib, total.memory_total_mib, total.rx_bps,
            total.tx_bps) == (4, 130 / 3, 4096, 16384, 1000.0, 50.0)
    rows = usage.gpu_rows(_answer(1.0))
    assert rows[0].jobs == [7] and rows[1].temperature == 41 and rows[0].memory_total_mib == 4096.0
    reserved = _sent(1.0)
    reserved["monitor"]["gpus"][0]["fb_reserved_mib"] = 615.0  # NVML memory v2: the driver's own part, in the total
    assert usage.gpu_rows(HealthAnswer.of(reserved))[0].memory_total_mib == 4096.0 + 615.0
    quiet = HealthAnswer.of({**_sent(1.0), "monitor": None})  # no health monitor on the node: no GPU, no figure
    assert usage.node_usage(None) is None and usage.gpu_rows(quiet) == [] and usage.node_usage(quiet).gpus == 0
    assert usage.cluster_usage([], []).gpu_utilization is None


def test_prometheus_figures_and_a_prometheus_that_answers_junk():
    answers = {"gpu_utilization": "42.5", "memory_used_mib": "100", "memory_free_mib": "300", "rx_bps": "NaN",
               "tx_bps": "7", "gpus": "8", "memory_reserved_mib": "615"}
    by_query = {query: answers[key] for key, query in usage.PROMETHEUS_QUERIES.items()}

    def get(url):
        from urllib.parse import parse_qs, urlsplit
        query = parse_qs(urlsplit(url).query)["query"][0]
        return json.dumps({"status": "success", "data": {"result": [{"value": [1, by_query[query]]}]}}), ""
    found = usage.prometheus_usage("http://127.0.0.1:9090/", get)
    assert (found.gpus, found.gpu_utilization, found.memory_total_mib, found.rx_bps, found.tx_bps) == \
        (8, 42.5, 1015.0, None, 7.0)  # the driver's reserve is in the total, not in what is used
    with pytest.raises(ValueError, match="does not answer: refused"):
        usage.prometheus_usage("http://127.0.0.1:9090", lambda url: (None, "refused"))
    with pytest.raises(ValueError, match="no result for"):
        usage.prometheus_usage("http://127.0.0.1:9090", lambda url: ("<html>", ""))


def test_the_session_says_the_tokens_cannot_be_used_and_leaves_why_to_the_log(page, tmp_path):
    assert page.get("/api/session").get_json()["problem"] == ""
    os.chmod(tmp_path / "tokens", 0o644)
    said = page.get("/api/session").get_json()["problem"]
    assert "cannot be used" in said and "log" in said and str(tmp_path) not in said and "644" not in said


class _Agents:
    """The agents as the boundary (agentapi.AgentClient) hands them to the page: its records, or its one error for
    an answer that is not one (the boundary itself, over HTTP: test_agentapi.py)."""

    def __init__(self, answer: dict):
        self.answer, self.asked = answer, []

    def health(self, node, addr="", timeout=None):
        self.asked.append(("health", node))
        try:
            return HealthAnswer.of({**self.answer, "node": node})
        except ValueError as err:
            raise AgentAnswerError(node, "127.0.0.1:1", f"its /health is not a health answer: {err}") from None

    def acceptance(self, node, addr="", trigger="", timeout=None):
        self.asked.append(("acceptance", node))
        raise AgentAnswerError(node, "127.0.0.1:1", "HTTP 404: try /livez, ...", 404)  # an agent older than /acceptance


def test_an_agent_answering_junk_costs_its_figures_never_the_refresh(tmp_path):
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[repair]\nsqlite_file = "{tmp_path / "r.db"}"\n')
    odd_values = {"time": 5.0, "monitor": {"driver": "", "gpus": [
        {"gpu": {"index": 0, "name": 5}, "utilization": float("nan"), "fb_used_mib": float("inf"), "temperature": "hot",
         "fb_free_mib": 10, "jobs": "7"},
        {"gpu": {"index": 1, "name": "N" * 300}, "utilization": True, "fb_used_mib": 1.0, "fb_free_mib": 3.0,
         "temperature": 10**400, "jobs": [7, "8", True]}]},
        "facts": {"os": ["x"], "interfaces": [{"name": "ib0", "speed_mbps": {"x": 1}, "rx_bytes": "many",
                                               "tx_bytes": 1}, {"speed_mbps": 100, "rx_bytes": 1, "tx_bytes": 1}]}}
    store = open_sqlite(str(tmp_path / "r.db"))
    watcher = Watcher(config.load(path), _Slurm(), store, lambda url, timeout: ("{]", ""), _Agents(odd_values))
    data = json.loads(watcher.refresh().body)
    # each odd figure is "-" alone: the GPU's other figures, the node and the refresh stand
    assert data["cluster"]["os_images"] == {} and data["cluster"]["interfaces"] == \
        {"ib0": {"nodes": 2, "speeds_mbps": []}}  # the interface without a name cannot be told from another
    assert data["nodes"][0]["gpu_readings"] == [
        {"index": 0, "name": "", "uuid": "", "utilization": None, "memory_used_mib": None, "memory_total_mib": None,
         "temperature": None, "error": "", "jobs": [], "holders": [], "idle_since": None, "idle": False},
        {"index": 1, "name": "N" * 200, "uuid": "", "utilization": None, "memory_used_mib": 1.0,
         "memory_total_mib": 4.0, "temperature": None, "error": "", "jobs": [7],
         "holders": [], "idle_since": None, "idle": False}]  # Slurm's queue runs no job 7: its record is stale
    assert data["usage"]["now"]["gpus"] == 4 and data["agents"]["answering"] == 2
    # an answer that is not a health answer at all is refused at the boundary: the node's agent is said not to answer
    for odd, why in (({"time": 5.0, "monitor": {"driver": {"a": 1}, "findings": "no", "gpus": ["not a gpu"]}},
                      "findings: expected a list of objects"),
                     ({"time": 5.0, "facts": {"interfaces": [7]}}, "interfaces: expected a list of objects")):
        watcher.agent_client = _Agents(odd)
        data = json.loads(watcher.refresh().body)
        assert data["agents"]["answering"] == 0 and data["nodes"][0]["gpu_readings"][1]["memory_used_mib"] == 1.0
        assert all(f"not a health answer: {why}" in said for said in data["agents"]["not_answering"].values()), \
            data["agents"]
    store.close()


def test_gpus_by_type_and_who_owns_a_drain():
    nodes = [Node("a", "IDLE", gres="gpu:h200:4(S:0-1)"), Node("b", "IDLE", gres="gpu:a100:2,gpu:h200:1"),
             Node("c", "IDLE", gres="gpu:3"), Node("d", "IDLE", gres="")]
    assert gpus_by_type(nodes) == {"h200": 5, "a100": 2, "gpu": 3}
    assert drain_owner(Node("a", "IDLE", reason="slurm-ext: xid 79 gpu 1")) == "slurm-ext"
    assert drain_owner(Node("a", "IDLE", reason="slurm-operator: pod deleted")) == "slurm-operator"
    assert drain_owner(Node("a", "IDLE", reason="NHC: check_fs_mount failed")) == "NHC"
    assert drain_owner(Node("a", "IDLE", reason="fan replacement, back monday", reason_user="root")) == "admin (root)"
    assert drain_owner(Node("a", "IDLE")) == ""


# -- the API over a real refresh -------------------------------------------------------------------------------------

class _Slurm:
    """Slurm's answers as literal records (the page's own logic is under test here)."""

    def __init__(self):
        self.down = False
        self.asked = []

    def _answer(self, what, value):
        self.asked.append(what)
        if self.down:
            raise SlurmUnreachable("sinfo: Slurm unreachable: Unable to contact slurm controller", [what])
        return value

    def nodes(self):
        return self._answer("nodes", [
            Node("n1", "IDLE", gres="gpu:h200:2", addr="127.0.0.1"),
            Node("n2", "IDLE", frozenset({"DRAIN"}), "slurm-ext: xid 79 gpu 1 GPU_HAS_FALLEN_OFF_THE_BUS (expected "
                 "none) action=reboot", "root", gres="gpu:h200:2", addr="127.0.0.1")])

    def node_events(self, node, since):
        return self._answer("events", [NodeEvent("n2", datetime(2026, 12, 1, tzinfo=timezone.utc), None, "DRAIN",
                                                 "slurm-ext: xid 79", "root")])

    def show_config(self):
        return self._answer("config", {"ClusterName": "unit", "SLURM_VERSION": "26.05.0"})

    def queue(self):
        return self._answer("queue", [])


@pytest.fixture
def page(tmp_path):
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = "{tmp_path / "tokens"}"\n'
                    f'[repair]\nagents = {{ n1 = "127.0.0.1:1", n2 = "127.0.0.1:2" }}\n')
    _token_file(tmp_path, f"alice {_hashed(TOKEN)}\n")
    loaded = config.load(path)
    store = open_sqlite(str(tmp_path / "repair.db"))
    with store.locked():
        store.add(Record("n2", "xid/79", "reboot", "79 gpu 1", opened=1.0, updated=1.0))
    first = int(time.time()) - 60
    stored_journal(store, "n2", "\n".join(
        json.dumps({"time": datetime.fromtimestamp(first + i, timezone.utc).isoformat(), "component": "health",
                    "event": "health-finding", "severity": "error", "message": f"critical {i}", "check": "xid",
                    "finding_severity": "critical", "gpu": 1}) for i in range(3)))

    slurm = _Slurm()
    watcher = Watcher(loaded, slurm, store, lambda url, timeout: (None, "refused"), _Agents(_sent(100.0)))
    app = create_app(loaded, watcher, store_opener=lambda: open_sqlite(str(tmp_path / "repair.db")))
    watcher.refresh()
    client = app.test_client()
    client.slurm, client.watcher = slurm, watcher
    yield client
    store.close()


def test_the_view_counts_nodes_and_says_where_each_journal_line_comes_from(page):
    data = page.get("/api/cluster").get_json()
    assert data["counts"] == {"healthy": 1, "booting": 0, "unhealthy": 0, "pending": 1, "paused": 0}
    assert data["cluster"]["name"] == "unit" and data["cluster"]["gpus_by_type"] == {"h200": 4}
    assert data["cluster"]["drivers"] == {"560.35.03": 2}  # the tally of what each answering agent says
    assert data["usage"]["now"]["gpus"] == 4 and data["usage"]["now"]["gpu_utilization"] == 60.0
    health = page.get("/api/health?node=n2&check=xid&severity=critical").get_json()["entries"]
    assert [e["message"] for e in health] == ["critical 2", "critical 1", "critical 0"] and health[0]["node"] == "n2"
    assert page.get("/api/health?node=n1").get_json()["entries"] == []
    timeline = page.get("/api/timeline?source=slurm").get_json()["entries"]
    assert [e["message"] for e in timeline] == ["DRAIN: slurm-ext: xid 79 (by root)"]
    repairs = page.get("/api/repairs").get_json()
    assert [r["node"] for r in repairs["open"]] == ["n2"]


def test_junk_queries_unknown_nodes_and_routes_are_4xx_with_a_reason_never_a_traceback(page):
    for url, status, said in (("/api/cluster?x=1", 400, "unknown query key 'x'"),
                              ("/api/timeline?limit=0", 400, "limit='0': expected a count from 1 to 5000"),
                              ("/api/timeline?limit=5&limit=6", 400, "given 2 times"),
                              ("/api/timeline?node=n9", 404, "no node 'n9' in this cluster"),
                              ("/api/timeline?node=%3Cscript%3E", 400, "expected a node name"),
                              ("/api/health?check=nope", 400, "expected one of gpu-lost"),
                              ("/api/health?severity=error", 400, "expected one of info, warning, critical"),
                              ("/api/nothing", 404, "404 Not Found")):
        answer = page.get(url)
        assert answer.status_code == status and said in answer.get_json()["error"], (url, answer.get_json())
        assert "Traceback" not in answer.get_data(as_text=True)
    assert page.post("/api/cluster").status_code == 405


def test_an_operation_needs_csrf_an_operator_and_a_known_node_and_is_recorded_with_the_user(page, tmp_path):
    csrf = page.get("/api/session").get_json()["csrf"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert page.post("/api/nodes/n2/approve", headers=auth).status_code == 403  # no CSRF token
    refused = page.post("/api/nodes/n2/approve", headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 401 and "authenticated operator" in refused.get_json()["error"]
    for forged in ("1." + "0" * 64, "1.\xe9", "\xe9.x", csrf.split(".")[0] + ".00"):
        refused = page.post("/api/nodes/n2/approve", headers={**auth, "X-CSRF-Token": forged})
        assert refused.status_code == 403 and "not issued by this server" in refused.get_json()["error"], forged
    deep = page.post("/api/nodes/n2/approve", headers={**auth, "X-CSRF-Token": csrf}, data="[" * 12000)
    assert deep.status_code == 400 and deep.get_json()["error"] == "the body is not JSON"
    unknown = page.post("/api/nodes/n7/approve", headers={**auth, "X-CSRF-Token": csrf})
    assert unknown.status_code == 404
    bad_action = page.post("/api/nodes/n2/approve", headers={**auth, "X-CSRF-Token": csrf}, json={"action": "nuke"})
    assert bad_action.status_code == 400 and "expected one of reset-gpu, reboot" in bad_action.get_json()["error"]
    no_reason = page.post("/api/nodes/n2/reject", headers={**auth, "X-CSRF-Token": csrf}, json={"why": " "})
    assert no_reason.status_code == 400
    done = page.post("/api/nodes/n2/approve", headers={**auth, "X-CSRF-Token": csrf}, json={})
    assert done.status_code == 200 and done.get_json()["user"] == "alice", done.get_json()
    again = page.post("/api/nodes/n2/approve", headers={**auth, "X-CSRF-Token": csrf}, json={})
    assert again.status_code == 409 and "already approved by alice" in again.get_json()["error"]
    store = open_sqlite(str(tmp_path / "repair.db"))
    assert [(r.state, r.decided_by) for r in store.records(node="n2")] == [("approved", "alice")]
    store.close()
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert [e["event"] for e in journal if e["component"] == "web"].count("web-refused") == 1  # one a minute
    assert any(e["event"] == "web-operation" and e["user"] == "alice" for e in journal)


def test_slurm_away_keeps_the_last_state_says_so_and_comes_back(page):
    page.slurm.down = True
    page.watcher.refresh()
    data = page.get("/api/cluster").get_json()
    assert data["sources"]["slurm"]["ok"] is False and "Unable to contact" in data["sources"]["slurm"]["error"]
    assert [n["name"] for n in data["nodes"]] == ["n1", "n2"] and data["counts"]["pending"] == 1  # last known
    page.slurm.down = False
    page.watcher.refresh()
    assert page.get("/api/cluster").get_json()["sources"]["slurm"]["ok"] is True


def test_ten_browsers_at_once_after_an_idle_while_cost_one_refresh_and_see_its_answer(page):
    import threading
    page.slurm.asked.clear()
    page.watcher.view.data["refreshed"] -= 60  # nobody looked for a minute: the next look waits for a new view
    page.watcher.start()
    answers = []

    def browse():
        answers.append(page.application.test_client().get("/api/cluster").get_json()["refreshed"])
    browsers = [threading.Thread(target=browse) for _ in range(10)]
    try:
        for browser in browsers:
            browser.start()
        for browser in browsers:
            browser.join(30)
    finally:
        page.watcher.stop()
    assert len(answers) == 10 and len(set(answers)) == 1 and answers[0] == page.watcher.view.data["refreshed"]
    assert page.slurm.asked.count("nodes") == 1 and page.slurm.asked.count("events") == 1, page.slurm.asked
    assert page.slurm.asked.count("queue") == 1, page.slurm.asked


def test_with_a_prometheus_the_usage_panels_are_its_figures_and_its_silence_is_said(tmp_path):
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\nprometheus_url = "http://127.0.0.1:9/"\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "repair.db"}"\n')
    answers = {"gpu_utilization": "12.5", "memory_used_mib": "10", "memory_free_mib": "30", "rx_bps": "100",
               "tx_bps": "200", "gpus": "4", "memory_reserved_mib": "NaN"}  # agents before FB_RESERVED
    by_query = {query: answers[key] for key, query in usage.PROMETHEUS_QUERIES.items()}
    down = []

    def get(url, timeout):
        from urllib.parse import parse_qs, urlsplit
        if down:
            return None, "Connection refused"
        query = parse_qs(urlsplit(url).query).get("query", [""])[0]
        if query in by_query:
            return json.dumps({"status": "success", "data": {"result": [{"value": [1, by_query[query]]}]}}), ""
        return "", ""
    store = open_sqlite(str(tmp_path / "repair.db"))
    watcher = Watcher(config.load(path), _Slurm(), store, get, _Agents(_sent(1.0)))
    data = watcher.refresh().data
    assert data["usage"]["source"] == "prometheus" and data["sources"]["prometheus"]["ok"]
    assert data["usage"]["now"] == {"gpus": 4, "gpu_utilization": 12.5, "memory_used_mib": 10.0,
                                    "memory_total_mib": 40.0, "rx_bps": 100.0, "tx_bps": 200.0}
    down.append(True)
    data = watcher.refresh().data
    assert not data["sources"]["prometheus"]["ok"] and "does not answer" in data["sources"]["prometheus"]["error"]
    assert data["usage"]["now"]["gpu_utilization"] == 12.5  # its last answer, said to be old
    store.close()


# -- the security review's attacks (issue 28), on a real server ------------------------------------------------------

@dataclass
class _Standalone:
    """`slurm-ext web` running in a process of its own, on 127.0.0.1:`port`; its log (standard error) in `log`."""

    port: int
    process: subprocess.Popen
    log: Path

    def ask(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None,
            source: str = "127.0.0.1") -> tuple[int, str]:
        """(status, the answer's text) of one request, as a client at `source` sends it."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(source, 0))
        try:
            connection.request(method, path, body=body, headers=headers or {})
            answer = connection.getresponse()
            return answer.status, answer.read().decode(errors="replace")
        finally:
            connection.close()

    def csrf(self) -> str:
        return json.loads(self.ask("GET", "/api/session")[1])["csrf"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def _standalone(tmp_path: Path, web: str = 'token_file = ""', env: dict | None = None):
    """The page as `slurm-ext web` runs it (waitress, its limits, its watcher), with `web` as its [web] section;
    stopped by its PID at the end."""
    port = _free_port()
    conf = tmp_path / "standalone.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\n{web}\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "repair.db"}"\n')
    log = tmp_path / "web.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "--listen",
                                    f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})})
    page = _Standalone(port, process, log)
    try:
        wait_for("the standalone page answers", lambda: process.poll() is not None or _answers(page), 30,
                 interval=0.1)
        assert process.poll() is None, f"the page ended: {log.read_text()}"
        yield page
    finally:
        process.terminate()
        process.wait(30)


def _answers(page: _Standalone) -> bool:
    try:
        return page.ask("GET", "/api/session")[0] == 200
    except OSError:
        return False


def _spooled(pid: int, spool: Path) -> int:
    """Bytes of the files process `pid` holds open in `spool` (waitress's request bodies: unnamed files there)."""
    total = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(str(spool)):
                total += os.stat(fd).st_size
        except OSError:
            continue  # closed meanwhile
    return total


def test_a_body_or_headers_larger_than_the_page_takes_are_refused_before_they_are_read(tmp_path):
    """Item 6: waitress spooled any body up to 1 GiB to a temporary file, for anyone, before the app refused it."""
    spool = tmp_path / "spool"
    spool.mkdir()
    with _standalone(tmp_path, env={"TMPDIR": str(spool)}) as page:
        size, chunk, sent, spooled = 50 * 2**20, b"x" * 2**20, 0, 0
        attacker = socket.create_connection(("127.0.0.1", page.port), timeout=30)
        try:
            attacker.sendall(f"POST /api/nodes/n1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                             f"\r\nContent-Length: {size}\r\n\r\n".encode())
            try:
                while sent < size:  # no login, no CSRF token: only the body
                    attacker.sendall(chunk)
                    sent += len(chunk)
                    spooled = max(spooled, _spooled(page.process.pid, spool))
            except OSError:
                pass  # the server closed the connection: refused
            try:
                answer = attacker.recv(4096)
            except OSError:
                answer = b""  # reset with our unread body in its buffer: the refusal itself is lost
        finally:
            attacker.close()
        assert spooled == 0 and sent < size, (spooled, sent)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:200]
        try:
            status, said = page.ask("GET", "/api/session", {"X-Padding": "p" * 100_000})
        except ConnectionResetError:
            status, said = 0, "reset"  # closed with the rest of the headers unread: refused, the answer lost
        assert status in (431, 0), (status, said[:200])
        # what the page does take still reaches it: a body of its largest (refused for its missing CSRF token)
        status, said = page.ask("POST", "/api/nodes/n1/check", {"Content-Type": "application/json"},
                                b"{" + b" " * (16 * 1024 - 2) + b"}")
        assert status == 403 and "CSRF" in said, (status, said)
        assert page.process.poll() is None


_DISCLOSED = ("tokens", "65534", "0644", "line(s)", "ignored", "readable")


def test_an_anonymous_caller_learns_nothing_of_the_token_file_and_the_log_says_it_all(tmp_path):
    """Item 11: /api/session and every 401 named the token file, its owner, mode and ignored lines."""
    path = _token_file(tmp_path, f"alice {_hashed(TOKEN)}\nbob short\n", mode=0o644, owner=65534)
    with _standalone(tmp_path, f'token_file = "{path}"') as page:
        csrf = page.csrf()
        wrong = {"X-CSRF-Token": csrf, "Authorization": "Bearer " + "z" * 24}
        answers = [page.ask("GET", "/api/session"),
                   page.ask("POST", "/api/nodes/n1/check", {"X-CSRF-Token": csrf}),
                   page.ask("POST", "/api/nodes/n1/check", wrong),
                   page.ask("POST", "/api/nodes/n1/check", {**wrong, "Authorization": f"Bearer {TOKEN}"})]
        assert [status for status, _ in answers] == [200, 401, 401, 401], answers
        assert "cannot be used" in json.loads(answers[0][1])["problem"]
        for _, said in answers:
            assert not any(word in said for word in (*_DISCLOSED[1:], str(tmp_path))), said
        wait_for("the log says why", lambda: f"{path}: owned by uid 65534 with mode 0644" in page.log.read_text())

        os.chown(path, 0, 0)
        os.chmod(path, 0o600)  # usable now, with one line it ignores: said in the log only
        for _ in range(2):
            status, said = page.ask("POST", "/api/nodes/n1/check", wrong)
            assert status == 401 and not any(word in said for word in (*_DISCLOSED, str(tmp_path))), said
        assert json.loads(page.ask("GET", "/api/session")[1])["problem"] == ""
        wait_for("the ignored line in the log", lambda: f"{path}: line(s) 2 ignored" in page.log.read_text())


def test_with_the_proxy_secret_a_trusted_address_without_it_is_not_believed(tmp_path):
    """Item 12: any local user of a trusted proxy's address (127.0.0.1 here) could name any user."""
    secret = hashlib.sha256(b"the proxy's secret").hexdigest()
    secret_file = tmp_path / "proxy-secret"
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    with _standalone(tmp_path, f'token_file = ""\nproxy_user_header = "X-Forwarded-User"\ntrusted_proxies = '
                               f'["127.0.0.1"]\nproxy_secret_file = "{secret_file}"') as page:
        csrf = page.csrf()
        forged = {"X-Forwarded-User": "root", "X-CSRF-Token": csrf}
        for headers in (forged, {**forged, "X-Slurm-Ext-Proxy-Secret": "0" * 64},
                        {**forged, "X-Slurm-Ext-Proxy-Secret": ""}):
            status, said = page.ask("POST", "/api/nodes/n1/check", headers)
            assert status == 403 and "not believed" in said, (status, said)
            session = json.loads(page.ask("GET", "/api/session", headers)[1])
            assert session["user"] is None and "not believed" in session["problem"], session
        proxied = {"X-Forwarded-User": "bob", "X-Slurm-Ext-Proxy-Secret": secret}
        session = json.loads(page.ask("GET", "/api/session", proxied)[1])
        assert (session["user"], session["via"]) == ("bob", "proxy"), session
        status, said = page.ask("POST", "/api/nodes/n1/check", {**proxied, "X-CSRF-Token": csrf}, source="127.0.0.2")
        assert status == 403 and "not in web.trusted_proxies" in said  # the secret does not replace the address

        os.chmod(secret_file, 0o644)  # a secret others can read is no secret: no proxy user is believed
        session = json.loads(page.ask("GET", "/api/session", proxied)[1])
        assert session["user"] is None and str(secret_file) not in json.dumps(session), session
        wait_for("the log says why", lambda: f"web.proxy_secret_file {secret_file}: owned by uid 0 with mode 0644"
                 in page.log.read_text())


def _config_env(tmp_path: Path) -> dict:
    """The environment of a CLI run with a config of its own (no token file of the host's)."""
    path = tmp_path / "cli.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\nuser = "root"\n')  # root's alone: 0600
    return {"SLURM_EXT_CONFIG": str(path)}


def test_add_token_keeps_only_the_hash_and_the_token_it_prints_is_an_operators(tmp_path):
    """Item 10: the token file held every operator's token in plain text."""
    path = tmp_path / "etc" / "web-tokens"
    added = cli("web", "add-token", "alice", "--file", str(path), env=_config_env(tmp_path))
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    kept = path.read_text()
    assert token not in kept and kept.startswith(f"alice {_hashed(token)} # added "), kept  # and when
    assert (os.stat(path).st_mode & 0o777, os.stat(path).st_uid) == (0o600, 0)
    assert Tokens(str(path)).user_of(token) == "alice" and Tokens(str(path)).user_of(_hashed(token)) is None
    link = tmp_path / "etc" / "link"
    link.symlink_to(path)
    refused = cli("web", "add-token", "bob", "--file", str(link), env=_config_env(tmp_path))
    assert refused.returncode == 1 and "symbolic link" in refused.stderr and path.read_text() == kept


def test_a_plain_token_is_not_used_until_hash_tokens_hashes_it_in_place(tmp_path):
    """Item 10, the migration: a file of plain `USER TOKEN` lines is refused, naming the file and the command that
    hashes it; after it, the same tokens work and the file holds none of them."""
    path = _token_file(tmp_path, f"# operators\nalice {TOKEN}  # since 2026\nbob {_hashed('b' * 24)}\n")
    tokens = Tokens(path)
    assert tokens.user_of(TOKEN) is None and tokens.user_of("b" * 24) == "bob"
    assert f"{path}: line(s) 2 hold a token in plain text" in tokens.problem
    assert "slurm-ext web hash-tokens" in tokens.problem
    done = cli("web", "hash-tokens", "--file", path, env=_config_env(tmp_path))
    assert done.returncode == 0 and "1 token(s) in plain text replaced" in done.stderr, done.stderr
    assert Path(path).read_text() == (f"# operators\nalice {_hashed(TOKEN)} # since 2026\n"
                                      f"bob {_hashed('b' * 24)}\n")
    assert tokens.user_of(TOKEN) == "alice" and tokens.user_of("b" * 24) == "bob" and tokens.problem == ""
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_token_file_that_is_a_link_is_refused_even_to_a_file_of_roots(tmp_path):
    """Item 10: the token file was read through a link (stat, then open: each following it)."""
    real = _token_file(tmp_path, f"alice {_hashed(TOKEN)}\n")
    link = tmp_path / "web-tokens"
    link.symlink_to(real)
    tokens = Tokens(str(link))
    assert tokens.user_of(TOKEN) is None and f"{link}: is a symbolic link" in tokens.problem
    assert Tokens(real).user_of(TOKEN) == "alice"


def test_the_copied_ssh_command_quotes_a_node_address_slurm_reports(tmp_path):
    """Item 16: an address such as `127.0.0.1; touch FILE` ran its second command in the operator's shell."""
    planted = tmp_path / "planted"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"  # the operator's ssh, as far as the shell can tell: it writes down what it was given
    ssh.write_text(f'#!/bin/sh\nfor word in "$@"; do printf "%s\\n" "$word"; done > {tmp_path / "argv"}\n')
    os.chmod(ssh, 0o755)
    address = f"127.0.0.1; touch {planted}"

    class Slurm(_Slurm):
        def nodes(self):
            return [Node("n1", "IDLE", addr=address), Node("n2", "IDLE", addr="")]
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\nssh_command = "ssh -l root {{addr}}"\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "r.db"}"\n')
    store = open_sqlite(str(tmp_path / "r.db"))
    watcher = Watcher(config.load(path), Slurm(), store, lambda url, timeout: (None, "refused"), _Agents(_sent(1.0)))
    watcher.refresh()
    rows = create_app(config.load(path), watcher).test_client().get("/api/cluster").get_json()["nodes"]
    store.close()
    copied = {row["name"]: row["ssh"] for row in rows}
    assert copied["n2"] == "ssh -l root n2"  # a plain name needs no quotes
    pasted = subprocess.run(["bash", "-c", copied["n1"]], env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=30)
    assert pasted.returncode == 0, pasted.stderr
    assert (tmp_path / "argv").read_text().splitlines() == ["-l", "root", address]
    assert not planted.exists()


# -- the journal cache under load (issue 28, item 8) -----------------------------------------------------------------

#: nodes and journal events each: 200,000 events in the history
_MANY_NODES, _EVENTS_EACH = 200, 1000
#: clients looping over the timeline at once (the page's server has 8 threads)
_LOOPING = 8


class _ManySlurm(_Slurm):
    def nodes(self):
        return [Node(f"n{i}", "IDLE", addr="127.0.0.1") for i in range(_MANY_NODES)]

    def node_events(self, node, since):
        return []


def test_a_refresh_takes_every_agent_in_while_clients_loop_over_a_large_history(tmp_path):
    """The watcher held its lock while it merged every node's journal for each /api/timeline: eight clients asking
    for one node's timeline kept the agents' answers of a refresh out of it. The journals are now the collector's,
    in the repair database: the clients' queries and the refresh share its connection, never the agents'."""
    from waitress.server import create_server
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\nrefresh = "3600s"\nagent_timeout = "5s"\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "r.db"}"\n')
    loaded = config.load(path)
    store, collector = open_sqlite(str(tmp_path / "r.db")), open_sqlite(str(tmp_path / "r.db"))
    first = time.time() - _EVENTS_EACH - 60
    for i in range(_MANY_NODES):
        stored_journal(collector, f"n{i}", journal_lines(0, _EVENTS_EACH, first))
    agents = StandInAgents([f"n{i}" for i in range(_MANY_NODES)], _sent(1.0))
    watcher = Watcher(loaded, _ManySlurm(), store, lambda url, timeout: (None, "refused"), agents)
    watcher.refresh()
    server = create_server(create_app(loaded, watcher), host="127.0.0.1", port=0, threads=8)
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    stop, answers, failures = threading.Event(), [], []

    def loop():
        while not stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=120)
            try:
                connection.request("GET", "/api/timeline?node=n7&limit=5000")
                answer = connection.getresponse()
                answer.read()
                answers.append(answer.status)
            except OSError as err:
                failures.append(repr(err))
            finally:
                connection.close()
    clients = [threading.Thread(target=loop) for _ in range(_LOOPING)]
    try:
        try:
            for client in clients:
                client.start()
            wait_for("every client answered once", lambda: len(answers) >= _LOOPING, 120, interval=0.05)
            for i in range(_MANY_NODES):  # one new event on every node
                stored_journal(collector, f"n{i}", journal_lines(_EVENTS_EACH, 1, first + _EVENTS_EACH))
            begun = time.monotonic()
            view = watcher.refresh()
            took = time.monotonic() - begun
        finally:
            stop.set()
            for client in clients:
                client.join(120)
        late = [n["name"] for n in view.data["nodes"] if n["agent"]["answered"] != view.data["refreshed"]]
        assert not late, f"{len(late)} of {_MANY_NODES} nodes' answers not taken in by the refresh ({took:.1f}s)"
        assert set(answers) == {200} and not failures, (set(answers), failures[:3])
        connection = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=120)
        connection.request("GET", "/api/timeline?node=n7&source=agent&limit=1")
        newest = json.loads(connection.getresponse().read())["entries"]
        connection.close()
        assert [e["message"] for e in newest] == [f"event {_EVENTS_EACH}"], newest
    finally:
        server.close()
        store.close()
        collector.close()
    print(f"a refresh of {_MANY_NODES} nodes while {_LOOPING} clients looped over /api/timeline?node=n7&limit=5000 "
          f"({_MANY_NODES * _EVENTS_EACH} events stored): {took:.2f}s; {len(answers)} answers")


def test_the_timeline_keeps_the_severity_of_an_entry_moved_after_the_repair_step_that_caused_it(tmp_path):
    """An agent's whole-second event after a reboot of its second is moved just after that step, as a copy: its
    severity goes with it (it was looked up by the original's id, a 500 of the timeline)."""
    second = float(int(time.time()) - 60)
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[repair]\nagents = {{ n1 = "127.0.0.1:1", n2 = "127.0.0.1:2" }}\n')
    loaded = config.load(path)
    store = open_sqlite(str(tmp_path / "repair.db"))
    with store.locked():
        record = store.add(Record("n2", "xid/79", "reboot", "79 gpu 1", opened=second, updated=second))
        store.event("n2", "repair-rebooting", "scontrol reboot n2", "alice", record, now=second + 0.5, acts="reboot")
    journal = json.dumps({"time": datetime.fromtimestamp(second, timezone.utc).isoformat(), "component": "supervisor",
                          "event": "agent-started", "severity": "warning", "message": "the agent started"})
    stored_journal(store, "n2", journal)
    watcher = Watcher(loaded, _Slurm(), store, lambda url, timeout: (None, "refused"), _Agents(_sent(100.0)))
    client = create_app(loaded, watcher).test_client()
    watcher.refresh()
    answer = client.get("/api/timeline?node=n2")
    assert answer.status_code == 200, answer.data
    entries = answer.get_json()["entries"]
    moved = next(e for e in entries if e["event"] == "supervisor/agent-started")
    assert moved["severity"] == "warning" and moved["time"] > second + 0.5
    store.close()

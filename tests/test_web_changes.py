"""The page's updates as changes (web/changes.py, issue 33): each node row kept without its GPUs' readings, with the
version at which it last changed, and each node's figures (changes.FIGURES) apart with theirs; what changed since a
browser's version (rows, figures, nodes removed, usage history points), the whole view for a version this server
did not give or no longer holds; /api/cluster (a script's whole view) and /api/cluster?since= (the page's) over a
real refresh (Slurm and the agents stood in by literal answers, as in test_web.py), and the page's merge, its canvas
grids and its Nodes list of /api/nodes pages in headless Chromium (as in test_web_page_defects.py)."""

from __future__ import annotations

from types import SimpleNamespace

import gzip
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from slurm_ext import config
from slurm_ext.agentapi import HealthAnswer
from slurm_ext.repair.store import open_sqlite
from slurm_ext.slurm import Node
from slurm_ext.web.app import create_app
from slurm_ext.web.changes import FIGURES, KEPT, Changes, figures_of
from slurm_ext.web.watch import Watcher

import test_web_page_defects as defects
from helpers.page import LiteralSlurm, StandInAgents
from test_web_page_defects import cell, until

#: the page's defects' Chromium fixture, one per module
browser = defects.browser


@dataclass
class _View:
    """What Changes takes of a PageView: its data."""

    data: dict = field(default_factory=dict)


def _view(rows: list[dict], history: list | None = None, refreshed: float = 1.0) -> _View:
    return _View({"refreshed": refreshed, "counts": {"healthy": len(rows)},
                  "usage": {"now": None, "history": history or []}, "nodes": rows})


def _row(name: str, state: str = "healthy", answered: float = 1.0, **more) -> dict:
    """A node row as the watcher makes it: its GPU readings, and its figures made of them."""
    row = {"name": name, "state": state, "gpu_readings": [{"index": 0, "utilization": 5}],
           "agent": {"answered": answered, "error": "", "readings_time": answered, "journal": ""}, **more}
    return {**row, "figures": _figures(row["gpu_readings"])}


def _figures(readings: list[dict]) -> list:
    """watch.py's figures of a node's GPU readings."""
    keys = ("utilization", "memory_used_mib", "memory_total_mib", "temperature")
    return figures_of([SimpleNamespace(**{k: g.get(k) for k in keys}) for g in readings],
                      sum(1 for g in readings if g.get("idle")))


def _names(delta) -> list[str]:
    return [json.loads(row)["name"] for row in delta.rows]


# -- changes.py --------------------------------------------------------------------------------------------------------

def test_a_row_changed_unchanged_removed_and_added_since_a_version():
    changes = Changes()
    first = changes.take(_view([_row("a"), _row("b"), _row("c")]))
    assert changes.since(None) is None and changes.since(first).rows == ()  # nothing changed since the view itself
    second = changes.take(_view([_row("a", "unhealthy"), _row("b"), _row("d")]))
    delta = changes.since(first)
    assert delta.version == second and _names(delta) == ["a", "d"] and delta.removed == ("c",)
    assert json.loads(delta.rows[0])["state"] == "unhealthy"
    third = changes.take(_view([_row("a", "unhealthy"), _row("b", "paused"), _row("c"), _row("d")]))
    delta = changes.since(first)  # c gone and back: a row again, not removed
    assert delta.version == third and _names(delta) == ["a", "b", "c", "d"] and delta.removed == ()
    assert _names(changes.since(second)) == ["b", "c"] and changes.since(second).removed == ()
    assert changes.take(changes._snapshot.view) == third  # the same view again: nothing taken


def test_an_agents_answer_alone_is_no_change_and_the_row_keeps_it_as_of_its_last_change():
    """agent.answered and agent.readings_time move at every answer: were they a change, every answering node's row
    would be in every delta."""
    changes = Changes()
    first = changes.take(_view([_row("a", answered=1.0), _row("b", answered=1.0)]))
    changes.take(_view([_row("a", answered=6.0), _row("b", answered=6.0, reason="admin: fan")], refreshed=6.0))
    delta = changes.since(first)
    assert _names(delta) == ["b"] and json.loads(delta.rows[0])["agent"]["answered"] == 6.0
    full = json.loads(changes.body())
    assert [n["agent"]["answered"] for n in full["nodes"]] == [1.0, 6.0]
    error = _row("a", answered=6.0)
    error["agent"]["error"] = "agent at 127.0.0.1:1: refused"  # its error is a change: answered stands still after it
    changes.take(_view([error, _row("b", answered=11.0, reason="admin: fan")], refreshed=11.0))
    assert _names(changes.since(first)) == ["a", "b"]


def test_an_unknown_or_old_version_gets_the_whole_view():
    changes = Changes(kept=3)
    versions = [changes.take(_view([_row("a", reason=str(i))], refreshed=i)) for i in range(5)]
    epoch = changes.epoch
    assert versions[-1] == f"{epoch}.5"
    for unknown in (versions[0], versions[1], f"{epoch}.6", f"{epoch}.0", "0000.5" if epoch != "0000" else "0001.5",
                    "junk", "", None):
        assert changes.since(unknown) is None, unknown
        assert json.loads(changes.body(unknown))["full"] is True
    assert [changes.since(v) is not None for v in versions[2:]] == [True, True, True]  # the last 3 views' changes
    assert Changes().since(None) is None and KEPT == 12  # a minute of 5 s refreshes: each version asked a delta
    asked = Changes(kept=3)
    versions = [asked.take(_view([_row("a", reason=str(i))], refreshed=i)) for i in range(5)]
    for version in versions:  # a client that asks with every version it was given: at most kept deltas are made
        asked.body(version)
        asked.body(version, zipped=True)
    assert len(asked._snapshot.bodies) <= 2 * (3 + 1)
    with pytest.raises(LookupError):
        Changes().body()


def test_the_usage_history_points_newer_than_the_version():
    changes = Changes()
    none_yet = changes.take(_view([_row("a")], history=[]))
    first = changes.take(_view([_row("a")], history=[[1.0, 5], [2.0, 6]], refreshed=2.0))
    second = changes.take(_view([_row("a")], history=[[1.0, 5], [2.0, 6], [3.0, 7]], refreshed=3.0))
    assert changes.since(first).history == [[3.0, 7]] and changes.since(second).history == []
    assert changes.since(none_yet).history == [[1.0, 5], [2.0, 6], [3.0, 7]]
    # full: the points kept; a delta: the new points in the usage, the rest of the usage as it is
    assert json.loads(changes.body())["usage"]["history"] == [[1.0, 5], [2.0, 6], [3.0, 7]]
    delta = json.loads(changes.body(first))
    assert delta["usage"] == {"now": None, "history": [[3.0, 7]]} and delta["full"] is False
    # the server keeps 720 points: the oldest go, the newest still come
    changes.take(_view([_row("a")], history=[[2.0, 6], [3.0, 7], [4.0, 8]], refreshed=4.0))
    assert changes.since(first).history == [[3.0, 7], [4.0, 8]]


def test_the_bodies_are_json_made_once_and_shared():
    changes = Changes()
    first = changes.take(_view([_row("a", gpu_readings=[], temperature=float("nan"))]))
    full = changes.body()
    assert changes.body() is full and changes.body("junk") is full  # one body per view, for every browser
    data = json.loads(full)
    assert data["version"] == first and data["full"] is True and "gpu_readings" not in data["nodes"][0]
    assert data["figures"] == {"a": [None, None, None, None, 0]}  # no NaN: a browser refuses a whole answer for one
    assert data["counts"] == {"healthy": 1} and data["refreshed"] == 1.0
    changes.take(_view([_row("a"), _row("b")], refreshed=2.0))
    delta = changes.body(first)
    assert changes.body(first) is delta  # many browsers ask with the same version: one delta for them
    # a's GPU reads now (its figures moved) and its odd temperature is gone (its row moved); b is new
    assert json.loads(delta)["removed"] == [] and [n["name"] for n in json.loads(delta)["nodes"]] == ["a", "b"]
    assert json.loads(delta)["figures"] == {"a": [5, None, None, None, 0], "b": [5, None, None, None, 0]}
    empty = Changes()
    empty.take(_View({"nodes": []}))
    assert json.loads(empty.body())["nodes"] == []


def test_a_nodes_figures_go_apart_from_its_row():
    """A node whose GPUs' figures change is in the delta's "figures", not in its "nodes"; a row that changes but its
    figures is in "nodes" alone; a node gone is in "removed" and in neither."""
    changes = Changes()
    gpus = lambda utilization, used: [{"index": i, "utilization": utilization, "memory_used_mib": used,  # noqa: E731
                                       "memory_total_mib": 100.0, "temperature": 40 + i, "idle": i == 1}
                                      for i in range(2)]
    first = changes.take(_view([_row("a", gpu_readings=gpus(10, 5.0)), _row("b", gpu_readings=gpus(10, 5.0)),
                                _row("c")]))
    assert FIGURES == ("utilization", "memory_used_mib", "memory_total_mib", "temperature", "idle")
    assert json.loads(changes.body())["figures"] == {"a": [10, 10, 200, 41, 1], "b": [10, 10, 200, 41, 1],
                                                     "c": [5, None, None, None, 0]}
    changes.take(_view([_row("a", gpu_readings=gpus(60, 7.5)), _row("b", reason="admin: fan",
                                                                     gpu_readings=gpus(10, 5.0))]))
    delta = changes.since(first)
    assert _names(delta) == ["b"] and delta.figures == {"a": [60, 15, 200, 41, 1]} and delta.removed == ("c",)
    body = json.loads(changes.body(first))
    assert [n["name"] for n in body["nodes"]] == ["b"] and body["figures"] == {"a": [60, 15, 200, 41, 1]}
    assert all("gpu_readings" not in n for n in body["nodes"])


def _ten_thousand(tmp_path: Path, moved: int) -> tuple[bytes, dict]:
    """/api/cluster?since= at 10,000 nodes of 8 GPUs (rows as a refresh makes them), after a refresh where every
    agent answered again and every `moved`th node's GPUs' figures moved, no row else changed: (the delta's bytes as
    a browser that takes gzip gets them, the delta)."""
    row = _real_row(tmp_path)
    text = json.dumps(row)
    rows = [json.loads(text.replace('"big0"', f'"big{i}"')) for i in range(10000)]
    history = [[float(t), 50.0, 1.0, 2.0, 3.0, 4.0, 5.0] for t in range(720)]
    later = []
    for i, found in enumerate(rows):
        found = {**found, "agent": {**found["agent"], "answered": 6.0}}  # every agent answered again
        if i % moved == 0:  # a busy node's GPUs: utilization, memory and temperature, each GPU its own
            found = {**found, "gpu_readings": [{**g, "utilization": (i + k) % 100, "temperature": 30 + (i * 7 + k) % 60,
                                                "memory_used_mib": 1000.0 * ((i + 3 * k) % 140) + 17}
                                               for k, g in enumerate(found["gpu_readings"])]}
            found["figures"] = _figures(found["gpu_readings"])
        later.append(found)
    views = [_View({"refreshed": 1.0, "usage": {"history": history}, "nodes": rows}),
             _View({"refreshed": 6.0, "usage": {"history": history[1:] + [[720.0, 1, 1, 1, 1, 1, 1]]},
                    "nodes": later})]

    class Stand:
        """The watcher as the route reads it: its view now (no changes of its own: the app takes each view)."""

        def current(self):
            return views[0]
    watcher = Stand()
    client = create_app(config.load(_config(tmp_path)), watcher).test_client()
    version = client.get("/api/cluster?since=").get_json()["version"]
    views.pop(0)
    answer = client.get(f"/api/cluster?since={version}", headers={"Accept-Encoding": "gzip"})
    data = answer.get_data()
    return data, json.loads(gzip.decompress(data) if answer.headers.get("Content-Encoding") == "gzip" else data)


def test_at_10000_nodes_a_delta_where_a_third_of_the_nodes_figures_moved_is_under_200_kib(tmp_path):
    """Issue 33: the page's update under 200 KiB per client at 10,000 nodes. At 10,000 nodes whose answers the
    collector takes every 15 s, a third of them move every 5 s refresh: their figures go, their rows do not."""
    sent, delta = _ten_thousand(tmp_path, 3)
    assert delta["full"] is False and delta["nodes"] == [] and len(delta["figures"]) == 3334
    assert len(delta["usage"]["history"]) == 1
    assert len(sent) < 200 * 1024, len(sent)


def test_at_10000_nodes_a_delta_where_every_nodes_figures_moved_is_under_200_kib(tmp_path):
    """Issue 33's bound where every node is busy and every agent answered within the refresh: no row changed, every
    node's figures did."""
    sent, delta = _ten_thousand(tmp_path, 1)
    assert delta["full"] is False and delta["nodes"] == [] and len(delta["figures"]) == 10000
    assert len(sent) < 200 * 1024, len(sent)


def _real_row(tmp_path: Path) -> dict:
    """One node row as a refresh makes it: 8 GPUs, its agent's checks."""
    gpus = [{"gpu": {"index": i, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "name": "NVIDIA H200"},
             "utilization": 40 + i, "fb_used_mib": 1000.0 * i, "fb_free_mib": 140000.0 - 1000 * i,
             "temperature": 40 + i, "jobs": []} for i in range(8)]
    checks = {c: "ok" for c in ("gpu-lost", "xid", "ecc", "thermal", "nvlink", "pcie", "mounts", "slurmd", "disk")}
    answer = {"boot": "b", "time": 1.0, "monitor": {"driver": "560.35.03", "gpus": gpus, "checks": checks}}
    slurm = _Slurm([Node("big0", "IDLE", gres="gpu:h200:8", addr="127.0.0.1")])
    store = open_sqlite(str(tmp_path / "repair.db"))
    watcher = Watcher(config.load(_config(tmp_path)), slurm, store, lambda url, timeout: (None, "refused"),
                      StandInAgents(["big0"], answer))
    [row] = watcher.refresh().data["nodes"]
    store.close()
    assert len(row["gpu_readings"]) == 8 and len(row["checks"]) == 9
    return row


# -- /api/cluster?since= -----------------------------------------------------------------------------------------------

_Slurm = LiteralSlurm


def _config(tmp_path: Path, web: str = 'token_file = ""') -> Path:
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\n{web}\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "repair.db"}"\n')
    return path


def _agents(names) -> StandInAgents:
    return StandInAgents(names, {"boot": "b", "time": 1.0, "monitor": {"driver": "560.35.03", "gpus": [
        {"gpu": {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"}, "utilization": 40, "fb_used_mib": 10.0,
         "fb_free_mib": 90.0, "temperature": 40, "jobs": []}]}})


def _nodes(count: int) -> list[Node]:
    return [Node(f"n{i}", "IDLE", gres="gpu:h200:1", addr="127.0.0.1") for i in range(1, count + 1)]


@pytest.fixture
def page(tmp_path):
    store = open_sqlite(str(tmp_path / "repair.db"))
    slurm = _Slurm(_nodes(3))
    agents = _agents([f"n{i}" for i in range(1, 10)])
    watcher = Watcher(config.load(_config(tmp_path)), slurm, store, lambda url, timeout: (None, "refused"), agents)
    watcher.refresh()
    client = create_app(config.load(_config(tmp_path)), watcher).test_client()
    client.slurm, client.watcher = slurm, watcher
    yield client
    store.close()


def test_the_cluster_api_answers_the_whole_view_then_what_changed_since_the_version_given(page):
    script = page.get("/api/cluster").get_json()  # a script's: the view as the watcher made it, each GPU in its row
    assert [n["name"] for n in script["nodes"]] == ["n1", "n2", "n3"] and "version" not in script
    assert [len(n["gpu_readings"]) for n in script["nodes"]] == [1, 1, 1] and "figures" not in script
    whole = page.get("/api/cluster?since=").get_json()  # the page's first poll
    assert whole["full"] is True and [n["name"] for n in whole["nodes"]] == ["n1", "n2", "n3"]
    assert all("gpu_readings" not in n for n in whole["nodes"])
    assert whole["figures"] == dict.fromkeys(["n1", "n2", "n3"], [40, 10, 100, 40, 0])
    assert whole["counts"]["healthy"] == 3 and len(whole["usage"]["history"]) == 1
    version = whole["version"]
    same = page.get(f"/api/cluster?since={version}").get_json()
    assert (same["full"], same["version"], same["nodes"], same["figures"], same["removed"],
            same["usage"]["history"]) == (False, version, [], {}, [], [])
    assert same["counts"] == whole["counts"] and same["cluster"] == whole["cluster"]  # the rest as it is
    page.slurm.listed = [Node("n1", "IDLE", frozenset({"DRAIN"}), "admin: fan replacement", "root",
                              gres="gpu:h200:1", addr="127.0.0.1"), *_nodes(2)[1:], Node("n4", "IDLE", addr="")]
    page.watcher.refresh()
    delta = page.get(f"/api/cluster?since={version}").get_json()
    assert delta["full"] is False and delta["version"] != version
    assert [(n["name"], n["state"]) for n in delta["nodes"]] == [("n1", "paused"), ("n4", "healthy")]
    assert delta["figures"] == {"n4": [40, 10, 100, 40, 0]}  # n1's GPUs read as before: its figures did not move
    assert delta["removed"] == ["n3"] and len(delta["usage"]["history"]) == 1
    assert delta["counts"] == {"healthy": 2, "booting": 0, "unhealthy": 0, "pending": 0, "paused": 1}
    # a server started again (another epoch), or a version too old: the whole view
    for other in ("00000000.1", f"{version.split('.')[0]}.999"):
        assert page.get(f"/api/cluster?since={other}").get_json()["full"] is True
    assert "version" not in page.get("/api/cluster").get_json()  # without since: the script's whole view still
    answers = [page.get(f"/api/cluster?since={version}").get_data() for _ in range(2)]
    assert answers[0] == answers[1] and json.loads(answers[0])["nodes"][0]["name"] == "n1"


def test_the_since_a_route_takes_is_a_version_and_anything_else_a_400_naming_it(page):
    for junk in ("x", "1", "abc.def", "a" * 40 + ".1", "../1", ".1"):
        answer = page.get("/api/cluster", query_string={"since": junk})
        assert answer.status_code == 400 and answer.get_json()["error"].startswith("since="), (junk, answer.data)
        assert "expected a version /api/cluster gave" in answer.get_json()["error"]
    assert page.get("/api/cluster?since=a.1&since=a.2").status_code == 400
    assert page.get("/api/cluster?sinse=a.1").status_code == 400


def test_a_watcher_with_its_own_changes_is_the_one_the_route_answers_from(tmp_path):
    """Once the watcher's refresh thread takes each view (watch.py holds `changes`), the route takes nothing itself
    and every app over that watcher answers the same versions."""
    store = open_sqlite(str(tmp_path / "repair.db"))
    watcher = Watcher(config.load(_config(tmp_path)), _Slurm(_nodes(2)), store, lambda url, timeout: (None, "x"),
                      _agents(["n1", "n2"]))
    watcher.changes = Changes()
    version = watcher.changes.take(watcher.refresh())
    for _ in range(2):
        client = create_app(config.load(_config(tmp_path)), watcher).test_client()
        assert client.get("/api/cluster?since=").get_json()["version"] == version
    store.close()


# -- the page in Chromium ----------------------------------------------------------------------------------------------

@contextmanager
def _served(tmp_path: Path, count: int, web: str = 'token_file = ""\nrefresh = "1s"'):
    """The page on a free port of 127.0.0.1 over `count` stand-in nodes, its watcher's thread refreshing it every
    second while it is looked at: (its URL, the Slurm stand-in, the agents' stand-in, the paths /api/cluster and
    /api/nodes were asked with, in order)."""
    from flask import request
    from werkzeug.serving import make_server
    loaded = config.load(_config(tmp_path, web))
    store = open_sqlite(str(tmp_path / "repair.db"))
    slurm = _Slurm(_nodes(count))
    agents = _agents([f"n{i}" for i in range(1, count + 10)])
    watcher = Watcher(loaded, slurm, store, lambda url, timeout: (None, "refused"), agents)
    watcher.refresh()
    app = create_app(loaded, watcher)
    asked: list[str] = []

    @app.after_request
    def record(answer):
        if request.path in ("/api/cluster", "/api/nodes"):
            asked.append(request.full_path)
        return answer
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    watcher.start()
    try:
        yield f"http://127.0.0.1:{server.port}/", slurm, agents, asked
    finally:
        watcher.stop()
        server.shutdown()
        server.server_close()
        thread.join(10)
        store.close()


def _cells(browser, grid: str) -> dict[str, str]:
    return {c["name"]: c["state"] for c in browser.execute_script("return slurmExt.cells(arguments[0])", grid)}


def _listed(browser) -> list[str]:
    """The names of the Nodes list's rows, read at once (each poll draws the list again)."""
    return browser.execute_script("return [...document.querySelectorAll('#node-table tbody tr[data-node]')]"
                                  ".map((row) => row.dataset.node)")


def _text(browser, element_id: str) -> str:
    return browser.find_element(By.ID, element_id).text


def _row_said(browser, name: str) -> dict | None:
    """Node `name`'s row of the Nodes list, read at once (each poll draws the list again): its state and text."""
    return browser.execute_script(
        "const row = document.querySelector(`#node-table tr[data-node='${arguments[0]}']`);"
        "return row && {state: row.dataset.state, text: row.innerText}", name)


def _busy(name: str, utilization: int) -> HealthAnswer:
    """Node `name`'s agent's answer with its one GPU at `utilization` %, read later than _agents' answer."""
    return HealthAnswer.of({"node": name, "boot": "b", "time": 2.0, "monitor": {"driver": "560.35.03", "gpus": [
        {"gpu": {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"}, "utilization": utilization,
         "fb_used_mib": 50.0, "fb_free_mib": 50.0, "temperature": 41, "jobs": []}]}})


def test_the_page_merges_what_changed_into_the_rows_and_the_figures_it_holds(tmp_path, browser):
    with _served(tmp_path, 3) as (url, slurm, agents, asked):
        browser.get(url + "#overview")
        until(browser, "the state grid", lambda b: _cells(b, "state-grid") == dict.fromkeys(["n1", "n2", "n3"],
                                                                                           "healthy"))
        canvas = browser.find_element(By.CSS_SELECTOR, "#state-grid canvas")
        assert canvas.get_attribute("data-nodes") == "3" and canvas.get_attribute("data-drawn") == "3"
        assert not browser.find_elements(By.CSS_SELECTOR, "#state-grid .cell")  # no element per node
        assert browser.execute_script("return slurmExt.figures('n2')") == [40, 10, 100, 40, 0]
        slurm.listed = [Node("n1", "IDLE", frozenset({"DRAIN"}), "admin: fan replacement", "root",
                             gres="gpu:h200:1", addr="127.0.0.1"), *_nodes(2)[1:], *_nodes(4)[3:]]
        until(browser, "n1 paused, n3 gone, n4 come", lambda b: _cells(b, "state-grid") == {
            "n1": "paused", "n2": "healthy", "n4": "healthy"})
        assert canvas.get_attribute("data-nodes") == "3"
        assert cell(browser, "n1", "state-grid")["tip"] == "n1: paused - admin: fan replacement"
        assert browser.execute_script("return slurmExt.figures('n3')") is None  # gone: its figures with its row
        until(browser, "the counts", lambda b: b.find_element(By.CSS_SELECTOR, "#state-counts .paused .n").text == "1")
        polls = [path for path in asked if path.startswith("/api/cluster")]
        assert polls[0] == "/api/cluster?since=" and all(
            path.startswith("/api/cluster?since=") and len(path) > len(polls[0]) for path in polls[1:]), polls
        assert not any(path.startswith("/api/nodes") for path in asked)  # the Overview asks for no list
        # n2's GPU busier: its figures move, its row does not; the Nodes grid says it
        browser.get(url + "#nodes")
        browser.find_element(By.ID, "view-grid").click()
        agents.answers["n2"] = _busy("n2", 77)
        until(browser, "n2's figures", lambda b: b.execute_script("return slurmExt.figures('n2')") ==
              [77, 50, 100, 41, 0])
        until(browser, "n2's cell", lambda b: (cell(b, "n2") or {}).get("lines") == ["n2", "0/1 GPU 77%"])
        browser.find_element(By.ID, "view-list").click()
        until(browser, "the list of the nodes held", lambda b: _listed(b) == ["n1", "n2", "n4"])
        until(browser, "n2's row", lambda b: "77 %" in (_row_said(b, "n2") or {}).get("text", ""))
        assert _text(browser, "node-range") == "1-3 of 3" and _text(browser, "node-shown") == "3 of 3 nodes"
        # the list is asked again at each poll while it is shown: n4 drained shows without a click
        slurm.listed = [*slurm.listed[:2], Node("n4", "IDLE", frozenset({"DRAIN"}), "admin: cable", "root",
                                                gres="gpu:h200:1", addr="127.0.0.1")]
        until(browser, "n4 paused in the list", lambda b: (_row_said(b, "n4") or {}).get("state") == "paused")
        # sorted by the server: GPU utilization descending is n2 (77 %) first
        header = browser.find_element(By.CSS_SELECTOR, "#node-table th[data-sort=utilization]")
        header.click()
        header.click()
        until(browser, "n2 first", lambda b: _listed(b)[:1] == ["n2"])
        assert any("sort=utilization&desc=1" in path for path in asked), asked


def test_at_600_nodes_the_list_pages_100_rows_the_grids_draw_all_and_a_click_on_the_overview_shows_that_node(
        tmp_path, browser):
    with _served(tmp_path, 600) as (url, _, _, asked):
        browser.get(url + "#nodes")
        browser.execute_script("sessionStorage.setItem('slurm-ext-node-view', 'list')")
        browser.get(url + "#nodes")
        until(browser, "the first page", lambda b: _text(b, "node-range") == "1-100 of 600")
        listed = _listed(browser)
        assert listed == [f"n{i}" for i in range(1, 101)], listed  # by name as people read them: n2 before n10
        assert _text(browser, "node-shown") == "600 of 600 nodes"
        assert not browser.find_element(By.ID, "node-previous").is_enabled()
        browser.find_element(By.ID, "node-next").click()
        until(browser, "the second page", lambda b: _text(b, "node-range") == "101-200 of 600")
        assert _listed(browser) == [f"n{i}" for i in range(101, 201)]
        assert browser.find_element(By.ID, "node-previous").is_enabled()
        assert any("offset=100" in path and "limit=100" in path for path in asked)
        browser.find_element(By.ID, "node-name").send_keys("n59")  # the server's filter: n59, n590-n599
        until(browser, "11 rows", lambda b: _text(b, "node-range") == "1-11 of 11")
        assert _listed(browser) == ["n59", *(f"n{i}" for i in range(590, 600))]
        assert not browser.find_element(By.ID, "node-next").is_enabled()
        browser.find_element(By.ID, "node-name").clear()
        browser.find_element(By.ID, "node-name").send_keys("=n5")  # that node alone, not n50-n59, n500-n599
        until(browser, "n5 alone", lambda b: _listed(b) == ["n5"] and _text(b, "node-range") == "1-1 of 1")
        browser.find_element(By.ID, "node-name").clear()
        browser.find_element(By.ID, "node-name").send_keys("no such")  # no node has a space: the server says so
        until(browser, "the refusal", lambda b: "expected a node name" in _text(b, "node-range"))
        assert _listed(browser) == []
        browser.find_element(By.ID, "node-name").clear()
        browser.find_element(By.ID, "view-grid").click()
        grid = browser.find_element(By.CSS_SELECTOR, "#node-grid canvas")
        until(browser, "the grid", lambda b: grid.get_attribute("data-nodes") == "600")
        assert not browser.find_element(By.ID, "node-pages").is_displayed()
        drawn = int(grid.get_attribute("data-drawn"))
        assert 0 < drawn < 600  # taller than the window: the cells in view only
        assert cell(browser, "n600")["drawn"] is False and cell(browser, "n1")["lines"] == ["n1", "0/1 GPU 40%"]
        browser.find_element(By.ID, "node-name").send_keys("=n59")  # the grid's filter is the list's
        until(browser, "n59 alone in the grid", lambda b: _cells(b, "node-grid") == {"n59": "healthy"})
        browser.find_element(By.ID, "node-name").clear()
        browser.find_element(By.ID, "node-name").send_keys("N59")  # a part of the name, any case
        until(browser, "11 cells", lambda b: len(_cells(b, "node-grid")) == 11)
        assert _text(browser, "node-shown") == "11 of 600 nodes"
        browser.find_element(By.ID, "node-name").clear()
        browser.find_element(By.ID, "view-list").click()
        browser.get(url + "#overview")
        until(browser, "the state grid", lambda b: (cell(b, "n417", "state-grid") or {}).get("drawn"))
        found = cell(browser, "n417", "state-grid")
        canvas = browser.find_element(By.CSS_SELECTOR, "#state-grid canvas")
        box = browser.execute_script("return arguments[0].getBoundingClientRect().toJSON()", canvas)
        ActionChains(browser).move_to_element_with_offset(
            canvas, int(found["x"] - box["left"] - box["width"] / 2),
            int(found["y"] - box["top"] - box["height"] / 2)).perform()
        until(browser, "the tooltip", lambda b: b.find_element(By.ID, "grid-tip").text == "n417: healthy")
        ActionChains(browser).click().perform()
        until(browser, "the Nodes tab with n417 alone", lambda b: b.current_url.endswith("#nodes") and
              _listed(b) == ["n417"])
        assert _text(browser, "node-shown") == "1 of 600 nodes" and _text(browser, "node-range") == "1-1 of 1"

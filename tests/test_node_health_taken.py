"""What the collector takes of each node besides its journal (issue 33): its agent's /health, once an interval, so
that `status` and the page ask no agent at 10,000 nodes.

Real parts: the fleet simulator's agents (their credential check and signed answers) and the collector over HTTP
into SQLite; `status`'s with_agents and the page's watcher over that store, with an agent client that fails the
test if it is asked."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from helpers.page import LiteralSlurm
from helpers.wait import wait_for
from slurm_ext.agentapi import AcceptanceAnswer, AgentAnswerError, HealthAnswer
from slurm_ext.config import section_class
from slurm_ext.devcluster import fleet as simulator
from slurm_ext.repair import nodeevents
from slurm_ext.repair.collector import CONTROL
from slurm_ext.repair.status import Taken, node_statuses, taken_lately, with_agents
from slurm_ext.repair.store import open_sqlite
from slurm_ext.slurm import Node

from test_history_collector import _Fleet, _collector, _fleet_layout


class _NotAsked:
    """An agent client the code under test must not use."""

    def health(self, node, addr="", timeout=None):
        raise AssertionError(f"node {node}'s agent was asked for its /health")

    def acceptance(self, node, addr="", trigger="", timeout=None):
        raise AssertionError(f"node {node}'s agent was asked for its /acceptance")


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "repair.db"))
    yield opened
    opened.close()


def _history(interval: float) -> SimpleNamespace:
    return SimpleNamespace(history=section_class("history")(interval=interval))


def test_the_collector_takes_each_agents_health_once_an_interval_and_status_asks_no_agent(tmp_path, store):
    """Twenty simulated agents: the collector stores each one's /health as its agent signed it (what the page and
    status read of it, GPU by GPU); status then reads them and asks no agent. Once the agents stop answering, the
    answers grow old (not shown as now) and status says from the collector's record why each is unreachable."""
    layout = _fleet_layout(tmp_path, 20)
    names = [n.name for n in layout.defined_nodes[1:]]
    fleet = _Fleet(layout, rate=0.0)
    collector = _collector(layout, store, interval=0.5, retry_max=1.0)
    stop = threading.Event()
    runner = threading.Thread(target=collector.run, args=(stop,))
    runner.start()
    try:
        wait_for("every node's /health taken", lambda: set(nodeevents.health(store)) == set(names), 30)
        taken = nodeevents.health(store)
        answer = taken["node2"].answer
        assert answer.node == "node2" and answer.boot == "fleet" and len(answer.monitor.gpus) == 8
        read = answer.monitor.readings_time
        assert answer == HealthAnswer.of(simulator._health("node2", answer.time))  # as the agent said it
        assert read == answer.time - answer.time % simulator._READINGS_EVERY
        first = taken["node2"].taken
        wait_for("taken again an interval later", lambda: nodeevents.health(store)["node2"].taken > first, 10)

        nodes = [Node(name, "IDLE", gres="gpu:h200:8", addr="127.0.0.1") for name in names]
        statuses = node_statuses(nodes, [], [])
        lately = taken_lately(store, _history(0.5), time.time())
        assert set(lately.findings) == set(names) and not lately.unreachable
        told, unreachable = with_agents(statuses, nodes, _NotAsked(), taken=lately)
        assert not unreachable and all(s.state == "healthy" and not s.findings for s in told)

        fleet.kill()
        wait_for("the collector's record of the agents it cannot reach",
                 lambda: len(taken_lately(store, _history(0.5), time.time()).unreachable) == 20, 30)
        lately = taken_lately(store, _history(0.5), time.time())
        assert not lately.findings  # older than 3 intervals: not what the node says now
        _, unreachable = with_agents(statuses, nodes, _NotAsked(), taken=lately)
        assert set(unreachable) == set(names)
        assert "the collector cannot reach its agent since" in unreachable["node2"]
        assert "Connection refused" in unreachable["node2"]
    finally:
        stop.set()
        runner.join(30)
        fleet.stop()
    assert not runner.is_alive()


def test_without_a_collector_running_status_asks_the_agents_itself(tmp_path, store):
    """Answers a collector took long ago, and a collector whose last word is old, say nothing of now: every agent is
    asked, as before the collector."""
    layout = _fleet_layout(tmp_path, 2)
    old = time.time() - 3600
    _store_health(store, "node2", simulator._health("node2", old), old)
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 2}), "collector", old)
    lately = taken_lately(store, _history(15.0), time.time())
    assert lately == Taken()
    fleet = _Fleet(layout, rate=0.0)
    try:
        nodes = [Node(n.name, "IDLE", addr="127.0.0.1") for n in layout.defined_nodes[1:]]
        agents = _collector(layout, store).agents
        told, unreachable = with_agents(node_statuses(nodes, [], []), nodes, agents, taken=lately)
    finally:
        fleet.stop()
    assert not unreachable and len(told) == 2


def test_the_page_takes_the_collected_answers_and_asks_no_agent(tmp_path, store):
    """The page's refresh reads the answers the collector took (only those since its last read) and asks no agent
    while they are fresh; an answer that grew old has the node's own agent asked."""
    from slurm_ext import config
    from slurm_ext.web.watch import Watcher
    now = [time.time()]
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\n')


    class Agents(_NotAsked):
        asked: list = []
        runs: list = []

        def health(self, node, addr="", timeout=None):
            self.asked.append(node)
            return HealthAnswer.of(simulator._health(node, now[0]))

        def acceptance(self, node, addr="", trigger="", timeout=None):
            self.runs.append(node)  # at the page's start: a run older than its timeline is known only there
            return AcceptanceAnswer(node, "fleet", False, False, None)

    for name in ("n1", "n2"):
        _store_health(store, name, simulator._health(name, now[0]), now[0])
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 2}), "collector", now[0])
    agents = Agents()
    slurm = LiteralSlurm([Node(f"n{i}", "IDLE", gres="gpu:h200:8", addr="127.0.0.1") for i in (1, 2)])
    watcher = Watcher(config.load(path), slurm, store, lambda url, timeout: (None, "refused"), agents,
                      clock=lambda: now[0])
    rows = {row["name"]: row for row in watcher.refresh().data["nodes"]}
    assert agents.asked == [] and sorted(agents.runs) == ["n1", "n2"]
    expected = HealthAnswer.of(simulator._health("n1", now[0])).monitor.gpus
    assert [g["utilization"] for g in rows["n1"]["gpu_readings"]] == [g.utilization for g in expected]
    assert rows["n1"]["checks"]["xid"] == "ok" and rows["n1"]["agent"]["error"] == ""
    now[0] += 10  # the collector took n2 again, not n1; an answer of n1 taken earlier commits late (a second
    # collector, a clock stepped back): read all the same
    _store_health(store, "n2", simulator._health("n2", now[0]), now[0])
    _store_health(store, "n1", {**simulator._health("n1", now[0] - 8), "time": now[0] - 8}, now[0] - 8)
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 2}), "collector", now[0])
    rows = {row["name"]: row for row in watcher.refresh().data["nodes"]}
    assert agents.asked == [] and sorted(agents.runs) == ["n1", "n2"]  # each run asked once
    assert rows["n1"]["agent"]["answered"] == now[0] - 8
    nodeevents.failed(store, {"n2": "Connection refused"}, now[0])  # the collector failed to reach n2 since
    watcher.refresh()
    assert agents.asked == ["n2"]  # its answer, fresh as it is, is not what n2 says now
    agents.asked.clear()
    nodeevents.take(store, [nodeevents.Page("n2", nodeevents.cursors(store)["n2"].cursor, f"{'0' * 16}:999", "b")],
                    now=now[0])  # it answers the collector again
    now[0] += 40  # n1's answer is older than 3 intervals: its own agent is asked
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 2}), "collector", now[0])
    watcher.refresh()
    assert agents.asked == ["n1"]
    watcher.stop()


def test_a_refresh_makes_again_only_the_rows_whose_answer_or_slurm_node_changed(tmp_path, store):
    """At 10,000 nodes a refresh that made every row again cost seconds: a row is made again only when something it
    shows changed (here: the answer the collector took, Slurm's node), and the changes skip the rows kept without
    comparing them."""
    from slurm_ext import config
    from slurm_ext.web.watch import Watcher
    now = [time.time()]
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\n')

    def answer(node: str, utilization: int) -> dict:
        gpus = [{"gpu": {"index": i, "name": "NVIDIA H200"}, "utilization": utilization, "fb_used_mib": 10.0,
                 "fb_free_mib": 90.0} for i in range(8)]
        return {"node": node, "boot": "b", "time": now[0], "monitor": {"readings_time": now[0], "findings": [],
                                                                       "gpus": gpus, "checks": {"xid": "ok"}}}

    def taken(**utilization) -> None:
        for name, busy in utilization.items():
            _store_health(store, name, answer(name, busy), now[0])
        store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 3}), "collector", now[0])

    class Agents(_NotAsked):
        def acceptance(self, node, addr="", trigger="", timeout=None):
            return AcceptanceAnswer(node, "b", False, False, None)

    taken(n1=10, n2=20, n3=30)
    slurm = LiteralSlurm([Node(f"n{i}", "IDLE", gres="gpu:h200:8", addr="127.0.0.1") for i in (1, 2, 3)])
    watcher = Watcher(config.load(path), slurm, store, lambda url, timeout: (None, "refused"), Agents(),
                      clock=lambda: now[0])
    first = {row["name"]: row for row in watcher.refresh().data["nodes"]}
    version = watcher.changes.version
    now[0] += 5
    taken(n2=95)  # the collector took n2 again; Slurm drains n3
    slurm.listed[2] = Node("n3", "IDLE", flags=frozenset({"DRAIN"}), reason="admin: cables", gres="gpu:h200:8",
                           addr="127.0.0.1")
    second = {row["name"]: row for row in watcher.refresh().data["nodes"]}
    assert second["n1"] is first["n1"]
    assert second["n2"] is not first["n2"] and [g["utilization"] for g in second["n2"]["gpu_readings"]] == [95] * 8
    assert second["n3"] is not first["n3"] and second["n3"]["state"] == "paused"
    delta = json.loads(watcher.changes.body(version))
    # n2's row shows nothing new but its figures (its answer's time is no change); n3's row changed
    assert [row["name"] for row in delta["nodes"]] == ["n3"] and list(delta["figures"]) == ["n2"]
    now[0] += 5
    third = {row["name"]: row for row in watcher.refresh().data["nodes"]}
    assert all(third[name] is second[name] for name in third)  # nothing new: every row kept
    watcher.stop()


def test_status_says_the_findings_the_collector_took_and_asks_no_agent(store):
    """A warning a node's monitor holds open (it drains nothing: only its agent says it) is in `status` from the
    answer the collector took; a node without a collected answer has its agent asked."""
    now = time.time()
    answer = simulator._health("n1", now)
    answer["monitor"]["findings"] = [{"check": "xid", "severity": "warning", "gpu": 0,
                                      "evidence": "xid 13 gpu 0 graphics engine exception", "action": "none"}]
    _store_health(store, "n1", answer, now)
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 1}), "collector", now)
    nodes = [Node("n1", "IDLE", addr="127.0.0.1")]
    told, unreachable = with_agents(node_statuses(nodes, [], []), nodes, _NotAsked(),
                                    taken=taken_lately(store, _history(15.0), now))
    assert not unreachable and told[0].state == "healthy"
    assert told[0].findings == ["warning: xid xid 13 gpu 0 graphics engine exception"], told[0].findings
    with pytest.raises(AssertionError, match="node n2's agent was asked"):
        more = [*nodes, Node("n2", "IDLE", addr="127.0.0.1")]
        with_agents(node_statuses(more, [], []), more, _NotAsked(), taken=taken_lately(store, _history(15.0), now))


def test_an_agent_the_collector_failed_to_reach_since_is_unreachable_whatever_its_last_answer(store):
    now = time.time()
    _store_health(store, "n1", simulator._health("n1", now), now)
    store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": 1}), "collector", now)
    nodeevents.failed(store, {"n1": "Connection refused"}, now + 1)
    lately = taken_lately(store, _history(15.0), now + 2)
    assert not lately.findings and "Connection refused" in lately.unreachable["n1"]


def test_an_answer_is_stamped_when_it_came_not_when_the_database_took_it(store):
    """A page that waited for the database (an outage, a full backlog) is not shown as what the node says now."""
    came = time.time() - 600
    nodeevents.take(store, [nodeevents.Page("n1", "", f"{'0' * 16}:1", "b", health=json.dumps(
        simulator._health("n1", came)), health_at=came)])
    assert nodeevents.health(store)["n1"].taken == came
    assert nodeevents.findings(store, time.time() - 45) == {}


def test_an_agent_that_gives_its_journal_but_no_health_has_its_page_taken(tmp_path, store):
    layout = _fleet_layout(tmp_path, 2)
    fleet = _Fleet(layout, rate=1.0)
    try:
        time.sleep(1.5)
        collector = _collector(layout, store, interval=0.5)

        def refused(node, addr="", timeout=None):
            raise AgentAnswerError(node, addr, "its /health is not a health answer: a test")
        collector.agents.health = refused
        stop = threading.Event()
        runner = threading.Thread(target=collector.run, args=(stop,))
        runner.start()
        wait_for("events stored", lambda: collector.figures.events > 0 and collector.figures.health_failures > 0, 30)
        stop.set()
        runner.join(30)
    finally:
        fleet.stop()
    assert collector.figures.failures == 0 and not nodeevents.health(store)
    assert not any(c.error for c in nodeevents.cursors(store).values())


def test_each_nodes_newest_acceptance_run_in_one_query(store):
    rows = [(1000.0 + i, node, "acceptance", "acceptance-done", "info", "", f"run {i}",
             json.dumps({"verdict": "pass" if i % 2 else "fail", "level": "quick"}))
            for i in range(6) for node in ("n1", "n2")]
    nodeevents.take(store, [nodeevents.Page("n1", "", f"{'0' * 16}:1", "b", rows)])
    runs = nodeevents.newest_runs(store, 0)
    assert {node: (run.message, run.fields["verdict"]) for node, run in runs.items()} == \
        {"n1": ("run 5", "pass"), "n2": ("run 5", "pass")}
    assert nodeevents.newest_runs(store, 1010.0) == {}


def test_a_figure_no_sum_can_hold_is_none_and_never_stops_the_page():
    from slurm_ext.web.changes import figures_of
    gpus = [SimpleNamespace(utilization=50, memory_used_mib=1e308, memory_total_mib=1e308, temperature=40)] * 2
    assert figures_of(gpus, 0) == [50, None, None, 40, 0]


def test_a_stored_answer_that_is_no_health_answer_is_left_out(store):
    _store_health(store, "n1", {"node": "n1", "boot": "b", "time": 1.0, "monitor": "odd"}, time.time())
    _store_health(store, "n2", simulator._health("n2", 1.0), time.time())
    assert set(nodeevents.health(store)) == {"n2"}


def test_pruning_forgets_the_answers_of_nodes_gone_longer_than_the_history_is_kept(store):
    now = time.time()
    _store_health(store, "gone", simulator._health("gone", 1.0), now - 100 * 86400)
    _store_health(store, "here", simulator._health("here", 1.0), now)
    nodeevents.prune(store, keep=90 * 86400, most=10**6, now=now)
    assert set(nodeevents.health(store)) == {"here"}


def _store_health(store, node: str, answer: dict, when: float) -> None:
    """`answer` stored as the collector stores a node's /health with its page (an empty page)."""
    start = nodeevents.cursors(store).get(node, nodeevents.Cursor(node)).cursor
    offset = int(start.split(":")[1]) + 1 if start else 1
    monitor = answer.get("monitor")
    found = monitor.get("findings", []) if isinstance(monitor, dict) else []
    nodeevents.take(store, [nodeevents.Page(node, start, f"{'0' * 16}:{offset}", "b", health=json.dumps(answer),
                                            findings=json.dumps(found))], now=when)


def test_a_large_clusters_refresh_sets_what_it_holds_aside_and_collects_it_whole_every_so_often(tmp_path, store,
                                                                                                 monkeypatch):
    """At 10,000 nodes the cycle collector's passes over the page's 850,000 objects cost up to 0.6 s a refresh: a
    refresh sets them aside (gc.freeze), where a pass does not walk them, and every _COLLECT_ALL_EVERY refreshes
    collects everything once: a cycle set aside is collected then, not before, and not never."""
    import gc
    import weakref
    from slurm_ext import config
    from slurm_ext.web import watch
    monkeypatch.setattr(watch, "_SET_ASIDE_FROM", 2)  # this cluster counts as large
    monkeypatch.setattr(watch, "_COLLECT_ALL_EVERY", 3)
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\n')
    # nodes Slurm shows not answering: their agents are not asked (none runs)
    slurm = LiteralSlurm([Node(f"n{i}", "DOWN", flags=frozenset({"NOT_RESPONDING"}), gres="gpu:h200:8",
                               addr="127.0.0.1") for i in (1, 2)])
    watcher = watch.Watcher(config.load(path), slurm, store, lambda url, timeout: (None, "refused"), _NotAsked())

    class Cycle:
        pass
    gc.disable()  # no pass of its own collects the cycle before the refresh sets it aside
    try:
        cycle = Cycle()
        cycle.me = cycle
        gone = weakref.ref(cycle)
        del cycle
        watcher.refresh()  # the first: set aside, the cycle with it
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert gone() is not None, "a pass walked what was set aside"
        watcher.refresh()
        assert gone() is not None
        watcher.refresh()  # the third: everything collected once, then set aside again
        assert gone() is None, "the cycle set aside was never collected"
        assert gc.get_freeze_count() > 0
        slurm.listed[1:] = []  # the cluster became small: nothing set aside any more
        watcher.refresh()
        assert gc.get_freeze_count() == 0
        watcher.refresh()
    finally:
        watcher.stop()
        gc.enable()
        gc.unfreeze()

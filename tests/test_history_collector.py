"""The collected history (issue 33): the controller's collector takes every node agent's journal into the repair
database, each event once, from a cursor per node, across restarts of either side, within its bounds.

Real parts: the agents' own listener and credential guard (supervisor.http) or the fleet simulator (`slurm-ext dev
fleet`, a child process playing node agents on their own ports with journals written by events.emit), the
collector over HTTP, the repair database in SQLite. The dev cluster's real controller agent, collector worker and
MariaDB are in test_history_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.wait import wait_for
from slurm_ext import events
from slurm_ext.agentapi import AgentClient, create_credential
from slurm_ext.config import section_class
from slurm_ext.devcluster import fleet as simulator
from slurm_ext.devcluster.layout import Layout
from slurm_ext.repair import nodeevents
from slurm_ext.repair.collector import Collector
from slurm_ext.repair.store import StoreError, open_sqlite

#: the simulated nodes' ports: below the ephemeral range, beside no other test's
FLEET_PORTS = 14000


def _fleet_layout(tmp_path: Path, nodes: int) -> Layout:
    settings = section_class("dev")(state_dir=str(tmp_path / "dev"), defined_nodes=nodes + 1, nodes=1,
                                    node_port_base=FLEET_PORTS)
    layout = Layout(settings)
    layout.etc.mkdir(parents=True, exist_ok=True)
    create_credential(layout.agent_credential)
    return layout


class _Fleet:
    """`slurm-ext dev fleet`'s simulator in a child process (its own session: stopped by its process group's id)."""

    def __init__(self, layout: Layout, rate: float, seconds: float = 0.0, burst_rate: float = 0.0):
        settings = layout.settings
        code = ("import sys\nfrom slurm_ext.config import section_class\nfrom slurm_ext.devcluster.layout import "
                "Layout\nfrom slurm_ext.devcluster import fleet\n"
                f"s = section_class('dev')(state_dir={settings.state_dir!r}, defined_nodes={settings.defined_nodes}, "
                f"nodes=1, node_port_base={settings.node_port_base})\n"
                f"sys.exit(fleet.run(Layout(s), fleet.FleetSettings(rate={rate}, burst_rate={burst_rate}, "
                f"burst_after=0, burst_for=3600, seconds={seconds})))\n")
        self.layout = layout
        self.process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        last = layout.defined_nodes[-1].probe_port
        wait_for("the fleet's last agent listening", lambda: self._listening(last), 60)

    @staticmethod
    def _listening(port: int) -> bool:
        import socket
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    def kill(self) -> None:
        """SIGKILL, as an agent that crashed: no count saved, nothing closed."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)

    def written(self) -> dict[str, int]:
        """Each simulated node's events, counted from its own journal (the fleet numbers them from 0)."""
        return simulator.written(self.layout)


def _collector(layout: Layout, store, **history) -> Collector:
    nodes = [SimpleNamespace(name=n.name, addr="") for n in layout.defined_nodes[1:]]
    config = SimpleNamespace(history=section_class("history")(**history),
                             node=SimpleNamespace(state_dir=str(layout.root)))
    said = []
    agents = AgentClient(str(layout.agent_credential), 9810,
                         {n.name: f"127.0.0.1:{n.probe_port}" for n in layout.defined_nodes[1:]}, 5.0)

    class Slurm:
        def nodes(self):
            return nodes
    collector = Collector(config, store, agents, Slurm(), lambda event, message, *args, **fields: said.append(event))
    collector.said = said
    return collector


def _collect_the_rest(layout: Layout, store) -> dict[str, int]:
    """The fleet's agents again, writing nothing now, and one pass of a new collector: each node's events written."""
    quiet = _Fleet(layout, rate=0.0)
    try:
        figures = _collector(layout, store).once()
    finally:
        quiet.stop()
    assert figures.failures == 0
    return quiet.written()


def _each_once(store, written: dict[str, int]) -> None:
    """Every event each node wrote is in the store exactly once: its numbers 0 .. count-1, no other, none twice."""
    seqs: dict[str, list[int]] = {}
    for found in nodeevents.events(store, 0, limit=10**7):
        if found.component != "repair":
            seqs.setdefault(found.node, []).append(found.fields["fleet_seq"])
    wrong = {node: (count, len(seqs.get(node, [])), len(set(seqs.get(node, []))))
             for node, count in written.items() if sorted(seqs.get(node, [])) != list(range(count))}
    assert not wrong, f"node: (written, stored, distinct) where they differ: {dict(list(wrong.items())[:10])}"


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "repair.db"))
    yield opened
    opened.close()


def test_every_event_once_across_a_collector_crash_mid_transaction_and_an_agent_killed(tmp_path, store,
                                                                                       monkeypatch):
    """Two hundred simulated agents write 400 events a second. The collector dies three ways: in the middle of its
    transaction (the database refuses the cursors after the events went in: all of it rolls back), abandoned with
    pages read and not stored, and stopped; the agents are SIGKILLed and started again on their journals. At the
    end every event of every node is in the store once."""
    layout = _fleet_layout(tmp_path, 200)
    fleet = _Fleet(layout, rate=2.0)
    try:
        first = _collector(layout, store, interval=0.5)
        stop = threading.Event()
        runner = threading.Thread(target=first.run, args=(stop,))
        runner.start()
        wait_for("events stored", lambda: first.figures.events > 500, 30)
        real_put = nodeevents._put

        def cursors_refused(*args):
            raise StoreError("repair database: the disk is full (a test)")
        monkeypatch.setattr(nodeevents, "_put", cursors_refused)  # the rows went in; the cursors do not
        wait_for("a refused store", lambda: first.figures.store_failures >= 2, 30)
        assert "history-store-failed" in first.said
        stored = first.figures.events
        stop.set()  # abandoned with what it read and could not store
        runner.join(30)
        monkeypatch.setattr(nodeevents, "_put", real_put)
        assert len(nodeevents.events(store, 0, limit=10**7)) == stored  # the refused transactions left nothing

        second = _collector(layout, store, interval=0.5)
        stop = threading.Event()
        runner = threading.Thread(target=second.run, args=(stop,))
        runner.start()
        wait_for("more events stored", lambda: second.figures.events > 500, 30)
        fleet.kill()  # every agent at once, mid-write
        time.sleep(1.0)
        fleet = _Fleet(layout, rate=2.0)  # the same journals: each node numbers on from its last event
        wait_for("the restarted agents' events", lambda: second.figures.events > 1500, 30)
        stop.set()
        runner.join(30)
        assert not runner.is_alive()
    finally:
        fleet.stop()
    written = _collect_the_rest(layout, store)
    _each_once(store, written)
    assert sum(written.values()) > 2000
    assert sum(c.taken for c in nodeevents.cursors(store).values()) == sum(written.values())


def test_a_full_backlog_stops_the_asking_says_so_and_loses_nothing(tmp_path, store, monkeypatch):
    """The database refuses every store: the collector reads until history.backlog events wait, then asks no agent
    (its memory stays bounded; the journals hold the rest), says so once, and once the database takes them again
    stores each event once and says that too."""
    layout = _fleet_layout(tmp_path, 50)
    fleet = _Fleet(layout, rate=40.0)  # 2,000 events a second
    try:
        time.sleep(3.0)  # a first page of about 120 events from each node: a few fill the backlog
        collector = _collector(layout, store, interval=0.5, backlog=1000, batch=200)
        real_take = nodeevents.take

        def refused(*args, **kwargs):
            raise StoreError("repair database: away (a test)")
        monkeypatch.setattr(nodeevents, "take", refused)
        stop = threading.Event()
        runner = threading.Thread(target=collector.run, args=(stop,))
        runner.start()
        try:
            wait_for("a full backlog", lambda: "history-backlog-full" in collector.said, 30)
            time.sleep(2.0)
            waiting = collector._waiting.events
            assert 1000 <= waiting < 50 * 120  # stopped asking before every node was asked
            time.sleep(2.0)
            assert collector._waiting.events == waiting  # no agent asked while the backlog is full
            assert collector.said.count("history-backlog-full") == 1
            monkeypatch.setattr(nodeevents, "take", real_take)
            wait_for("the backlog cleared", lambda: "history-backlog-cleared" in collector.said, 30)
            assert "history-store-recovered" in collector.said
        finally:
            stop.set()
            runner.join(30)
    finally:
        fleet.stop()
    _each_once(store, _collect_the_rest(layout, store))


def test_a_journal_that_rotated_past_the_cursor_is_said_lost_in_the_history(tmp_path, store, monkeypatch):
    """An agent away while its node wrote more than its journal keeps: the collector takes what is left, records a
    journal-lost row for the node and says so in an event; `history` names the node as incomplete."""
    from slurm_ext.repair.history import gather
    from slurm_ext.supervisor.http import Guard, ProbeServer, journal_answer
    from slurm_ext.supervisor.later import AnswerWorker
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 3000)
    layout = _fleet_layout(tmp_path, 1)
    state = tmp_path / "node-state"
    for number in range(10):
        events.emit(str(state), "supervisor", "started", f"event {number}", seq=number)
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    agent = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(
        agent_credential=str(layout.agent_credential), slurm_name="node2", boot_id_file=str(boot))))
    guard, reader = Guard(agent), AnswerWorker("http-journal")
    server = ProbeServer("127.0.0.1", layout.defined_nodes[1].probe_port, lambda target, headers: guard.guarded(
        "GET", target, headers, lambda: journal_answer(str(state), target.partition("?")[2], reader))).start()
    try:
        assert _collector(layout, store).once().events == 10
        for number in range(10, 400):
            events.emit(str(state), "supervisor", "started", f"event {number}", seq=number)
        for rotated in events.journal_files(str(state))[:-1]:  # quiet since: no writer can reach them any more
            os.utime(rotated, (time.time() - 60, time.time() - 60))
        collector = _collector(layout, store)
        figures = collector.once()
    finally:
        server.close()
    assert figures.lost == 1 and collector.said == ["history-journal-lost"]

    class Slurm:
        def node_events(self, node, since):
            return []
    timeline = gather(store, Slurm(), 0)
    assert "rotated out before the collector took them" in timeline.incomplete["node2"]
    kept = [json.loads(text)["seq"] for path in events.journal_files(str(state)) if path.exists()
            for text in path.read_text().splitlines()]
    stored = [e.fields["seq"] for e in nodeevents.events(store, 0, limit=10**6) if e.component == "supervisor"]
    assert stored == list(range(10)) + kept  # the first ten, then what the journal still had: none twice


def test_history_names_agents_the_collector_cannot_reach_and_a_collector_that_does_not_run(tmp_path, store):
    from slurm_ext.repair.history import gather
    layout = _fleet_layout(tmp_path, 3)  # no fleet: nobody listens on their ports

    class Slurm:
        def node_events(self, node, since):
            return []
    assert "the collector has never run" in gather(store, Slurm(), 0).collector
    collector = _collector(layout, store)
    figures = collector.once()
    assert figures.failures == 3
    timeline = gather(store, Slurm(), 0)
    assert timeline.collector == ""
    assert set(timeline.unreachable) == {n.name for n in layout.defined_nodes[1:]}
    assert "Connection refused" in timeline.unreachable["node2"]
    assert "its events since then are missing" in timeline.unreachable["node2"]
    assert "last ran" in gather(store, Slurm(), 0, now=time.time() + 3600).collector


def test_history_keeps_the_newest_entries_and_counts_the_rest(tmp_path, store):
    from slurm_ext.repair.history import gather
    rows = [(1000.0 + n, "n1", "supervisor", "started", "info", "", f"event {n}", "{}") for n in range(50)]
    nodeevents.take(store, [nodeevents.Page("n1", "", "0123456789abcdef:1", "b", rows)])

    class Slurm:
        def node_events(self, node, since):
            return []
    timeline = gather(store, Slurm(), 0, limit=10)
    assert [e.message for e in timeline.entries] == [f"event {n}" for n in range(40, 50)]
    assert timeline.cut >= 1


def test_pruning_keeps_the_age_and_the_count(store):
    now = time.time()
    rows = [(now - 86400 * (100 - n), "n1", "supervisor", "started", "info", "", f"old {n}", "{}") for n in range(10)]
    rows += [(now - n, "n1", "supervisor", "started", "info", "", f"new {n}", "{}") for n in range(100)]
    nodeevents.take(store, [nodeevents.Page("n1", "", "0123456789abcdef:1", "b", rows)])
    assert nodeevents.prune(store, keep=30 * 86400, most=10**6, now=now) == 10
    assert nodeevents.prune(store, keep=30 * 86400, most=60, now=now) == 40
    left = nodeevents.events(store, 0, limit=1000)
    assert len(left) == 60 and all(e.message.startswith("new") for e in left)


def test_a_page_read_from_a_cursor_another_collector_moved_is_dropped_whole(store):
    row = (1000.0, "n1", "supervisor", "started", "info", "", "one", "{}")
    assert nodeevents.take(store, [nodeevents.Page("n1", "", "0123456789abcdef:10", "b", [row])]) == (1, [])
    assert nodeevents.take(store, [nodeevents.Page("n1", "", "0123456789abcdef:10", "b", [row])]) == (0, ["n1"])
    assert len(nodeevents.events(store, 0)) == 1


def test_the_journal_route_checks_its_query_and_the_credential(tmp_path):
    from slurm_ext.agentapi import AgentAnswerError
    from slurm_ext.supervisor.http import Guard, ProbeServer, journal_answer
    from slurm_ext.supervisor.later import AnswerWorker
    layout = _fleet_layout(tmp_path, 1)
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    agent = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(
        agent_credential=str(layout.agent_credential), slurm_name="node2", boot_id_file=str(boot))))
    guard, reader = Guard(agent), AnswerWorker("http-journal")
    server = ProbeServer("127.0.0.1", 0, lambda target, headers: guard.guarded(
        "GET", target, headers, lambda: journal_answer(str(tmp_path), target.partition("?")[2], reader))).start()
    try:
        client = AgentClient(str(layout.agent_credential), 9810, {"node2": f"127.0.0.1:{server.address[1]}"}, 5.0)
        assert client.journal("node2").lines == ()
        with pytest.raises(AgentAnswerError, match="HTTP 400: max: expected a count of bytes"):
            client.journal("node2", size=0)
        with pytest.raises(AgentAnswerError, match="HTTP 400: after: expected a cursor"):
            client.journal("node2", cursor="../../etc")
        other = tmp_path / "other-credential"
        create_credential(other)
        with pytest.raises(AgentAnswerError, match="refused our agent credential"):
            AgentClient(str(other), 9810, {"node2": f"127.0.0.1:{server.address[1]}"}, 5.0).journal("node2")
    finally:
        server.close()


def _serving(tmp_path: Path, layout: Layout) -> list:
    """The agents' own listener (supervisor.http: its guard and GET /journal) for each simulated node of `layout`,
    on its port, each with its journal in tmp_path/<node>. Close them."""
    from slurm_ext.supervisor.http import Guard, ProbeServer, journal_answer
    from slurm_ext.supervisor.later import AnswerWorker
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    servers = []
    for node in layout.defined_nodes[1:]:
        agent = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(
            agent_credential=str(layout.agent_credential), slurm_name=node.name, boot_id_file=str(boot))))
        state = str(tmp_path / node.name)
        guard, reader = Guard(agent), AnswerWorker("http-journal")
        servers.append(ProbeServer("127.0.0.1", node.probe_port, lambda target, headers, g=guard, r=reader, d=state:
                                   g.guarded("GET", target, headers, lambda: journal_answer(
                                       d, target.partition("?")[2], r))).start())
    return servers


def test_a_page_the_database_refuses_is_set_aside_said_and_never_holds_up_the_others(tmp_path, store):
    """One node's journal holds a line the database refuses (here a trigger of its own; a value no column takes in
    life): a batch with it fails whole, so the collector tries its pages one by one, stores the others, sets that
    one aside with a mark in the node's history, and moves the node's cursor past it. A line with a lone surrogate
    (a file name in another encoding, escaped in the journal) is no such line: stored, the surrogate replaced."""
    from slurm_ext.repair.history import gather
    layout = _fleet_layout(tmp_path, 3)
    for number, node in enumerate(layout.defined_nodes[1:]):
        for seq in range(5):
            text = "poison" if (number, seq) == (1, 2) else "file caf\udce9.txt" if seq == 4 else f"event {seq}"
            events.emit(str(tmp_path / node.name), "supervisor", "started", text, seq=seq)
    store._execute("CREATE TRIGGER refuse BEFORE INSERT ON node_events WHEN NEW.message LIKE '%poison%' "
                   "BEGIN SELECT RAISE(ABORT, 'a value this database refuses'); END")
    servers = _serving(tmp_path, layout)
    try:
        collector = _collector(layout, store)
        figures = collector.once()
        for node in layout.defined_nodes[1:]:
            events.emit(str(tmp_path / node.name), "supervisor", "started", "after", seq=5)
        again = _collector(layout, store).once()
    finally:
        for server in servers:
            server.close()
    assert (figures.refused, figures.events, again.events) == (5, 10, 3)
    assert collector.said.count("history-page-refused") == 1
    stored = {(e.node, e.fields.get("seq")) for e in nodeevents.events(store, 0) if e.component == "supervisor"}
    assert stored == {(n.name, seq) for n in layout.defined_nodes[1:] for seq in range(6)} - {
        ("node3", seq) for seq in range(5)}
    assert {e.message for e in nodeevents.events(store, 0) if e.fields.get("seq") == 4} == {"file caf?.txt"}

    class Slurm:
        def node_events(self, node, since):
            return []
    timeline = gather(store, Slurm(), 0, limit=2)
    assert "the database refused 5 event(s)" in timeline.incomplete["node3"]  # said, however old the mark is


def test_a_node_slurm_no_longer_lists_is_not_named_unreachable_for_ever(tmp_path, store):
    layout = _fleet_layout(tmp_path, 2)
    collector = _collector(layout, store)
    assert collector.once().failures == 2  # nobody listens
    assert {n for n, c in nodeevents.cursors(store).items() if c.error} == {"node2", "node3"}
    assert set(nodeevents.failing(store)) == {"node2", "node3"} and set(nodeevents.failing(store, ["node3"])) == \
        {"node3"}
    fewer = _collector(layout, store)
    listed = [SimpleNamespace(name="node2", addr="")]
    fewer.slurm = SimpleNamespace(nodes=lambda: listed)
    fewer.once()
    assert {n for n, c in nodeevents.cursors(store).items() if c.error} == {"node2"} == set(nodeevents.failing(store))

"""The Health checks tab's history as pure logic over literal journal events (as health/monitor.py writes them): a
cleared finding reads as cleared, and a finding the node ended by rebooting gets its "cleared" row."""

from __future__ import annotations

import time

from slurm_ext.web.healthview import history_rows
from test_web import page  # noqa: F401 (the page over literal records, its fixture)

XID = {"component": "health", "check": "xid", "subject": "gpu 1", "evidence": "79 gpu 1 fallen off the bus",
       "action": "reboot", "finding_severity": "critical", "gpu": 1}


def _event(name: str, severity: str = "info", **fields) -> dict:
    return {"event": name, "severity": severity, **fields}


def test_a_cleared_finding_reads_as_cleared_not_as_its_severity():
    rows = history_rows([(100.0, "n1", _event("health-finding", "critical", **XID)),
                         (200.0, "n1", _event("health-cleared", why="operator", **XID))], {"n1": set()})
    assert [(r["time"], r["state"], r["severity"], r["why"]) for r in rows] == \
        [(200.0, "cleared", "critical", "operator"), (100.0, "open", "critical", "")]


def test_a_finding_ended_by_a_reboot_gets_its_cleared_row_at_the_monitors_next_start():
    rows = history_rows([(100.0, "n1", _event("health-finding", "critical", **XID)),
                         (300.0, "n1", _event("health-started")),
                         (400.0, "n2", _event("health-started"))], {"n1": set(), "n2": set()})
    made = [r for r in rows if r["made_by_page"]]
    assert [(r["time"], r["node"], r["event"], r["state"], r["why"], r["check"]) for r in made] == \
        [(300.0, "n1", "health-cleared", "cleared", "reboot", "xid")]
    assert "the node rebooted" in made[0]["message"]
    assert [r["time"] for r in rows] == [400.0, 300.0, 300.0, 100.0]  # newest first


def test_no_cleared_row_is_made_for_a_finding_the_agent_still_holds_or_whose_agent_is_silent():
    events = [(100.0, "n1", _event("health-finding", "critical", **XID)), (300.0, "n1", _event("health-started"))]
    # the monitor restarted on the same boot and kept the finding
    assert not [r for r in history_rows(events, {"n1": {("xid", "gpu 1")}}) if r["made_by_page"]]
    # its agent does not answer: what it holds is not known
    assert not [r for r in history_rows(events, {}) if r["made_by_page"]]
    # cleared after the restart: its own row says so, none is made
    cleared = events + [(350.0, "n1", _event("health-cleared", why="quiet", **XID))]
    assert not [r for r in history_rows(cleared, {"n1": set()}) if r["made_by_page"]]
    # opened again after a start: only a later start ends it
    again = events + [(500.0, "n1", _event("health-finding", "critical", **XID))]
    assert not [r for r in history_rows(again, {"n1": set()}) if r["made_by_page"]]


def test_the_routes_filter_the_timeline_and_say_each_health_events_state(page):  # noqa: F811 (test_web's page)
    slurm = page.get("/api/timeline?source=slurm&severity=warning").get_json()["entries"]
    assert [(e["message"], e["severity"]) for e in slurm] == [("DRAIN: slurm-ext: xid 79 (by root)", "warning")]
    assert page.get("/api/timeline?source=slurm&severity=info").get_json()["entries"] == []
    found = page.get("/api/timeline?node=n2&source=agent&event=health-finding&severity=error").get_json()["entries"]
    assert [e["message"] for e in found] == ["critical 2", "critical 1", "critical 0"]
    assert page.get("/api/timeline?source=agent&event=health-cleared").get_json()["entries"] == []
    answer = page.get("/api/timeline?event=%3Cb%3E")
    assert answer.status_code == 400 and "part of an event's name" in answer.get_json()["error"]
    health = page.get("/api/health?node=n2").get_json()
    assert [(e["state"], e["severity"]) for e in health["entries"]] == [("open", "critical")] * 3
    assert page.get("/api/health?state=cleared").get_json()["entries"] == []
    assert health["open"] == [f for f in health["open"] if f["node"] == "n2"]


def test_one_seconds_events_are_taken_in_the_order_the_journal_wrote_them():
    """The review of 29: the watcher gives a node's journal newest first, and the journal's times are whole
    seconds. A monitor that starts and finds a fault in the same second wrote health-started first: the finding came
    after that start, so the start does not end it (no "cleared (reboot)" row for a finding opened after it, which
    the agent's last answer may not hold yet), while the finding before the reboot gets its row; the rows stay
    newest first, one second's too."""
    before = {**XID, "subject": "gpu 1"}
    after = {**XID, "subject": "gpu 2", "gpu": 2, "evidence": "79 gpu 2 fallen off the bus"}
    newest_first = [(300.0, "n1", _event("health-finding", "critical", **after)),
                    (300.0, "n1", _event("health-started")),
                    (100.0, "n1", _event("health-finding", "critical", **before))]
    rows = history_rows(newest_first, {"n1": set()})
    made = [(r["time"], r["subject"]) for r in rows if r["made_by_page"]]
    assert made == [(300.0, "gpu 1")], made
    assert [(r["time"], r["event"], r["subject"]) for r in rows if not r["made_by_page"]] == \
        [(300.0, "health-finding", "gpu 2"), (300.0, "health-started", ""), (100.0, "health-finding", "gpu 1")]


def test_no_cleared_row_is_made_while_the_nodes_agent_serves_no_monitor_readings(tmp_path):
    """The review of 29: an agent that answers without its health monitor's readings (the monitor starting, or
    stopped) does not say what is open on the node: a finding opened before the monitor's last start is not shown as
    cleared by a reboot from that answer (it may be open still: a monitor restarted on the same boot keeps it)."""
    import json

    from slurm_ext import config
    from slurm_ext.repair.store import open_sqlite
    from slurm_ext.web.app import create_app
    from slurm_ext.web.watch import Watcher
    from test_web import _Agents, _Slurm
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\n'
                    f'[repair]\nagents = {{ n1 = "127.0.0.1:1", n2 = "127.0.0.1:2" }}\n')
    from helpers.page import stored_journal
    from slurm_ext.words import moment
    finding = {"time": moment(time.time() - 600), "component": "health", "event": "health-finding",
               "severity": "critical", "message": "critical: xid 79", **XID}
    started = {"time": moment(time.time() - 300), "component": "health", "event": "health-started",
               "severity": "info", "message": "health monitor on node n2"}
    no_monitor = {"boot": "boot-1", "time": 1.0, "facts": {}}
    store = open_sqlite(str(tmp_path / "repair.db"))
    stored_journal(store, "n2", "\n".join(json.dumps(e) for e in (finding, started)))
    watcher = Watcher(config.load(path), _Slurm(), store, lambda url, timeout: (None, "refused"),
                      _Agents(no_monitor))
    app = create_app(config.load(path), watcher, store_opener=lambda: open_sqlite(str(tmp_path / "repair.db")))
    watcher.refresh()
    health = app.test_client().get("/api/health?node=n2").get_json()
    assert [(e["event"], e["state"]) for e in health["entries"]] == \
        [("health-started", ""), ("health-finding", "open")], health["entries"]
    store.close()

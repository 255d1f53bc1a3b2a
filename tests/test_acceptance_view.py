"""What the operator sees of acceptance and switches: `status`'s line and each node's last run, `history`'s result
lines, the cluster page (its configuration panel, the node's last run with every result's figures, the timeline) and
the offer of `accept cluster` once the switch is turned on for a running cluster.

Real parts: runs made of acceptance's own records and checked by the agent boundary (agentapi.AcceptanceAnswer), a
journal written by the real emitter and read back as an agent serves it, the controller's plug-in part over real
config files and reloads, the page's watcher and Flask routes over a real refresh. Slurm and the agents' transport
are stood in by literal answers, as in tests/test_web.py (the agents' GET /acceptance over HTTP is
tests/test_agentapi.py's)."""

from __future__ import annotations

import json
import types
from datetime import datetime, timezone
from pathlib import Path

from helpers.page import stored_journal
from slurm_ext import config, events, journal
from slurm_ext.acceptance import offer
from slurm_ext.acceptance.plugin import PLUGIN
from slurm_ext.acceptance.records import Figure, Result, Run
from slurm_ext.acceptance.runner import _line
from slurm_ext.acceptance.settings import WHY_OFF
from slurm_ext.agentapi import AcceptanceAnswer, AgentAnswerError, EventsPage, HealthAnswer
from slurm_ext.repair import status
from slurm_ext.repair.history import result_lines
from slurm_ext.repair.store import open_sqlite
from slurm_ext.slurm import Node
from slurm_ext.web.app import create_app
from slurm_ext.web.watch import Watcher

STARTED = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc).timestamp()


def _config(tmp_path: Path, acceptance: str) -> config.Config:
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = "{tmp_path / "tokens"}"\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "r.db"}"\nagents = {{ n1 = "127.0.0.1:1", '
                    f'n2 = "127.0.0.1:2" }}\n[acceptance]\n{acceptance}\n')
    return config.load(path)


def _offers(state_dir: Path) -> list[str]:
    return [e.message for e in journal.read_events(str(state_dir)) if e.event == "acceptance-offer"]


def test_turning_acceptance_on_offers_accept_cluster_once_until_a_cluster_run(tmp_path):
    state = tmp_path / "state"
    off = _config(tmp_path, "enabled = false")
    assert status.OFFER == offer.OFFER  # status reads acceptance's file, a floor beside it: the same words
    controller = PLUGIN.attach(types.SimpleNamespace(config=off, role="controller"))
    said = status.acceptance_state(off)
    assert said["enabled"] is False and said["why_off"] == WHY_OFF and said["offer"] is None
    assert _offers(state) == [] and offer.switch_path(str(state)).exists()
    on = _config(tmp_path, "enabled = true")
    controller.reloaded(off, on)
    controller.reloaded(on, on)  # a reload that changes nothing offers nothing
    PLUGIN.attach(types.SimpleNamespace(config=on, role="controller"))  # nor does the agent's restart
    assert _offers(state) == [offer.OFFER]
    said = status.acceptance_state(on)
    assert said["offer"] == offer.OFFER and said["why_off"] is None and said["at_start"] == "quick"
    assert said["offered"] == offer.pending(str(state), True)
    # a node's last run of trigger cluster after the offer takes it; one before it does not
    ran = status.NodeStatus("n1", "healthy", "IDLE", "", "", "", 0,
                            acceptance={"trigger": "cluster", "finished": said["offered"] + 1})
    before = status.NodeStatus("n2", "healthy", "IDLE", "", "", "", 0,
                               acceptance={"trigger": "cluster", "finished": said["offered"] - 1})
    assert status.acceptance_state(on, [ran])["offer"] is None and status.acceptance_state(on, [before])["offer"]
    offer.cluster_ran(str(state))  # `accept cluster` ended on the controller
    assert status.acceptance_state(on)["offer"] is None and offer.pending(str(state), True) is None
    # off, then on again: offered again
    controller.reloaded(on, off)
    assert status.acceptance_state(off)["offer"] is None
    controller.reloaded(off, on)
    assert _offers(state) == [offer.OFFER] * 2 and status.acceptance_state(on)["offer"] == offer.OFFER
    # a worker's agent offers nothing; a cluster first started with acceptance on is not offered it
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    PLUGIN.attach(types.SimpleNamespace(config=_config(fresh, "enabled = true"), role="controller"))
    assert _offers(fresh / "state") == [] and status.acceptance_state(_config(fresh, "enabled = true"))["offer"] is None


def _run(node: str, trigger: str = "start", finished: float = STARTED + 12) -> Run:
    return Run(node, "quick", trigger, STARTED, finished, "h200-sxm", [
        Result("gpu-bandwidth", "gpu", "gpu 0", "pass", "", (Figure("h2d_gbps", 55.4, "GB/s", 48.0),
                                                            Figure("d2d_gbps", 4265.0, "GB/s", 3800.0)), 2.0),
        Result("gpu-memory", "gpu", "gpu 1", "fail", "gpu 1: stuck bit at 0x1000-0x1fff (4 KiB)",
               (Figure("memory_bad_bytes", 4096.0, "B", 0.0, at_least=False),), 3.0, "reset-gpu"),
        Result("storage", "storage", "/scratch", "error", "fio not installed and /scratch not writable")],
        {"gpu-nvlink": "no NVLink on this part"}, boot_id="boot-1")


def _journal(tmp_path: Path, runs: list[Run]) -> str:
    """The journal lines of acceptance-done for `runs`, written by the real emitter as the runner writes them."""
    state = tmp_path / "node-journal"
    emit = events.emitter(str(state), "acceptance")
    for run in runs:
        emit("acceptance-done", f"acceptance {run.level} on {run.node} ({run.trigger}): {run.verdict}",
             "critical" if run.verdict == "fail" else "info", level=run.level, trigger=run.trigger,
             verdict=run.verdict, profile=run.profile, seconds=12.0,
             failed=[f"{r.test} {r.target}".strip() for r in run.failures()],
             errors=[f"{r.test} {r.target}".strip() for r in run.errors()], results=[_line(r) for r in run.results])
    return "".join(p.read_text() for p in sorted(state.glob("journal*.jsonl")))


class _Agents:
    """n1's agent serves /acceptance (its run, checked by agentapi); n2's is older than /acceptance (404): the page
    knows its run from its journal alone (as the controller's collector stored it)."""

    def __init__(self, runs: dict[str, Run]):
        self.runs, self.asked = runs, []

    def health(self, node, addr="", timeout=None):
        return HealthAnswer.of({"node": node, "boot": "boot-1", "time": STARTED + 20})

    def acceptance(self, node, addr="", trigger="", timeout=None):
        self.asked.append(node)
        if node == "n2":
            raise AgentAnswerError(node, "127.0.0.1:2", "HTTP 404: try /livez ...", 404)
        run = self.runs.get(node)
        return AcceptanceAnswer.of({"node": node, "boot": "boot-1", "running": False, "enabled": True,
                                    "run": run.to_json() if run else None})


class _Slurm:
    def nodes(self):
        return [Node("n1", "IDLE", frozenset({"DRAIN"}), "slurm-ext: acceptance quick: gpu-memory gpu 1: stuck bit "
                     "action=reset-gpu", "root", gres="gpu:h200:2", addr="127.0.0.1"),
                Node("n2", "IDLE", gres="gpu:h200:2", addr="127.0.0.1")]

    def node_events(self, node, since):
        return []

    def show_config(self):
        return {"ClusterName": "unit", "SLURM_VERSION": "26.05.0"}

    def queue(self):
        return []


def test_status_says_each_nodes_last_run_and_the_page_shows_its_results_with_their_figures(tmp_path):
    first = _run("n1")
    agents = _Agents({"n1": first})
    slurm = _Slurm()
    nodes = slurm.nodes()
    told, unreachable = status.with_agents(status.node_statuses(nodes, [], []), nodes, agents)
    assert unreachable == {}
    by_name = {s.name: s for s in told}
    assert by_name["n1"].acceptance == {
        "verdict": "fail", "level": "quick", "trigger": "start", "profile": "h200-sxm", "finished": STARTED + 12,
        "tests": 3, "failed": ["gpu-memory gpu 1: gpu 1: stuck bit at 0x1000-0x1fff (4 KiB)"],
        "errors": ["storage /scratch: fio not installed and /scratch not writable"]}
    line = status.acceptance_line(by_name["n1"].acceptance)
    assert line.startswith("acceptance fail (quick, start) 2026-12-01T") and "stuck bit at 0x1000-0x1fff" in line
    assert by_name["n2"].acceptance is None  # `status` asks /acceptance only: an older agent's run is not known there

    agents.asked.clear()

    # the page: the configuration panel, each node's row and its run's results
    loaded = _config(tmp_path, "enabled = false")
    store = open_sqlite(str(tmp_path / "r.db"))
    stored_journal(store, "n1", _journal(tmp_path / "j1", [first]))
    stored_journal(store, "n2", _journal(tmp_path / "j2", [_run("n2")]))
    watcher = Watcher(loaded, slurm, store, lambda url, timeout: (None, "refused"), agents)
    client = create_app(loaded, watcher, store_opener=lambda: open_sqlite(str(tmp_path / "r.db"))).test_client()
    try:
        data = json.loads(watcher.refresh().body)
        assert data["acceptance"]["enabled"] is False and data["acceptance"]["why_off"] == WHY_OFF
        rows = {n["name"]: n for n in data["nodes"]}
        assert rows["n1"]["acceptance"]["verdict"] == "fail" and rows["n1"]["acceptance"]["trigger"] == "start"
        # n2's agent sent no run: its journal's acceptance-done says it
        assert rows["n2"]["acceptance"]["verdict"] == "fail" and rows["n2"]["acceptance"]["failed"] == [
            "gpu-memory gpu 1"] and rows["n2"]["acceptance"]["finished"] is not None
        answer = client.get("/api/acceptance").get_json()
        assert answer["acceptance"]["why_off"] == WHY_OFF
        n1, n2 = answer["nodes"]
        results = {(r["test"], r["target"]): r for r in n1["run"]["results"]}
        assert results[("gpu-bandwidth", "gpu 0")]["figures"][0] == {"name": "h2d_gbps", "value": 55.4, "unit": "GB/s",
                                                                     "limit": 48.0, "at_least": True}
        assert results[("gpu-memory", "gpu 1")]["action"] == "reset-gpu"
        assert n1["run"]["not_applicable"] == {"gpu-nvlink": "no NVLink on this part"}
        assert n2["run"] is None and n2["lines"] == [
            "gpu-bandwidth gpu 0: pass: h2d_gbps 55.4 GB/s (>= 48); d2d_gbps 4265 GB/s (>= 3800)",
            "gpu-memory gpu 1: fail: stuck bit at 0x1000-0x1fff (4 KiB)",
            "storage /scratch: error: fio not installed and /scratch not writable"]
        assert client.get("/api/acceptance?node=n2").get_json()["nodes"] == [n2]
        assert client.get("/api/acceptance?node=n9").status_code == 404
        # the timeline: acceptance-done with its result lines (as `history` shows them)
        timeline = client.get("/api/timeline?event=acceptance").get_json()["entries"]
        assert {e["node"] for e in timeline} == {"n1", "n2"} and all(e["lines"] == n2["lines"] for e in timeline)

        # bounded and cached: /acceptance is asked at an agent's first answer, then only after its journal (as
        # collected) tells of a run that ended (n2's older agent: not again after its 404)
        assert sorted(agents.asked) == ["n1", "n2"]
        watcher.refresh()
        assert sorted(agents.asked) == ["n1", "n2"]
        second = _run("n1", "cluster", STARTED + 100)
        agents.runs["n1"] = second
        stored_journal(store, "n1", _journal(tmp_path / "j1-later", [second]))  # its journal: the new run's end
        data = json.loads(watcher.refresh().body)
        assert agents.asked.count("n1") == 2 and agents.asked.count("n2") == 1
        assert {n["name"]: n["acceptance"]["trigger"] for n in data["nodes"]}["n1"] == "cluster"
    finally:
        store.close()


def test_history_shows_an_acceptance_runs_results_under_its_end(tmp_path):
    run = _run("n1")
    text = _journal(tmp_path, [run])
    done = [line.data for line in EventsPage.of("n1", "b", text).events][-1]
    assert result_lines(done) == tuple(_line(r) for r in run.results)
    assert result_lines({**done, "event": "acceptance-test"}) == ()  # a test's own event is its message alone
    assert result_lines({**done, "results": "odd"}) == ()
    many = {**done, "results": [f"t{i}: pass: x 1" for i in range(205)]}
    assert len(result_lines(many)) == 201 and result_lines(many)[-1].startswith("+5 more")

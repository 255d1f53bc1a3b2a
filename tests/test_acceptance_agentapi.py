"""Acceptance across the agent boundary: the answer's checks (agentapi.AcceptanceAnswer), the agent's GET /acceptance and
POST /acceptance/run over real HTTP with the credential guard and the real runner (its tests in child processes, over
this host's interfaces), and a failed run's drain read back as a repair recommendation (recommend.fault_of).

The agent here is the agent's HTTP server in this process, with a real config file; its node-state owner is a recorder
of the wants and clears the agent's liaison would take (the liaison itself is tested with Slurm in
test_nodestate_cluster.py and, with acceptance, in test_acceptance_repair_cluster.py)."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.wait import wait_for
from slurm_ext import agentapi, config
from slurm_ext.acceptance.records import LEVELS, Figure, Result, Run
from slurm_ext.acceptance.runner import TRIGGERS, _node_lock
from slurm_ext.acceptance.verdict import drain_reason
from slurm_ext.agentapi import AcceptanceAnswer, AgentAnswerError, AgentClient, create_credential
from slurm_ext.repair import recommend
from slurm_ext.repair.settings import RepairSection
from slurm_ext.slurm import REASON_PREFIX, Node
from slurm_ext.supervisor.acceptruns import AcceptanceRuns
from slurm_ext.journal import read_events
from slurm_ext.supervisor import http, plugins
from slurm_ext.supervisor.http import Guard, ProbeServer, agent_posts, agent_routes


def _run(*results: Result, level: str = "quick", trigger: str = "repair", boot: str = "boot-1") -> Run:
    return Run("n1", level, trigger, 1000.0, 1003.5, "h200-sxm", list(results), {"gpu-nvlink": "no NVLink"}, boot)


MEMORY_FAIL = Result("gpu-memory", "gpu", "gpu 1", "fail", "gpu 1: 3 bad bytes at 0x7f0000000000-0x7f0000000fff "
                     "(stuck bit 5 reads 1)", (Figure("memory_bad_bytes", 3.0, "B", 0.0, at_least=False),), 2.5,
                     "reset-gpu")
H2D_PASS = Result("gpu-bandwidth", "gpu", "gpu 0", "pass", "h2d 55.4 GB/s (>= 48)",
                  (Figure("h2d", 55.4, "GB/s", 48.0),), 1.0)


def _answer(run: Run | dict | None, **more) -> dict:
    body = run.to_json() if isinstance(run, Run) else run
    return {"node": "n1", "boot": "boot-1", "running": False, "enabled": True, "run": body, **more}


# -- the answer's checks ------------------------------------------------------------------------------------------

def test_the_boundarys_levels_and_triggers_are_acceptances():
    assert agentapi.ACCEPTANCE_LEVELS == LEVELS
    assert agentapi.ACCEPTANCE_TRIGGERS == TRIGGERS
    assert set(agentapi.ACCEPTANCE_ASKED) <= set(TRIGGERS) and "start" not in agentapi.ACCEPTANCE_ASKED


def test_a_run_crosses_the_boundary_as_the_runner_wrote_it():
    run = _run(H2D_PASS, MEMORY_FAIL)
    answer = AcceptanceAnswer.of(json.loads(json.dumps(_answer(run))))
    assert (answer.node, answer.boot, answer.running, answer.enabled, answer.verdict) == \
        ("n1", "boot-1", False, True, "fail")
    assert answer.run == {**run.to_json(), "results": [{**r.to_json(), "seconds": r.seconds} for r in run.results]}
    assert AcceptanceAnswer.of(_answer(None)).run is None and AcceptanceAnswer.of(_answer(None)).verdict == ""


def test_an_odd_figure_is_none_and_long_texts_are_cut():
    data = _run(MEMORY_FAIL).to_json()
    data["results"][0]["figures"][0]["value"] = math.nan  # json writes NaN, and reads it back
    data["results"][0]["message"] = "x" * 100_000
    answer = AcceptanceAnswer.of(json.loads(json.dumps(_answer(data))))
    result = answer.run["results"][0]
    assert result["figures"][0]["value"] is None and result["figures"][0]["limit"] == 0.0
    assert len(result["message"]) == 2000


@pytest.mark.parametrize("spoil, said", [
    (lambda d: d.update(verdict="pass"), "its verdict 'pass' is not its results' (fail)"),
    (lambda d: d.update(results=[], verdict="pass"), "its verdict 'pass' is not its results' (error)"),
    (lambda d: d.update(level="thorough"), "level 'thorough' is none of quick, standard, extended"),
    (lambda d: d["results"][0].update(outcome="flaky"), "outcome 'flaky'"),
    (lambda d: d.update(results={"gpu-memory": "fail"}), "results: expected a list of objects"),
    (lambda d: d.update(started="yesterday"), "started: expected a number"),
    (lambda d: d.update(boot_id=7), "boot_id: expected text"),
])
def test_a_run_that_is_not_one_is_refused_whole(spoil, said):
    data = _run(MEMORY_FAIL).to_json()
    spoil(data)
    with pytest.raises(ValueError, match="^run: ") as caught:
        AcceptanceAnswer.of(_answer(data))
    assert said in str(caught.value)


@pytest.mark.parametrize("body", [[], {"node": "n1", "boot": "b", "running": "no", "enabled": True, "run": None},
                                  {"node": "n1", "boot": "b", "running": False, "run": None},
                                  {"node": "n1", "boot": "b", "running": False, "enabled": True, "run": []}])
def test_an_answer_that_is_not_one_is_refused(body):
    with pytest.raises(ValueError):
        AcceptanceAnswer.of(body)


# -- the agent's routes, over HTTP ------------------------------------------------------------------------------------

class _NodeState:
    """The wants and clears the agent's liaison takes (its node-state owner's side of the agent)."""

    def __init__(self):
        self.said: list[tuple] = []

    def want(self, owner: str, reason: str):
        self.said.append(("want", owner, reason))

    def clear(self, owner: str):
        self.said.append(("clear", owner))


def _agent(tmp_path: Path, acceptance: str, role: str = "worker") -> SimpleNamespace:
    credential = tmp_path / "agent-credential"
    create_credential(credential)
    (tmp_path / "boot_id").write_text("boot-1\n")
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nname = "n1"\nstate_dir = "{tmp_path}/state"\nruntime_dir = "{tmp_path}/run"\n'
                    f'boot_id_file = "{tmp_path}/boot_id"\nagent_credential = "{credential}"\n\n{acceptance}')
    loaded = config.load(path)
    return SimpleNamespace(config=loaded, role=role, node="n1", liaison=_NodeState())


@pytest.fixture
def served(tmp_path):
    """(agent, client, port) of the agent's HTTP server on 127.0.0.1; its config's [acceptance] is set by
    `agent.config = ...` (a reload)."""
    agent = _agent(tmp_path, "[acceptance]\nenabled = false\n")
    guard, runs = Guard(agent), AcceptanceRuns(agent)
    server = ProbeServer("127.0.0.1", 0, agent_routes(agent, guard, runs), post=agent_posts(agent, guard, runs)).start()
    port = server.address[1]
    client = AgentClient(agent.config.node.agent_credential, port, timeout=5.0)
    try:
        yield agent, client, port
    finally:
        server.close()


def _links(agent, tmp_path: Path, *interfaces: str) -> None:
    """[acceptance] on, its one quick test the links of `interfaces`, as a reloaded config."""
    agent.config = _agent(tmp_path, "[acceptance]\nenabled = true\nareas = [\"network\"]\n" + "".join(
        f"[acceptance.interfaces.{name}]\n" for name in interfaces)).config


def _ended(client: AgentClient, trigger: str = "repair") -> AcceptanceAnswer:
    return wait_for("the asked run kept", lambda: (a := client.acceptance("n1", "127.0.0.1", trigger)).run is not None
                    and not a.running and a, 60, interval=0.1)


def test_a_node_with_acceptance_off_says_so_and_refuses_a_run(served):
    agent, client, port = served
    answer = client.acceptance("n1", "127.0.0.1")
    assert (answer.node, answer.boot, answer.enabled, answer.running, answer.run) == ("n1", "boot-1", False, False, None)
    assert client.run_acceptance("n1", "quick", "repair", "127.0.0.1") is False
    with pytest.raises(AgentAnswerError, match="not asked: level 'thorough'"):
        client.run_acceptance("n1", "thorough", "repair", "127.0.0.1")
    with pytest.raises(AgentAnswerError, match="not asked: trigger 'later'"):
        client.acceptance("n1", "127.0.0.1", "later")


def test_without_the_credential_the_routes_answer_401(served, tmp_path):
    agent, _, port = served
    other = tmp_path / "other-credential"
    create_credential(other)
    stranger = AgentClient(str(other), port, timeout=5.0)
    for ask in (lambda: stranger.acceptance("n1", "127.0.0.1"),
                lambda: stranger.run_acceptance("n1", "quick", "repair", "127.0.0.1")):
        with pytest.raises(AgentAnswerError) as caught:
            ask()
        assert caught.value.status == 401
    assert not (Path(agent.config.node.state_dir) / "acceptance").exists()


def test_a_failed_run_asked_by_the_controller_drains_through_the_agents_owner_and_a_pass_lifts_it(served, tmp_path):
    agent, client, _ = served
    _links(agent, tmp_path, "lo", "nosuch0")
    assert client.run_acceptance("n1", "quick", "repair", "127.0.0.1") is True
    failed = _ended(client)
    assert (failed.verdict, failed.run["trigger"], failed.run["boot_id"], failed.run["level"]) == \
        ("fail", "repair", "boot-1", "quick")
    assert [(r["target"], r["outcome"]) for r in failed.run["results"]] == [("lo", "pass"), ("nosuch0", "fail")]
    (said, owner, reason), = agent.liaison.said
    assert (said, owner) == ("want", "acceptance") and reason.startswith("acceptance quick failed: network-links "
                                                                         "nosuch0: ") and reason.endswith(" action=reboot")
    assert "no such interface (expected up)" in reason

    _links(agent, tmp_path, "lo")
    assert client.run_acceptance("n1", "standard", "manual", "127.0.0.1") is True
    passed = _ended(client, "manual")
    assert (passed.verdict, passed.run["level"]) == ("pass", "standard")
    assert agent.liaison.said[-1] == ("clear", "acceptance")
    assert client.acceptance("n1", "127.0.0.1", "repair").verdict == "fail"  # the last run of each trigger is kept
    told = [(e.event, e.fields.get("trigger")) for e in read_events(agent.config.node.state_dir)
            if e.event in ("acceptance-drain", "acceptance-cleared")]
    assert told == [("acceptance-drain", "repair"), ("acceptance-cleared", "manual")]


def test_a_run_is_refused_while_another_process_holds_the_node(served, tmp_path):
    """An operator's `accept run` (or a job of `accept cluster`) holds the runner's lock: the POST says so at once."""
    agent, client, _ = served
    _links(agent, tmp_path, "lo")
    with _node_lock(agent.config.node.runtime_dir):
        assert client.run_acceptance("n1", "quick", "repair", "127.0.0.1") is False
        assert client.acceptance("n1", "127.0.0.1").running is False
    assert client.run_acceptance("n1", "quick", "repair", "127.0.0.1") is True
    assert _ended(client).verdict == "pass"


def test_while_the_agents_run_goes_on_it_says_so_and_takes_no_other(served, tmp_path, monkeypatch):
    """The run itself held until the test lets it end (the runner's tests are in the test above): the agent's
    answers meanwhile."""
    agent, client, _ = served
    _links(agent, tmp_path, "lo")
    release = threading.Event()

    def held(config, node, level, trigger, node_state, began):
        began()
        release.wait(30)
        return "pass"
    monkeypatch.setattr(plugins, "run_acceptance", held)
    assert client.run_acceptance("n1", "quick", "repair", "127.0.0.1") is True
    assert client.acceptance("n1", "127.0.0.1").running is True
    assert client.run_acceptance("n1", "quick", "cluster", "127.0.0.1") is False
    release.set()
    wait_for("the run over", lambda: not client.acceptance("n1", "127.0.0.1").running, 10, interval=0.05)


def test_only_a_workers_agent_runs_acceptance(tmp_path):
    agent = _agent(tmp_path, "[acceptance]\nenabled = true\n", role="controller")
    code, said, _ = http._run_acceptance(agent, "level=quick&trigger=repair", AcceptanceRuns(agent),
                                         http.AnswerWorker("test"))
    assert code == 409 and b"this is the controller agent" in said


# -- a failed run's drain is a fault to repair ------------------------------------------------------------------------

def _drained(reason: str) -> Node:
    return Node("n1", "IDLE", frozenset({"DRAIN"}), f"{REASON_PREFIX} {reason}", "root", gres="gpu:h200:4")


def test_an_acceptance_drain_is_a_fault_named_by_its_test_with_its_gpu_and_action():
    fault = recommend.fault_of(_drained(drain_reason(_run(H2D_PASS, MEMORY_FAIL))))
    assert (fault.signature, fault.action, fault.gpu) == ("acceptance/gpu-memory", "reset-gpu", 1)
    assert fault.evidence.startswith("acceptance quick: gpu-memory gpu 1: ") and "3 bad bytes at 0x7f0000000000" in \
        fault.evidence


def test_a_node_wide_failure_names_no_gpu_and_more_failures_are_counted():
    links = Result("network-links", "network", "ib0", "fail", "ib0: down (expected up)", (), 0.1, "reboot")
    reason = drain_reason(_run(links, MEMORY_FAIL, level="standard"))
    fault = recommend.fault_of(_drained(reason))
    assert (fault.signature, fault.action, fault.gpu) == ("acceptance/network-links", "reboot", None)
    assert fault.evidence.endswith("(+1 failed)") and reason.endswith("action=reboot")


def test_an_acceptance_fault_is_recommended_and_a_health_drain_is_still_healths():
    node = _drained(drain_reason(_run(MEMORY_FAIL)))
    changes = recommend.plan([], [node], {"n1": [42]}, RepairSection(), {}, time.time())
    assert [(c.kind, c.record.signature, c.record.action, c.record.detail, c.record.jobs) for c in changes] == \
        [("new", "acceptance/gpu-memory", "reset-gpu", {"gpu": 1}, [42])]
    xid = recommend.fault_of(_drained("xid 79 gpu 2 GPU has fallen off the bus action=reboot"))
    assert (xid.signature, xid.gpu) == ("xid/79", 2)

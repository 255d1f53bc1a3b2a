"""Issue 29 item 6: no decision is a dead end. A rejected recommendation can be reopened (`repair reopen`), the
refusal to approve a rejected one says how, and `repair unpause` when nothing is paused says so and records nothing.
On a real SQLite store, and through the real CLI on a config that names it."""

from __future__ import annotations

import pytest

from helpers.cli import cli
from slurm_ext.repair import decide
from slurm_ext.repair.settings import RepairSection
from slurm_ext.repair.store import Record, open_sqlite


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "state" / "repair.db"))
    yield opened
    opened.close()


def _recommend(store, node: str, now: float = 1000.0) -> Record:
    with store.locked():
        return store.add(Record(node, "xid/79", "reboot", "79 gpu 1", opened=now, updated=now, detail={"gpu": 1}))


def test_a_rejected_recommendation_is_reopened_recorded_and_then_approved(store):
    _recommend(store, "n1")
    decide.reject(store, "n1", "bob", "vendor on site tomorrow", now=1100.0)
    with pytest.raises(decide.DecisionRefused, match=r"rejected by bob .*vendor on site tomorrow.*"
                                                     r"`slurm-ext repair reopen n1`"):
        decide.approve(store, "n1", "alice", RepairSection(), 10)
    record = decide.reopen(store, "n1", "carol", now=1200.0)
    assert (record.state, record.decided_by, record.decided_at, record.note) == ("recommended", "", None, "")
    assert record.closed is None and store.records(node="n1", open_only=True)[0].state == "recommended"
    reopened = store.events(node="n1")[-1]
    assert (reopened.event, reopened.user, reopened.time, reopened.record) == ("repair-reopened", "carol", 1200.0,
                                                                               record.id)
    assert "reopened by carol" in reopened.message and "rejected by bob" in reopened.message \
        and "vendor on site tomorrow" in reopened.message, reopened.message
    approved, _ = decide.approve(store, "n1", "alice", RepairSection(), 10)
    assert (approved.state, approved.decided_by) == ("approved", "alice")


def test_only_a_rejected_recommendation_is_reopened_and_the_refusal_says_why(store):
    with pytest.raises(decide.DecisionRefused, match="no rejected recommendation to reopen"):
        decide.reopen(store, "n1", "carol")
    _recommend(store, "n1")
    with pytest.raises(decide.DecisionRefused, match="awaits approval already"):
        decide.reopen(store, "n1", "carol")
    decide.approve(store, "n1", "alice", RepairSection(), 10)
    with pytest.raises(decide.DecisionRefused, match="already approved by alice"):
        decide.reopen(store, "n1", "carol")
    assert [e.event for e in store.events(node="n1")] == ["repair-approved"]


def test_unpause_when_not_paused_says_so_and_records_nothing(store):
    assert decide.unpause(store, "carol") is False
    assert store.events() == [] and decide.paused(store) is None
    decide.pause(store, "carol", now=10.0)
    assert decide.pause(store, "dave", now=11.0) is False  # already paused: carol's pause stands, nothing recorded
    assert decide.paused(store) == ("carol", 10.0)
    assert decide.unpause(store, "carol", now=12.0) is True
    assert [(e.event, e.user) for e in store.events()] == [("repair-paused", "carol"), ("repair-unpaused", "carol")]


def _config(tmp_path) -> str:
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[repair]\ndatabase = "sqlite"\n'
                    f'sqlite_file = "{tmp_path}/state/repair.db"\n')
    return str(path)


def test_the_cli_reopens_and_unpause_when_not_paused_exits_0_saying_so(store, tmp_path):
    conf = _config(tmp_path)
    _recommend(store, "n1")
    decide.reject(store, "n1", "bob", "vendor on site tomorrow")
    reopened = cli("--config", conf, "repair", "reopen", "n1", env={"SUDO_USER": "carol"})
    assert reopened.returncode == 0, reopened.stderr
    assert "reopened reboot of node n1" in reopened.stdout and "repair approve n1" in reopened.stdout
    assert store.records(node="n1", open_only=True)[0].state == "recommended"
    assert store.events(node="n1")[-1].user == "carol"
    again = cli("--config", conf, "repair", "reopen", "n1")
    assert again.returncode == 1 and "awaits approval already" in again.stderr, again.stderr
    before = len(store.events())
    unpause = cli("--config", conf, "repair", "unpause")
    assert unpause.returncode == 0 and "repair is not paused: nothing to do" in unpause.stdout, unpause
    assert len(store.events()) == before

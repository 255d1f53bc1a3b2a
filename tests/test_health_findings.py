"""`Findings`: observations kept over time with explicit `now` values: hold before a polled condition is a
finding, quiet before it clears (no storm from a flapping fault), events at once, repeats counted, escalation
in place, sticky findings kept, an operator's drop, and the JSON round trip a restarted monitor relies on."""

from __future__ import annotations

import dataclasses
import json

from slurm_ext.health.findings import FindingChange, Finding, Findings
from slurm_ext.health.records import Gpu, Observation
from slurm_ext.health.settings import HealthSection

GPU0 = Gpu(0, "GPU-0a1b2c3d-0000-4000-8000-000000000000", "00000000:17:00.0", 0, "NVIDIA H200")
GPU1 = Gpu(1, "GPU-0a1b2c3d-1111-4000-8000-000000000001", "00000000:2A:00.0", 1, "NVIDIA H200")


def params(check: str, **changes):
    return dataclasses.replace(HealthSection().params(check), **changes)


def obs(check: str = "temperature", gpu: Gpu = GPU0, severity: str = "warning", action: str = "failover",
        evidence: str = "temperature 88C (limit 87C: slowdown 87C - 0C)", **kw) -> Observation:
    return Observation(check, gpu.uuid, severity, action, evidence, gpu=gpu, pci_bus_id=gpu.pci_bus_id, **kw)


def no_jobs(_obs) -> list:
    return []


def kinds(changes: list[FindingChange]) -> list[str]:
    return [c.kind for c in changes]


TEMP = params("temperature", hold=30.0, quiet=60.0)


# -- polled: hold -----------------------------------------------------------------------------------

def test_polled_condition_becomes_a_finding_only_after_hold():
    findings = Findings()
    assert findings.polled(TEMP, [obs()], 100.0, no_jobs) == []
    assert findings.open() == []
    assert findings.polled(TEMP, [obs()], 110.0, no_jobs) == []
    assert findings.polled(TEMP, [obs()], 129.9, no_jobs) == []
    changes = findings.polled(TEMP, [obs()], 130.0, lambda o: ["1002", "1001"])
    assert kinds(changes) == ["opened"]
    found = changes[0].finding
    assert (found.check, found.subject, found.severity, found.action) == ("temperature", GPU0.uuid, "warning",
                                                                          "failover")
    assert (found.first_seen, found.last_seen, found.opened) == (100.0, 130.0, 130.0)
    assert (found.gpu, found.uuid, found.pci_bus_id, found.polled) == (0, GPU0.uuid, GPU0.pci_bus_id, True)
    assert found.jobs == ["1001", "1002"]
    assert found.reason == "temperature temperature 88C (limit 87C: slowdown 87C - 0C) action=failover"
    assert findings.open() == [found]
    # still there: no new change
    assert findings.polled(TEMP, [obs()], 140.0, no_jobs) == []
    assert found.count == 1 and found.last_seen == 140.0


def test_zero_hold_opens_at_once():
    findings = Findings()
    assert kinds(findings.polled(params("ecc"), [obs("ecc", severity="critical", action="reset-gpu",
                                                     evidence="2 uncorrectable ecc errors (volatile) (limit 0)")],
                                 5.0, no_jobs)) == ["opened"]


def test_gone_before_hold_is_nothing():
    findings = Findings()
    asked = []
    assert findings.polled(TEMP, [obs()], 100.0, lambda o: asked.append(o) or []) == []
    assert findings.polled(TEMP, [], 120.0, no_jobs) == []
    assert findings.by_key == {} and findings.open() == []
    # back again: its hold starts over
    assert findings.polled(TEMP, [obs()], 125.0, no_jobs) == []
    assert findings.polled(TEMP, [obs()], 150.0, no_jobs) == []
    assert kinds(findings.polled(TEMP, [obs()], 155.0, no_jobs)) == ["opened"]
    assert findings.open()[0].first_seen == 125.0
    assert asked == []  # jobs are asked only when a finding opens


# -- polled: quiet, flapping --------------------------------------------------------------------------

def _opened(findings: Findings, now: float = 100.0) -> Finding:
    findings.polled(TEMP, [obs()], now, no_jobs)
    return findings.polled(TEMP, [obs()], now + TEMP.hold, no_jobs)[0].finding


def test_open_finding_clears_only_after_quiet():
    findings = Findings()
    found = _opened(findings)  # last seen at 130
    assert findings.polled(TEMP, [], 140.0, no_jobs) == []
    assert findings.polled(TEMP, [], 189.9, no_jobs) == []
    assert findings.open() == [found]
    changes = findings.polled(TEMP, [], 190.0, no_jobs)
    assert [(c.kind, c.why) for c in changes] == [("cleared", "quiet")]
    assert changes[0].finding is found
    assert findings.open() == [] and findings.by_key == {}


def test_flapping_condition_is_one_finding():
    findings = Findings()
    p = params("temperature", hold=0.0, quiet=60.0)
    changes = []
    for step in range(60):  # 10 minutes: 20 s present, 10 s away, over and over
        now = 1000.0 + step * 10.0
        changes += findings.polled(p, [obs()] if step % 3 != 2 else [], now, no_jobs)
    assert kinds(changes) == ["opened"]
    last = 1000.0 + 58 * 10.0  # the last step with the condition
    assert findings.polled(p, [], last + 59.0, no_jobs) == []
    assert kinds(findings.polled(p, [], last + 60.0, no_jobs)) == ["cleared"]


def test_polled_escalates_in_place():
    findings = Findings()
    found = _opened(findings)
    worse = obs(severity="critical", action="reboot", evidence="temperature 99C (limit 87C: slowdown 87C - 0C)",
                detail="hot", fields={"t": 99})
    changes = findings.polled(TEMP, [worse], 140.0, no_jobs)
    assert [(c.kind, c.why) for c in changes] == [
        ("escalated", "warning action=failover: temperature 88C (limit 87C: slowdown 87C - 0C)")]
    assert changes[0].finding is found
    assert (found.severity, found.action, found.evidence) == ("critical", "reboot", worse.evidence)
    assert (found.detail, found.fields, found.opened) == ("hot", {"t": 99}, 130.0)
    # a milder reading does not take it back down, and is no change
    assert findings.polled(TEMP, [obs()], 150.0, no_jobs) == []
    assert (found.severity, found.action) == ("critical", "reboot")
    # a worse action at the same severity escalates too
    assert kinds(findings.polled(TEMP, [obs(severity="critical", action="remove")], 160.0, no_jobs)) == ["escalated"]


def test_polled_leaves_other_checks_and_subjects_alone():
    findings = Findings()
    ecc = params("ecc")
    findings.polled(ecc, [obs("ecc", severity="critical", action="reset-gpu", evidence="1 (limit 0)")], 0.0, no_jobs)
    _opened(findings)
    # temperature now judges only GPU1 hot: GPU0's temperature finding waits its quiet; ecc's is not touched
    findings.polled(TEMP, [obs(gpu=GPU1)], 140.0, no_jobs)
    keys = set(findings.by_key)
    assert keys == {("ecc", GPU0.uuid), ("temperature", GPU0.uuid), ("temperature", GPU1.uuid)}
    changes = findings.polled(TEMP, [obs(gpu=GPU1)], 500.0, no_jobs)
    assert [(c.kind, c.finding.subject) for c in changes] == [("opened", GPU1.uuid), ("cleared", GPU0.uuid)]
    assert ("ecc", GPU0.uuid) in findings.by_key


def test_open_lists_oldest_first():
    findings = Findings()
    p = params("temperature", hold=0.0)
    findings.polled(p, [obs(gpu=GPU1)], 10.0, no_jobs)
    findings.polled(p, [obs(gpu=GPU1), obs(gpu=GPU0)], 20.0, no_jobs)
    assert [f.subject for f in findings.open()] == [GPU1.uuid, GPU0.uuid]


# -- events -----------------------------------------------------------------------------------------

XIDP = params("xid")


def xid_obs(number: int = 13, severity: str = "warning", action: str = "restart-job", sticky: bool = False,
            **kw) -> Observation:
    return Observation("xid", f"{GPU0.uuid}/xid{number}", severity, action,
                       kw.pop("evidence", f"{number} gpu 0 X (expected none)"), gpu=GPU0,
                       pci_bus_id=GPU0.pci_bus_id, detail=f"NVRM: Xid (PCI:0000:17:00): {number}", sticky=sticky,
                       fields={"xid": number}, **kw)


def test_event_opens_at_once_and_repeats_are_counted():
    findings = Findings()
    changes = findings.event(XIDP, xid_obs(), 1000.0, lambda o: ["77"])
    assert kinds(changes) == ["opened"]
    found = changes[0].finding
    assert (found.opened, found.count, found.polled, found.jobs) == (1000.0, 1, False, ["77"])
    assert found.fields == {"xid": 13}
    assert findings.event(XIDP, xid_obs(), 1010.0, no_jobs) == []
    assert findings.event(XIDP, xid_obs(), 1020.0, no_jobs) == []
    assert (found.count, found.first_seen, found.last_seen, found.opened) == (3, 1000.0, 1020.0, 1000.0)
    assert findings.open() == [found]


def test_event_escalates_in_place():
    findings = Findings()
    found = findings.event(XIDP, xid_obs(), 1000.0, no_jobs)[0].finding
    worse = xid_obs(severity="critical", action="reboot", sticky=True,
                    evidence="13 gpu 0 X, 3 in 1h (limit 2) (expected none)")
    changes = findings.event(XIDP, worse, 1100.0, no_jobs)
    assert [(c.kind, c.why) for c in changes] == [("escalated", "warning action=restart-job: 13 gpu 0 X (expected "
                                                                "none)")]
    assert changes[0].finding is found
    assert (found.severity, found.action, found.sticky, found.count) == ("critical", "reboot", True, 2)
    assert found.evidence == worse.evidence
    # the same again, or milder: counted, no change
    assert findings.event(XIDP, worse, 1200.0, no_jobs) == []
    assert findings.event(XIDP, xid_obs(), 1300.0, no_jobs) == []
    assert (found.severity, found.count) == ("critical", 4)


def test_event_expires_after_quiet_unless_sticky():
    findings = Findings()
    findings.event(XIDP, xid_obs(13), 1000.0, no_jobs)
    findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1000.0, no_jobs)
    quiet = {"xid": 600.0}.__getitem__
    assert findings.expire(quiet, 1599.0) == []
    findings.event(XIDP, xid_obs(13), 1500.0, no_jobs)  # a repeat starts the quiet window again
    assert findings.expire(quiet, 2000.0) == []
    changes = findings.expire(quiet, 2100.0)
    assert [(c.kind, c.why, c.finding.subject) for c in changes] == [("cleared", "quiet", f"{GPU0.uuid}/xid13")]
    # sticky: a day, a week later, still open
    assert findings.expire(quiet, 1000.0 + 86400.0 * 7) == []
    assert [f.subject for f in findings.open()] == [f"{GPU0.uuid}/xid79"]


def test_expire_leaves_polled_findings_to_polled():
    findings = Findings()
    _opened(findings)
    assert findings.expire(lambda check: 0.0, 10_000.0) == []
    assert len(findings.open()) == 1


def test_escalation_to_sticky_stops_expiry():
    findings = Findings()
    findings.event(XIDP, xid_obs(), 1000.0, no_jobs)
    findings.event(XIDP, xid_obs(severity="critical", action="reboot", sticky=True), 1001.0, no_jobs)
    assert findings.expire(lambda check: 600.0, 100_000.0) == []


# -- drop ------------------------------------------------------------------------------------------

def test_drop_clears_for_the_operator():
    findings = Findings()
    findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1000.0, no_jobs)
    findings.event(XIDP, xid_obs(13), 1000.0, no_jobs)
    findings.polled(TEMP, [obs()], 1000.0, no_jobs)  # pending, not yet a finding
    changes = findings.drop(lambda f: f.subject != f"{GPU0.uuid}/xid79", "operator")
    assert [(c.kind, c.why, c.finding.subject) for c in changes] == [("cleared", "operator", f"{GPU0.uuid}/xid79")]
    assert set(findings.by_key) == {("xid", f"{GPU0.uuid}/xid13"), ("temperature", GPU0.uuid)}
    # dropping a pending condition is silent: it never was a finding
    changes = findings.drop(lambda f: f.check != "temperature", "disabled")
    assert changes == [] and set(findings.by_key) == {("xid", f"{GPU0.uuid}/xid13")}
    assert kinds(findings.drop(lambda f: False, "reboot")) == ["cleared"]
    assert findings.by_key == {}
    # a dropped sticky Xid that comes again is a new finding
    assert kinds(findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 2000.0, no_jobs)) == \
        ["opened"]


def test_an_operators_clear_names_who_and_the_finding_its_signature():
    """Issue 29 item 6: the clear carries who asked (the monitor's health-cleared event names them), and a finding
    names its fault as its repair record does (xid/79), so the event says which fault was cleared."""
    findings = Findings()
    findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1000.0, no_jobs)
    findings.polled(params("temperature", hold=0.0), [obs()], 1000.0, no_jobs)
    assert sorted(f.signature for f in findings.open()) == ["temperature", "xid/79"]
    changes = findings.drop(lambda f: f.check != "xid", "operator", "alice")
    assert [(c.why, c.by, c.finding.signature) for c in changes] == [("operator", "alice", "xid/79")]
    assert [c.by for c in findings.drop(lambda f: False, "disabled")] == [""]


# -- persistence ----------------------------------------------------------------------------------

def test_json_round_trip():
    findings = Findings()
    findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1000.0, lambda o: ["5", "4"])
    findings.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1001.0, no_jobs)
    findings.polled(TEMP, [obs()], 1000.0, no_jobs)  # pending
    findings.polled(params("gpu-count"), [Observation("gpu-count", "node", "critical", "reboot",
                                                      "1 gpus, missing GPU-x (expected 2)",
                                                      fields={"missing": ["GPU-x"]})], 1000.0, no_jobs)
    data = json.loads(json.dumps(findings.to_json()))
    restored = Findings.from_json(data)
    assert restored.by_key == findings.by_key
    assert restored.open() == findings.open()
    xid79 = restored.by_key[("xid", f"{GPU0.uuid}/xid79")]
    assert (xid79.count, xid79.jobs, xid79.sticky, xid79.polled, xid79.gpu) == (2, ["4", "5"], True, False, 0)
    # a restarted monitor neither reports the open finding again nor forgets the pending one's hold
    assert restored.event(XIDP, xid_obs(79, "critical", "reboot", sticky=True), 1100.0, no_jobs) == []
    assert restored.polled(TEMP, [obs()], 1029.0, no_jobs) == []
    assert kinds(restored.polled(TEMP, [obs()], 1030.0, no_jobs)) == ["opened"]
    assert restored.polled(params("gpu-count"), [Observation("gpu-count", "node", "critical", "reboot", "same")],
                           1040.0, no_jobs) == []


def test_from_json_takes_what_it_knows():
    data = Findings([Finding("xid", "s", "warning", "none", "e (expected none)", 1.0, 2.0, opened=1.0)]).to_json()
    data[0]["added_later"] = "ignored"
    restored = Findings.from_json([*data, "not a finding", 42, None])
    assert list(restored.by_key) == [("xid", "s")]
    assert restored.by_key[("xid", "s")].opened == 1.0
    assert Findings.from_json([]).by_key == {}

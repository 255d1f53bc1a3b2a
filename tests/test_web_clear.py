"""The review of 29: a finding's "clear" on the Health checks tab clears that finding, not every finding of its check
on the node. Each open finding is named by its subject (`<uuid>/xid48`, a mount point, an interface): the page
passes it to the node's agent as it is, and the agent takes it (over the agent credential, bounded, no control
character)."""

from __future__ import annotations

from types import SimpleNamespace

from slurm_ext.agentapi import ClearAnswer
from test_web import TOKEN, page  # noqa: F401 (the page over literal records, its fixture)

UUID = "GPU-6a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d"


def test_the_clear_of_one_open_finding_names_its_subject_to_the_agent(page):  # noqa: F811
    asked = []

    def clear_findings(node, by, check="", subject="", addr="", timeout=None):
        asked.append((node, by, check, subject))
        return ClearAnswer(True, 0.1)
    page.watcher.agent_client.clear_findings = clear_findings
    headers = {"Authorization": f"Bearer {TOKEN}", "X-CSRF-Token": page.get("/api/session").get_json()["csrf"]}
    # xid 48 on a GPU that also has an xid 79 open (a reboot's): the row's clear names the xid 48 finding alone
    answer = page.post("/api/nodes/n2/clear", headers=headers, json={"check": "xid", "subject": f"{UUID}/xid48"})
    assert answer.status_code == 200, answer.get_json()
    assert asked[-1] == ("n2", "alice", "xid", f"{UUID}/xid48")
    # one file system of several: its mount point
    answer = page.post("/api/nodes/n2/clear", headers=headers, json={"check": "filesystem", "subject": "/scratch"})
    assert answer.status_code == 200 and asked[-1][3] == "/scratch", answer.get_json()
    # the command line's --gpu still names a GPU
    answer = page.post("/api/nodes/n2/clear", headers=headers, json={"check": "xid", "gpu": "1"})
    assert answer.status_code == 200 and asked[-1][3] == "1"
    for bad in ({"subject": "a\nb"}, {"subject": "x" * 300}, {"subject": "1", "gpu": "2"}):
        answer = page.post("/api/nodes/n2/clear", headers=headers, json={"check": "xid", **bad})
        assert answer.status_code == 400, (bad, answer.get_json())
    assert len(asked) == 3


def test_the_agent_takes_a_findings_subject_and_refuses_control_characters(tmp_path):
    from urllib.parse import urlencode

    from slurm_ext.supervisor import http
    agent = SimpleNamespace(poll_health_now=lambda: False,
                            config=SimpleNamespace(node=SimpleNamespace(state_dir=str(tmp_path))))
    worker = SimpleNamespace(busy=False)
    for subject in (f"{UUID}/xid48", "/scratch", "ib0", "1"):
        status = http._clear(agent, urlencode({"by": "alice", "check": "xid", "gpu": subject}), worker)[0]
        assert status == 409, subject  # taken; refused only because no monitor runs in this test
    for subject in ("a\nb", "x" * 300):
        status = http._clear(agent, urlencode({"by": "alice", "check": "xid", "gpu": subject}), worker)[0]
        assert status == 400, subject

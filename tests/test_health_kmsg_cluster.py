"""Issue 26 on the real dev cluster: kernel-log lines a user cannot forge, and what one source can cost.

The session cluster's monitor reads a kernel log of its own (test_health_cluster's docstring says why); these
tests put into it the records the real /dev/kmsg gave for a user's forgeries, exactly as read, and after them a
line of the driver's whose finding is the sign that the monitor judged everything before it. The journal then
shows what the forgeries and floods cost: no finding and no drain for a user's records; one node finding and a
handful of events for a thousand Xid lines of bus ids no GPU has; one warning, never a drain, for a crash's burst.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid

import pytest

from slurm_ext.health.checks.xid import BURST
from slurm_ext.health.kmsg import KernelLog, facility_of
from slurm_ext.health.monitor import load_state, metrics_path

from helpers.wait import wait_for
from test_health_cluster import Health, _journal, health  # noqa: F401 (health: the cluster monitor's fixture)

pytestmark = pytest.mark.cluster


def _domain() -> str:
    """A PCI domain no GPU has, unique to this run."""
    return f"{random.Random(uuid.uuid4().hex).randrange(0x1000, 0xFFFF):04x}"


def _from_dev_kmsg(make_records, tokens: list[str], timeout: float = 5.0) -> list[str]:
    """The records the real /dev/kmsg gives for what `make_records()` does, one per token, as KernelLog reads them."""
    log = KernelLog("/dev/kmsg")
    log.open()
    try:
        make_records()
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(found) < len(tokens):
            for line in log.lines(0.5):
                found.update({token: line for token in tokens if token in line and token not in found})
    finally:
        log.close()
    assert len(found) == len(tokens), f"not in /dev/kmsg: {set(tokens) - set(found)}"
    return [found[token] for token in tokens]


def _append(health: Health, records: list[str]) -> None:
    with open(health.layout.kernel_log, "a") as log:
        log.write("".join(record + "\n" for record in records))


def _sentinel(health: Health) -> dict:
    """A line of the driver's after everything else: once its finding is in the journal, the monitor has judged
    every line before it (one reader, one queue, in order)."""
    marker = uuid.uuid4().hex[:8]
    health.kmsg(f"NVRM: Xid (PCI:0000:20:00): 43, pid=1, name=sentinel-{marker}, Ch 00000008")
    return health.wait_event("health-finding", check="xid", xid=43, timeout=60)


def _xid_lines(health: Health, xid: int, uuid_: str) -> int:
    """The Xid `xid` lines of GPU `uuid_` the monitor has judged, as its readings (written every poll) count them."""
    try:
        data = json.loads(metrics_path(str(health.layout.runtime_dir)).read_text())
    except (OSError, ValueError):
        return 0
    return sum(e.get("count", 0) for e in data.get("xid_counts") or () if e.get("xid") == xid and e.get("uuid") == uuid_)


def _judged(health: Health, xid: int, uuid_: str, lines: int) -> int:
    """Wait until the monitor has judged `lines` lines of Xid `xid` on that GPU; returns the count."""
    return wait_for(f"the monitor judging {lines} Xid {xid} lines", lambda: (lambda n: n if n >= lines else None)(
        _xid_lines(health, xid, uuid_)), timeout=30, interval=0.1)


def _drains(health: Health) -> list[dict]:
    return health.events("drain", component="nodestate")


def test_a_users_records_in_dev_kmsg_and_the_failed_mount_trick_make_no_finding_and_no_drain(health):
    gpu = health.spec["gpus"][1]
    bus = gpu["pci_bus_id"].lower()[4:-2]  # 00000000:18:00.0 -> 0000:18:00, as the driver writes it
    tag, domain = uuid.uuid4().hex[:12], _domain()
    echoed = f"NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus. {tag}"
    mount_option = f"NVRM: Xid (PCI:{domain}:3b:00): 79, pid=1, GPU has fallen off the bus."

    def forge():
        with open("/dev/kmsg", "w") as kmsg:  # root's echo, "<3>" asking for level err: the kernel makes it user's
            kmsg.write(f"<3>{echoed}\n")
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "unshare", "-Urm",
                               "mount", "-t", "tmpfs", "-o", mount_option, "none", "/mnt"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode != 0, done
    records = _from_dev_kmsg(forge, [tag, f"PCI:{domain}:3b:00"])
    assert [facility_of(record) for record in records] == [1, 0], records  # user's echo; the kernel's tmpfs line
    assert records[1].split(";", 1)[1].startswith("tmpfs: Unknown parameter 'NVRM: Xid"), records
    mark = len(_journal(health.layout))
    _append(health, records)  # the monitor reads them as the kernel gave them, heads and all
    _sentinel(health)
    after = _journal(health.layout)[mark:]
    findings = [e for e in after if e["event"] == "health-finding"]
    assert [f["xid"] for f in findings] == [43], findings
    assert not _drains(health) and health.reason() == ""


def test_a_thousand_xid_lines_for_bus_ids_no_gpu_has_cost_one_node_finding_and_a_bounded_journal(health):
    domains = random.Random(uuid.uuid4().hex).sample(range(0x1000, 0xFFFF), 1000)
    records = [f"3,{i},{i},-;NVRM: Xid (PCI:{d:04x}:{i % 256:02x}:00): {(79, 13, 48, 999)[i % 4]}, pid={i}, "
               "name=flood, GPU has fallen off the bus." for i, d in enumerate(domains)]
    series_before = set(load_state(str(health.layout.node_state)).get("xid_counts", {}))
    mark = len(_journal(health.layout))
    _append(health, records)
    _sentinel(health)
    after = _journal(health.layout)[mark:]
    findings = [e for e in after if e["event"] in ("health-finding", "health-escalated") and e.get("check") == "xid"]
    assert [(e["event"], e["subject"]) for e in findings if e["xid"] != 43] == [("health-finding", "node/xid")], \
        findings
    assert findings[0]["finding_severity"] == "critical" and findings[0]["action"] == "reboot"
    assert len(after) <= 12, [f"{e['event']}: {e['message']}" for e in after]
    health.wait_reason(lambda r: r.startswith("slurm-ext: xid 79 bus "), "the node finding's drain")
    # the counts kept in the state (and the metrics) stay small: one series per Xid number for the node (the state
    # is the boot's: earlier tests' series are there too)
    state = load_state(str(health.layout.node_state))
    new_series = set(state.get("xid_counts", {})) - series_before
    assert new_series <= {"node/13", "node/48", "node/79", "node/999", f"{health.spec['gpus'][2]['uuid']}/43"}, \
        new_series
    assert len(json.dumps(state)) < 64 * 1024


def test_one_processs_burst_of_xid13_lines_drains_nothing(health):
    """A crash prints a burst of Xid 13 lines (16 in 2 ms from one process in a real log): one fault, one warning.
    Faults of three processes on one GPU within the hour ask for diagnostics, still without a drain."""
    bus = health.spec["gpus"][0]["pci_bus_id"].lower()[4:-2]
    at = time.monotonic_ns() // 1000

    def burst(pid: str, n: int = 16) -> list[str]:
        return [f"4,{at + i},{at + i * 125},-;NVRM: Xid (PCI:{bus}): 13, pid={pid}, name=python3, Graphics SM Warp "
                f"Exception on (GPC 1, TPC 3, SM {i % 2}): Out Of Range Address" for i in range(n)]
    mark = len(_journal(health.layout))
    uuid_ = health.spec["gpus"][0]["uuid"]
    seen = _xid_lines(health, 13, uuid_)
    _append(health, burst("4242"))
    seen = _judged(health, 13, uuid_, seen + 16)
    _sentinel(health)
    after = _journal(health.layout)[mark:]
    thirteens = [e for e in after if e.get("check") == "xid" and e.get("xid") == 13]
    assert [(e["event"], e["finding_severity"], e["action"], e["repeats"]) for e in thirteens] == \
        [("health-finding", "warning", "restart-job", 1)], thirteens
    assert not _drains(health) and health.reason() == ""
    # two more processes crash on the same GPU (the driver's '<unknown>' pid: a burst is still one fault), each past
    # the BURST seconds of the one before (lines within them would be the same fault), counted from when the monitor
    # judged it: on a loaded machine it may read a burst a while after it was written
    time.sleep(BURST + 0.5)
    _append(health, burst("'<unknown>'"))
    _judged(health, 13, uuid_, seen + 16)
    time.sleep(BURST + 0.5)
    _append(health, burst("7777"))
    # escalated in place, or opened anew where the finding's quiet window (5 s here) ended between two bursts
    escalated = wait_for("the third fault's diagnostics warning", lambda: next(
        (e for e in health.events(check="xid", xid=13) if e["event"] in ("health-escalated", "health-finding")
         and e["action"] == "reset-gpu"), None), timeout=30)
    assert (escalated["finding_severity"], escalated["action"]) == ("warning", "reset-gpu"), escalated
    assert "3 faults in 1h:" in escalated["evidence"] and "diagnostics" in escalated["evidence"]
    assert escalated["expected"] == "at most 2 faults in 1h", escalated
    _sentinel(health)
    assert not _drains(health) and health.reason() == ""

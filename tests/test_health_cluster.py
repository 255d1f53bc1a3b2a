"""The health monitor on the real dev cluster: the worker agent's `health` worker, the fake NVML, the kernel's
records in the node's kernel log, and real Slurm drains through the node-state owner.

The session cluster's monitor reads a kernel log of its own (a file of /dev/kmsg records: user space cannot write a
record of facility kernel into the real one, and the monitor judges no other) and polls every second (conftest's
TEST_CLUSTER). Each test gives
it short windows through the config (rewritten, then SIGHUP to the worker agent, which passes it on) and puts the
cluster back as it was: the GPUs healthy, no finding open, the node idle.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from slurm_ext import devcluster as dev, events
from slurm_ext.devcluster import daemons, fakenvml, render
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.devcluster.layout import Layout

from helpers.wait import wait_for

pytestmark = pytest.mark.cluster

#: short windows, so that a test sees a finding open and clear in seconds (the defaults are minutes)
_FAST = """
[health.checks.gpu-lost]
quiet = "3s"
[health.checks.throttle]
window = "6s"
quiet = "3s"
[health.checks.temperature]
hold = "0s"
quiet = "2s"
[health.checks.persistence]
hold = "0s"
quiet = "2s"
[health.checks.pcie-link]
hold = "0s"
quiet = "2s"
[health.checks.nvlink]
hold = "0s"
quiet = "2s"
[health.checks.pcie-replay]
window = "4s"
quiet = "2s"
[health.checks.nvlink-errors]
window = "4s"
quiet = "2s"
[health.checks.fabric]
hold = "0s"
quiet = "2s"
[health.checks.xid]
quiet = "5s"
"""


def _agent_pid(layout: Layout) -> int:
    return int(layout.pidfile("supervise-worker").read_text().split()[0])


def _monitor_pid(layout: Layout) -> int | None:
    """The health worker: the worker agent's child whose command line is `... health monitor`."""
    agent = _agent_pid(layout)
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    for pid in map(int, children):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"health" in argv and b"monitor" in argv:
            return pid
    return None


def _monitor_off(config: str) -> str:
    """The cluster's slurm-ext.toml with health.enabled = false."""
    return config.replace("[health]\n", "[health]\nenabled = false\n", 1)


def _journal(layout: Layout) -> list[dict]:
    """The node journal's events; a last line still being written (no newline yet) is not one yet."""
    path = events.journal_path(str(layout.node_state))
    if not path.exists():
        return []
    text = path.read_text()
    whole = text if text.endswith("\n") else text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


class Health:
    """One test's handle on the cluster's monitor: faults in, events and drains out."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.layout = cluster.layout
        self.mark = len(_journal(self.layout))
        self.spec = fakenvml.default_gpus(cluster.settings.gpu_count, cluster.settings.gpu_name)
        #: the monitor runs a config of this test's own (restart-only keys): restore() starts one on the cluster's
        #: (a reload keeps poll intervals)
        self.restarted = False
        self._seq = 0

    def kmsg(self, line: str) -> None:
        """One kernel record into the node's kernel log, as /dev/kmsg gives the driver's: facility kernel, level err."""
        self._seq += 1
        with open(self.layout.kernel_log, "a") as log:
            log.write(f"3,{self._seq},{time.monotonic_ns() // 1000},-;{line}\n")

    def configure(self, extra: str = _FAST, health_keys: str = "", restart: bool = False) -> None:
        """The cluster's config with `health_keys` in its [health] table and `extra` tables after it, reloaded
        (SIGHUP to the agent, passed on to the monitor), or with `restart` taken by a new monitor."""
        head, table = render.slurm_ext_toml(self.layout).split("[health]\n", 1)
        table, rest = table.split("\n\n", 1)
        given = {line.split("=", 1)[0].strip() for line in health_keys.splitlines() if "=" in line}
        kept = [line for line in table.splitlines() if line.split("=", 1)[0].strip() not in given]
        text = f"{head}[health]\n{health_keys}" + "\n".join(kept) + "\n\n" + rest
        self.layout.slurm_ext_conf.write_text(text + extra)
        if restart:
            self.restarted = extra != _FAST or bool(health_keys)
            self.restart_monitor()
            return
        seen = self.count("reload", component="health")
        os.kill(_agent_pid(self.layout), signal.SIGHUP)
        wait_for("the monitor's reload", lambda: self.count("reload", component="health") > seen, timeout=15)

    def restart_monitor(self) -> int:
        old = _monitor_pid(self.layout)
        started = self.count("health-started")
        # a kill within supervisor.stable_after (2 s) of its start counts as a failed start: the agent would back
        # off, and 5 in 10 s are a crash loop
        time.sleep(max(0.0, 2.5 - (time.time() - psutil.Process(old).create_time())))
        os.kill(old, signal.SIGKILL)
        try:
            wait_for("the monitor restarted by the agent", lambda: self.count("health-started") > started, timeout=20)
        except AssertionError as err:
            said = [f"{e['time']} {e['event']}: {e['message']}" for e in _journal(self.layout)[-8:]]
            raise AssertionError(f"{err}; the journal ends:\n" + "\n".join(said)) from None
        return old

    def gpus(self, **changes) -> None:
        """Rewrite the fake GPUs: changes as gpu index -> dict of keys (None restores the healthy GPU)."""
        healthy = fakenvml.default_gpus(self.cluster.settings.gpu_count, self.cluster.settings.gpu_name)
        for index, keys in changes.items():
            number = int(index.removeprefix("gpu"))
            self.spec["gpus"][number] = healthy["gpus"][number] if keys is None else \
                {**self.spec["gpus"][number], **keys}
        fakenvml.write_spec(self.layout.gpu_spec, self.spec)

    def events(self, name: str | None = None, component: str | None = None, **fields) -> list[dict]:
        return [e for e in _journal(self.layout)[self.mark:]
                if (name is None or e["event"] == name) and (component is None or e["component"] == component)
                and all(e.get(k) == v for k, v in fields.items())]

    def count(self, name: str, **fields) -> int:
        return len(self.events(name, **fields))

    def wait_event(self, name: str, timeout: float = 15.0, **fields) -> dict:
        found = wait_for(f"event {name} {fields}", lambda: self.events(name, **fields), timeout=timeout)
        return found[0]

    def reason(self) -> str:
        node = self.cluster.client().node(self.cluster.node)
        return node.reason if node.drained else ""

    def wait_reason(self, test, what: str, timeout: float = 15.0) -> str:
        return wait_for(what, lambda: (lambda r: [r] if test(r) else None)(self.reason()), timeout=timeout,
                        interval=0.05)[0]

    def cli(self, *args: str, check: bool = True):
        return self.cluster.run(sys.executable, "-m", "slurm_ext.cli", "--config", str(self.layout.slurm_ext_conf),
                                *args, check=check)

    def restore(self) -> None:
        """Healthy GPUs, the cluster's own config, no finding left (the next test starts from a clean node)."""
        fakenvml.write_spec(self.layout.gpu_spec, fakenvml.default_gpus(self.cluster.settings.gpu_count,
                                                                        self.cluster.settings.gpu_name))
        self.mark = len(_journal(self.layout))
        self.layout.slurm_ext_conf.write_text(render.slurm_ext_toml(self.layout))
        if self.restarted:
            self.restart_monitor()
        else:
            os.kill(_agent_pid(self.layout), signal.SIGHUP)
            wait_for("the monitor's reload", lambda: self.count("reload", component="health"), timeout=15)
        self.cli("health", "clear", check=False)
        wait_for("no slurm-ext health drain", lambda: not self.reason().startswith("slurm-ext:"), timeout=30)


@pytest.fixture
def health(running_cluster):
    wait_for("the health worker", lambda: _monitor_pid(running_cluster.layout), timeout=20)
    handle = Health(running_cluster)
    handle.configure()
    yield handle
    handle.restore()


def test_xid79_in_the_kernel_log_drains_naming_the_action_within_5s_and_clear_lifts_it(health):
    gpu = health.spec["gpus"][1]
    bus = gpu["pci_bus_id"].lower().removeprefix("0000")  # 0000:18:00.0, the kernel's form
    started = time.monotonic()
    health.kmsg(f"NVRM: Xid (PCI:{bus[:-2]}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    reason = health.wait_reason(lambda r: r.startswith("slurm-ext: xid 79 gpu 1"), "the xid 79 drain", timeout=5)
    took = time.monotonic() - started
    assert took < 5 and reason.endswith("action=reboot"), (took, reason)
    finding = health.wait_event("health-finding", check="xid")
    assert finding["uuid"] == gpu["uuid"] and finding["action"] == "reboot" and finding["xid"] == 79
    assert finding["severity"] == "critical" and finding["finding_severity"] == "critical"
    # sticky: a quiet window does not lift it; the operator's clear does
    time.sleep(6)
    assert health.reason().startswith("slurm-ext: xid 79")
    health.cli("health", "clear", "--check", "xid")
    health.wait_event("health-cleared", why="operator", check="xid")
    health.wait_reason(lambda r: not r, "the drain lifted")


def test_a_gpu_reset_clears_only_what_a_reset_repairs_on_that_gpu(health):
    """The review of 29.3: the reset of a GPU cleared every finding on it, so an Xid 79 (reboot) opened after an
    Xid 48 (reset-gpu) on the same GPU was cleared by the reset too, and the repair resumed a GPU that needs a
    reboot. The reset's clear asks for action reset-gpu only (health.gpureset)."""
    from slurm_ext.health import request_clear
    bus = health.spec["gpus"][1]["pci_bus_id"].lower().removeprefix("0000")[:-2]
    health.kmsg(f"NVRM: Xid (PCI:{bus}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error")
    health.wait_event("health-finding", check="xid", xid=48, timeout=5)
    health.kmsg(f"NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    health.wait_event("health-finding", check="xid", xid=79, timeout=5)
    request_clear(str(health.layout.node_state), "", "1", action="reset-gpu")
    cleared = health.wait_event("health-cleared", why="operator", check="xid", timeout=5)
    assert cleared["xid"] == 48, cleared
    time.sleep(2)
    assert [e["xid"] for e in health.events("health-cleared")] == [48]
    assert health.reason().startswith("slurm-ext: xid 79 gpu 1"), health.reason()
    health.cli("health", "clear", "--check", "xid")
    health.wait_reason(lambda r: not r, "the drain lifted")


def test_xid13_once_is_an_event_not_a_drain(health):
    health.kmsg("NVRM: Xid (PCI:0000:10:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 1, TPC 3, "
          "SM 0): Out Of Range Address")
    finding = health.wait_event("health-finding", check="xid", xid=13, timeout=5)
    assert finding["finding_severity"] == "warning" and finding["action"] == "restart-job"
    time.sleep(3)
    assert health.reason() == ""
    assert health.count("drain", component="nodestate") == 0


def test_a_single_throttle_sample_is_nothing_and_throttling_over_the_window_drains_until_quiet(health):
    health.gpus(gpu2={"clocks_event_reasons": 0x40})
    time.sleep(1.5)
    health.gpus(gpu2=None)
    time.sleep(8)  # more than the window, with one or two throttled samples in it
    assert health.count("health-finding", check="throttle") == 0
    health.gpus(gpu2={"clocks_event_reasons": 0x40})
    finding = health.wait_event("health-finding", check="throttle", timeout=20)
    assert finding["gpu"] == 2 and finding["action"] == "failover" and "HW Thermal Slowdown" in finding["evidence"]
    health.wait_reason(lambda r: r.startswith("slurm-ext: throttle gpu 2 HW Thermal Slowdown"), "the throttle drain")
    health.gpus(gpu2=None)
    health.wait_event("health-cleared", check="throttle", why="quiet", timeout=20)
    health.wait_reason(lambda r: not r, "the throttle drain lifted")


def test_a_flapping_gpu_makes_one_drain_and_is_lifted_after_its_quiet_window(health):
    health.gpus(gpu0={"lost": True})
    health.wait_reason(lambda r: r.startswith("slurm-ext: gpu-lost gpu 0 fallen off the bus (NVML GPU_IS_LOST)"),
                       "the gpu-lost drain")
    for _ in range(3):  # back and gone again, faster than the quiet window
        health.gpus(gpu0=None)
        time.sleep(1.2)
        health.gpus(gpu0={"lost": True})
        time.sleep(1.2)
    health.gpus(gpu0=None)
    health.wait_event("health-cleared", check="gpu-lost", timeout=20)
    health.wait_reason(lambda r: not r, "the gpu-lost drain lifted")
    findings = health.events("health-finding", check="gpu-lost")
    assert len(findings) == 1, [(f["time"], f["subject"]) for f in findings]
    drains = [e for e in health.events("drain", component="nodestate") if "gpu-lost" in e.get("reason", "")]
    assert len(drains) == 1, drains


def test_an_admins_drain_is_never_touched(health):
    cluster = health.cluster
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=admin: new cables")
    try:
        health.gpus(gpu3={"lost": True})
        health.wait_event("health-finding", check="gpu-lost")
        health.wait_event("drain-skipped")
        health.gpus(gpu3=None)
        health.wait_event("health-cleared", check="gpu-lost", timeout=20)
        time.sleep(2)
        assert health.reason() == "admin: new cables"
    finally:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def test_a_fault_behind_an_admins_drain_is_shown_held_and_drained_once_the_admin_resumes(health):
    """`status`, `repair list` and the page say what waits behind someone else's drain; the admin's resume is
    followed by our drain (the node-state owner looks twice a second while a want is held)."""
    cluster = health.cluster
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=admin: new cables")
    try:
        health.gpus(gpu3={"lost": True})
        health.wait_event("drain-skipped")

        def held_line() -> str:
            # `status` reads the /health answer the controller's collector took (once its interval, 1 s here), not
            # the agent: the finding is there within an interval or two of the monitor's
            status = health.cli("status").stdout
            line = next(row for row in status.splitlines() if row.startswith(cluster.node))
            return line if "held: gpu-lost gpu 3 fallen off the bus" in line else ""
        assert " paused " in wait_for("status shows the finding held behind the admin's drain", held_line, 10,
                                      interval=0.5)
        listed = json.loads(health.cli("repair", "list", "--json").stdout)["held"]
        assert [(h["node"], h["reason"]) for h in listed] == [(cluster.node, "admin: new cables")], listed
        assert listed[0]["findings"][0].startswith("gpu-lost gpu 3 fallen off the bus"), listed
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
        health.wait_reason(lambda r: r.startswith("slurm-ext: gpu-lost"), "our drain after the admin's resume",
                           timeout=5)
    finally:
        health.gpus(gpu3=None)
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def test_a_restarted_monitor_does_not_judge_an_old_kernel_line_again_and_the_agent_keeps_slurmd(health):
    marker = uuid.uuid4().hex[:8]
    health.kmsg(f"NVRM: Xid (PCI:0000:20:00): 43, pid=1, name=job-{marker}, Ch 00000008")
    health.wait_event("health-finding", check="xid", xid=43)
    health.cli("health", "clear")
    health.wait_event("health-cleared", check="xid", why="operator")
    slurmd = health.cluster.client().node(health.cluster.node).slurmd_start
    health.restart_monitor()
    health.wait_event("worker-exited", worker="health")
    time.sleep(3)
    assert health.count("health-finding", xid=43) == 1
    assert health.cluster.client().node(health.cluster.node).slurmd_start == slurmd  # slurmd untouched


@pytest.mark.parametrize("fault, check, severity, action", [
    ({"gpu1": {"temperature": 89}}, "temperature", "warning", "failover"),
    ({"gpu1": {"persistence_mode": 0}}, "persistence", "warning", "none"),
    ({"gpu1": {"pcie": {"width": 8}}}, "pcie-link", "warning", "reboot"),
    ({"gpu1": {"remapped_rows": {"pending": 1}}}, "row-remap", "critical", "reset-gpu"),
    ({"gpu1": {"remapped_rows": {"failure": 1, "uncorrected": 3}}}, "row-remap", "critical", "remove"),
    ({"gpu1": {"ecc": {"volatile": {"corrected": 0, "uncorrected": 2}}}}, "ecc", "critical", "reset-gpu"),
    ({"gpu1": {"lost": True}}, "gpu-lost", "critical", "reboot"),
    ({"gpu1": {"query_error": "RESET_REQUIRED"}}, "gpu-lost", "critical", "reset-gpu"),
    ({"gpu1": {"fabric": {"state": 2}}}, "fabric", "critical", "reboot"),
    ({"gpu1": {"retired_pages": [{"address": 4096 * n, "cause": "double_bit", "timestamp": 1700000000 + n}
                                 for n in range(60)]}}, "retired-pages", "critical", "remove"),
    ({"gpu1": {"retired_pages": [], "retired_pages_pending": 1}}, "retired-pages", "critical", "reset-gpu"),
    ({"gpu1": {"nvlink_peers": []}}, "nvlink", "critical", "reboot"),
    ({"gpu1": {"query_error": "UNKNOWN"}}, "nvml", "critical", "reboot"),
])
def test_each_nvml_check_fires_on_its_fault_mid_run(health, fault, check, severity, action):
    time.sleep(2)  # healthy readings first: the nvlink check learns the links the GPU has
    health.gpus(**fault)
    finding = health.wait_event("health-finding", check=check, timeout=20)
    assert (finding["finding_severity"], finding["action"]) == (severity, action), finding
    if severity == "critical":
        health.wait_reason(lambda r: r.startswith(f"slurm-ext: {check} ") and r.endswith(f"action={action}"),
                           f"the {check} drain")


def test_clearing_the_nvlink_check_accepts_the_links_the_gpu_has_now(health):
    time.sleep(2)  # healthy readings first: 3 links expected
    health.gpus(gpu1={"nvlink_peers": []})
    health.wait_event("health-finding", check="nvlink", timeout=20)
    health.cli("health", "clear", "--check", "nvlink", "--gpu", "1")
    health.wait_event("health-cleared", check="nvlink", why="operator")
    time.sleep(3)  # three polls of the GPU without links: the expectation is what it has now
    assert health.count("health-finding", check="nvlink") == 1
    assert not health.reason().startswith("slurm-ext: nvlink")


@pytest.mark.parametrize("fault, check, severity, action", [
    ("nvidia-nvswitch0: SXid (PCI:0000:0a:00.0): 20034, Fatal, Link 30 LTSSM Fault Up", "sxid", "critical", "reboot"),
    ("nvidia-nvswitch1: SXid (PCI:0000:0b:00.0): 12028, Non-fatal, Link 57 egress non-posted PRIV error", "sxid",
     "warning", "none"),
    ("watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [kworker/1:2:345]", "kernel", "critical", "reboot"),
    ("INFO: task python:4242 blocked for more than 120 seconds.", "kernel", "warning", "none"),
    ("NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", "xid", "critical", "reset-gpu"),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     "xid", "critical", "reset-gpu"),
    ("NVRM: GPU 0000:20:00.0: GPU has fallen off the bus.", "xid", "critical", "reboot"),
    ("NVRM: Xid (0000:10:00): 999, pid=1, name=x, an Xid no catalog has", "xid", "warning", "none"),
])
def test_each_kernel_check_fires_on_its_line(health, fault, check, severity, action):
    health.kmsg(fault)
    finding = health.wait_event("health-finding", check=check, timeout=5)
    assert (finding["finding_severity"], finding["action"]) == (severity, action), finding
    if severity == "critical":
        health.wait_reason(lambda r: r.startswith(f"slurm-ext: {check} "), f"the {check} drain", timeout=5)


def test_a_stopped_slurmd_is_reported_not_responding_without_a_drain_and_cleared_once_it_answers(health):
    # a poll interval is taken at the monitor's start
    health.configure(_FAST + '[health.checks.slurmd]\ninterval = "1s"\nhold = "0s"\nquiet = "2s"\n', restart=True)
    slurmd = int(health.layout.pidfile(f"slurmd-{health.layout.settings.node_name}").read_text().split()[0])
    os.kill(slurmd, signal.SIGSTOP)  # hung, not dead: the agent has nothing to restart, Slurm's ping times out
    try:
        # slurmctld pings it a third of SlurmdTimeout (30 s) after its last answer, and waits MessageTimeout (10 s)
        finding = health.wait_event("health-finding", check="slurmd", timeout=40)
        assert (finding["finding_severity"], finding["action"]) == ("warning", "none"), finding
        assert "not responding" in finding["evidence"], finding
        time.sleep(2)
        assert not health.reason().startswith("slurm-ext:")  # a warning: reported, never drained
    finally:
        os.kill(slurmd, signal.SIGCONT)
    health.wait_event("health-cleared", check="slurmd", why="quiet", timeout=60)
    health.cluster.wait_idle()


def test_garbage_kernel_lines_are_ignored_and_the_monitor_keeps_running(health):
    for line in ("NVRM: Xid (PCI:0000:1", "NVRM: Xid (PCI:zz:zz:zz): abc,", "\x01\x02 binary \xff",
                 "NVRM: Xid (PCI:0000:17:00): " + "9" * 40 + ", huge", "x" * 900):
        health.kmsg(line)
    health.kmsg("NVRM: Xid (PCI:0000:10:00): 31, pid=7, name=train, Ch 00000007, intr 00000000.")
    finding = health.wait_event("health-finding", check="xid", xid=31, timeout=5)
    assert finding["gpu"] == 0 and finding["finding_severity"] == "warning"
    assert health.count("health-check-failed") == 0


def test_an_nvml_xid_event_is_a_finding(health):
    health.spec["events"] = [{"gpu": 2, "xid": 48}]
    fakenvml.write_spec(health.layout.gpu_spec, health.spec)
    finding = health.wait_event("health-finding", check="xid", xid=48, timeout=5)
    assert finding["source"] == "nvml" and finding["gpu"] == 2 and finding["action"] == "reset-gpu"


def test_a_gpu_fewer_than_the_baseline_drains(health):
    health.spec["gpus"] = health.spec["gpus"][:-1]
    fakenvml.write_spec(health.layout.gpu_spec, health.spec)
    finding = health.wait_event("health-finding", check="gpu-count", timeout=10)
    assert "missing GPU-fa4e0003" in finding["evidence"] and finding["action"] == "reboot"
    health.wait_reason(lambda r: r.startswith("slurm-ext: gpu-count "), "the gpu-count drain")


@pytest.mark.parametrize("field, check", [("pcie_replay_counter", "pcie-replay"), ("nvlink_errors", "nvlink-errors")])
def test_an_error_counter_growing_fast_is_a_warning(health, field, check):
    healthy = health.spec["gpus"][1]
    for step in range(1, 7):
        if field == "nvlink_errors":
            value = [{"replay": 500 * step}] + [{}] * (len(healthy.get("nvlink_peers", [])) - 1)
        else:
            value = 100 * step
        health.gpus(gpu1={field: value})
        time.sleep(1)
    finding = health.wait_event("health-finding", check=check, timeout=10)
    assert finding["gpu"] == 1 and finding["finding_severity"] == "warning"


def test_a_healthy_node_stays_silent_for_a_minute(health):
    time.sleep(60)
    assert health.events("health-finding") == [] and health.count("health-check-failed") == 0
    assert health.reason() == ""


@pytest.fixture
def veth(health):
    """A veth pair in a network namespace of the test's own, watched by the monitor (restarted to take it)."""
    name = f"se-health-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ip = ["ip", "-n", name, "link"]
        subprocess.run([*ip, "add", "se-v0", "type", "veth", "peer", "name", "se-v1"], check=True)
        for end in ("se-v0", "se-v1"):
            subprocess.run([*ip, "set", end, "up"], check=True)
        health.configure(_FAST + """
[health.checks.link-down]
hold = "1s"
quiet = "2s"
[health.checks.link-flap]
window = "20s"
quiet = "2s"
""", health_keys=f'interfaces = ["se-v0"]\nnetwork_namespace = "{name}"\n', restart=True)
        yield lambda up: subprocess.run([*ip, "set", "se-v1", "up" if up else "down"], check=True)
        health.configure(restart=True)  # let go of the namespace before it goes
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_link_down_drains_and_flaps_are_counted(health, veth):
    time.sleep(2)
    assert health.events("health-finding") == []
    veth(False)
    finding = health.wait_event("health-finding", check="link-down", timeout=5)
    assert finding["interface"] == "se-v0" and finding["action"] == "reboot"
    health.wait_reason(lambda r: r.startswith("slurm-ext: link-down se-v0 down"), "the link-down drain")
    veth(True)
    health.wait_event("health-cleared", check="link-down", timeout=10)
    for _ in range(2):
        veth(False)
        time.sleep(0.3)
        veth(True)
        time.sleep(0.3)
    finding = health.wait_event("health-finding", check="link-flap", timeout=5)
    assert "went down 3 times" in finding["evidence"]


def test_nvml_hanging_is_reported_the_other_checks_go_on_and_it_drains_after_its_polls(health):
    health.configure(_FAST, health_keys='call_timeout = "2s"\n')
    health.gpus(gpu2={"query_delay_ms": 12000})
    hung = health.wait_event("health-check-hung", reader="nvml", timeout=15)
    assert "nvml" in hung["message"]
    health.kmsg("NVRM: Xid (PCI:0000:10:00): 13, pid=9, name=python, Graphics SM Warp Exception")
    health.wait_event("health-finding", check="xid", xid=13, timeout=5)  # the kernel log is still read
    finding = health.wait_event("health-finding", check="nvml", timeout=15)
    assert "hung" in finding["evidence"] and finding["action"] == "reboot"
    health.gpus(gpu2=None)
    # the stuck call returns after its 12 s: polls answer again, and restore() finds no hang left to report
    wait_for("the stuck call back", lambda: health.events("health-check-hung") and _nvml_answers(health), timeout=30)


def test_health_check_judges_the_node_now_and_show_lists_the_monitors_findings(health):
    health.configure(_FAST, health_keys='call_timeout = "2s"\n')
    healthy = health.cli("health", "check", "--json", check=False)
    report = json.loads(healthy.stdout)
    assert healthy.returncode == 0 and report["healthy"] and report["findings"] == [], \
        (healthy.returncode, [(f["check"], f["evidence"], f["from"]) for f in report["findings"]])
    assert {"gpu-lost", "gpu-count", "temperature", "filesystem", "slurmd"} <= set(report["ran"])
    assert health.cli("health", "show").stdout.strip() == "no open findings"

    health.gpus(gpu1={"lost": True})
    lost = health.cli("health", "check", check=False)
    assert lost.returncode == 1, lost
    assert "unhealthy" in lost.stdout and "gpu-lost gpu 1" in lost.stdout and "action=reboot" in lost.stdout
    health.wait_event("health-finding", check="gpu-lost", timeout=10)
    shown = health.cli("health", "show", "--json", check=False)
    assert [(f["check"], f["gpu"], f["severity"]) for f in json.loads(shown.stdout)] == [("gpu-lost", 1, "critical")]
    # issue 29.7: one time format, and epoch seconds named as such (a bare "opened": 1733390000.2 before)
    opened = json.loads(shown.stdout)[0]
    assert datetime.fromisoformat(opened["opened"]).timestamp() == int(opened["opened_epoch"]), opened
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d critical gpu-lost gpu 1",
                    health.cli("health", "show", check=False).stdout)
    # issue 29.7: `health show` exited 0 with a critical finding open; and said "1 findings"
    assert shown.returncode == 1 and health.cli("health", "show", check=False).returncode == 1
    assert re.search(r"^unhealthy: 2 findings; \d+ checks ran now", lost.stdout, re.M), lost.stdout
    # one fault once: once the monitor has its own finding of the lost GPU (with the UUID it read before), `health
    # check` lists the fault judged now, not both (seen in CI: "3 findings", gpu-lost gpu 1 twice)
    again = health.cli("health", "check", check=False).stdout
    assert len(re.findall(r"^critical gpu-lost gpu 1", again, re.M)) == 1 and "unhealthy: 2 findings" in again, again
    assert "gpu-lost gpu 1: gpu 1 fallen off the bus" in lost.stdout  # no uuid: no space before the colon

    # a driver call that hangs: `health check` answers within call_timeout, an NVML failure of now, not a hang
    health.gpus(gpu1=None, gpu2={"query_delay_ms": 20000})
    started = time.monotonic()
    hung = health.cli("health", "check", "--json", check=False)
    took = time.monotonic() - started
    rows = {f["check"]: f for f in json.loads(hung.stdout)["findings"] if f["from"] == "now"}
    assert took < 10 and "did not answer within health.call_timeout (2s)" in rows["nvml"]["evidence"], (took, rows)
    assert rows["nvml"]["severity"] == "warning"  # one failed reading; the monitor judges repeats
    health.gpus(gpu2=None)
    wait_for("the monitor's stuck call back", lambda: _nvml_answers(health), timeout=30)


def _nvml_answers(health: Health) -> bool:
    """The monitor's latest readings are fresh and name every GPU (no reader stuck)."""
    try:
        data = json.loads((health.layout.runtime_dir / "health.json").read_text())
    except (OSError, ValueError):
        return False
    # readings_time, not the file's: during a hang the file is rewritten on a timer with the last good readings
    return time.time() - data["readings_time"] < 2 and all(g["error"] is None for g in data["gpus"])


def test_turning_the_monitor_off_lifts_its_drains_and_on_again_it_keeps_what_it_found(health):
    health.kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    health.wait_reason(lambda r: r.startswith("slurm-ext: xid "), "the Xid 79 drain", timeout=5)
    started = health.count("health-started")
    own = render.slurm_ext_toml(health.layout)
    health.layout.slurm_ext_conf.write_text(_monitor_off(own))
    os.kill(_agent_pid(health.layout), signal.SIGHUP)
    health.wait_event("worker-removed", worker="health")
    health.wait_reason(lambda r: not r, "the drain lifted with no monitor to clear it", timeout=15)
    health.layout.slurm_ext_conf.write_text(own)
    os.kill(_agent_pid(health.layout), signal.SIGHUP)
    wait_for("the monitor back", lambda: health.count("health-started") > started, timeout=20)
    # Xid 79 is sticky for the boot: the monitor's own record of it drains again, until an operator clears it
    health.wait_reason(lambda r: r.startswith("slurm-ext: xid "), "the kept finding's drain", timeout=10)
    assert health.count("health-finding", xid=79) == 1


def test_an_agent_started_with_the_monitor_off_lifts_the_health_drain_of_its_last_run(health):
    health.kmsg("NVRM: Xid (PCI:0000:10:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    health.wait_reason(lambda r: r.startswith("slurm-ext: xid 79 gpu 0"), "the Xid 79 drain", timeout=5)
    agent = next(d for d in cluster_daemons(health.layout) if d.name == "supervise-worker")
    own = render.slurm_ext_toml(health.layout)
    started = health.count("health-started")
    daemons.stop(agent, grace=60.0)
    try:
        health.layout.slurm_ext_conf.write_text(_monitor_off(own))
        daemons.start(agent, health.layout.daemon_environ(), 60.0)
        health.wait_reason(lambda r: not r, "the last run's health drain lifted by an agent without a monitor",
                           timeout=30)
        assert _monitor_pid(health.layout) is None and health.count("health-started") == started
    finally:
        health.layout.slurm_ext_conf.write_text(own)
        daemons.stop(agent, grace=60.0)
        dev.up(health.cluster.settings)
        wait_for("the monitor back", lambda: health.count("health-started") > started, timeout=60)


def test_a_bad_config_is_refused_on_reload_and_the_monitor_keeps_running(health):
    health.layout.slurm_ext_conf.write_text(render.slurm_ext_toml(health.layout)
                                            + '[health.checks.nosuch]\nenabled = true\n'
                                            + '[health.checks.throttle]\nthreshold = "50"\n')
    os.kill(_agent_pid(health.layout), signal.SIGHUP)
    refused = health.wait_event("reload-failed", component="supervisor")
    assert "health.checks.nosuch" in refused["message"]
    health.layout.slurm_ext_conf.write_text(render.slurm_ext_toml(health.layout)
                                            + '[health.checks.throttle]\nthreshold = "50"\n')
    os.kill(_agent_pid(health.layout), signal.SIGHUP)
    refused = wait_for("the threshold refused", lambda: [e for e in health.events("reload-failed")
                                                         if "health.checks.throttle.threshold" in e["message"]])[0]
    assert "a share with %" in refused["message"]
    health.kmsg("NVRM: Xid (PCI:0000:10:00): 43, pid=9, name=python, Ch 00000008")
    health.wait_event("health-finding", check="xid", xid=43, timeout=5)  # still running, on the old config


def test_a_finding_names_the_job_that_held_the_gpu(health):
    cluster = health.cluster
    job = cluster.sbatch("--gres=gpu:1", "--wrap", "sleep 30")
    path = health.layout.node_state / "jobs" / f"{job}.json"
    wait_for("the job's record (its Prolog ran)", path.exists, timeout=30)
    record = json.loads(path.read_text())
    gpu = record["gpus"][0]
    bus = health.spec["gpus"][gpu]["pci_bus_id"].lower().removeprefix("0000")[:-2]
    health.kmsg(f"NVRM: Xid (PCI:{bus}): 31, pid=77, name=python, Ch 00000007, intr 00000000.")
    finding = health.wait_event("health-finding", check="xid", xid=31, timeout=5)
    assert finding["gpu"] == gpu and finding["jobs"] == [job], finding
    cluster.run("scancel", str(job))


def test_a_full_or_read_only_file_system_drains_and_is_lifted_once_it_is_fixed(health, tmp_path):
    mount = tmp_path / "scratch"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        health.configure(_FAST + '[health.checks.filesystem]\nthreshold = "2MiB"\ninterval = "1s"\nquiet = "2s"\n',
                         health_keys=f'paths = ["{mount}"]\n', restart=True)
        (mount / "fill").write_bytes(b"\0" * (3 * 2**20))
        finding = health.wait_event("health-finding", check="filesystem", timeout=10)
        assert finding["path"] == str(mount) and "free (limit 2MiB)" in finding["evidence"]
        health.wait_reason(lambda r: r.startswith(f"slurm-ext: filesystem {mount} "), "the filesystem drain")
        (mount / "fill").unlink()
        health.wait_event("health-cleared", check="filesystem", timeout=10)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        found = health.events
        finding = wait_for("the read-only finding", lambda: [e for e in found("health-finding", check="filesystem")
                                                            if "read-only" in e["evidence"]], timeout=10)[0]
        assert finding["action"] == "none"
        health.configure(restart=True)  # let go of the mount before it goes
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_drain_by_someone_else_is_reported_and_never_acted_on(health):
    cluster = health.cluster
    health.configure(_FAST + '[health.checks.foreign-drain]\ninterval = "1s"\n', restart=True)
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=NHC: check_fs_mount /scratch")
    try:
        finding = health.wait_event("health-finding", check="foreign-drain", timeout=10)
        assert finding["finding_severity"] == "info" and finding["action"] == "none"
        assert "NHC: check_fs_mount /scratch" in finding["evidence"]
        time.sleep(2)
        assert health.reason() == "NHC: check_fs_mount /scratch"
    finally:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)
    health.configure(restart=True)


def test_a_restarted_agent_does_not_judge_an_old_kernel_line_again(health):
    marker = uuid.uuid4().hex[:8]
    health.kmsg(f"NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=job-{marker}, GPU has fallen off the bus.")
    health.wait_reason(lambda r: r.startswith("slurm-ext: xid 79 gpu 0"), "the xid 79 drain", timeout=5)
    health.cli("health", "clear")
    health.wait_event("health-cleared", check="xid", why="operator")
    health.wait_reason(lambda r: not r, "the drain lifted")
    started = health.count("health-started")
    agent = next(d for d in cluster_daemons(health.layout) if d.name == "supervise-worker")
    daemons.stop(agent, grace=60.0)
    dev.up(health.cluster.settings)  # the worker agent again (with the cluster's own config)
    wait_for("the new monitor", lambda: health.count("health-started") > started, timeout=60)
    health.wait_reason(lambda r: not r, "the stop's drain lifted by the new agent", timeout=30)
    time.sleep(3)
    assert len(health.events("health-finding", xid=79)) == 1
    assert health.reason() == ""

"""gres.conf from NVML on the real cluster: 8 fake GPUs, a lost GPU, drains, jobs with --gres.

The worker agent regenerates gres.conf before every slurmd start, so each
scenario edits the fake NVML's spec and kills slurmd (by pid); the agent
regenerates and restarts it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import psutil
import pytest

from helpers.cli import cli
from helpers.cluster import Cluster
from helpers.wait import wait_for
from slurm_ext import devcluster as dev
from slurm_ext.devcluster import fakenvml


#: minor numbers of the 8 GPUs, by NVML index: not contiguous, and not in PCI order
MINORS = [5, 0, 13, 7, 2, 15, 9, 11]
#: PCI bus numbers by NVML index: sorting by bus id gives yet another order
BUSES = [0x9A, 0x1B, 0x4C, 0xCB, 0x2A, 0xBA, 0x5D, 0xDB]


def eight_gpus(cpus: int) -> dict:
    spec = fakenvml.default_gpus(8, "NVIDIA H200")
    bus_ids = [f"00000000:{bus:02X}:00.0" for bus in BUSES]
    for index, gpu in enumerate(spec["gpus"]):
        gpu["minor"] = MINORS[index]
        gpu["pci_bus_id"] = bus_ids[index]
        gpu["nvlink_peers"] = [peer for peer in bus_ids if peer != bus_ids[index]]  # a full mesh
        gpu["cpu_affinity"] = [0] if index < 4 or cpus == 1 else [cpus - 1]
    return spec


@pytest.fixture(scope="module")
def eight_gpus_cluster(cluster):
    """The cluster with 8 fake GPUs (slurm.conf Gres=gpu:h200:8) for this module's tests; the 4-GPU cluster is
    back afterwards."""
    base = cluster
    dev.up(base.settings)
    settings = dataclasses.replace(base.settings, gpu_count=8)
    layout = Cluster(settings).layout
    made = []
    for minor in MINORS:
        device = layout.dev / f"nvidia{minor}"
        if not device.exists():
            made.append(fakenvml.make_device(device, minor))
    fakenvml.write_spec(layout.gpu_spec, eight_gpus(os.cpu_count() or 1))
    try:
        dev.up(settings)
        yield Cluster(settings)
    finally:
        fakenvml.write_spec(layout.gpu_spec, fakenvml.default_gpus(base.settings.gpu_count, base.settings.gpu_name))
        (layout.node_state / "gres" / "baseline.json").unlink(missing_ok=True)  # the 4 GPUs are the node's again
        for device in made:
            device.unlink()
        dev.up(base.settings)
        # the same UUIDs have 3 NVLinks where they had 7: a board swap, which an operator accepts by clearing
        # (the nvlink check holds 30 s before it drains: the clear comes first)
        base.run(sys.executable, "-m", "slurm_ext.cli", "--config", str(layout.slurm_ext_conf), "health", "clear",
                 "--check", "nvlink", check=False)
        base.run("scontrol", "update", f"nodename={base.node}", "state=resume", check=False)
        base.wait_idle()


@pytest.fixture
def eight(eight_gpus_cluster):
    """The 8-GPU cluster, up and idle before each test (an admin's drain a test left is lifted)."""
    cluster = eight_gpus_cluster
    dev.up(cluster.settings)
    leftovers = [str(job.job_id) for job in cluster.client().jobs() if not job.finished]
    if leftovers:
        cluster.run("scancel", *leftovers, check=False)
    node = cluster.client().node(cluster.node)
    if node.drained and not node.reason_is_ours:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)
    cluster.wait_idle()
    return cluster


def _slurmd_pid(cluster: Cluster) -> int | None:
    agent = next(d.pid for d in dev.status(cluster.settings).daemons if d.name == "supervise-worker")
    for child in psutil.Process(agent).children():
        if child.name() == "slurmd" and child.status() != psutil.STATUS_ZOMBIE:
            return child.pid
    return None


def _restart_slurmd(cluster: Cluster) -> None:
    """Kill slurmd; the agent regenerates gres.conf and starts a new one."""
    old = _slurmd_pid(cluster)
    os.kill(old, signal.SIGKILL)
    try:
        wait_for("a new slurmd", lambda: _slurmd_pid(cluster) not in (None, old), timeout=30)
    except AssertionError as err:
        log = (cluster.layout.log / "slurm-ext.log").read_text().splitlines()[-15:]
        raise AssertionError(f"{err}; the agent's log ends:\n" + "\n".join(log)) from None


def _journal(cluster: Cluster, event: str) -> list[dict]:
    path = cluster.layout.node_state / "journal.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == event]


def _gres_lines(cluster: Cluster) -> list[str]:
    return [line for line in (cluster.layout.etc / "gres.conf").read_text().splitlines()
            if line.startswith("NodeName=")]


def test_eight_gpus_are_generated_in_pci_order_accepted_by_slurmd_and_confined_per_job(eight):
    cluster = eight
    node = cluster.wait_idle(timeout=60)
    assert node.gres.startswith("gpu:h200:8"), node.gres
    lines = _gres_lines(cluster)
    by_bus = sorted(range(8), key=lambda i: BUSES[i])
    assert [line.split("File=")[1].split()[0] for line in lines] == \
        [f"{cluster.layout.dev}/nvidia{MINORS[i]}" for i in by_bus]
    links = [line.split("Links=")[1].split()[0].split(",") for line in lines]
    assert all(row[k] == "-1" if k == i else int(row[k]) > 0 for i, row in enumerate(links) for k in range(8))
    check = cluster.run("slurmd", "-G", "-N", cluster.node, check=False)
    assert "Type=h200" in check.stderr + check.stdout

    out = cluster.layout.out / f"gres-job-{os.getpid()}"
    devices = " ".join(f"{cluster.layout.dev}/nvidia{m}" for m in sorted(MINORS))
    job = cluster.sbatch("--gres=gpu:2", f"--output={out}", "--wrap",
                         f'echo "CVD=$CUDA_VISIBLE_DEVICES"; for d in {devices}; do '
                         f'if (exec 3<$d) 2>/dev/null; then echo "open $d"; else '
                         f'(exec 3<$d) 2>&1 | grep -q "not permitted" && echo "denied $d" || echo "open $d"; fi; done')
    assert cluster.wait_accounted(job).state == "COMPLETED"
    text = out.read_text()
    out.unlink()
    assert "CVD=0,1" in text, text
    assert text.count("open ") == 2 and text.count("denied ") == 6, text


def test_a_lost_gpu_drains_with_its_uuid_and_coming_back_clears_only_our_drain(eight):
    cluster = eight
    cluster.wait_idle(timeout=60)
    slurm = cluster.client()
    spec = json.loads(cluster.layout.gpu_spec.read_text())
    lost = spec["gpus"][3]
    lost["lost"] = True
    fakenvml.write_spec(cluster.layout.gpu_spec, spec)
    _restart_slurmd(cluster)
    node = wait_for("our drain", lambda: (n := slurm.node(cluster.node)).drained and n, timeout=30)
    assert node.reason.startswith("slurm-ext: gpu missing:") and lost["uuid"] in node.reason, node.reason
    assert len(_gres_lines(cluster)) == 7
    assert any(lost["uuid"] in r["message"] for r in _journal(cluster, "gpu-missing"))

    lost["lost"] = False
    fakenvml.write_spec(cluster.layout.gpu_spec, spec)
    _restart_slurmd(cluster)
    # the health monitor saw the GPU lost too; its drain waits out gpu-lost's quiet window (5 minutes) unless an
    # operator clears it, as here: what is left must be gres's drain, lifted by gres alone
    cluster.run(sys.executable, "-m", "slurm_ext.cli", "--config", str(cluster.layout.slurm_ext_conf), "health",
                "clear", "--check", "gpu-lost")
    try:
        wait_for("our drain cleared", lambda: not slurm.node(cluster.node).drained, timeout=30)
    except AssertionError as err:
        events = (cluster.layout.node_state / "journal.jsonl").read_text().splitlines()[-6:]
        raise AssertionError(f"{err}: node {slurm.node(cluster.node)}; journal ends:\n" + "\n".join(events)) from None
    assert len(_gres_lines(cluster)) == 8
    assert any(r["why"] == "cleared" for r in _journal(cluster, "resume"))

    # an admin's drain is not ours to clear, even when the GPUs are all there
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=maintenance")
    skipped = len(_journal(cluster, "resume-skipped"))
    _restart_slurmd(cluster)
    wait_for("the agent's decision to leave the admin's drain",
             lambda: len(_journal(cluster, "resume-skipped")) > skipped, timeout=30)
    assert "'maintenance'" in _journal(cluster, "resume-skipped")[-1]["message"]
    node = slurm.node(cluster.node)
    assert node.drained and node.reason.startswith("maintenance"), node.reason


def test_generate_dry_run_diff_and_inventory_from_the_cli(eight):
    cluster = eight
    env = {**cluster.env}
    config = str(cluster.layout.slurm_ext_conf)
    dry = cli("--config", config, "gres", "generate", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("NodeName=") == 8 and "driver" in dry.stdout
    inventory = cli("--config", config, "gres", "inventory", "--json", env=env)
    assert inventory.returncode == 0, inventory.stderr
    assert len(json.loads(inventory.stdout)["gpus"]) == 8
    dynamic = cli("--config", config, "gres", "inventory", "--slurmd-conf", env=env)
    assert dynamic.stdout.strip() == "Gres=gpu:h200:8", dynamic.stdout + dynamic.stderr
    check = cli("--config", config, "gres", "check", env=env)
    assert check.returncode == 0 and "agrees" in check.stdout, check.stdout + check.stderr

"""Drills without a running cluster: the real `slurm-ext dev inject` / `dev heal` on a dev cluster's state directory
(its gpus.json, drills.json and node journal, real files), and what they refuse. What the node's checks make of a
drill, on real Slurm, is tests/test_drills_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from slurm_ext import events
from slurm_ext.devcluster import fakenvml, render
from slurm_ext.devcluster.drills import KINDS, parse_fault
from slurm_ext.devcluster.layout import Layout
from slurm_ext.devcluster.settings import DevSection
from slurm_ext.errors import DevClusterError

from helpers.cli import cli


@pytest.fixture
def state(tmp_path):
    """A two-node dev cluster's files as `dev up` writes them (no daemon runs): configs, fake GPUs, node state."""
    settings = DevSection(state_dir=str(tmp_path), node_name="dnode1", nodes=2)
    layout = Layout(settings)
    for node in layout.nodes:
        node.etc.mkdir(parents=True)
        node.node_state.mkdir(parents=True)
        node.slurm_ext_conf.write_text(render.slurm_ext_toml(layout, node))
        fakenvml.write_spec(node.gpu_spec, fakenvml.default_gpus(settings.gpu_count, settings.gpu_name))
    conf = tmp_path / "dev.toml"
    conf.write_text(f'[dev]\nstate_dir = "{tmp_path}"\nnode_name = "dnode1"\nnodes = 2\n')

    def dev(*args: str):
        return cli("--config", str(conf), "dev", *args, timeout=60)
    return layout, dev


def test_faults_are_the_kinds_and_any_xid_number():
    assert parse_fault("xid-79") == ("xid", 79) and parse_fault("XID-48") == ("xid", 48)
    assert parse_fault("xid-999") == ("xid", 999)
    for kind in KINDS:
        if kind != "xid-NN":
            assert parse_fault(kind) == (kind, None)
    for bad in ("xid-NN", "xid-0", "xid-1000", "xid", "meltdown", "gpu_lost"):
        with pytest.raises(DevClusterError, match="faults: xid-NN, gpu-lost, ecc, throttle, nvlink-down, "
                                                  "link-down, fs-full, stuck-bit, slurmd-hang"):
            parse_fault(bad)


def test_a_gpu_drill_changes_only_its_gpu_is_recorded_and_journaled_and_heal_undoes_it(state):
    layout, dev = state
    node = layout.node("dnode2")
    healthy = json.loads(node.gpu_spec.read_text())
    done = dev("inject", "dnode2", "ecc", "--gpu", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("DRILL ecc on dnode2 gpu 2: gpu 2: 1 uncorrectable ECC error"), done.stdout
    assert "ecc: a critical finding, action reset-gpu" in done.stdout
    assert "row-remap: a critical finding, action reset-gpu" in done.stdout
    spec = json.loads(node.gpu_spec.read_text())
    assert spec["gpus"][2]["ecc"]["volatile"]["uncorrected"] == 1
    assert spec["gpus"][2]["remapped_rows"]["pending"] == 1
    assert [g for i, g in enumerate(spec["gpus"]) if i != 2] == [g for i, g in enumerate(healthy["gpus"]) if i != 2]
    assert json.loads(layout.node("dnode1").gpu_spec.read_text()) == healthy  # the other node untouched
    assert dev("inject", "dnode2", "xid-79", "--gpu", "1").returncode == 0
    # no agent runs to take it: the event stays in the spec until the heal
    assert json.loads(node.gpu_spec.read_text())["events"] == [{"gpu": 1, "xid": 79}]
    recorded = json.loads(layout.drills.read_text())
    assert [(d["kind"], d["gpu"], d["xid"]) for d in recorded["dnode2"]] == [("ecc", 2, None), ("xid", 1, 79)]
    journal = [json.loads(line) for line in events.journal_path(str(node.node_state)).read_text().splitlines()]
    assert [(e["event"], e["fault"], e["drill"]) for e in journal] == [("drill-injected", "ecc", True),
                                                                       ("drill-injected", "xid-79", True)]
    assert journal[0]["message"].startswith("DRILL (not a real fault): ecc on dnode2 gpu 2")

    healed = dev("heal", "dnode2")
    assert healed.returncode == 0, healed.stderr
    assert "ecc: gpu 2 healthy again" in healed.stdout and "xid-79: an event, nothing to undo" in healed.stdout
    assert "not resumed here" in healed.stdout
    after = json.loads(node.gpu_spec.read_text())
    assert after["gpus"] == healthy["gpus"] and after["events"] == []  # the drill's event taken out again
    assert json.loads(layout.drills.read_text()) == {}
    last = json.loads(events.journal_path(str(node.node_state)).read_text().splitlines()[-1])
    assert (last["event"], last["faults"], last["drill"]) == ("drill-healed", ["ecc", "xid-79"], True)
    assert dev("heal", "dnode2").stdout.startswith("no drill injected on dnode2: nothing to undo")


@pytest.mark.parametrize("args, says", [
    (("inject", "nosuchnode", "gpu-lost"), "dev inject: 'nosuchnode' is not a node of the dev cluster in {root} "
                                           "(dnode1, dnode2)"),
    (("heal", "nosuchnode"), "dev heal: 'nosuchnode' is not a node of the dev cluster in {root} (dnode1, dnode2)"),
    (("inject", "dnode1", "meltdown"), "dev inject: unknown fault 'meltdown'; faults: xid-NN, gpu-lost, ecc, "
                                       "throttle, nvlink-down, link-down, fs-full, stuck-bit, slurmd-hang (NN: an Xid number"),
    (("inject", "dnode1", "ecc", "--gpu", "4"), "dev inject: --gpu 4 is out of range: dnode1 has gpus 0-3 ("),
    (("inject", "dnode1", "ecc", "--gpu", "-1"), "'-1': a GPU index"),
    (("inject", "dnode1", "link-down", "--gpu", "1"), "dev inject: link-down is a fault of the node, not of a GPU: "
                                                      "--gpu does not apply"),
])
def test_inject_and_heal_refuse_with_an_error_that_says_why(state, args, says):
    layout, dev = state
    before = {node.name: node.gpu_spec.read_text() for node in layout.nodes}
    done = dev(*args)
    assert done.returncode != 0 and says.format(root=layout.root) in done.stderr, done.stderr
    assert not layout.drills.exists() or json.loads(layout.drills.read_text()) == {}
    assert {node.name: node.gpu_spec.read_text() for node in layout.nodes} == before


def test_nvlink_down_takes_one_link_of_the_gpu_and_refuses_a_gpu_without_nvlink(state):
    layout, dev = state
    node = layout.node("dnode1")
    assert dev("inject", "dnode1", "nvlink-down", "--gpu", "0").returncode == 0
    gpu = json.loads(node.gpu_spec.read_text())["gpus"][0]
    assert len(gpu["nvlink_peers"]) == 2 and gpu["nvlink_count"] == 3  # 3 peers of 4 GPUs: the last one inactive
    assert dev("heal", "dnode1").returncode == 0
    spec = json.loads(node.gpu_spec.read_text())
    spec["gpus"][3]["nvlink_peers"] = []
    fakenvml.write_spec(node.gpu_spec, spec)
    done = dev("inject", "dnode1", "nvlink-down", "--gpu", "3")
    assert done.returncode != 0 and "gpu 3 of dnode1 has no active NVLink to take down" in done.stderr


def _process_state(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rfind(")") + 2]


def _fake_slurmd(tmp_path, *args: str, env: dict | None = None):
    """A real process whose comm is `slurmd` (a script of that name), with slurmd's arguments: what a stale pidfile
    may name once its PID is reused."""
    script = tmp_path / "bin" / "slurmd"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\nwhile :; do sleep 0.2; done\n")
    script.chmod(0o755)
    process = subprocess.Popen([str(script), *args], env={**os.environ, **(env or {})})
    for _ in range(100):
        if open(f"/proc/{process.pid}/comm").read().strip() == "slurmd":
            break
        time.sleep(0.01)
    return process


@pytest.mark.parametrize("how", ["another node's", "another cluster's", "started after the pidfile"])
def test_slurmd_hang_stops_only_this_clusters_slurmd_of_the_node(state, tmp_path, how):
    """The review of 29.4: the pidfile's PID was trusted when its comm was slurmd. A slurmd of another node or another
    cluster (its SLURM_CONF another), or a process that took the PID after the pidfile was written, is refused and
    never stopped."""
    layout, dev = state
    pidfile = layout.pidfile("slurmd-dnode1")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    name, conf = {"another node's": ("dnode2", str(layout.node("dnode2").slurm_conf)),
                  "another cluster's": ("dnode1", "/var/lib/elsewhere/etc/slurm.conf")}.get(
        how, ("dnode1", str(layout.node("dnode1").slurm_conf)))
    process = _fake_slurmd(tmp_path, "-D", "-N", name, env={"SLURM_CONF": conf})
    try:
        pidfile.write_text(f"{process.pid}\n")
        if how == "started after the pidfile":  # the pidfile of a slurmd long gone, its PID taken since
            os.utime(pidfile, (time.time() - 60, time.time() - 60))
        done = dev("inject", "dnode1", "slurmd-hang")
        assert done.returncode != 0, done.stdout
        assert f"pid {process.pid} of {pidfile}" in done.stderr and "not the slurmd of dnode1" in done.stderr, \
            done.stderr
        assert _process_state(process.pid) != "T", "a process that is not this node's slurmd was stopped"
        assert not layout.drills.exists() or json.loads(layout.drills.read_text()) == {}
    finally:
        process.kill()
        process.wait(10)


def test_slurmd_hang_stops_the_nodes_slurmd_and_heal_continues_it(state, tmp_path):
    layout, dev = state
    node = layout.node("dnode1")
    pidfile = layout.pidfile("slurmd-dnode1")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    process = _fake_slurmd(tmp_path, "-D", "-N", "dnode1", env={"SLURM_CONF": str(node.slurm_conf)})
    try:
        pidfile.write_text(f"{process.pid}\n")  # as slurmd writes it: after it started
        done = dev("inject", "dnode1", "slurmd-hang")
        assert done.returncode == 0, done.stderr
        assert _process_state(process.pid) == "T"
        assert dev("heal", "dnode1").returncode == 0
        assert _process_state(process.pid) != "T"
    finally:
        process.kill()
        process.wait(10)


def test_a_heal_that_fails_half_way_keeps_the_record_of_what_is_still_injected(state, tmp_path):
    """The review of 29.4: `heal` took the node's drills out of drills.json before undoing them, so an undo that
    failed lost the record of what was still injected. Each drill is forgotten only once undone, and the failure
    names what is still injected; a later heal undoes it."""
    layout, dev = state
    node = layout.node("dnode1")
    assert dev("inject", "dnode1", "ecc", "--gpu", "2").returncode == 0
    pidfile = layout.pidfile("slurmd-dnode1")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    process = _fake_slurmd(tmp_path, "-D", "-N", "dnode1", env={"SLURM_CONF": str(node.slurm_conf)})
    try:
        pidfile.write_text(f"{process.pid}\n")
        assert dev("inject", "dnode1", "slurmd-hang").returncode == 0
        spec = node.gpu_spec.read_text()
        node.gpu_spec.write_text("{ not json")  # the GPU drill cannot be undone now
        failed = dev("heal", "dnode1")
        assert failed.returncode != 0, failed.stdout
        assert "still injected on dnode1: ecc on dnode1 gpu 2" in failed.stderr, failed.stderr
        assert _process_state(process.pid) != "T", "the drill undone before the failure was undone"
        left = json.loads(layout.drills.read_text())["dnode1"]
        assert [d["kind"] for d in left] == ["ecc"], left
        node.gpu_spec.write_text(spec)
        healed = dev("heal", "dnode1")
        assert healed.returncode == 0, healed.stderr
        assert "ecc: gpu 2 healthy again" in healed.stdout
        assert json.loads(layout.drills.read_text()) == {}
    finally:
        process.kill()
        process.wait(10)

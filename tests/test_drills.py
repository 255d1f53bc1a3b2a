"""Drills without a running cluster: the real `slurm-ext dev inject` / `dev heal` on a dev cluster's state directory
(its gpus.json, drills.json and node journal, real files), and what they refuse. What the node's checks make of a
drill, on real Slurm, is tests/test_drills_cluster.py.
"""

from __future__ import annotations

import json

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
                                                  "link-down, fs-full, slurmd-hang"):
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
                                       "throttle, nvlink-down, link-down, fs-full, slurmd-hang (NN: an Xid number"),
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
    assert len(gpu["nvlink_peers"]) == 2 and gpu["nvlink_count"] == 18  # 3 peers of 4 GPUs: the last one inactive
    assert dev("heal", "dnode1").returncode == 0
    spec = json.loads(node.gpu_spec.read_text())
    spec["gpus"][3]["nvlink_peers"] = []
    fakenvml.write_spec(node.gpu_spec, spec)
    done = dev("inject", "dnode1", "nvlink-down", "--gpu", "3")
    assert done.returncode != 0 and "gpu 3 of dnode1 has no active NVLink to take down" in done.stderr

"""Tests for slurm_ext.gres.inventory: what NVML says the node's GPUs are, in Slurm's order.

The reader runs with the real pynvml over the fake libnvidia-ml
(devcluster/fakenvml) in a child process: pynvml caches the library per process
and LD_LIBRARY_PATH is read at process start. The child prints the
inventory as to_json, so every test also goes through the JSON round trip.
/dev, /proc and /sys are fake trees under tmp_path; device files are real
character devices made with mknod (the tests run as root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers.files import fake_sysfs
from slurm_ext.devcluster import fakenvml
from slurm_ext.errors import SlurmExtError
from slurm_ext.gres import render
from slurm_ext.gres.inventory import GresError, Inventory, InventoryGpu, MigDevice, from_json, slurm_type, to_json

# Runs in the child: argv[1] is a JSON request of read_inventory's path
# arguments and types; prints {"inventory": <to_json>} or {"error": ...} for
# a GresError. Any other exception fails the child with a traceback.
CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from slurm_ext.gres import inventory

    request = json.loads(sys.argv[1])
    try:
        found = inventory.read_inventory(dev_dir=Path(request["dev_dir"]), proc_root=Path(request["proc_root"]),
                                         sys_root=Path(request["sys_root"]), types=request["types"])
        print(json.dumps({"inventory": inventory.to_json(found)}))
    except inventory.GresError as err:
        print(json.dumps({"error": str(err), "code": err.nvml_code, "cause": type(err.__cause__).__name__}))
    """
)

#: NVML index -> device minor: not contiguous, not in bus order
MINORS = [0, 2, 5, 7, 9, 11, 13, 15]
#: NVML index -> PCI bus id: sorting by bus reorders the GPUs
BUSES = [
    "00000000:C1:00.0", "00000000:18:00.0", "00000000:9A:00.0", "00000000:2A:00.0",
    "00000000:DB:00.0", "00000000:3A:00.0", "00000000:AB:00.0", "00000000:5D:00.0",
]
#: NVML indexes in PCI bus order: 18, 2A, 3A, 5D, 9A, AB, C1, DB
BUS_ORDER = [1, 3, 5, 7, 2, 6, 0, 4]
#: the fake node: 2 sockets x 4 cores x 2 threads; OS cpus 0-3 and 8-11 are socket 0
#: (cores 0-3), 4-7 and 12-15 socket 1 (cores 4-7), cpu c and c+8 one core
SOCKET_CPUS = [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
#: the pair with 4 NVLinks between them (NVML indexes); every other pair has 2
FAT_PAIR = (0, 4)


@pytest.fixture(scope="session")
def fakenvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session; returns its directory."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    """Fake /dev (a char device per minor), /proc (empty) and /sys (two sockets)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in MINORS:
        fakenvml.make_device(dev / f"nvidia{minor}", minor)
    proc = tmp_path / "proc"
    proc.mkdir()
    sys_root = fake_sysfs(tmp_path / "sys", {cpu: ((cpu % 8) // 4, 0, cpu % 4) for cpu in range(16)})
    return {"dev_dir": dev, "proc_root": proc, "sys_root": sys_root}


def short_bus(bus: str) -> str:
    """"00000000:18:00.0" -> "0000:18:00.0", the other spelling of one bus id."""
    return bus[4:]


def node_spec() -> dict[str, Any]:
    """8 H200s: minors MINORS, buses BUSES, full NVLink mesh (FAT_PAIR doubled), half the GPUs
    (in bus order) near each socket."""
    spec = fakenvml.default_gpus(8)
    for i, gpu in enumerate(spec["gpus"]):
        gpu["minor"] = MINORS[i]
        gpu["pci_bus_id"] = BUSES[i]
        gpu["cpu_affinity"] = SOCKET_CPUS[BUS_ORDER.index(i) // 4]
        # peers in the short spelling: the reader must match them to the long one
        peers = [short_bus(BUSES[j]) for j in range(8) for _ in range(2) if j != i]
        if i in FAT_PAIR:
            other = FAT_PAIR[1 - FAT_PAIR.index(i)]
            peers += [short_bus(BUSES[other])] * 2
        gpu["nvlink_peers"] = peers
    return spec


def read(lib_dir: Path, tmp_path: Path, spec: dict[str, Any], roots: dict[str, Path],
         types: dict[str, str] | None = None) -> Inventory:
    """read_inventory in a child over `spec`; returns the inventory (via JSON)."""
    answer = run_child(lib_dir, tmp_path, spec, roots, types)
    assert "inventory" in answer, answer
    return from_json(answer["inventory"])


def run_child(lib_dir: Path, tmp_path: Path, spec: dict[str, Any], roots: dict[str, Path],
              types: dict[str, str] | None = None) -> dict[str, Any]:
    spec_path = tmp_path / "gpus.json"
    fakenvml.write_spec(spec_path, spec)
    request = {**{key: str(value) for key, value in roots.items()}, "types": types or {}}
    env = {**os.environ, **fakenvml.environ(lib_dir, spec_path)}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(request)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---------------------------------------------------------------------------
# Real pynvml over the fake library
# ---------------------------------------------------------------------------


def test_gpus_in_pci_order_with_their_own_device_files(fakenvml_lib, tmp_path, roots):
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots, {"NVIDIA H200": "h200"})
    assert inv.driver_version == "580.159.04"  # the fake's default: the recorded H200's driver
    assert [g.nvml_index for g in inv.gpus] == BUS_ORDER
    assert [g.pci_bus_id for g in inv.gpus] == sorted(BUSES)
    assert [g.minor for g in inv.gpus] == [MINORS[i] for i in BUS_ORDER]
    assert [g.device for g in inv.gpus] == [f"{roots['dev_dir']}/nvidia{MINORS[i]}" for i in BUS_ORDER]
    assert [g.uuid for g in inv.gpus] == [f"GPU-{0xFA4E0000 + i:08x}-0000-4000-8000-{i:012x}" for i in BUS_ORDER]
    assert {(g.name, g.type) for g in inv.gpus} == {("NVIDIA H200", "h200")}
    assert inv.lost == () and inv.problems == ()
    assert all(g.mig == () and not g.mig_mode for g in inv.gpus)


def test_links_matrix_counts_active_nvlinks_per_peer_in_inventory_order(fakenvml_lib, tmp_path, roots):
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots)
    matrix = [list(g.links) for g in inv.gpus]
    fat = sorted(BUS_ORDER.index(i) for i in FAT_PAIR)
    for i, row in enumerate(matrix):
        assert len(row) == 8
        for j, links in enumerate(row):
            if i == j:
                assert links == -1
            elif sorted((i, j)) == fat:
                assert links == 4
            else:
                assert links == 2
    assert matrix == [list(col) for col in zip(*matrix)]  # symmetric


def test_cores_are_slurm_core_indexes_of_the_affinity(fakenvml_lib, tmp_path, roots):
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots)
    assert inv.core_count == 8
    assert [g.cpus for g in inv.gpus] == [tuple(SOCKET_CPUS[k // 4]) for k in range(8)]
    assert [g.cores for g in inv.gpus] == [(0, 1, 2, 3)] * 4 + [(4, 5, 6, 7)] * 4


def test_unreadable_topology_leaves_cores_out_with_a_problem(fakenvml_lib, tmp_path, roots):
    roots = {**roots, "sys_root": tmp_path / "no-sys"}
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots)
    assert all(g.cores == () for g in inv.gpus) and inv.core_count == 0
    assert all(g.cpus for g in inv.gpus)
    [problem] = inv.problems
    assert problem.startswith("Cores= left out of every GPU line: ") and "no-sys" in problem


def test_type_mapping_first_rule_for_the_rest_with_a_problem(fakenvml_lib, tmp_path, roots):
    spec = node_spec()
    for i in (2, 6):
        spec["gpus"][i]["name"] = "NVIDIA A100-SXM4-80GB"
    inv = read(fakenvml_lib, tmp_path, spec, roots, {"NVIDIA H200": "h200"})
    types = {g.nvml_index: g.type for g in inv.gpus}
    assert types == {i: "nvidia_a100-sxm4-80gb" if i in (2, 6) else "h200" for i in range(8)}
    [problem] = inv.problems  # one line per unmapped name, not per GPU
    assert "'NVIDIA A100-SXM4-80GB'" in problem and "'nvidia_a100-sxm4-80gb'" in problem
    assert "gres.types" in problem


def test_without_a_mapping_the_rule_is_no_problem(fakenvml_lib, tmp_path, roots):
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots)
    assert {g.type for g in inv.gpus} == {"nvidia_h200"}
    assert inv.problems == ()


def test_lost_gpu_is_left_out_and_described(fakenvml_lib, tmp_path, roots):
    spec = node_spec()
    spec["gpus"][5]["lost"] = True
    inv = read(fakenvml_lib, tmp_path, spec, roots)
    assert [g.nvml_index for g in inv.gpus] == [i for i in BUS_ORDER if i != 5]
    [lost] = inv.lost
    assert lost.startswith("NVML GPU 5")
    assert "GPU is lost (NVML error 15)" in lost and "reset the GPU or reboot" in lost
    # the links matrix is over the GPUs kept; links to the lost one are not counted
    assert all(len(g.links) == 7 for g in inv.gpus)
    assert [g.links.count(-1) for g in inv.gpus] == [1] * 7


def test_missing_or_wrong_device_file_is_a_problem_gpu_kept(fakenvml_lib, tmp_path, roots):
    (roots["dev_dir"] / "nvidia9").unlink()  # NVML index 4
    (roots["dev_dir"] / "nvidia13").unlink()  # NVML index 6
    (roots["dev_dir"] / "nvidia13").write_text("")
    inv = read(fakenvml_lib, tmp_path, node_spec(), roots)
    assert len(inv.gpus) == 8 and inv.lost == ()
    missing, regular = sorted(inv.problems)[0], sorted(inv.problems)[1]
    assert len(inv.problems) == 2
    assert f"{roots['dev_dir']}/nvidia9 is missing (expected a character device)" in missing
    assert "nvidia-modprobe -c 9" in missing
    assert f"{roots['dev_dir']}/nvidia13 is not a character device" in regular


def test_nvml_init_failure_is_a_gres_error(fakenvml_lib, tmp_path, roots):
    spec = node_spec()
    spec["init_error"] = "DRIVER_NOT_LOADED"
    answer = run_child(fakenvml_lib, tmp_path, spec, roots)
    assert answer["code"] == 9
    assert answer["cause"] == "NVMLError_DriverNotLoaded"
    assert answer["error"].startswith("gres: cannot initialise NVML: ")
    assert "load the NVIDIA kernel driver" in answer["error"]


def test_no_gpus_is_an_empty_inventory(fakenvml_lib, tmp_path, roots):
    spec = {"gpus": []}
    inv = read(fakenvml_lib, tmp_path, spec, {**roots, "sys_root": tmp_path / "unused"})
    assert inv == Inventory("580.159.04", (), (), (), 0)


MIG_MINORS = textwrap.dedent(
    """\
    config 1
    monitor 2
    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13
    gpu0/gi2/access 21
    gpu0/gi2/ci0/access 22
    gpu2/gi1/access 102
    gpu2/gi1/ci0/access 103
    gpu2/gi2/access 111
    gpu2/gi2/ci0/access 112
    """
)


def mig_spec() -> dict[str, Any]:
    """Two H200s (minors 0 and 2); the second in MIG mode with a 1g.18gb and a 3g.71gb."""
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["minor"] = 2
    for gpu in spec["gpus"]:
        gpu["cpu_affinity"] = list(range(16))  # every core: no Cores=
    spec["gpus"][1]["mig_devices"] = [
        {"name": "NVIDIA H200 MIG 1g.18gb", "gpu_instance_id": 1, "compute_instance_id": 0},
        {"name": "NVIDIA H200 MIG 3g.71gb", "gpu_instance_id": 2, "compute_instance_id": 0},
    ]
    return spec


def test_mig_devices_with_their_caps_files(fakenvml_lib, tmp_path, roots):
    caps = roots["proc_root"] / "driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(MIG_MINORS)
    inv = read(fakenvml_lib, tmp_path, mig_spec(), roots, {"NVIDIA H200": "h200"})
    assert inv.problems == ()
    whole, split = inv.gpus
    assert whole.mig == () and not whole.mig_mode
    assert split.mig_mode
    dev = roots["dev_dir"]
    assert split.mig == (
        MigDevice(1, 0, "MIG-fa4e0001-0000-5000-8000-000000000001", "1g.18gb",
                  (f"{dev}/nvidia2", f"{dev}/nvidia-caps/nvidia-cap102", f"{dev}/nvidia-caps/nvidia-cap103")),
        MigDevice(2, 0, "MIG-fa4e0001-0001-5000-8000-000000000001", "3g.71gb",
                  (f"{dev}/nvidia2", f"{dev}/nvidia-caps/nvidia-cap111", f"{dev}/nvidia-caps/nvidia-cap112")),
    )
    text = render.gres_conf(inv, "gpu-node-1", now=0)
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == [
        f"NodeName=gpu-node-1 Name=gpu Type=h200 File={dev}/nvidia0",
        f"NodeName=gpu-node-1 Name=gpu Type=h200_1g.18gb MultipleFiles={','.join(split.mig[0].files)}",
        f"NodeName=gpu-node-1 Name=gpu Type=h200_3g.71gb MultipleFiles={','.join(split.mig[1].files)}",
    ]
    assert render.gres_string(inv) == "gpu:h200:1,gpu:h200_1g.18gb:1,gpu:h200_3g.71gb:1"


def test_mig_without_the_minors_file_is_a_problem(fakenvml_lib, tmp_path, roots):
    inv = read(fakenvml_lib, tmp_path, mig_spec(), roots)
    [problem] = inv.problems
    assert f"{roots['proc_root']}/driver/nvidia-caps/mig-minors: cannot read" in problem
    assert [m.files for m in inv.gpus[1].mig] == [(f"{roots['dev_dir']}/nvidia2",)] * 2


def test_mig_mode_without_devices_unnamed_profile_and_missing_cap_are_problems(fakenvml_lib, tmp_path, roots):
    caps = roots["proc_root"] / "driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("gpu2/gi1/access 102\n")  # no ci0 entry
    spec = mig_spec()
    spec["gpus"][0]["mig_mode"] = 1  # on, but no GPU instances made
    spec["gpus"][1]["mig_devices"] = [{}]  # the fake's default name, "NVIDIA H200 MIG", has no profile
    inv = read(fakenvml_lib, tmp_path, spec, roots)
    empty, split = inv.gpus
    assert empty.mig_mode and empty.mig == ()
    [mig] = split.mig
    assert mig.profile == "gi1ci0"
    assert mig.files == (f"{roots['dev_dir']}/nvidia2", f"{roots['dev_dir']}/nvidia-caps/nvidia-cap102")
    no_devices, unnamed, no_cap = inv.problems
    assert "is named 'NVIDIA H200 MIG', without a profile" in unnamed and "nvidia_h200_gi1ci0" in unnamed
    assert "no 'gpu2/gi1/ci0/access' in" in no_cap
    assert no_devices.startswith(f"{empty.uuid} ({empty.pci_bus_id}): MIG mode is on but it has no MIG devices")
    assert render.gres_string(inv) == "gpu:nvidia_h200_gi1ci0:1"


def test_json_round_trip_of_a_read_inventory(fakenvml_lib, tmp_path, roots):
    spec = node_spec()
    spec["gpus"][3]["lost"] = True
    answer = run_child(fakenvml_lib, tmp_path, spec, roots)
    inv = from_json(answer["inventory"])
    assert to_json(inv) == answer["inventory"]
    assert from_json(to_json(inv)) == inv
    assert inv.lost and inv.gpus


# ---------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------


def test_slurm_type_mapping_then_autodetect_rule():
    types = {"NVIDIA H200": "h200"}
    assert slurm_type("NVIDIA H200", types) == ("h200", True)
    assert slurm_type("NVIDIA H200", {}) == ("nvidia_h200", False)
    assert slurm_type("NVIDIA A100-SXM4-80GB", types) == ("nvidia_a100-sxm4-80gb", False)
    assert slurm_type("Tesla V100-PCIE-16GB", types) == ("tesla_v100-pcie-16gb", False)


def test_json_round_trip_of_a_literal_inventory_with_mig():
    mig = MigDevice(1, 0, "MIG-1", "1g.18gb", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12"))
    inv = Inventory("550.54.15", (
        InventoryGpu(0, 0, "NVIDIA H200", "h200", "GPU-0", "00000000:18:00.0", "/dev/nvidia0", (0, 1), (0,), (-1,),
            (mig,), True),
    ), ("NVIDIA GPU 1: GPU is lost",), ("a problem",), 4)
    assert from_json(to_json(inv)) == inv


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"format": 2}', '{"format": 1, "gpus": "x"}',
                                  '{"format": 1, "driver_version": 5, "gpus": [], "lost": [], "problems": [], '
                                  '"core_count": 0}'])
def test_from_json_refuses_what_it_did_not_write(text):
    with pytest.raises(GresError, match="remove the file") as info:
        from_json(text)
    assert isinstance(info.value, SlurmExtError)


def test_gres_error_message_says_what_to_do():
    err = GresError("cannot initialise NVML: Driver Not Loaded", 9)
    assert str(err) == ("gres: cannot initialise NVML: Driver Not Loaded (NVML error 9); "
                        "load the NVIDIA kernel driver (nvidia-smi should list the GPUs)")
    assert (err.problem, err.nvml_code) == ("cannot initialise NVML: Driver Not Loaded", 9)

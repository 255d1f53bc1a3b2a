"""Tests for slurm_ext.gres.generate (`generate`) and the `slurm-ext gres` CLI: gres.conf, baseline, drains.

Every generation runs the real pynvml over the fake libnvidia-ml
(devcluster/fakenvml) in a child process: pynvml caches the library per process
and LD_LIBRARY_PATH is read at process start. The child prints the
Generation and the events it emitted as JSON; the parent rebuilds the
Generation, so assertions read as they would in-process. Between runs the
test rewrites the spec (a GPU lost, removed, renamed, NVML failing), as a
node restart would find it. State dir, output, /dev (mknod'd character
devices, major 195) and /sys are in one temporary directory per test,
removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from helpers.files import fake_sysfs
from slurm_ext.devcluster import fakenvml
from slurm_ext.gres import Generation
from slurm_ext.gres.drift import Drift, Missing
from slurm_ext.gres.inventory import from_json

NODE = "gpu-node-1"
H200_TYPES = {"NVIDIA H200": "h200"}

# Runs in the child: argv[1] is {"config": <from_dict data>, "node", "dry_run", "accept", "sys_root",
# "proc_root"}; prints the Generation's fields and the emitted events. Any exception (OSError included)
# fails the child with a traceback.
CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from slurm_ext import config
    from slurm_ext.gres import generate
    from slurm_ext.gres.inventory import to_json

    request = json.loads(sys.argv[1])
    events = []

    def emit(event, message, severity="info", **fields):
        events.append({"event": event, "message": message, "severity": severity, "fields": fields})

    gen = generate(config.from_dict(request["config"]), request["node"], emit=emit, dry_run=request["dry_run"],
                   accept=request["accept"], sys_root=Path(request["sys_root"]),
                   proc_root=Path(request["proc_root"]))
    print(json.dumps({
        "inventory": to_json(gen.inventory) if gen.inventory is not None else None,
        "missing": [[m.uuid, m.pci_bus_id] for m in gen.drift.missing],
        "new": list(gen.drift.new),
        "renumbered": [list(r) for r in gen.drift.renumbered],
        "path": str(gen.path), "text": gen.text, "changed": gen.changed, "drain": gen.drain,
        "events": events,
    }))
    """
)


@pytest.fixture(scope="session")
def fakenvml_lib() -> Iterator[Path]:
    """The fake library, built once per session; yields its directory."""
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-gres-generate-lib-"))
    try:
        yield fakenvml.build(root / "lib").parent
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Event:
    event: str
    message: str
    severity: str
    fields: dict[str, Any]


@dataclass
class Run:
    """One generate() in a child: what it returned and what it emitted."""

    generation: Generation
    events: list[Event]

    def names(self) -> list[str]:
        return [e.event for e in self.events]

    def only(self, name: str) -> Event:
        found = [e for e in self.events if e.event == name]
        assert len(found) == 1, (name, self.names())
        return found[0]


@dataclass
class Node:
    """A fake GPU node: temporary state dir, output, /dev, /sys and NVML spec."""

    root: Path
    lib_dir: Path
    expected: int = 0
    types: dict[str, str] = field(default_factory=lambda: dict(H200_TYPES))
    output: Path | None = None

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def sys_root(self) -> Path:
        return self.root / "sys"

    @property
    def proc_root(self) -> Path:
        return self.root / "proc"

    @property
    def spec_path(self) -> Path:
        return self.root / "gpus.json"

    @property
    def gres_conf(self) -> Path:
        return self.output or self.root / "etc" / "gres.conf"

    @property
    def baseline_file(self) -> Path:
        return self.state / "gres" / "baseline.json"

    def config_data(self) -> dict[str, Any]:
        return {
            "node": {"name": NODE, "state_dir": str(self.state)},
            "gres": {"output": str(self.gres_conf), "dev_dir": str(self.dev), "types": self.types,
                     "expected": self.expected},
        }

    def env(self) -> dict[str, str]:
        return {**os.environ, **fakenvml.environ(self.lib_dir, self.spec_path)}

    def generate(self, spec: dict[str, Any], *, dry_run: bool = False, accept: bool = False) -> Run:
        fakenvml.write_spec(self.spec_path, spec)
        request = {"config": self.config_data(), "node": NODE, "dry_run": dry_run, "accept": accept,
                   "sys_root": str(self.sys_root), "proc_root": str(self.proc_root)}
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(request)], env=self.env(),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout)
        drift = Drift(tuple(Missing(uuid, bus) for uuid, bus in answer["missing"]), tuple(answer["new"]),
                      tuple(tuple(r) for r in answer["renumbered"]))
        inventory = from_json(answer["inventory"]) if answer["inventory"] is not None else None
        generation = Generation(inventory, drift, Path(answer["path"]), answer["text"], answer["changed"],
                                answer["drain"])
        return Run(generation, [Event(**e) for e in answer["events"]])

    def baseline(self) -> dict[str, list[Any]]:
        return json.loads(self.baseline_file.read_text())["gpus"]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """`slurm-ext --config <this node's config> <args>` in a child with the fake NVML."""
        cfg = self.root / "slurm-ext.toml"
        cfg.write_text(toml(self.config_data()))
        return subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(cfg), *args],
                              env=self.env(), capture_output=True, text=True, timeout=60)


@pytest.fixture
def node(fakenvml_lib: Path) -> Iterator[Node]:
    """A node with /dev/nvidia0..15 (character devices, major 195) and a 4-CPU, 2-socket /sys."""
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-gres-generate-"))
    try:
        made = Node(root, fakenvml_lib)
        made.dev.mkdir()
        for minor in range(16):
            fakenvml.make_device(made.dev / f"nvidia{minor}", minor)
        (made.root / "etc").mkdir()
        made.proc_root.mkdir()
        fake_sysfs(made.sys_root, {cpu: (cpu // 2, 0, cpu % 2) for cpu in range(4)})
        yield made
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spec(count: int = 8) -> dict[str, Any]:
    """`count` healthy H200s, minors 0..count-1, CPU affinity split over the fake node's 4 CPUs."""
    return fakenvml.default_gpus(count, cpus=4)


def gpu_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def toml(data: dict[str, Any]) -> str:
    """The few shapes config_data() uses, as TOML (strings, ints, one inline table)."""
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)
    return "".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items())
                   for name, table in data.items())


def file_id(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


# ---------------------------------------------------------------------------
# generate()
# ---------------------------------------------------------------------------


def test_first_run_writes_gres_conf_and_a_baseline_second_run_leaves_them(node):
    first = node.generate(spec(8))
    gen = first.generation
    assert gen.path == node.gres_conf and gen.changed and gen.drain is None
    assert gen.gres == "gpu:h200:8"
    lines = gpu_lines(node.gres_conf.read_text())
    assert lines == gpu_lines(gen.text)
    assert [line.split(" Cores=")[0] for line in lines] == [
        f"NodeName={NODE} Name=gpu Type=h200 File={node.dev}/nvidia{i}" for i in range(8)]
    # the first inventory is one baseline event, not eight "gpu-new"
    assert first.names() == ["gpu-baseline", "gres-written"]
    assert first.only("gpu-baseline").message.startswith("8 GPUs are this node's from now on: gpu:h200:8")
    assert first.only("gres-written").fields == {"path": str(node.gres_conf)}
    # the Generation's drift still lists all 8 as new (against the empty baseline); only the events say it once
    assert gen.drift == Drift(new=tuple(g["uuid"] for g in spec(8)["gpus"]))
    baseline = node.baseline()
    assert sorted(baseline) == sorted(g["uuid"] for g in spec(8)["gpus"])
    assert {uuid: tuple(v) for uuid, v in baseline.items()} == {
        g["uuid"]: (g["pci_bus_id"], g["minor"]) for g in spec(8)["gpus"]}
    assert stat.S_IMODE(node.baseline_file.stat().st_mode) == 0o600

    conf_before, baseline_before = file_id(node.gres_conf), file_id(node.baseline_file)
    second = node.generate(spec(8))
    assert second.generation.changed is False and second.generation.drain is None
    assert second.events == []
    assert file_id(node.gres_conf) == conf_before
    assert file_id(node.baseline_file) == baseline_before


def test_lost_gpu_drains_until_it_is_back_and_the_baseline_remembers_it(node):
    node.generate(spec(8))
    lost_spec = spec(8)
    lost_spec["gpus"][3]["lost"] = True
    uuid = lost_spec["gpus"][3]["uuid"]
    bus = node.baseline()[uuid][0]
    assert bus == lost_spec["gpus"][3]["pci_bus_id"]

    lost = node.generate(lost_spec)
    gen = lost.generation
    lines = gpu_lines(node.gres_conf.read_text())
    assert len(lines) == 7 and not any(f"File={node.dev}/nvidia3" in line for line in lines)
    assert gen.changed and gen.gres == "gpu:h200:7"
    assert gen.drain.startswith("gpu missing:")
    assert gen.drain == f"gpu missing: {uuid} ({bus})"
    assert gen.drift.missing == (Missing(uuid, bus),)
    missing = lost.only("gpu-missing")
    assert missing.severity == "error" and missing.fields == {"uuid": uuid, "pci_bus_id": bus}
    # NVML still lists it, so it is also a lost GPU of the inventory; a lost GPU answers no UUID or bus
    # id (only the baseline knows them, which is why the drain names the missing GPU)
    lost_event = lost.only("gpu-lost")
    assert lost_event.severity == "error"
    assert lost_event.message.startswith("gpu left out of gres.conf: NVML GPU 3: GPU is lost (NVML error 15)")
    assert "gpu-new" not in lost.names()
    assert len(node.baseline()) == 8 and node.baseline()[uuid] == [bus, 3]

    again = node.generate(lost_spec)
    assert again.generation.drain == gen.drain
    assert again.generation.changed is False
    assert "gpu-missing" in again.names()
    assert len(node.baseline()) == 8

    back = node.generate(spec(8))
    assert len(gpu_lines(node.gres_conf.read_text())) == 8
    assert back.generation.changed and back.generation.drain is None
    assert back.generation.drift == Drift()
    # it was in the baseline: coming back is no new GPU
    assert back.names() == ["gres-written"]


def test_removed_gpu_is_missing_too(node):
    node.generate(spec(8))
    removed = spec(8)
    gone = removed["gpus"].pop(5)
    run = node.generate(removed)
    assert run.generation.drain == f"gpu missing: {gone['uuid']} ({gone['pci_bus_id']})"
    assert run.generation.inventory.lost == ()
    assert run.names() == ["gpu-missing", "gres-written"]
    assert len(gpu_lines(run.generation.text)) == 7


def test_accept_while_a_gpu_is_lost_forgets_it_but_nvml_still_reports_it_lost(node):
    node.generate(spec(8))
    lost_spec = spec(8)
    lost_spec["gpus"][3]["lost"] = True
    uuid = lost_spec["gpus"][3]["uuid"]
    assert node.generate(lost_spec).generation.drain.startswith("gpu missing:")

    accepted = node.generate(lost_spec, accept=True)
    assert len(node.baseline()) == 7 and uuid not in node.baseline()
    assert accepted.generation.drift.missing == () and uuid not in accepted.generation.drift.new
    assert "gpu-missing" not in accepted.names() and "gpu-baseline" in accepted.names()
    # no longer "missing", but NVML still shows a lost GPU: the node stays out of service
    assert accepted.generation.drain.startswith("gpu lost during inventory: NVML GPU 3: GPU is lost")


def test_accept_after_a_gpu_was_removed_clears_the_drain(node):
    node.generate(spec(8))
    removed = spec(8)
    gone = removed["gpus"].pop(3)
    assert node.generate(removed).generation.drain.startswith("gpu missing:")

    accepted = node.generate(removed, accept=True)
    assert accepted.generation.drain is None
    assert len(node.baseline()) == 7 and gone["uuid"] not in node.baseline()
    assert accepted.names() == ["gpu-baseline"]  # gres.conf already had the 7
    assert accepted.generation.changed is False

    after = node.generate(removed)
    assert after.generation.drain is None and after.events == []
    # a GPU put back after being accepted away is new hardware
    back = node.generate(spec(8))
    assert back.generation.drift.new == (gone["uuid"],)
    assert back.names() == ["gpu-new", "gres-written"]
    assert back.generation.drain is None


@pytest.mark.parametrize("expected, severity", [(8, "error"), (0, "warning")])
def test_nvml_init_failure_leaves_gres_conf_alone(node, expected, severity):
    node.generate(spec(8))
    conf_before, baseline_before = file_id(node.gres_conf), file_id(node.baseline_file)
    node.expected = expected
    broken = spec(8)
    broken["init_error"] = "DRIVER_NOT_LOADED"
    run = node.generate(broken)
    gen = run.generation
    assert gen.inventory is None and gen.text == "" and gen.changed is False and gen.gres == ""
    assert gen.path == node.gres_conf
    failed = run.only("inventory-failed")
    assert run.names() == ["inventory-failed"]
    assert failed.severity == severity
    assert "cannot initialise NVML" in failed.message and "gres.conf left as it is" in failed.message
    if expected:
        assert gen.drain.startswith("gpu inventory failed: ")
        assert "(NVML error 9)" in gen.drain and "load the NVIDIA kernel driver" in gen.drain
    else:
        assert gen.drain is None
    assert file_id(node.gres_conf) == conf_before
    assert file_id(node.baseline_file) == baseline_before


def test_fewer_gpus_than_expected_drains(node):
    node.expected = 8
    run = node.generate(spec(4))
    assert run.generation.drain == "gpus fewer than expected: 4 of 8"
    assert len(gpu_lines(node.gres_conf.read_text())) == 4  # still written: the drain keeps jobs off
    node.expected = 4
    assert node.generate(spec(4)).generation.drain is None


def test_unmapped_gpu_name_gets_the_rule_type_and_a_problem(node):
    renamed = spec(8)
    for i in (2, 6):
        renamed["gpus"][i]["name"] = "NVIDIA A100-SXM4-80GB"
    run = node.generate(renamed)
    gen = run.generation
    types = [line.split(" Type=")[1].split()[0] for line in gpu_lines(gen.text)]
    assert types == ["nvidia_a100-sxm4-80gb" if i in (2, 6) else "h200" for i in range(8)]
    assert gen.gres == "gpu:h200:6,gpu:nvidia_a100-sxm4-80gb:2"
    problem = run.only("inventory-problem")
    assert problem.severity == "warning"
    assert "'NVIDIA A100-SXM4-80GB'" in problem.message and "'nvidia_a100-sxm4-80gb'" in problem.message
    assert gen.drain is None


def test_missing_device_file_is_a_problem_event(node):
    (node.dev / "nvidia5").unlink()
    run = node.generate(spec(8))
    problem = run.only("inventory-problem")
    assert f"{node.dev}/nvidia5 is missing" in problem.message
    assert len(gpu_lines(run.generation.text)) == 8  # the GPU is kept: the line is still right
    assert f"# problem: {problem.message}" in node.gres_conf.read_text().splitlines()
    assert run.generation.drain is None


def test_dry_run_writes_nothing(node):
    run = node.generate(spec(8), dry_run=True)
    gen = run.generation
    assert len(gpu_lines(gen.text)) == 8
    assert gen.changed is True  # would be written
    assert not node.gres_conf.exists()
    assert not node.baseline_file.exists() and not (node.state / "gres").exists()
    assert "gres-written" not in run.names()


# ---------------------------------------------------------------------------
# slurm-ext gres generate / inventory
# ---------------------------------------------------------------------------


def test_cli_generate_writes_and_says_so(node):
    fakenvml.write_spec(node.spec_path, spec(8))
    proc = node.cli("gres", "generate")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {node.gres_conf}: Gres=gpu:h200:8\n"
    assert len(gpu_lines(node.gres_conf.read_text())) == 8
    journal = [json.loads(line) for line in (node.state / "journal.jsonl").read_text().splitlines()]
    assert [r["event"] for r in journal] == ["gpu-baseline", "gres-written"]
    assert {r["component"] for r in journal} == {"gres"}

    again = node.cli("gres", "generate")
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"unchanged {node.gres_conf}: Gres=gpu:h200:8\n"


def test_cli_dry_run_prints_the_file(node):
    fakenvml.write_spec(node.spec_path, spec(8))
    proc = node.cli("gres", "generate", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"# gres.conf for {NODE}, written by slurm-ext gres generate")
    assert len(gpu_lines(proc.stdout)) == 8
    assert "gres: gpu-baseline: " in proc.stderr  # dry runs print events instead of journaling them
    assert not node.gres_conf.exists() and not (node.state / "journal.jsonl").exists()


def test_cli_diff_after_a_gpu_change(node):
    fakenvml.write_spec(node.spec_path, spec(8))
    assert node.cli("gres", "generate").returncode == 0
    before = node.gres_conf.read_bytes()
    lost_spec = spec(8)
    lost_spec["gpus"][3]["lost"] = True
    fakenvml.write_spec(node.spec_path, lost_spec)
    proc = node.cli("gres", "generate", "--diff")
    assert proc.returncode == 1  # the lost GPU: the node should be drained
    out = proc.stdout.splitlines()
    assert out[0] == f"--- {node.gres_conf}" and out[1] == "+++ generated"
    # every line changes (Links= is over the GPUs kept); the new file has no line for GPU 3
    removed = [line for line in out if line.startswith("-NodeName=")]
    added = [line for line in out if line.startswith("+NodeName=")]
    assert len(removed) == 8 and len(added) == 7
    assert not any(f"File={node.dev}/nvidia3 " in line for line in added)
    assert any(line.startswith("+# lost: NVML GPU 3: GPU is lost") for line in out)
    assert node.gres_conf.read_bytes() == before  # --diff writes nothing


def test_cli_lost_gpu_exits_1_and_says_drain(node):
    fakenvml.write_spec(node.spec_path, spec(8))
    assert node.cli("gres", "generate").returncode == 0
    lost_spec = spec(8)
    lost_spec["gpus"][3]["lost"] = True
    fakenvml.write_spec(node.spec_path, lost_spec)
    proc = node.cli("gres", "generate")
    assert proc.returncode == 1
    assert proc.stdout == f"wrote {node.gres_conf}: Gres=gpu:h200:7\n"
    assert f"slurm-ext: the node should be drained: gpu missing: {lost_spec['gpus'][3]['uuid']}" in proc.stderr


def test_cli_nvml_failure_exits_1(node):
    broken = spec(8)
    broken["init_error"] = "DRIVER_NOT_LOADED"
    fakenvml.write_spec(node.spec_path, broken)
    proc = node.cli("gres", "generate")
    assert proc.returncode == 1
    assert f"slurm-ext: error: no GPU inventory; {node.gres_conf} left as it is" in proc.stderr
    assert not node.gres_conf.exists()


def test_cli_unwritable_output_is_one_error_line(node):
    blocker = node.root / "file"
    blocker.write_text("not a directory\n")
    node.output = blocker / "gres.conf"
    fakenvml.write_spec(node.spec_path, spec(8))
    proc = node.cli("gres", "generate")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert f"slurm-ext: error: cannot write {node.output}: Not a directory" in proc.stderr
    assert blocker.read_text() == "not a directory\n"


def test_cli_inventory_json(node):
    fakenvml.write_spec(node.spec_path, spec(8))
    proc = node.cli("gres", "inventory", "--json")
    assert proc.returncode == 0, proc.stderr
    inventory = from_json(proc.stdout)
    assert len(inventory.gpus) == 8
    assert {g.type for g in inventory.gpus} == {"h200"}
    assert [g.uuid for g in inventory.gpus] == [g["uuid"] for g in spec(8)["gpus"]]
    assert [g.device for g in inventory.gpus] == [f"{node.dev}/nvidia{i}" for i in range(8)]

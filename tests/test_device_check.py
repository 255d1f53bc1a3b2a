"""The device check (tests/device/gpu-check) run end to end against the fake NVML, so that it cannot rot before
it is next run on a machine with a GPU: wheels packed from this environment (build-wheels --from-installed,
offline), a venv with pip run from its wheel, every step, and a summary of the shape the GPU run's reader needs.
What the numbers are is the GPU run's business; this holds only that each is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEVICE = REPO / "tests" / "device"
STEPS = ["environment", "install", "fake NVML", "NVML", "gres inventory", "monitor imports (tracemalloc)",
         "health check", "monitor idle and under load", "health check (under load)", "epilog GPU release",
         "acceptance GPU tests", "recordings"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("device") / "wheels"
    done = subprocess.run([sys.executable, DEVICE / "build-wheels", "--from-installed", "--no-fake-recording",
                           "--dest", dest], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dest


@pytest.fixture(scope="module")
def fake_run(wheels, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("device-out")
    done = subprocess.run([DEVICE / "gpu-check", "--fake", "--wheels", wheels, "--out", out, "--phase-seconds", "3",
                           "--import-seconds", "3", "--no-compile"], capture_output=True, text=True, timeout=400,
                          env={**os.environ, "GPU_CHECK_PYTHON": sys.executable}, cwd=REPO)
    return done, out


def test_build_wheels_packs_the_project_its_dependencies_and_pip(wheels):
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("slurm_ext-") for n in names)
    assert any(n.startswith("pip-") for n in names)
    for dependency in ("nvidia_ml_py", "prometheus_client", "pyroute2", "flask", "waitress"):
        assert any(n.lower().startswith(dependency) for n in names), (dependency, names)
    manifest = json.loads((wheels / "manifest.json").read_text())
    assert manifest["total_bytes"] == sum(manifest["files"].values()) < 32 * 2**20


def test_the_fake_run_does_every_step(fake_run):
    done, out = fake_run
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "fake" and summary["exit"] == 0
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == STEPS
    failed = {name: s["detail"] for name, s in steps.items() if not s["ok"]}
    assert not failed, failed
    assert summary["gpu"]["gpus"][0]["name"] == "NVIDIA H200"
    assert summary["gres_inventory"]["gpus"] and not summary["gres_inventory"]["problems"]
    for name in ("health-check", "health-check-load"):
        check = summary["health_check"][name]
        assert check["exit"] == 0 and check["findings"] == [], check


def test_the_summary_has_the_monitor_cost_and_where_its_memory_goes(fake_run):
    done, out = fake_run
    summary = json.loads((out / "summary.json").read_text())
    monitor = summary["monitor"]
    assert monitor["exit"] == 0 and monitor["findings"] == []
    for phase in ("idle", "load"):
        cost = monitor[phase]
        assert cost["seconds"] >= 3 and cost["cpu_percent"] >= 0 and cost["rss_mb"] > 5 and cost["threads"] >= 1
        kinds = cost["breakdown"]["by_kind"]
        assert "libnvidia-ml" in kinds and "python (interpreter, libpython)" in kinds
        assert sum(k["rss_kb"] for k in kinds.values()) == cost["breakdown"]["rss_kb"] > 0
        assert cost["breakdown"]["largest"] and cost["breakdown"]["anonymous_by_use"]
        assert (out / f"smaps-{phase}.txt").stat().st_size > 0
    assert {"utilization", "power_w", "clocks_event_reasons"} <= set(monitor["load"]["readings"][0])
    assert monitor["load_kind"].startswith("fake: ")
    imports = summary["imports"]
    assert imports["monitor_exit"] == 0 and imports["modules_total"] > imports["modules_loaded"] > 50
    assert "pynvml" in imports["by_package"] and "slurm-ext" in imports["by_kind"]
    assert summary["targets"] == {"cpu_percent": 0.2, "rss_mb": 50.0}
    text = (out / "summary.txt").read_text()
    for line in ("CPU % of one core", "RSS, MB (at the end)", "RSS by mapping (idle", "RSS by mapping (load",
                 "imports:", "epilog GPU release: released", "recording: "):
        assert line in text, line
    assert text.strip() in done.stdout  # printed last, as written


def test_the_epilog_release_and_the_recording(fake_run):
    _, out = fake_run
    summary = json.loads((out / "summary.json").read_text())
    release = summary["release"]
    assert release["listed"] and release["released"] and release["still_held"] == []
    assert release["held"]["v2_used_mib"] > release["after"]["v2_used_mib"]
    assert {"v1_used_mib", "v2_used_mib", "v2_reserved_mib"} <= set(release["after"])
    rec = summary["recording"]
    recording = json.loads(Path(rec["recording"]).read_text())
    assert recording["format"] == "slurm-ext-nvml-recording" and len(recording["calls"]) == rec["calls"] > 10
    assert set(rec["part_names"]) == {"gres-inventory", "monitor", "health-check", "health-check-load",
                                      "epilog-release"} and not rec["parts_missing"]
    calls = {c["call"] for c in recording["calls"]}
    assert {"nvmlInit", "nvmlDeviceGetComputeRunningProcesses", "nvmlEventSetCreate"} <= calls
    # compared with each committed recording of an H200 (exit 1: it differs), or "none matches" said
    assert rec["diffs"] and all(d.get("exit") in (0, 1) or d["differs"] is None for d in rec["diffs"])


def test_the_acceptance_phase_runs_gpu_memory_and_bandwidth_through_libcuda(fake_run):
    """The fake libcuda beside the fake NVML: the acceptance child's answers, the H2D share of PCIe Gen5 x16, and
    PyTorch's copy said absent where the machine has no PyTorch."""
    _, out = fake_run
    found = json.loads((out / "summary.json").read_text())["acceptance"]
    for test in ("gpu-memory", "gpu-bandwidth"):
        assert [r["outcome"] for r in found[test]["results"]] == ["pass"], found[test]
    assert round(found["h2d_share"], 3) == round(55.4 / 63, 3)
    assert "d2d_gbps" in found["torch"] or found["torch"]["error"]
    text = (out / "summary.txt").read_text()
    assert "acceptance (libcuda, PTX; standard):" in text and "H2D 87.9% of PCIe Gen5 x16's 63 GB/s" in text


def test_a_python_older_than_3_11_is_named_and_the_check_exits_2(tmp_path):
    old = tmp_path / "python3"
    old.write_text("#!/bin/sh\ncase \"$2\" in *version_info*'>='*) exit 1 ;; esac\necho /usr/bin/python3 3.10.12\n")
    old.chmod(0o755)
    done = subprocess.run([DEVICE / "gpu-check", "--out", tmp_path / "out"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "GPU_CHECK_PYTHON": str(old)})
    assert done.returncode == 2
    assert "needs Python >= 3.11" in done.stderr and "3.10.12" in done.stderr
    assert "needs Python >= 3.11" in (tmp_path / "out" / "summary.txt").read_text()


def test_without_wheels_the_check_says_how_to_make_them(tmp_path):
    done = subprocess.run([DEVICE / "gpu-check", "--fake", "--wheels", tmp_path / "none", "--out", tmp_path / "out"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPU_CHECK_PYTHON": sys.executable})
    assert done.returncode == 2, done.stdout[-2000:]
    assert "tests/device/build-wheels" in done.stdout
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["exit"] == 2

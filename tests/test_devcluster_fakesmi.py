"""The dev cluster's `nvidia-smi --gpu-reset` (devcluster/fakesmi.py) does to a fake GPU what NVIDIA's does to a
real one, no more: run as the node agent runs it (a process, the node's gpus.json named by SLURM_EXT_FAKE_NVML).

What NVIDIA documents of `nvidia-smi -r` / `--gpu-reset`: it clears the GPU's volatile ECC counts (aggregate counts
persist across resets), applies a pending row remap or page retirement (the rows and pages stay remapped or
retired), ends a "reset required" state; it needs no process using the GPU, and a GPU that has fallen off the bus
cannot be reset (a reboot recovers it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slurm_ext.devcluster import fakenvml, fakesmi


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "gpus.json"
    fakenvml.write_spec(path, fakenvml.default_gpus(4))
    return path


def _smi(spec, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, fakenvml.SPEC_ENV: str(spec)}
    return subprocess.run([sys.executable, "-m", "slurm_ext.devcluster.fakesmi", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def _change(spec, gpu: int, **keys) -> None:
    data = json.loads(spec.read_text())
    data["gpus"][gpu] = {**data["gpus"][gpu], **keys}
    fakenvml.write_spec(spec, data)


def _gpu(spec, gpu: int) -> dict:
    return json.loads(spec.read_text())["gpus"][gpu]


def test_a_reset_clears_volatile_ecc_and_applies_pending_remaps_but_keeps_what_persists(spec):
    _change(spec, 1, ecc={"volatile": {"corrected": 3, "uncorrected": 1}, "aggregate": {"corrected": 7,
                                                                                         "uncorrected": 2}},
            remapped_rows={"corrected": 0, "uncorrected": 1, "pending": 1, "failure": 0},
            retired_pages=[{"address": 4096, "cause": "double_bit", "timestamp": 1}], retired_pages_pending=1,
            query_error="RESET_REQUIRED", gpu_recovery_action=1)
    untouched = _gpu(spec, 2)
    done = _smi(spec, "--gpu-reset", "-i", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"GPU {_gpu(spec, 1)['pci_bus_id']} was successfully reset."), done.stdout
    gpu = _gpu(spec, 1)
    assert gpu["ecc"] == {"volatile": {"corrected": 0, "uncorrected": 0},
                          "aggregate": {"corrected": 7, "uncorrected": 2}}
    assert gpu["remapped_rows"] == {"corrected": 0, "uncorrected": 1, "pending": 0, "failure": 0}
    assert gpu["retired_pages"] == [{"address": 4096, "cause": "double_bit", "timestamp": 1}]
    assert gpu["retired_pages_pending"] == 0
    assert gpu.get("query_error") in (None, 0) and gpu["gpu_recovery_action"] == 0
    assert _gpu(spec, 2) == untouched


def test_a_reset_keeps_a_failed_remap_and_a_node_reboots_recovery_action(spec):
    _change(spec, 0, remapped_rows={"corrected": 0, "uncorrected": 3, "pending": 0, "failure": 1},
            gpu_recovery_action=2)
    assert _smi(spec, "-r", "-i", "0").returncode == 0
    gpu = _gpu(spec, 0)
    assert gpu["remapped_rows"]["failure"] == 1 and gpu["gpu_recovery_action"] == 2


def test_a_gpu_fallen_off_the_bus_is_not_reset(spec):
    _change(spec, 3, lost=True, ecc={"volatile": {"corrected": 0, "uncorrected": 1},
                                     "aggregate": {"corrected": 0, "uncorrected": 1}})
    before = spec.read_text()
    done = _smi(spec, "--gpu-reset", "-i", "3")
    assert done.returncode == 15, done.stdout + done.stderr
    assert "GPU is lost" in done.stdout and "Reboot the system to recover this GPU" in done.stdout, done.stdout
    assert spec.read_text() == before


def test_a_gpu_a_process_holds_is_not_reset_and_is_once_the_process_is_gone(spec):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        _change(spec, 2, processes=[{"pid": holder.pid, "used_memory": 2**30, "while_alive": True}],
                ecc={"volatile": {"corrected": 0, "uncorrected": 1}, "aggregate": {"corrected": 0,
                                                                                   "uncorrected": 1}})
        before = spec.read_text()
        done = _smi(spec, "--gpu-reset", "-i", "2")
        assert done.returncode != 0, done.stdout
        bus = _gpu(spec, 2)["pci_bus_id"]
        assert f"GPU {bus}: In use by another client" in done.stdout, done.stdout
        assert "Please first kill all processes using this device" in done.stdout
        assert spec.read_text() == before
    finally:
        holder.kill()
        holder.wait(10)
    done = _smi(spec, "--gpu-reset", "-i", "2")
    assert done.returncode == 0, done.stdout
    assert _gpu(spec, 2)["ecc"]["volatile"]["uncorrected"] == 0


def test_a_gpu_that_is_not_there_is_not_found_and_every_call_is_logged(spec):
    done = _smi(spec, "--gpu-reset", "-i", "4")
    assert done.returncode == 6 and "No devices were found" in done.stdout + done.stderr
    log = spec.parent / fakesmi.LOG_NAME
    assert [json.loads(line) for line in log.read_text().splitlines()] == [["--gpu-reset", "-i", "4"]]


def test_the_fail_file_plays_a_gpu_in_use_in_nvidias_words(spec):
    (spec.parent / fakesmi.FAIL_NAME).touch()
    before = spec.read_text()
    done = _smi(spec, "--gpu-reset", "-i", "0")
    assert done.returncode != 0 and "In use by another client" in done.stdout, done.stdout
    assert spec.read_text() == before

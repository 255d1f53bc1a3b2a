"""The health monitor's NVML reader against the fake library: answers real drivers give that once cost a GPU's
whole sample (and, three polls later, a critical `nvml` finding on a healthy node)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_ext.devcluster import fakenvml

#: reads one snapshot twice (the second with the GPU facts the first kept) and prints each GPU's sample; pynvml's
#: call named in argv[1], if any, fails with NVML's UNKNOWN on GPU 0 (a driver answering a code we do not expect)
_CHILD = textwrap.dedent("""
    import dataclasses, json, sys
    import pynvml
    from slurm_ext.health import nvmlread

    failing = sys.argv[1]

    class Driver:
        def __getattr__(self, name):
            value = getattr(pynvml, name)
            if name != failing:
                return value
            def fail(handle, *args, **kwargs):
                if pynvml.nvmlDeviceGetIndex(handle) == 0:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
                return value(handle, *args, **kwargs)
            fail.__name__ = name
            return fail

    pynvml.nvmlInit()
    facts = {}
    first = nvmlread.read_snapshot(Driver(), facts=facts)
    again = nvmlread.read_snapshot(Driver(), facts=facts)
    print(json.dumps([[dataclasses.asdict(s) for s in snap.gpus] for snap in (first, again)]))
""")


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml")).parent


def _samples(lib: Path, tmp_path: Path, spec: dict, failing: str = "") -> list[list[dict]]:
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    done = subprocess.run([sys.executable, "-c", _CHILD, failing], capture_output=True, text=True, timeout=60,
                          env={**fakenvml.environ(lib, tmp_path / "gpus.json")})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_link_past_the_last_answered_invalid_argument_ends_the_links_and_costs_nothing(lib, tmp_path):
    """pynvml 13's NVML_NVLINK_MAX_LINKS is 36; a GB200 driver answers INVALID_ARGUMENT past the GPU's own links."""
    spec = fakenvml.default_gpus(2)
    for gpu in spec["gpus"]:
        gpu.update(nvlink_count=2, nvlink_past_last="INVALID_ARGUMENT")
    for snapshot in _samples(lib, tmp_path, spec):
        for sample in snapshot:
            assert sample["error"] is None and sample["failed"] == [], sample
            assert sample["nvlink_active"] == 1 and sample["power_w"] is not None, sample


def test_one_failing_call_costs_its_reading_only(lib, tmp_path):
    spec = fakenvml.default_gpus(2)
    for snapshot in _samples(lib, tmp_path, spec, failing="nvmlDeviceGetPowerUsage"):
        broken, fine = snapshot
        assert broken["error"] is None and broken["power_w"] is None, broken
        assert broken["failed"] == ["nvmlDeviceGetPowerUsage: Unknown Error"], broken
        assert broken["temperature"] is not None and broken["fb_used_mib"] == 0.0, broken  # the rest is read
        assert fine["failed"] == [] and fine["power_w"] is not None


def test_a_gpu_without_a_fabric_has_no_fabric_reading_and_a_fact_that_failed_is_asked_again(lib, tmp_path):
    """The real H200 answers the fabric call with SUCCESS and state NOT_SUPPORTED: no fabric, not a broken one."""
    spec = fakenvml.default_gpus(1)
    first, again = _samples(lib, tmp_path, spec, failing="nvmlDeviceGetTemperatureThreshold")
    assert first[0]["fabric_state"] is None and first[0]["fb_reserved_mib"] == fakenvml.MEMORY_RESERVED / 2**20
    # a fact that failed is not kept: asked again at the next poll, and said again
    assert any("nvmlDeviceGetTemperatureThreshold" in call for call in first[0]["failed"])
    assert any("nvmlDeviceGetTemperatureThreshold" in call for call in again[0]["failed"])
    fine, cached = _samples(lib, tmp_path, spec)
    assert fine[0]["slowdown_temperature"] == cached[0]["slowdown_temperature"] == 89

"""The GPU acceptance tests through libcuda (slurm_ext.acceptance.gpucuda) against the fake libcuda.so.1 and
libnvidia-ml.so.1 (devcluster/fakenvml): the real ctypes code, the real PTX text, the real child process.

Each scenario writes a spec (fakenvml.default_gpus plus each GPU's "cuda" object), runs
`python -I -m slurm_ext.acceptance.child` with the fakes on LD_LIBRARY_PATH and reads its JSON answer.
The fake enumerates CUDA devices in the reverse of NVML's order, so a result that names the right
"gpu N" shows the PCI bus id mapping at work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_ext.acceptance import cudadriver, gpucuda, ptx
from slurm_ext.devcluster import fakenvml

from helpers.acceptance import ask_child, by_target, figure

#: the GPU object's key of the fake libcuda's settings (README.md there, "The fake libcuda")
CUDA_KEY = "cuda"
#: a burn of 0.4 x this: short, still several NVML samples
BURN_DEADLINE = 5.0


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fakelib")
    fakenvml.build(out)
    assert (out / "libcuda.so.1").is_file() and os.readlink(out / "libcuda.so") == "libcuda.so.1"
    return out


def _spec(count: int = 2, **cuda) -> dict:
    """A healthy node as the h200-sxm profile judges it: NVLink peers (p2p), idle as recorded (345 MHz, reason
    0x1) and, while the fake libcuda runs its work, as recorded under load (1,470 MHz at the power cap, reason 0x4:
    the fake NVML's default "load"), the fake's default 256 MiB of device memory per GPU."""
    spec = fakenvml.default_gpus(count)
    for gpu in spec["gpus"]:
        gpu[CUDA_KEY] = {"memory_mib": 256, "p2p_gbps": 400, **cuda}
    return spec


def _run(tmp: Path, lib: Path, spec: dict, test: str, level: str = "standard", deadline: float = 30.0,
         config: str = "", env: dict | None = None) -> dict:
    """The child's answer to one test on the node `spec` describes."""
    spec_path, cfg = tmp / "spec.json", tmp / "slurm-ext.toml"
    fakenvml.write_spec(spec_path, spec)
    cfg.write_text(f'[node]\nstate_dir = "{tmp / "state"}"\n{config}')
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **fakenvml.environ(lib, spec_path), **(env or {})}
    return ask_child(cfg, test, level, deadline, environment, cwd=tmp)


def test_a_healthy_node_passes_memory_bandwidth_p2p_and_burn(tmp_path, lib_dir):
    spec = _spec()
    memory = by_target(_run(tmp_path, lib_dir, spec, "gpu-memory"))
    assert set(memory) == {"gpu 0", "gpu 1"}
    for result in memory.values():
        assert result["outcome"] == "pass", result
        assert figure(result, "memory_bad_bytes") == {"name": "memory_bad_bytes", "value": 0.0, "unit": "B",
                                                       "limit": 0, "at_least": False}
        assert "8 of 8 patterns" in result["message"]

    answer = _run(tmp_path, lib_dir, spec, "gpu-bandwidth")
    assert answer["profile"] == "h200-sxm"
    for result in by_target(answer).values():
        assert result["outcome"] == "pass", result
        # the fake's defaults are the real H200's (tests/data/real-gpu): 55.4 / 55.2 / 4,265 GB/s, Gen5 x16
        assert round(figure(result, "h2d_gbps")["value"], 1) == 55.4
        assert round(figure(result, "d2h_gbps")["value"], 1) == 55.2
        assert round(figure(result, "d2d_gbps")["value"]) == 4265
        assert (figure(result, "pcie_gen")["value"], figure(result, "pcie_width")["value"]) == (5, 16)
        assert figure(result, "h2d_gbps")["limit"] == 48

    pairs = by_target(_run(tmp_path, lib_dir, spec, "gpu-p2p"))
    assert set(pairs) == {"gpu 0->gpu 1", "gpu 1->gpu 0"}
    assert all(r["outcome"] == "pass" and round(figure(r, "p2p_gbps")["value"]) == 400 for r in pairs.values())

    burn = by_target(_run(tmp_path, lib_dir, spec, "gpu-burn", deadline=BURN_DEADLINE))
    for result in burn.values():
        # the software power cap (0x4) is no fault
        assert result["outcome"] == "pass", result
        assert figure(result, "burn_sm_clock_mhz")["value"] == 1470  # the recorded H200 under load
        assert figure(result, "burn_throttled_share")["value"] == 0
        assert figure(result, "burn_samples")["value"] >= 3


def test_a_stuck_bit_fails_memory_naming_the_gpu_and_the_address_range(tmp_path, lib_dir):
    spec = _spec()
    spec["gpus"][1][CUDA_KEY]["stuck_bits"] = [{"offset": 0x100000, "bit": 3, "value": 0}]
    spec["gpus"][0][CUDA_KEY]["stuck_bits"] = [{"offset": 0x2345679, "bit": 6, "value": 1},
                                               {"offset": 0x300002, "bit": 0, "value": 1}]
    results = by_target(_run(tmp_path, lib_dir, spec, "gpu-memory", level="quick"))
    one, zero = results["gpu 1"], results["gpu 0"]
    assert one["outcome"] == "fail" and one["action"] == "reset-gpu"
    assert one["message"].startswith("gpu 1: 1 bad 32-bit word(s) in bytes 0x100000-0x100000 ")
    assert "bits 0x00000008 differ" in one["message"]
    assert figure(one, "memory_bad_bytes")["value"] == 4
    # two stuck bits: the range runs from the first bad byte to the last
    assert zero["outcome"] == "fail"
    assert "2 bad 32-bit word(s) in bytes 0x300002-0x2345679 of the 230 MiB tested (3 of 3 patterns)" in \
        zero["message"], zero["message"]


def test_the_fake_kernels_compute_what_the_ptx_says_and_count_real_bad_words(tmp_path, lib_dir):
    """The kernels' C twins in the fake are held to ptx.expected, and check counts words really corrupted (one
    written over through a host copy), through the same ctypes binding the tests use."""
    spec_path = tmp_path / "spec.json"
    fakenvml.write_spec(spec_path, _spec(1))
    script = textwrap.dedent("""
        import ctypes, json
        from slurm_ext.acceptance import cudadriver, ptx
        d = cudadriver.open_driver()
        dev = d.devices()[0]
        d.retain(dev)
        fill, check = (d.function(d.load_module(ptx.MODULE), k) for k in (ptx.FILL, ptx.CHECK))
        words = 1 << 20
        buf, res = d.alloc(words * 4), d.alloc(32)
        out, host = {}, (ctypes.c_uint32 * words)()
        for name, mode in ptx.MODES.items():
            d.launch(fill, 64, 256, [ctypes.c_uint64(buf), ctypes.c_uint64(words), ctypes.c_uint32(mode),
                                     ctypes.c_uint32(0x1234567)])
            d.dtoh(ctypes.addressof(host), buf, words * 4); d.sync()
            good = all(host[i] == ptx.expected(mode, 0x1234567, i, buf + 4 * i) for i in range(0, words, 4099))
            bad = ctypes.c_uint32(host[777] ^ 0x00F0000F)
            d.htod(buf + 4 * 777, ctypes.addressof(bad), 4)
            bad2 = ctypes.c_uint32(host[900001] ^ 0x1)
            d.htod(buf + 4 * 900001, ctypes.addressof(bad2), 4)
            r = (ctypes.c_uint64 * 4)(0, 2**64 - 1, 0, 0)
            d.htod(res, ctypes.addressof(r), 32)
            d.launch(check, 64, 256, [ctypes.c_uint64(buf), ctypes.c_uint64(words), ctypes.c_uint32(mode),
                                      ctypes.c_uint32(0x1234567), ctypes.c_uint64(res)])
            d.dtoh(ctypes.addressof(r), res, 32); d.sync()
            out[name] = [good, *r]
        print(json.dumps(out))
    """)
    env = {"PATH": os.environ.get("PATH", ""), **fakenvml.environ(lib_dir, spec_path)}
    proc = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name, (good, count, low, high, bits) in json.loads(proc.stdout).items():
        assert good, name
        assert (count, low, high, bits) == (2, 777, 900001, 0x00F0000F), name


def test_a_slow_copy_fails_bandwidth_and_a_narrow_link_asks_for_a_reboot(tmp_path, lib_dir):
    spec = _spec()
    spec["gpus"][0][CUDA_KEY]["h2d_gbps"] = 20.0
    spec["gpus"][1]["pcie"] = {"gen": 5, "width": 8, "max_gen": 5, "max_width": 16}
    results = by_target(_run(tmp_path, lib_dir, spec, "gpu-bandwidth", level="quick"))
    slow, narrow = results["gpu 0"], results["gpu 1"]
    assert slow["outcome"] == "fail" and slow["action"] == "reset-gpu"
    assert slow["message"].startswith("gpu 0: h2d_gbps 20 GB/s (>= 48)"), slow["message"]
    assert narrow["outcome"] == "fail" and narrow["action"] == "reboot"
    assert narrow["message"].startswith("gpu 1: pcie_width 8 lanes (>= 16)"), narrow["message"]


def test_a_failing_context_and_a_lost_gpu_are_errors_not_fails(tmp_path, lib_dir):
    spec = _spec()
    spec["gpus"][0][CUDA_KEY]["context_error"] = 999
    spec["gpus"][1][CUDA_KEY]["lost_after_ms"] = 0
    for test in ("gpu-memory", "gpu-bandwidth"):
        results = by_target(_run(tmp_path, lib_dir, spec, test, level="quick"))
        assert results["gpu 0"]["outcome"] == "error"
        assert results["gpu 0"]["message"].startswith(
            "gpu 0: cuDevicePrimaryCtxRetain failed: CUDA_ERROR_UNKNOWN (999)"), results["gpu 0"]["message"]
        assert "fallen off the bus" in results["gpu 0"]["message"]
        assert results["gpu 1"]["outcome"] == "error" and "CUDA_ERROR_UNKNOWN" in results["gpu 1"]["message"]
        assert results["gpu 1"]["message"].startswith("gpu 1: ")

    # lost mid-burn: that GPU's error, the other still judged
    spec = _spec()
    spec["gpus"][1][CUDA_KEY]["lost_after_ms"] = 700
    burn = by_target(_run(tmp_path, lib_dir, spec, "gpu-burn", deadline=BURN_DEADLINE))
    assert burn["gpu 0"]["outcome"] == "pass"
    assert burn["gpu 1"]["outcome"] == "error" and "CUDA_ERROR_UNKNOWN (999)" in burn["gpu 1"]["message"]

    # lost after the memory check counted bad words: still a fail, the error said (extended: 78 patterns of about
    # 30 ms each on 28 MiB, the GPU lost at 300 ms)
    spec = _spec(1, memory_mib=32, stuck_bits=[{"offset": 64, "bit": 1, "value": 1}], lost_after_ms=300)
    result = by_target(_run(tmp_path, lib_dir, spec, "gpu-memory", level="extended"))["gpu 0"]
    assert result["outcome"] == "fail" and "then gpu 0: " in result["message"], result["message"]


def test_without_libcuda_an_old_driver_or_no_ptx_compiler_the_test_cannot_run(tmp_path, lib_dir):
    nvml_only = tmp_path / "nvml-only"
    nvml_only.mkdir()
    shutil.copy(lib_dir / "libnvidia-ml.so.1", nvml_only / "libnvidia-ml.so.1")
    answer = _run(tmp_path, nvml_only, _spec(), "gpu-memory", level="quick")
    assert "cannot load libcuda.so.1" in answer["error"] and "install the driver" in answer["error"], answer

    spec = _spec()
    spec["cuda_driver_version"] = 11080
    answer = _run(tmp_path, lib_dir, spec, "gpu-bandwidth", level="quick")
    assert answer["error"].startswith("the NVIDIA driver offers CUDA 11.8, the GPU tests need 12.0"), answer

    answer = _run(tmp_path, lib_dir, _spec(module_error=221), "gpu-memory", level="quick")
    assert "CUDA_ERROR_JIT_COMPILER_NOT_FOUND (221)" in answer["error"], answer
    assert "libnvidia-ptxjitcompiler" in answer["error"]

    answer = _run(tmp_path, lib_dir, _spec(0), "gpu-memory", level="quick")
    assert answer["error"].startswith("the driver sees no GPU"), answer


def test_p2p_pairs_without_peer_access_and_a_single_gpu(tmp_path, lib_dir):
    # no peer access where the profile expects NVLink (h200-sxm: p2p >= 335 GB/s): a fail per pair
    results = by_target(_run(tmp_path, lib_dir, _spec(p2p_gbps=0), "gpu-p2p"))
    assert results["gpu 0->gpu 1"]["outcome"] == "fail"
    assert results["gpu 0->gpu 1"]["message"].startswith("gpu 0->gpu 1: no peer access between them")
    # the generic profile expects nothing of it: a pass that says so
    results = by_target(_run(tmp_path, lib_dir, _spec(p2p_gbps=0), "gpu-p2p",
                              config='[acceptance]\nprofile = "generic"\n'))
    assert results["gpu 1->gpu 0"]["outcome"] == "pass" and "no peer access" in results["gpu 1->gpu 0"]["message"]
    # a slow pair against a limit of the config
    results = by_target(_run(tmp_path, lib_dir, _spec(p2p_gbps=100), "gpu-p2p"))
    assert results["gpu 1->gpu 0"]["message"] == "gpu 1->gpu 0: p2p_gbps 100 GB/s (>= 335)"
    assert _run(tmp_path, lib_dir, _spec(1), "gpu-p2p")["not_applicable"] == "one GPU: no pair to copy between"


def test_a_throttled_burn_fails_and_limits_come_from_the_config(tmp_path, lib_dir):
    spec = _spec()
    spec["gpus"][1]["load"] = {"clocks_event_reasons": 0x4 | 0x40}  # under load: power cap and HW thermal slowdown
    spec["gpus"][0]["load"] = {"clock_sm": 1100}
    results = by_target(_run(tmp_path, lib_dir, spec, "gpu-burn", deadline=BURN_DEADLINE,
                              config="[acceptance.tests.gpu-burn]\nlimits = { burn_sm_clock_mhz = 1300 }\n"))
    assert results["gpu 0"]["outcome"] == "fail"
    assert results["gpu 0"]["message"].startswith("gpu 0: burn_sm_clock_mhz 1100 MHz (>= 1300)")
    assert results["gpu 1"]["outcome"] == "fail"
    assert results["gpu 1"]["message"] == ("gpu 1: burn_throttled_share 1 (<= 0.05) "
                                           "(clocks event reasons seen: 0x44)")


def test_a_process_sees_only_the_gpus_of_its_device_files(tmp_path, lib_dir):
    """With the fake NVML's device dir, libcuda and NVML see the same GPUs: the second alone is "gpu 0" of this
    process, as under a job's devices cgroup."""
    dev = tmp_path / "dev"
    dev.mkdir()
    fakenvml.make_device(dev / "nvidia1", 1)
    spec = _spec(3)
    spec["gpus"][1][CUDA_KEY]["stuck_bits"] = [{"offset": 4096, "bit": 7, "value": 0}]
    env = fakenvml.environ(lib_dir, tmp_path / "spec.json", dev_dir=dev)
    results = by_target(_run(tmp_path, lib_dir, spec, "gpu-memory", level="quick", env=env))
    assert list(results) == ["gpu 0"] and "0x1000-0x1000" in results["gpu 0"]["message"]


def test_bus_ids_and_byte_ranges():
    assert cudadriver.bus_key("0000:18:00.0") == cudadriver.bus_key("00000000:18:00.0") == (0, 0x18, 0)
    assert cudadriver.bus_key("18:00.0") == (0, 0x18, 0)
    with pytest.raises(ValueError):
        cudadriver.bus_key("gpu0")
    bad = gpucuda._Bad()
    bad.add(3, 42, 82, 0x00F00000)
    bad.add(1, 22, 22, 0x0000000F)
    bad.add(0, 0, 0, 0)
    assert (bad.words, bad.first, bad.last, bad.bits) == (3, 22, 82, 0x00F0000F)
    assert ptx.MODULE.count(b".entry ") == 3 and b".target sm_70" in ptx.MODULE

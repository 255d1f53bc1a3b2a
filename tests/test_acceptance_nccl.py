"""The single-node NCCL all-reduce (slurm_ext.acceptance.gpunccl) against the fake libnccl.so.2, libcuda.so.1 and
libnvidia-ml.so.1 (devcluster/fakenvml): the real ctypes code in the real child process.

Each scenario writes a spec (fakenvml.default_gpus with a small "cuda" memory, and the top-level "nccl" object of
the fake NCCL), runs `python -I -m slurm_ext.acceptance.child` with the fakes on LD_LIBRARY_PATH and
$SLURM_EXT_NCCL_LIBRARY naming the fake NCCL (which build() keeps off the library path), and reads its answer.
The fake NCCL really sums the fake GPUs' buffers; its time follows the spec's bus bandwidth.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from slurm_ext.acceptance import gpunccl
from slurm_ext.devcluster import fakenvml

from helpers.acceptance import CHILD, ask_child, figure

#: the fake NCCL's default version code (fakenccl.c): 2.32.3
VERSION = "2.32.3"
#: 16 MiB of device memory a GPU: a 6 MiB message (two buffers within 90 % less a tenth), so that the fake's sums
#: over 8 GPUs stay quick
MEMORY_MIB = 16
MESSAGE = 6 * 2**20


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fakelib")
    fakenvml.build(out)
    library = fakenvml.nccl_library(out)
    assert library.is_file() and library.parent != out  # off LD_LIBRARY_PATH: no NCCL unless named
    assert not (out / "libnccl.so.2").exists()
    return out


def _spec(count: int = 8, **nccl) -> dict:
    spec = fakenvml.default_gpus(count)
    for gpu in spec["gpus"]:
        gpu["cuda"] = {"memory_mib": MEMORY_MIB}
    if nccl:
        spec["nccl"] = nccl
    return spec


def _run(tmp: Path, lib: Path, spec: dict, level: str = "standard", deadline: float = 60.0, config: str = "",
         nccl: bool = True, env: dict | None = None, extra_path: Path | None = None) -> dict:
    """The child's answer to gpu-nccl on the node `spec` describes; `nccl`: $SLURM_EXT_NCCL_LIBRARY names the
    fake; `extra_path`: one more sys.path entry for the child (a site-packages holding a wheel)."""
    spec_path, cfg = tmp / "spec.json", tmp / "slurm-ext.toml"
    fakenvml.write_spec(spec_path, spec)
    cfg.write_text(f'[node]\nstate_dir = "{tmp / "state"}"\n{config}')
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **fakenvml.environ(lib, spec_path)}
    if nccl:
        environment[gpunccl.LIBRARY_ENV] = str(fakenvml.nccl_library(lib))
    environment.update(env or {})
    command = CHILD if extra_path is None else (
        # the real child module, with one more entry on its sys.path, as a site-packages of the interpreter
        sys.executable, "-I", "-c", f"import runpy, sys; sys.path.append({str(extra_path)!r}); "
        f"runpy.run_module('slurm_ext.acceptance.child', run_name='__main__')")
    return ask_child(cfg, "gpu-nccl", level, deadline, environment, command=command, cwd=tmp)


def _result(answer: dict) -> dict:
    assert "results" in answer, answer
    (result,) = answer["results"]
    assert result["test"] == "gpu-nccl" and result["area"] == "gpu" and result["target"] == ""
    return result



def test_eight_healthy_gpus_pass_at_the_modelled_bus_bandwidth_against_the_h200_sxm_limit(tmp_path, lib_dir):
    answer = _run(tmp_path, lib_dir, _spec(busbw_gbps=480))
    assert answer["profile"] == "h200-sxm"
    result = _result(answer)
    assert result["outcome"] == "pass", result
    busbw = figure(result, "nccl_busbw_gbps")
    assert busbw["limit"] == 388 and busbw["unit"] == "GB/s" and busbw["at_least"]
    # the fake's events count exactly the modelled time: busbw back as set, algbw = busbw x n / 2(n-1)
    assert busbw["value"] == pytest.approx(480, rel=1e-3)
    assert figure(result, "nccl_algbw_gbps")["value"] == pytest.approx(480 * 8 / 14, rel=1e-3)
    assert result["message"].startswith(f"NCCL {VERSION}, 8 GPUs (gpu 0-7), a 6 MiB all-reduce x 20: "
                                        f"nccl_busbw_gbps 480 GB/s (>= 388)"), result["message"]
    assert "the sum is right on every GPU" in result["message"]
    assert result["action"] == "none"


def test_a_slow_all_reduce_fails_with_its_figure_and_a_reboot(tmp_path, lib_dir):
    result = _result(_run(tmp_path, lib_dir, _spec(busbw_gbps=200)))
    assert result["outcome"] == "fail" and result["action"] == "reboot"
    assert figure(result, "nccl_busbw_gbps")["value"] == pytest.approx(200, rel=1e-3)
    assert "nccl_busbw_gbps 200 GB/s (>= 388), too slow" in result["message"], result["message"]
    assert "NVLink" in result["message"] and "reboot" in result["message"]


def test_a_wrong_sum_fails_naming_each_gpu_even_at_full_speed(tmp_path, lib_dir):
    # the fake leaves the last rank's ones out: 7 where 8 GPUs' ones should sum to 8
    result = _result(_run(tmp_path, lib_dir, _spec(busbw_gbps=480, wrong_sum=True)))
    assert result["outcome"] == "fail" and result["action"] == "reboot"
    assert "the sum is wrong: gpu 0: element 0 reads 7, expected 8 (1.0 from each GPU)" in result["message"], \
        result["message"]
    for index in range(8):
        assert f"gpu {index}: element 0 reads 7" in result["message"]
    # every element of the start, middle and end read (1 MiB each) is wrong
    assert f"{3 * 2**20 // 4} of the {3 * 2**20 // 4} elements read are wrong" in result["message"]
    assert figure(result, "nccl_busbw_gbps")["value"] == pytest.approx(480, rel=1e-3)


def test_an_nccl_error_is_an_error_with_nccls_words_never_a_fail(tmp_path, lib_dir):
    at_init = _result(_run(tmp_path, lib_dir, _spec(error=2)))
    assert at_init["outcome"] == "error" and at_init["action"] == "none" and not at_init["figures"]
    assert at_init["message"].startswith(
        f"NCCL {VERSION}, gpu 0-7: ncclCommInitAll failed: unhandled system error (run with NCCL_DEBUG=INFO for "
        f"details) (2): fake NCCL: the spec's nccl.error (2) at init; a system call inside NCCL failed"), \
        at_init["message"]

    in_reduce = _result(_run(tmp_path, lib_dir, _spec(error=1, error_at="allreduce")))
    assert in_reduce["outcome"] == "error"
    assert "ncclGroupEnd failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details) (1)" in \
        in_reduce["message"], in_reduce["message"]


def test_no_nccl_library_is_not_applicable(tmp_path, lib_dir):
    # this venv has no NVIDIA NCCL wheel (CI's neither): nothing is found without $SLURM_EXT_NCCL_LIBRARY
    assert gpunccl.find_library() is None, "a NCCL wheel is installed here: this test needs a venv without one"
    answer = _run(tmp_path, lib_dir, _spec(), nccl=False)
    assert answer["not_applicable"] == "NVIDIA's NCCL wheel is not installed (pip install nvidia-nccl-cu12)"


def test_the_wheels_library_is_found_in_site_packages(tmp_path, lib_dir):
    site_packages = tmp_path / "site-packages"
    wheel_lib = site_packages / "nvidia" / "nccl" / "lib"
    wheel_lib.mkdir(parents=True)
    (wheel_lib / "libnccl.so.2").symlink_to(fakenvml.nccl_library(lib_dir))
    result = _result(_run(tmp_path, lib_dir, _spec(busbw_gbps=480), nccl=False, extra_path=site_packages))
    assert result["outcome"] == "pass", result


def test_a_named_library_that_is_not_there_is_an_error(tmp_path, lib_dir):
    answer = _run(tmp_path, lib_dir, _spec(), env={gpunccl.LIBRARY_ENV: str(tmp_path / "nope.so")})
    assert answer["error"].startswith(f"${gpunccl.LIBRARY_ENV} names {tmp_path / 'nope.so'}, which is not a file")


def test_one_gpu_is_not_applicable(tmp_path, lib_dir):
    answer = _run(tmp_path, lib_dir, _spec(count=1))
    assert answer["not_applicable"] == "one GPU: nothing to all-reduce with"


def test_four_gpus_show_the_8_gpu_limit_unjudged_unless_the_operator_sets_one(tmp_path, lib_dir):
    result = _result(_run(tmp_path, lib_dir, _spec(count=4, busbw_gbps=300)))
    assert result["outcome"] == "pass", result
    assert figure(result, "nccl_busbw_gbps")["limit"] is None
    assert figure(result, "nccl_busbw_gbps")["value"] == pytest.approx(300, rel=1e-3)
    assert "4 GPUs (gpu 0-3)" in result["message"]
    assert "not judged: the h200-sxm profile's 388 GB/s is for 8 GPUs and this node has 4" in result["message"]

    own = _result(_run(tmp_path, lib_dir, _spec(count=4, busbw_gbps=300),
                       config='[acceptance.tests.gpu-nccl]\nlimits = { nccl_busbw_gbps = 350 }\n'))
    assert own["outcome"] == "fail" and figure(own, "nccl_busbw_gbps")["limit"] == 350


def test_extended_asks_8_gib_and_takes_what_memory_allows(tmp_path, lib_dir):
    result = _result(_run(tmp_path, lib_dir, _spec(count=2, busbw_gbps=480), level="extended"))
    assert result["outcome"] == "pass", result
    assert "2 GPUs (gpu 0, gpu 1), a 6 MiB all-reduce x 100" in result["message"], result["message"]


def test_a_slow_all_reduce_stays_inside_its_deadline(tmp_path, lib_dir):
    # 0.05 GB/s busbw: 6 MiB over 2 GPUs (algbw = busbw with 2) takes 126 ms a round, 20 rounds would be 2.5 s;
    # the test plans half its 3 s deadline, of which the 5 warm-up rounds take 0.63 s: at most 6 timed rounds
    started = time.monotonic()
    result = _result(_run(tmp_path, lib_dir, _spec(count=2, busbw_gbps=0.05), deadline=3.0))
    assert time.monotonic() - started < 3.0 + 2.0  # the child's start and the fakes' build are outside its deadline
    iterations = int(result["message"].split(" all-reduce x ")[1].split(":")[0])
    assert 1 <= iterations <= 6, result["message"]
    assert figure(result, "nccl_busbw_gbps")["value"] == pytest.approx(0.05, rel=1e-2)


def test_a_gpu_lost_mid_test_is_an_error_naming_it(tmp_path, lib_dir):
    spec = _spec(busbw_gbps=480)
    spec["gpus"][3]["cuda"]["lost_after_ms"] = 0  # Xid 79 as its context is made: every call on it answers 999
    result = _result(_run(tmp_path, lib_dir, spec))
    assert result["outcome"] == "error" and result["action"] == "none", result
    assert result["message"].startswith(f"NCCL {VERSION}, gpu 0-7: gpu 3: cuStreamCreate failed: CUDA_ERROR_UNKNOWN "
                                        f"(999)"), result["message"]

"""slurm_ext.nvml: the NVML adapter the GPU checks and the gres inventory share.

The adapter runs with the real pynvml over the fake libnvidia-ml
(devcluster/fakenvml) in a child process: pynvml caches the library per
process and LD_LIBRARY_PATH is read at process start. The child reports
pynvml's own init count (`_nvmlLib_refcount`), so init and shutdown are seen
as the library sees them. Pure helpers (`errors`, `error_code`, `text`) are
tested in-process on pynvml's own classes and literal values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slurm_ext import nvml as nvml_adapter
from slurm_ext.devcluster import fakenvml
from slurm_ext.errors import SlurmExtError

# Runs in the child: argv[1] names a scenario; prints one JSON line with what it saw.
# Anything unexpected fails the child with a traceback.
CHILD = textwrap.dedent(
    """
    import json, os, sys, threading

    def spec_without_init_error():
        spec = json.loads(open(os.environ["SLURM_EXT_FAKE_NVML"]).read())
        spec.pop("init_error", None)
        fakenvml.write_spec(os.environ["SLURM_EXT_FAKE_NVML"], spec)

    class Failed(Exception):
        pass

    def fail(err):
        return Failed(f"translated: {err}")

    def caught(work):
        try:
            work()
        except Exception as err:
            return {"type": type(err).__name__, "error": str(err), "cause": type(err.__cause__).__name__,
                    "code": getattr(err.__cause__, "value", None)}
        return None

    scenario = sys.argv[1]
    if scenario == "missing":
        sys.modules["pynvml"] = None  # what a node without nvidia-ml-py sees: the import fails
    from slurm_ext import nvml as adapter
    from slurm_ext.devcluster import fakenvml
    from slurm_ext.gres import inventory
    from slurm_ext.prolog_epilog import gpus

    if scenario == "lazy":
        imported = "pynvml" in sys.modules
        module = adapter.load()
        value = {"imported_before_load": imported, "loaded": module.__name__, "initialised": module._nvmlLib_refcount}
    elif scenario == "missing":
        value = {"load": caught(adapter.load), "gpus": caught(lambda: gpus.gpu_usage([0])),
                 "inventory": caught(inventory.read_inventory)}
    elif scenario == "once":
        nvml = adapter.load()
        together = threading.Barrier(8)

        def init():
            together.wait()  # all threads ask at once, as the agent's concurrent Prologs may
            adapter.init_once(nvml, fail)

        threads = [threading.Thread(target=init) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        adapter.init_once(nvml, fail)
        value = {"refcount": nvml._nvmlLib_refcount, "count": nvml.nvmlDeviceGetCount()}
    elif scenario == "once-failure":
        nvml = adapter.load()
        failed = caught(lambda: adapter.init_once(nvml, fail))
        after_failure = nvml._nvmlLib_refcount
        spec_without_init_error()  # the driver is loaded now
        adapter.init_once(nvml, fail)
        value = {"failed": failed, "after_failure": after_failure, "refcount": nvml._nvmlLib_refcount,
                 "count": nvml.nvmlDeviceGetCount()}
    elif scenario == "session":
        nvml = adapter.load()
        with adapter.session(nvml, fail) as inside:
            during = {"same": inside is nvml, "refcount": nvml._nvmlLib_refcount, "count": nvml.nvmlDeviceGetCount()}
        after = nvml._nvmlLib_refcount
        closed = caught(nvml.nvmlDeviceGetCount)  # the library itself was shut down

        def body_fails():
            with adapter.session(nvml, fail):
                raise LookupError("the block's own error")

        body = caught(body_fails)
        after_body = nvml._nvmlLib_refcount
        adapter.init_once(nvml, fail)
        with adapter.session(nvml, fail):
            nested = nvml._nvmlLib_refcount
        value = {"during": during, "after": after, "closed": closed["type"], "body": body, "after_body": after_body,
                 "nested": nested, "after_nested": nvml._nvmlLib_refcount, "count": nvml.nvmlDeviceGetCount()}
    elif scenario == "session-failure":
        nvml = adapter.load()
        ran = []

        def use():
            with adapter.session(nvml, fail):
                ran.append(True)

        value = {"failed": caught(use), "ran": ran, "refcount": nvml._nvmlLib_refcount}
    elif scenario == "optional":
        nvml = adapter.load()
        adapter.init_once(nvml, fail)
        healthy, lost = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
        cause = nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        pages = adapter.optional(nvml, nvml.nvmlDeviceGetRetiredPages, healthy, cause, default="none")
        other_codes = caught(lambda: adapter.optional(nvml, nvml.nvmlDeviceGetRetiredPages, healthy, cause,
                                                      default="none", codes=(adapter.NOT_FOUND,)))
        try:
            adapter.optional(nvml, nvml.nvmlDeviceGetUUID, lost, default="none")
            lost_error = None
        except adapter.errors(nvml) as err:
            lost_error = {"type": type(err).__name__, "code": adapter.error_code(err)}
        value = {"pages": pages, "other_codes": other_codes, "lost": lost_error,
                 "uuid": adapter.text(adapter.optional(nvml, nvml.nvmlDeviceGetUUID, healthy, default="none"))}
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(value))
    """
)


@pytest.fixture(scope="session")
def fakenvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session; returns its directory."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


def run_child(lib_dir: Path, tmp_path: Path, scenario: str, spec: dict[str, Any] | None = None) -> Any:
    spec_path = tmp_path / "gpus.json"
    fakenvml.write_spec(spec_path, spec or fakenvml.default_gpus(2))
    env = {**os.environ, **fakenvml.environ(lib_dir, spec_path)}
    proc = subprocess.run([sys.executable, "-c", CHILD, scenario], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def spec_with_init_error() -> dict[str, Any]:
    spec = fakenvml.default_gpus(2)
    spec["init_error"] = "DRIVER_NOT_LOADED"
    return spec


# ---------------------------------------------------------------------------
# Real pynvml over the fake library
# ---------------------------------------------------------------------------


def test_pynvml_is_imported_only_by_load(fakenvml_lib: Path, tmp_path: Path) -> None:
    """The Prolog/Epilog imports gpus on its hot path: neither it, the inventory nor the adapter may
    import pynvml before NVML is used, and loading it does not initialise NVML."""
    got = run_child(fakenvml_lib, tmp_path, "lazy")
    assert got == {"imported_before_load": False, "loaded": "pynvml", "initialised": 0}


def test_missing_pynvml_names_the_package_and_each_component_keeps_its_error(
    fakenvml_lib: Path, tmp_path: Path
) -> None:
    got = run_child(fakenvml_lib, tmp_path, "missing")
    fix = "the pynvml package is not installed (pip install nvidia-ml-py)"
    assert got["load"] == {"type": "NvmlUnavailable", "error": f"nvml: {fix}", "cause": "ModuleNotFoundError",
                           "code": None}
    assert got["gpus"] == {"type": "GpuCheckError", "error": f"gpu check: NVML: {fix}", "cause": "NvmlUnavailable",
                           "code": None}
    assert got["inventory"] == {"type": "GresError", "error": f"gres: {fix}", "cause": "NvmlUnavailable",
                                "code": None}


def test_init_once_initialises_one_time_across_threads(fakenvml_lib: Path, tmp_path: Path) -> None:
    assert run_child(fakenvml_lib, tmp_path, "once") == {"refcount": 1, "count": 2}


def test_init_once_translates_a_failure_and_does_not_remember_it(fakenvml_lib: Path, tmp_path: Path) -> None:
    got = run_child(fakenvml_lib, tmp_path, "once-failure", spec_with_init_error())
    assert got["failed"] == {"type": "Failed", "error": "translated: Driver Not Loaded",
                             "cause": "NVMLError_DriverNotLoaded", "code": nvml_adapter.DRIVER_NOT_LOADED}
    assert got["after_failure"] == 0
    assert (got["refcount"], got["count"]) == (1, 2), "a driver loaded after a failed init was not picked up"


def test_session_shuts_down_after_its_block_and_leaves_init_once_in_force(fakenvml_lib: Path, tmp_path: Path) -> None:
    got = run_child(fakenvml_lib, tmp_path, "session")
    assert got["during"] == {"same": True, "refcount": 1, "count": 2}
    assert (got["after"], got["closed"]) == (0, "NVMLError_Uninitialized")
    assert got["body"] == {"type": "LookupError", "error": "the block's own error", "cause": "NoneType",
                           "code": None}, "the block's error was translated or swallowed"
    assert got["after_body"] == 0, "NVML was left initialised after the block failed"
    assert (got["nested"], got["after_nested"], got["count"]) == (2, 1, 2)


def test_session_translates_an_init_failure_and_skips_its_block(fakenvml_lib: Path, tmp_path: Path) -> None:
    got = run_child(fakenvml_lib, tmp_path, "session-failure", spec_with_init_error())
    assert got == {"failed": {"type": "Failed", "error": "translated: Driver Not Loaded",
                              "cause": "NVMLError_DriverNotLoaded", "code": nvml_adapter.DRIVER_NOT_LOADED},
                   "ran": [], "refcount": 0}


def test_optional_answers_the_default_only_for_the_codes_given(fakenvml_lib: Path, tmp_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["lost"] = True
    got = run_child(fakenvml_lib, tmp_path, "optional", spec)
    assert got["pages"] == "none"  # Hopper has no page retirement: NOT_SUPPORTED
    assert (got["other_codes"]["cause"], got["other_codes"]["type"]) == ("NoneType", "NVMLError_NotSupported")
    assert got["lost"] == {"type": "NVMLError_GpuIsLost", "code": nvml_adapter.GPU_IS_LOST}
    assert got["uuid"] == spec["gpus"][0]["uuid"]


# ---------------------------------------------------------------------------
# Pure helpers, on pynvml's own classes and literal values
# ---------------------------------------------------------------------------


def test_errors_of_pynvml_include_the_library_mismatch() -> None:
    assert nvml_adapter.errors(pynvml) == (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)  # why the tuple exists


def test_errors_of_a_stand_in_without_the_mismatch_class() -> None:
    class StandInError(Exception):
        pass

    assert nvml_adapter.errors(SimpleNamespace(NVMLError=StandInError)) == (StandInError,)
    assert nvml_adapter.errors(SimpleNamespace(NVMLError=StandInError, NVMLLibraryMismatchError=None)) == (
        StandInError,)


def test_error_code_reads_pynvml_values_only() -> None:
    assert nvml_adapter.error_code(pynvml.NVMLError(nvml_adapter.GPU_IS_LOST)) == 15
    assert type(pynvml.NVMLError(15)).__name__ == "NVMLError_GpuIsLost"
    assert nvml_adapter.error_code(pynvml.NVMLLibraryMismatchError("no _v2")) is None
    assert nvml_adapter.error_code(ValueError("x")) is None
    assert nvml_adapter.error_code(SimpleNamespace(value=True)) is None
    assert nvml_adapter.error_code(SimpleNamespace(value="15")) is None


def test_text_decodes_old_pynvml_bytes() -> None:
    assert nvml_adapter.text(b"GPU-1234") == "GPU-1234"
    assert nvml_adapter.text(b"NVIDIA \xff") == "NVIDIA \ufffd"  # a damaged name still reads
    assert nvml_adapter.text("550.54.15") == "550.54.15"


def test_unavailable_is_a_slurm_ext_error_naming_the_fix() -> None:
    err = nvml_adapter.NvmlUnavailable()
    assert isinstance(err, SlurmExtError)
    assert str(err) == "nvml: the pynvml package is not installed (pip install nvidia-ml-py)"
    assert err.problem == "the pynvml package is not installed (pip install nvidia-ml-py)"


def test_describe_adds_code_and_advice() -> None:
    assert nvml_adapter.describe("cannot initialise: Driver Not Loaded", 9) == (
        "cannot initialise: Driver Not Loaded (NVML error 9); "
        "load the NVIDIA kernel driver (nvidia-smi should list the GPUs)")
    assert nvml_adapter.describe("Unknown Error", 999) == "Unknown Error (NVML error 999)"
    assert nvml_adapter.describe("no such GPU", None) == "no such GPU"

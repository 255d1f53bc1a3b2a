"""NVIDIA DCGM's own diagnostics where DCGM is installed: `dcgmi diag -r 1|2|3 -j`, judged from its JSON.

Levels map one to one: quick -> -r 1 (deployment checks, seconds), standard -> -r 2 (adds memory and
PCIe, about two minutes), extended -> -r 3 (adds the stress plugins, about 15 minutes), as AWS PCS
maps its QUICK/MEDIUM/LONG. The exit status is not read: dcgmi returns DCGM_ST_NVVS_ERROR (-30) or
DCGM_ST_NVVS_ISOLATE_ERROR (-51), which a shell sees as 226 or 205, for a failed test and for a diag
that could not run alike; the JSON says which.

The JSON's shape (DCGM 4.x): {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
"results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"|"Fail"|"Warn"|"Skip"|..., "warnings":
[{"warning": text, "error_id", "error_category", "error_severity"}]}], "test_summary": {"status"}}]}],
"runtime_error"?: text}, "metadata": {...}}, as NVIDIA/DCGM's own tests of `dcgmi diag -j` read it
(testing/python3/tests: output["DCGM Diagnostic"]["test_categories"][1]["tests"][0]["results"][0]
["warnings"][0]["error_id"], ...). DCGM 3.x named the root "DCGM GPU Diagnostic" and a result's GPU
"gpu_id" (a string): read too.

A test that fails in the Deployment category (persistence mode, the driver, permissions, a process
on the GPU) is the node's set-up, not its hardware: a fail with no repair ("none"); a failure of any
other category (memory, PCIe, the stress plugins) recommends a GPU reset, as DCGM's documentation
places level 2 "as an epilogue on failure" and the repair flow escalates a reset that does not hold.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

from slurm_ext.command import run
from slurm_ext.errors import CommandError, CommandTimeout

from .catalog import Given
from .records import FAIL, PASS, NotApplicable, Result, TestError

__all__ = ["diag", "judge", "LEVELS"]

#: our level -> dcgmi diag's -r
LEVELS = {"quick": 1, "standard": 2, "extended": 3}
_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
#: seconds kept back from the deadline for starting dcgmi and reading its answer
_MARGIN = 5.0
_DEPLOYMENT = "deployment"


def diag(given: Given) -> list[Result]:
    """`dcgmi diag -r N -j` for the level, one result per GPU it reports (and one for the node's other entities).

    Raises:
        NotApplicable: dcgmi is not installed.
        TestError: dcgmi could not run, ran past the deadline, or answered JSON this does not understand.
    """
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        raise NotApplicable("DCGM is not installed (no dcgmi on PATH)")
    level = LEVELS[given.level]
    timeout = max(1.0, given.deadline - _MARGIN)
    cmd = [dcgmi, "diag", "-r", str(level), "-j"]
    started = time.monotonic()
    try:
        answer = run(cmd, timeout, check=False)
    except CommandTimeout as err:
        raise TestError(f"dcgmi diag -r {level} did not finish within {timeout:g}s (the test's deadline): raise "
                        f"[acceptance.tests.gpu-dcgm] deadline, or check nv-hostengine") from err
    except CommandError as err:
        raise TestError(str(err)) from err
    try:
        document = json.loads(answer.stdout)
    except ValueError as err:
        tail = (answer.stderr or answer.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TestError(f"dcgmi diag -r {level} -j gave no JSON (exit status {answer.returncode}): {tail[0]}") from err
    return judge(document, time.monotonic() - started)


def judge(document: Any, seconds: float = 0.0) -> list[Result]:
    """Results from the JSON of `dcgmi diag -j`: per GPU, a fail naming each failed test and DCGM's words.

    Raises:
        TestError: the JSON lacks what the format has (its root, test_categories, a test's results), or DCGM
            reports a runtime error (the diag did not run: nv-hostengine down, GPUs busy).
    """
    if not isinstance(document, dict):
        raise TestError(f"dcgmi diag JSON: expected an object, got {type(document).__name__}")
    root_key = next((key for key in _ROOTS if key in document), None)
    if root_key is None:
        raise TestError(f"dcgmi diag JSON: no {' or '.join(map(repr, _ROOTS))} object (keys: "
                        f"{', '.join(map(str, document)) or 'none'})")
    root = document[root_key]
    if not isinstance(root, dict):
        raise TestError(f"dcgmi diag JSON: {root_key!r} is not an object")
    runtime = root.get("runtime_error") or document.get("runtime_error")
    if runtime:
        raise TestError(f"dcgmi diag could not run: {runtime}")
    categories = root.get("test_categories")
    if not isinstance(categories, list) or not categories:
        raise TestError(f"dcgmi diag JSON: {root_key!r} has no test_categories list")
    per_target: dict[str, dict[str, Any]] = {}
    for category in categories:
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            raise TestError("dcgmi diag JSON: a test category without a tests list")
        name_of_category = str(category.get("category", ""))
        for test in category["tests"]:
            if not isinstance(test, dict) or "name" not in test or not isinstance(test.get("results"), list):
                raise TestError(f"dcgmi diag JSON: a test of {name_of_category or 'a category'} without a name or "
                                f"a results list")
            for item in test["results"]:
                _take(per_target, name_of_category, str(test["name"]), item)
    if not per_target:
        raise TestError("dcgmi diag JSON: no test reported a result for any GPU")
    return [_result(target, found, seconds) for target, found in sorted(per_target.items(), key=_order)]


def _take(per_target: dict, category: str, test: str, item: Any) -> None:
    if not isinstance(item, dict) or "status" not in item:
        raise TestError(f"dcgmi diag JSON: a result of {test} without a status")
    target = _target(item)
    found = per_target.setdefault(target, {"ran": [], "failed": [], "warned": [], "action": "none"})
    status = str(item["status"]).strip().lower()
    words = "; ".join(str(w.get("warning", "")).strip() for w in item.get("warnings") or () if isinstance(w, dict))
    if status == "fail":
        found["failed"].append(f"{test} failed" + (f": {words}" if words else ""))
        if category.strip().lower() != _DEPLOYMENT:
            found["action"] = "reset-gpu"
    elif status in ("warn", "warning"):
        found["warned"].append(f"{test} warned" + (f": {words}" if words else ""))
    if status in ("pass", "warn", "warning", "fail"):
        found["ran"].append(test)


def _target(item: dict) -> str:
    """"gpu N" for a GPU's result (4.x: entity_group GPU and entity_id; 3.x: gpu_id), "" for any other entity."""
    try:
        if "gpu_id" in item and "entity_group" not in item:
            return f"gpu {int(item['gpu_id'])}"
        if str(item.get("entity_group", "")).upper() == "GPU" and "entity_id" in item:
            return f"gpu {int(item['entity_id'])}"
    except (TypeError, ValueError) as err:
        raise TestError(f"dcgmi diag JSON: a GPU result whose id is not a number: {err}") from err
    return ""


def _order(entry: tuple[str, dict]) -> tuple[int, int]:
    target = entry[0]
    return (1, int(target.split()[1])) if target else (0, 0)


def _result(target: str, found: dict, seconds: float) -> Result:
    prefix = f"{target}: " if target else ""
    if found["failed"]:
        return Result("gpu-dcgm", "gpu", target, FAIL, prefix + "; ".join(found["failed"]), (), seconds,
                      found["action"])
    ran = ", ".join(dict.fromkeys(found["ran"])) or "no test ran (all skipped)"
    warned = ("; " + "; ".join(found["warned"])) if found["warned"] else ""
    return Result("gpu-dcgm", "gpu", target, PASS, f"{prefix}passed {ran}{warned}", (), seconds)

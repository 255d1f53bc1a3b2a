"""gpu-dcgm: `dcgmi diag -r N -j` judged from its JSON, the parser on literal documents and the real subprocess
path through the child process with a fake `dcgmi` on PATH.

The documents are written from DCGM 4.x's `dcgmi diag -j` format as NVIDIA/DCGM's own tests read it
(testing/python3/tests: output["DCGM Diagnostic"]["test_categories"][i]["tests"][j]["results"][k] with
"entity_group", "entity_id", "status" and "warnings" [{"warning", "error_id", "error_category",
"error_severity"}], and "test_summary" {"status"}), and DCGM 3.x's ("DCGM GPU Diagnostic", "gpu_id").
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_ext.acceptance import dcgm
from slurm_ext.acceptance.records import TestError

from helpers.acceptance import ask_child


def _result(gpu: int, status: str, warning: str = "") -> dict:
    item = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
    if warning:
        # DCGM_FR_* ids and categories are DCGM's; the numbers here only have to be there
        item["warnings"] = [{"warning": warning, "error_id": 33, "error_category": 3, "error_severity": 2}]
    return item


def _document(*categories: tuple[str, list[tuple[str, list[dict]]]]) -> dict:
    return {
        "DCGM Diagnostic": {
            "test_categories": [
                {"category": category, "tests": [
                    {"name": name, "results": results,
                     "test_summary": {"status": "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"}}
                    for name, results in tests]}
                for category, tests in categories],
        },
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                           "entities": [{"entity_id": 0}, {"entity_id": 1}]}],
        "metadata": {"version": "4.2.3", "Driver Version Detected": "580.159.04"},
    }


HEALTHY = _document(("Deployment", [("software", [_result(0, "Pass"), _result(1, "Pass")])]),
                    ("Integration", [("pcie", [_result(0, "Pass"), _result(1, "Pass")])]),
                    ("Hardware", [("memory", [_result(0, "Pass"), _result(1, "Pass")])]))

MEMORY_FAILS = _document(
    ("Deployment", [("software", [_result(0, "Pass"), _result(1, "Pass")])]),
    ("Hardware", [("memory", [_result(0, "Pass"),
                              _result(1, "Fail", "Memory test detected DBE on GPU 1: row remapping required")])]))


# -- the parser --------------------------------------------------------------------------------------------------


def test_a_healthy_diag_passes_every_gpu_naming_what_ran() -> None:
    results = dcgm.judge(HEALTHY, 1.5)
    assert [(r.target, r.outcome) for r in results] == [("gpu 0", "pass"), ("gpu 1", "pass")]
    assert results[0].message == "gpu 0: passed software, pcie, memory"


def test_a_hardware_failure_fails_its_gpu_with_reset_gpu_and_dcgms_words() -> None:
    results = {r.target: r for r in dcgm.judge(MEMORY_FAILS)}
    assert results["gpu 0"].outcome == "pass"
    failed = results["gpu 1"]
    assert (failed.outcome, failed.action) == ("fail", "reset-gpu")
    assert failed.message == "gpu 1: memory failed: Memory test detected DBE on GPU 1: row remapping required"


def test_a_deployment_failure_is_the_nodes_set_up_not_a_repair() -> None:
    doc = _document(("Deployment", [("software", [_result(0, "Fail", "Persistence mode for GPU 0 is disabled.")])]))
    (result,) = dcgm.judge(doc)
    assert (result.outcome, result.action) == ("fail", "none")
    assert "Persistence mode for GPU 0 is disabled." in result.message


def test_warnings_and_skips_pass_and_other_entities_are_the_nodes() -> None:
    doc = _document(("Hardware", [("memory", [_result(0, "Warn", "GPU 0 ran warm"), _result(1, "Skip")]),
                                  ("cpu_eud", [{"entity_group": "CPU", "entity_id": 0, "status": "Pass"}])]))
    results = {r.target: r for r in dcgm.judge(doc)}
    assert list(results) == ["", "gpu 0", "gpu 1"]
    assert results["gpu 0"].outcome == "pass" and "memory warned: GPU 0 ran warm" in results["gpu 0"].message
    assert results["gpu 1"].message == "gpu 1: passed no test ran (all skipped)"
    assert results[""].message == "passed cpu_eud"


def test_dcgm_3_documents_are_read_too() -> None:
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Pass"},
                                           {"gpu_id": "1", "status": "Fail",
                                            "warnings": [{"warning": "DBE", "error_id": 31}]}]}]}]}}
    results = {r.target: r.outcome for r in dcgm.judge(doc)}
    assert results == {"gpu 0": "pass", "gpu 1": "fail"}


@pytest.mark.parametrize("document, words", [
    ([], "expected an object, got list"),
    ({"version": "4.2.3"}, "no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' object (keys: version)"),
    ({"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}},
     "dcgmi diag could not run: Unable to connect to the host engine"),
    ({"DCGM Diagnostic": {}}, "'DCGM Diagnostic' has no test_categories list"),
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware"}]}}, "a test category without a tests list"),
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory"}]}]}},
     "a test of Hardware without a name or a results list"),
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0}]}]}]}}, "a result of memory without a "
                                                                                        "status"),
    ({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": []}]}]}}, "no test reported a result for any GPU"),
])
def test_json_that_is_not_the_format_is_an_error_naming_what_is_missing(document, words: str) -> None:
    with pytest.raises(TestError, match="^dcgmi diag") as raised:
        dcgm.judge(document)
    assert words in str(raised.value)


# -- the real subprocess path --------------------------------------------------------------------------------------


@pytest.fixture
def fake_dcgmi(tmp_path: Path):
    """A `dcgmi` that records its arguments and prints $FAKE_DCGMI_JSON's file, then exits with $FAKE_DCGMI_RC
    (226: what a shell sees of DCGM_ST_NVVS_ERROR, -30, for a failed diag)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dcgmi"
    script.write_text("#!/bin/sh\n"
                      "echo \"$@\" > \"$FAKE_DCGMI_ARGS\"\n"
                      "[ -n \"$FAKE_DCGMI_SLEEP\" ] && sleep \"$FAKE_DCGMI_SLEEP\"\n"
                      "cat \"$FAKE_DCGMI_JSON\"\n"
                      "exit \"${FAKE_DCGMI_RC:-0}\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _child(tmp_path: Path, path: str, level: str = "quick", deadline: float = 60.0, **fake: str) -> dict:
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n\n[acceptance]\nprofile = "generic"\n')
    env = {**os.environ, "PATH": path, "FAKE_DCGMI_ARGS": str(tmp_path / "args"), **fake}
    return ask_child(config, "gpu-dcgm", level, deadline, env)


def test_a_failed_diag_exiting_226_is_judged_from_its_json(tmp_path: Path, fake_dcgmi: Path) -> None:
    (tmp_path / "diag.json").write_text(json.dumps(MEMORY_FAILS))
    answer = _child(tmp_path, f"{fake_dcgmi}:/usr/bin:/bin", "standard", FAKE_DCGMI_JSON=str(tmp_path / "diag.json"),
                    FAKE_DCGMI_RC="226")
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "2", "-j"]
    outcomes = {r["target"]: (r["outcome"], r["action"]) for r in answer["results"]}
    assert outcomes == {"gpu 0": ("pass", "none"), "gpu 1": ("fail", "reset-gpu")}


@pytest.mark.parametrize("level, run_level", [("quick", "1"), ("extended", "3")])
def test_each_level_runs_its_diag_level_and_a_healthy_diag_passes(tmp_path: Path, fake_dcgmi: Path, level: str,
                                                                   run_level: str) -> None:
    (tmp_path / "diag.json").write_text(json.dumps(HEALTHY))
    answer = _child(tmp_path, f"{fake_dcgmi}:/usr/bin:/bin", level, FAKE_DCGMI_JSON=str(tmp_path / "diag.json"))
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", run_level, "-j"]
    assert {r["outcome"] for r in answer["results"]} == {"pass"}


def test_output_that_is_not_json_is_an_error_with_dcgmis_last_words(tmp_path: Path, fake_dcgmi: Path) -> None:
    (tmp_path / "diag.json").write_text("Error: unable to establish a connection to the specified host: localhost\n")
    answer = _child(tmp_path, f"{fake_dcgmi}:/usr/bin:/bin", FAKE_DCGMI_JSON=str(tmp_path / "diag.json"),
                    FAKE_DCGMI_RC="255")
    assert answer["error"] == ("dcgmi diag -r 1 -j gave no JSON (exit status 255): Error: unable to establish a "
                               "connection to the specified host: localhost")


def test_a_diag_past_the_deadline_is_killed_and_an_error(tmp_path: Path, fake_dcgmi: Path) -> None:
    (tmp_path / "diag.json").write_text(json.dumps(HEALTHY))
    answer = _child(tmp_path, f"{fake_dcgmi}:/usr/bin:/bin", deadline=6.5, FAKE_DCGMI_JSON=str(tmp_path / "diag.json"),
                    FAKE_DCGMI_SLEEP="30")
    assert answer["error"].startswith("dcgmi diag -r 1 did not finish within 1.5s (the test's deadline)")


def test_without_dcgmi_the_test_does_not_apply(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    answer = _child(tmp_path, str(empty))
    assert answer["not_applicable"] == "DCGM is not installed (no dcgmi on PATH)"

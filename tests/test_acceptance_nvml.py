"""The NVML acceptance tests (gpu-inventory, gpu-nvlink) and the SKU profiles, through the real child process
(`python -I -m slurm_ext.acceptance.child`) and the real pynvml over the fake libnvidia-ml.

The healthy GPU is the recorded H200 (tests/data/real-gpu/h200-580-idle.json through spec_from_recording): its
answers, NOT_SUPPORTED for NVLink link 0 and for retired pages included, must pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_ext.acceptance import profiles
from slurm_ext.devcluster import fakenvml

from helpers.acceptance import ask_child, by_target

DATA = Path(__file__).parent / "data" / "real-gpu"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


def _recorded_h200() -> dict:
    return fakenvml.spec_from_recording(json.loads((DATA / "h200-580-idle.json").read_text()))


def _hgx(name: str = H100, count: int = 8) -> dict:
    """`count` GPUs on an NVSwitch board: each GPU's 18 NVLinks active (their far ends are switches)."""
    spec = fakenvml.default_gpus(count, name)
    for gpu in spec["gpus"]:
        gpu["nvlink_peers"] = [f"00000000:{0xA0 + k:02X}:00.0" for k in range(18)]
        gpu["nvlink_count"] = 18
    return spec


def _baseline(state_dir: Path, count: int) -> None:
    """gres's baseline of `count` GPUs, in gres's own format (gres.generation._save_baseline)."""
    (state_dir / "gres").mkdir(parents=True, exist_ok=True)
    gpus = {f"GPU-{0xFA4E0000 + i:08x}-0000-4000-8000-{i:012x}": [f"00000000:{0x10 + 8 * i:02X}:00.0", i]
            for i in range(count)}
    (state_dir / "gres" / "baseline.json").write_text(json.dumps({"gpus": gpus}))


def _child(nvml_lib: Path, tmp_path: Path, test: str, spec: dict, acceptance: str = "", level: str = "quick",
           path: str | None = None) -> dict:
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n\n[acceptance]\n{acceptance}\n')
    env = {**os.environ, **fakenvml.environ(nvml_lib, tmp_path / "gpus.json")}
    if path is not None:
        env["PATH"] = path
    return ask_child(config, test, level, 60.0, env)


# -- the recorded H200 -------------------------------------------------------------------------------------------


def test_the_recorded_h200_passes_inventory_with_the_h200_sxm_profile(nvml_lib: Path, tmp_path: Path) -> None:
    _baseline(tmp_path / "state", 1)
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", _recorded_h200())
    assert (answer["profile"], answer["profile_note"]) == ("h200-sxm", "")
    results = by_target(answer)
    assert {r["outcome"] for r in results.values()} == {"pass"}, results
    node = results[""]
    assert "1 GPUs (expected 1, from gres/baseline.json); driver 580.159.04" == node["message"]
    assert {f["name"]: (f["value"], f["limit"]) for f in node["figures"]} == {"gpu_count": (1, 1), "driver_major": (580, 550)}
    gpu = results["gpu 0"]
    # 150,754,820,096 bytes, as the real H200 answered, against the profile's 140 GiB
    assert gpu["figures"] == [{"name": "memory_gib", "value": 140.4, "unit": "GiB", "limit": 139, "at_least": True}]
    for shown in ("NVIDIA H200", "VBIOS 96.00.A5.00.1A", "persistence on", "ECC on"):
        assert shown in gpu["message"]


def test_the_recorded_h200_has_no_nvlink_to_test(nvml_lib: Path, tmp_path: Path) -> None:
    answer = _child(nvml_lib, tmp_path, "gpu-nvlink", _recorded_h200())
    assert answer["not_applicable"] == "no NVLink on these GPUs (NVML: not supported on link 0)"


def test_without_an_expected_count_the_count_is_shown_not_judged(nvml_lib: Path, tmp_path: Path) -> None:
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", _recorded_h200())
    node = by_target(answer)[""]
    assert node["outcome"] == "pass"
    assert "count not judged: no [acceptance] gpus and no gres baseline yet" in node["message"]
    assert node["figures"][0]["limit"] is None


# -- an 8-GPU HGX H100 ------------------------------------------------------------------------------------------


def test_eight_h100s_with_their_nvlinks_pass_both(nvml_lib: Path, tmp_path: Path) -> None:
    inventory = _child(nvml_lib, tmp_path, "gpu-inventory", _hgx(), "gpus = 8")
    assert inventory["profile"] == "h100-sxm"
    assert [r["target"] for r in inventory["results"]] == ["", *(f"gpu {i}" for i in range(8))]
    assert {r["outcome"] for r in inventory["results"]} == {"pass"}
    assert "8 GPUs (expected 8, from [acceptance] gpus)" in inventory["results"][0]["message"]
    links = _child(nvml_lib, tmp_path, "gpu-nvlink", _hgx())
    assert len(links["results"]) == 8
    for result in links["results"]:
        assert result["outcome"] == "pass", result
        assert result["figures"][0]["value"] == 18 and result["figures"][0]["limit"] == 18


def test_nvlinks_down_fail_naming_the_gpu_and_links_with_reboot(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx()
    spec["gpus"][5]["nvlink_peers"] = spec["gpus"][5]["nvlink_peers"][:16]
    spec["gpus"][5]["nvlink_count"] = 18
    results = by_target(_child(nvml_lib, tmp_path, "gpu-nvlink", spec))
    assert results["gpu 5"]["outcome"] == "fail"
    assert results["gpu 5"]["action"] == "reboot"
    assert results["gpu 5"]["message"] == "gpu 5: 16 active NVLinks (expected >= 18); inactive: 16, 17"
    assert all(results[f"gpu {i}"]["outcome"] == "pass" for i in range(8) if i != 5)


def test_a_missing_gpu_fails_the_count_with_reboot(nvml_lib: Path, tmp_path: Path) -> None:
    _baseline(tmp_path / "state", 8)
    spec = _hgx()
    del spec["gpus"][3]
    results = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec))
    node = results[""]
    assert (node["outcome"], node["action"]) == ("fail", "reboot")
    assert node["message"] == "1 GPU missing: 7 of 8 (from gres/baseline.json)"
    assert [f["value"] for f in node["figures"] if f["name"] == "gpu_count"] == [7]
    assert all(results[f"gpu {i}"]["outcome"] == "pass" for i in range(7))


# -- memory health -----------------------------------------------------------------------------------------------


def test_row_remapping_pending_fails_with_reset_gpu_and_failed_with_remove(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx()
    spec["gpus"][2]["remapped_rows"] = {"corrected": 0, "uncorrected": 1, "pending": 1, "failure": 0}
    spec["gpus"][6]["remapped_rows"] = {"corrected": 0, "uncorrected": 512, "pending": 0, "failure": 1}
    results = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec, "gpus = 8"))
    assert (results["gpu 2"]["outcome"], results["gpu 2"]["action"]) == ("fail", "reset-gpu")
    assert results["gpu 2"]["message"] == "gpu 2: row remapping pending (applied at the next GPU reset)"
    assert (results["gpu 6"]["outcome"], results["gpu 6"]["action"]) == ("fail", "remove")
    assert "gpu 6: row remapping failed (512 rows remapped" in results["gpu 6"]["message"]
    assert results["gpu 0"]["outcome"] == "pass"


def test_ecc_off_fails_a_data_centre_gpu_with_reboot_and_is_shown_under_generic(nvml_lib: Path,
                                                                                 tmp_path: Path) -> None:
    spec = _hgx(count=2)
    spec["gpus"][1]["ecc_mode"] = {"current": 0, "pending": 0}
    results = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec))
    assert (results["gpu 1"]["outcome"], results["gpu 1"]["action"]) == ("fail", "reboot")
    assert "gpu 1: ECC off (memory errors go uncorrected and unreported" in results["gpu 1"]["message"]
    assert "enable it (nvidia-smi -e 1) and reboot" in results["gpu 1"]["message"]
    spec["gpus"][1]["ecc_mode"] = {"current": 0, "pending": 1}
    results = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec))
    assert "on at the next reboot" in results["gpu 1"]["message"]
    generic = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec, 'profile = "generic"'))
    assert generic["gpu 1"]["outcome"] == "pass" and "ECC off" in generic["gpu 1"]["message"]


def test_retired_pages_pending_fails_with_reset_gpu(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx(count=2)
    spec["gpus"][0].update(retired_pages=[{"address": 4096, "cause": "double_bit"}], retired_pages_pending=1)
    results = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec))
    assert (results["gpu 0"]["outcome"], results["gpu 0"]["action"]) == ("fail", "reset-gpu")
    assert "page retirement pending" in results["gpu 0"]["message"]
    assert results["gpu 1"]["outcome"] == "pass"


def test_a_lost_gpu_fails_with_reboot(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx(count=2)
    spec["gpus"][1]["lost"] = True
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", spec, 'profile = "h100-sxm"')
    lost = by_target(answer)["gpu 1"]
    assert (lost["outcome"], lost["action"]) == ("fail", "reboot")
    assert "GPU is lost" in lost["message"] and "drain the node" in lost["message"]


def test_less_memory_than_the_model_fails(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _recorded_h200()
    spec["gpus"][0]["memory_total"] = 100 * 2**30
    gpu = by_target(_child(nvml_lib, tmp_path, "gpu-inventory", spec))["gpu 0"]
    assert gpu["outcome"] == "fail"
    assert gpu["message"] == "gpu 0: memory_gib 100 GiB (>= 139): less memory than the model has"


# -- the profile's choice ----------------------------------------------------------------------------------------


def test_an_unknown_gpu_gets_the_generic_profile_with_a_note(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx("NVIDIA RTX PRO 6000 Blackwell Server Edition", 2)
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", spec)
    assert answer["profile"] == "generic"
    assert answer["profile_note"] == ("unknown GPU 'NVIDIA RTX PRO 6000 Blackwell Server Edition': the generic "
                                      "profile's limits")
    assert {r["outcome"] for r in answer["results"]} == {"pass"}
    # the generic profile has no NVLink count: every link the GPU has must be up, whatever the SKU
    links = _child(nvml_lib, tmp_path, "gpu-nvlink", spec)
    assert all(r["outcome"] == "pass" and r["figures"][0]["limit"] == 18 for r in links["results"])


def test_gpus_that_differ_are_noted_and_the_odd_one_fails_the_profile(nvml_lib: Path, tmp_path: Path) -> None:
    spec = _hgx(count=2)
    spec["gpus"][1]["name"] = "NVIDIA H200"
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", spec)
    assert answer["profile"] == "h100-sxm"
    assert "GPUs differ: gpu 0 is 'NVIDIA H100 80GB HBM3', others 'NVIDIA H200'" in answer["profile_note"]
    odd = by_target(answer)["gpu 1"]
    assert odd["outcome"] == "fail" and "'NVIDIA H200' is not the profile's (h100-sxm" in odd["message"]


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "h200-nvl", "b200", "generic"])
def test_a_named_profile_is_taken_whatever_the_gpus_are(nvml_lib: Path, tmp_path: Path, name: str) -> None:
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", _recorded_h200(), f'profile = "{name}"')
    assert (answer["profile"], answer["profile_note"]) == (name, "")
    memory = by_target(answer)["gpu 0"]["figures"][0]
    assert memory["limit"] == profiles.PROFILES[name].limits.get("memory_gib")


def test_without_a_driver_the_profile_is_generic_and_the_test_says_why(nvml_lib: Path, tmp_path: Path) -> None:
    answer = _child(nvml_lib, tmp_path, "gpu-inventory", {"init_error": "DRIVER_NOT_LOADED"})
    assert answer["profile"] == "generic"
    assert answer["profile_note"].startswith("NVML cannot start: ")
    assert answer["profile_note"].endswith("the generic profile's limits")
    assert "load the NVIDIA kernel driver" in answer["error"]


def test_every_profile_names_only_the_catalogs_limit_keys_and_the_names_match() -> None:
    from slurm_ext.acceptance.catalog import TESTS
    known = {key for spec in TESTS.values() for key in spec.limits}
    for profile in profiles.PROFILES.values():
        assert set(profile.limits) <= known - {"gpu_count"}, profile.name
        for gpu_name in profile.names:
            assert profiles.match(gpu_name.lower()) is profile
    assert profiles.match("NVIDIA H200") is profiles.PROFILES["h200-sxm"]
    assert profiles.match("NVIDIA A100-SXM4-80GB") is None
    # the generic profile never judges what a healthy unknown part may not reach
    assert set(profiles.GENERIC.limits) == {"memory_bad_bytes", "burn_throttled_share"}
    assert profiles.choose("b200") == (profiles.PROFILES["b200"], "")


def test_the_operator_pages_table_is_the_profiles() -> None:
    page = (Path(__file__).parent.parent / "docs" / "operator" / "acceptance-profiles.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `") and line.count("|") == 8]
    shown = {row.split("|")[1].strip(" `"): [c.strip() for c in row.split("|")[3:8]] for row in rows}
    names = list(profiles.PROFILES)
    assert names == ["h100-sxm", "h200-sxm", "h200-nvl", "b200", "generic"]
    for key, cells in shown.items():
        for name, cell in zip(names, cells):
            value = profiles.PROFILES[name].limits.get(key)
            assert cell == ("—" if value is None else f"{value:g}"), (key, name)
    assert set(shown) >= {key for p in profiles.PROFILES.values() for key in p.limits}

"""[acceptance] through the real config loader, the drain reason a failed run gives, and the slurm.conf lines of the
HealthCheckProgram: pure logic, no GPU."""

from __future__ import annotations

import pytest

from slurm_ext.acceptance.catalog import TESTS, specs_for
from slurm_ext.acceptance.records import FAIL, PASS, Figure, Result, Run, judged
from slurm_ext.acceptance.settings import WHY_OFF, AcceptanceSection
from slurm_ext.acceptance.slurmconf import slurm_conf_lines
from slurm_ext.slurm import version_tuple
from slurm_ext.acceptance.verdict import drain_reason
from slurm_ext.config import from_dict, render
from slurm_ext.errors import ConfigError
from slurm_ext.nodestate import catalogue


def acceptance(table: dict):
    return from_dict({"acceptance": table}).acceptance


def refused(table: dict) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        from_dict({"acceptance": table})
    return caught.value


def test_off_by_default_and_says_why():
    section = acceptance({})
    assert section == AcceptanceSection() and section.enabled is False
    assert "small or short-lived" in WHY_OFF and "enabled = true" in WHY_OFF


def test_a_typoed_limit_is_refused_naming_the_key_and_the_test_s_limits():
    err = refused({"tests": {"gpu-bandwidth": {"limits": {"h2d_gpbs": 40}}}})
    assert err.key == "acceptance.tests.gpu-bandwidth.limits"
    assert "unknown limit 'h2d_gpbs'" in err.problem and "h2d_gbps" in err.problem


def test_an_unknown_test_is_refused_with_the_tests_named():
    err = refused({"tests": {"gpu-memtest": {"enabled": False}}})
    assert err.key == "acceptance.tests.gpu-memtest"
    assert all(name in err.problem for name in TESTS)


def test_a_limit_must_be_a_number():
    err = refused({"tests": {"gpu-bandwidth": {"limits": {"h2d_gbps": "40GB/s"}}}})
    assert "expected a number" in err.problem


def test_limits_merge_the_config_over_the_profile_and_keep_only_the_test_s_own():
    section = acceptance({"tests": {"gpu-bandwidth": {"limits": {"h2d_gbps": 40}, "deadline": "20s"}}})
    merged = section.limits("gpu-bandwidth", {"h2d_gbps": 48.0, "d2h_gbps": 48.0, "p2p_gbps": 335.0})
    assert merged == {"h2d_gbps": 40.0, "d2h_gbps": 48.0}
    assert section.deadline("gpu-bandwidth", "quick") == 20.0
    assert section.deadline("gpu-memory", "standard") == 300.0


def test_config_show_renders_a_limit_back_as_a_number():
    text = render(from_dict({"acceptance": {"tests": {"storage": {"limits": {"fsync_ms": 2.5}}}}}))
    assert "[acceptance.tests.storage]" in text and "fsync_ms" in text and "2.5" in text


def test_levels_grow_quick_within_standard_within_extended():
    quick, standard, extended = ({s.name for s in specs_for(level)} for level in ("quick", "standard", "extended"))
    assert quick < standard <= extended
    assert "gpu-memory" in quick and "gpu-burn" not in quick


def _run(*results: Result) -> Run:
    return Run("gpu-node-3", "quick", "start", 1000.0, 1010.0, "h200-sxm", list(results))


def test_a_failed_run_s_reason_is_our_kind_and_names_the_gpu_and_the_address_range():
    memory = Result("gpu-memory", "gpu", "gpu 1", FAIL, "3 bad words in 0x100000-0x100fff", action="reset-gpu")
    slow = judged("gpu-bandwidth", "gpu", "gpu 0", [Figure("h2d_gbps", 20.0, "GB/s", 48.0)], action="reboot")
    assert slow.outcome == FAIL and "h2d_gbps 20 GB/s (>= 48)" in slow.message
    reason = drain_reason(_run(memory, slow))
    kind = catalogue.kind_of(reason)
    assert kind is not None and kind.owner == "acceptance"
    fields = kind.parse(reason)
    assert fields["level"] == "quick" and fields["action"] == "reboot"  # the most disruptive of the two
    assert fields["detail"].startswith("gpu-memory gpu 1: 3 bad words in 0x100000-0x100fff") and "(+1 failed)" in reason


def test_a_long_message_is_cut_in_the_reason():
    long = Result("storage", "storage", "/scratch", FAIL, "x" * 1000)
    assert len(drain_reason(_run(long))) < 260


def test_verdict_is_the_worst_and_an_empty_run_was_not_measured():
    ok = Result("gpu-nvlink", "gpu", "gpu 0", PASS, "18 links")
    assert _run(ok).verdict == "pass"
    assert _run().verdict == "error"
    assert _run(ok, Result("gpu-dcgm", "gpu", "", "error", "dcgmi hung")).verdict == "error"
    assert Run.from_json(_run(ok).to_json()).to_json() == _run(ok).to_json()


def test_a_nan_figure_is_never_within_its_limit():
    assert not Figure("h2d_gbps", float("nan"), "GB/s", 48.0).within
    assert Figure("h2d_gbps", float("nan"), "GB/s").within  # shown, not judged


@pytest.mark.parametrize("version,lines", [
    ("22.05.8", 0), ("24.11.5", 0), ("25.05.3", 0), ("25.11.0", 2), ("slurm 26.05.1", 2)])
def test_health_check_program_lines_only_where_slurm_has_start_only(version, lines):
    got = slurm_conf_lines(version, "/usr/local/sbin/slurm-ext-accept-start")
    assert len(got) == lines
    if lines:
        assert got == ["HealthCheckProgram=/usr/local/sbin/slurm-ext-accept-start", "HealthCheckNodeState=START_ONLY"]


def test_health_check_timeout_only_from_26_05():
    assert "HealthCheckTimeout=300" in slurm_conf_lines("26.05.0", "/x", timeout=300)
    assert not any("Timeout" in line for line in slurm_conf_lines("25.11.2", "/x", timeout=300))
    with pytest.raises(ValueError, match="not a Slurm version"):
        version_tuple("latest")


def test_a_fail_recommends_in_health_s_words():
    from slurm_ext.acceptance.records import ACTIONS
    from slurm_ext.health.settings import ACTIONS as HEALTH_ACTIONS
    assert ACTIONS == HEALTH_ACTIONS


def test_a_pass_lifts_only_a_drain_of_its_own_level_or_a_shorter_one(tmp_path):
    """A standard run's failed burn drains; a quick pass (no burn) keeps the drain; a standard pass lifts it."""
    from slurm_ext.acceptance.verdict import drained_level, settle
    calls, told = [], []

    def run(level: str, outcome: str) -> Run:
        return Run("n1", level, "manual", 0.0, 1.0, "h200-sxm",
                   [Result("gpu-burn" if outcome == FAIL else "gpu-memory", "gpu", "gpu 0", outcome, "measured",
                           action="reboot" if outcome == FAIL else "none")])

    def apply(level: str, outcome: str, full: bool = True):
        return settle(str(tmp_path), run(level, outcome), full, want=lambda reason: calls.append(("want", reason)),
                      clear=lambda: calls.append(("clear",)), emit=lambda event, *a, **k: told.append(event))
    apply("standard", FAIL)
    assert calls[-1][0] == "want" and drained_level(str(tmp_path)) == "standard"
    apply("quick", FAIL)  # a quick fail after it: the standard level still stands
    assert drained_level(str(tmp_path)) == "standard"
    calls.clear()
    apply("quick", PASS)
    assert calls == [] and told[-1] == "acceptance-kept"
    apply("standard", PASS, full=False)  # a pass of some tests only lifts nothing
    assert calls == []
    apply("standard", PASS)
    assert calls == [("clear",)] and told[-1] == "acceptance-cleared" and drained_level(str(tmp_path)) == ""


def test_every_limit_has_its_unit_said_and_a_profile_names_no_other():
    from slurm_ext.acceptance.catalog import LIMIT_UNITS
    from slurm_ext.acceptance.profiles import PROFILES
    keys = {key for spec in TESTS.values() for key in spec.limits}
    assert keys == set(LIMIT_UNITS)
    assert all(set(p.limits) <= keys for p in (PROFILES.values() if isinstance(PROFILES, dict) else PROFILES))
    assert "rdma_gbps (Gb/s (bits))" in refused({"tests": {"network-rdma": {"limits": {"rdma": 1}}}}).problem

"""The [health] section through `slurm_ext.config.from_dict`: [health.checks.<id>] and [health.xid.<N>] tables,
thresholds with their units, every bad value a ConfigError naming its key."""

from __future__ import annotations

import pytest

from slurm_ext.config import from_dict
from slurm_ext.errors import ConfigError
from slurm_ext.health.settings import CHECKS, CheckSection, HealthSection, XidSection, parse_threshold


def health(table: dict):
    return from_dict({"health": table}).health


def refused(table: dict) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        from_dict({"health": table})
    return caught.value


def test_defaults():
    section = health({})
    assert section == HealthSection()
    assert section.checks == {} and section.xid == {}
    assert section.params("throttle").threshold == 0.6


def test_unknown_check_names_the_key_and_the_checks():
    err = refused({"checks": {"nosuch": {"enabled": False}}})
    assert err.key == "health.checks.nosuch"
    assert "unknown check 'nosuch'" in err.problem
    for name in CHECKS:
        assert name in err.problem
    assert "health.checks.nosuch" in str(err)


def test_share_without_percent_is_refused():
    err = refused({"checks": {"throttle": {"threshold": "50"}}})
    assert err.key == "health.checks.throttle.threshold"
    assert "'50'" in err.problem and "a share with %, such as '60%'" in err.problem


@pytest.mark.parametrize("check,value", [("throttle", 5), ("throttle", "5C"), ("throttle", "150%"),
                                         ("temperature", "5"), ("temperature", "5%"), ("temperature", 5),
                                         ("nvlink-errors", "100"), ("nvlink-errors", "100/d"),
                                         ("pcie-replay", 8), ("filesystem", "1GB"), ("filesystem", "1 gib"),
                                         ("filesystem", 1024), ("xid", "3"), ("xid", -1), ("ecc", "1"),
                                         ("kernel", 2.5), ("link-flap", True)])
def test_threshold_in_the_wrong_form_is_refused(check, value):
    err = refused({"checks": {check: {"threshold": value}}})
    assert err.key == f"health.checks.{check}.threshold"


@pytest.mark.parametrize("check", [name for name, base in CHECKS.items() if not base.unit])
def test_threshold_for_a_check_without_one_is_refused(check):
    err = refused({"checks": {check: {"threshold": 1}}})
    assert err.key == f"health.checks.{check}.threshold"
    assert "takes no threshold" in err.problem


def test_integer_threshold_for_a_count():
    section = health({"checks": {"xid": {"threshold": 5, "window": "30m"}}})
    assert section.checks["xid"].threshold == 5
    p = section.params("xid")
    assert (p.threshold, p.window, p.relative) == (5.0, 1800.0, False)
    assert section.params("throttle") == HealthSection().params("throttle")  # other checks keep their defaults


@pytest.mark.parametrize("unit,value,expected", [
    ("rate", "100/s", (100.0, False)), ("rate", "8/m", (8 / 60, False)), ("rate", "10/h", (10 / 3600, False)),
    ("rate", "2.5 / s", (2.5, False)),
    ("size", "1GiB", (2.0**30, False)), ("size", "500MiB", (500 * 2.0**20, False)), ("size", "2TiB", (2.0**41, False)),
    ("size", "10KiB", (10 * 1024.0, False)), ("size", "512B", (512.0, False)), ("size", "5%", (0.05, True)),
    ("share", "60%", (0.6, False)), ("share", "100%", (1.0, False)), ("share", "0%", (0.0, False)),
    ("celsius", "5C", (5.0, False)), ("celsius", "0C", (0.0, False)), ("celsius", "2.5C", (2.5, False)),
    ("count", 3, (3.0, False)), ("count", 0, (0.0, False)),
])
def test_parse_threshold(unit, value, expected):
    number, relative = parse_threshold(unit, value)
    assert number == pytest.approx(expected[0]) and relative is expected[1]


@pytest.mark.parametrize("unit,value", [("rate", "100"), ("rate", 100), ("size", "1G"), ("size", "101%"),
                                        ("share", "60"), ("share", 0.6), ("celsius", "5F"), ("count", "3"),
                                        ("count", True), ("count", -1), ("", 1), ("", "5%")])
def test_parse_threshold_refuses(unit, value):
    with pytest.raises(ValueError):
        parse_threshold(unit, value)


def test_checks_table_applies_to_params():
    section = health({"checks": {"throttle": {"threshold": "80%", "window": "5m", "severity": "warning",
                                              "action": "none"},
                                 "filesystem": {"threshold": "5%", "interval": "30s"},
                                 "persistence": {"enabled": False, "hold": "0s"}}})
    p = section.params("throttle")
    assert (p.threshold, p.window, p.severity, p.action) == (0.8, 300.0, "warning", "none")
    assert (p.hold, p.quiet) == (CHECKS["throttle"].hold, CHECKS["throttle"].quiet)
    fs = section.params("filesystem")
    assert (fs.threshold, fs.relative, fs.interval) == (0.05, True, 30.0)
    off = section.params("persistence")
    assert (off.enabled, off.hold) == (False, 0.0)
    assert section.params("nvlink").interval == section.interval  # 0 in CHECKS: every health.interval


def test_bad_values_inside_a_check_table():
    assert refused({"checks": {"xid": {"severity": "fatal"}}}).key == "health.checks.xid.severity"
    assert refused({"checks": {"xid": {"action": "panic"}}}).key == "health.checks.xid.action"
    assert refused({"checks": {"xid": {"window": 60}}}).key == "health.checks.xid.window"
    assert refused({"checks": {"xid": {"interval": "0s"}}}).key == "health.checks.xid.interval"
    assert refused({"checks": {"xid": {"enabled": "yes"}}}).key == "health.checks.xid.enabled"
    assert refused({"checks": {"xid": "on"}}).key == "health.checks"


def test_unknown_key_inside_a_check_table():
    err = refused({"checks": {"throttle": {"treshold": "50%"}}})
    assert err.key == "health.checks.throttle.treshold"
    assert "unknown key" in err.problem and "threshold" in err.problem


def test_xid_tables():
    section = health({"xid": {"13": {"severity": "critical"}, "79": {"action": "reset-gpu", "sticky": False}}})
    assert section.xid == {"13": XidSection(severity="critical"),
                           "79": XidSection(action="reset-gpu", sticky=False)}


@pytest.mark.parametrize("name", ["abc", "0", "1000", "13a", "013", "-1"])
def test_xid_table_not_named_by_an_xid_number_is_refused(name):
    err = refused({"xid": {name: {"severity": "warning"}}})
    assert err.key == f"health.xid.{name}"
    if name not in ("-1",):  # '-' is allowed in table names, so the Xid rule is the one that refuses it
        assert "[health.xid.79]" in err.problem


def test_xid_table_keys():
    assert refused({"xid": {"13": {"threshold": 3}}}).key == "health.xid.13.threshold"
    assert refused({"xid": {"13": {"severity": "fatal"}}}).key == "health.xid.13.severity"
    assert refused({"xid": {"13": {"sticky": 1}}}).key == "health.xid.13.sticky"


def test_check_section_defaults_are_unset():
    assert CheckSection() == CheckSection(None, None, None, None, None, None, None, None)
    assert XidSection() == XidSection(None, None, None)

"""Under CI a skipped test is a failed one.

The test command installs what every test needs, so a skip under CI means a step of that set-up is missing; a
suite that reports such a test as merely skipped looks green while the feature went untested. The conftest
imports these hooks; `pytest -p helpers.ci_skips` loads them alone.
"""

from __future__ import annotations

import os

import pytest


def skips_fail() -> bool:
    return os.environ.get("CI") == "true"


def _fail_the_skip(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true, which counts as a failure: {reason}\n"
                       "the test command (README.md, after <!-- test-command -->) must install what this test needs")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if skips_fail() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_the_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if skips_fail() and report.skipped:  # a module that skips itself as it is imported (allow_module_level)
        _fail_the_skip(report)

"""The tests' own helpers (tests/helpers/): each one checked on a pytest run of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parent

SKIPPING = '''
import pytest

def test_needs_a_tool():
    pytest.skip("no frobnicator installed")

@pytest.mark.skipif(True, reason="no cgroup v1")
def test_marked():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False

def test_runs():
    pass
'''


def _pytest(tmp_path: Path, ci: str | None, source: str = SKIPPING) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(source)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(HELPERS)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "helpers.ci_skips", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(tmp_path), "-c", os.devnull, "-rA", "test_sample.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_under_ci_a_skipped_test_fails_the_run_and_says_why(tmp_path):
    result = _pytest(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    # a skip in the call is a failure; one decided in set-up (a skipif mark) an error: both fail the run
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in result.stdout
    assert "skipped under CI=true, which counts as a failure: Skipped: no frobnicator installed" in result.stdout
    assert "no cgroup v1" in result.stdout


def test_outside_ci_a_skip_stays_a_skip(tmp_path):
    for ci in (None, "false"):
        result = _pytest(tmp_path, ci)
        assert result.returncode == 0, result.stdout
        assert "1 passed, 2 skipped, 1 xfailed" in result.stdout


def test_under_ci_a_module_that_skips_itself_fails_the_run(tmp_path):
    source = 'import pytest\npytest.skip("no systemd tools", allow_module_level=True)\n\ndef test_x():\n    pass\n'
    result = _pytest(tmp_path, "true", source)
    assert result.returncode != 0, result.stdout
    assert "skipped under CI=true" in result.stdout and "no systemd tools" in result.stdout

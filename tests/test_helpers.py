"""The tests' own helpers (tests/helpers/): each one checked on a pytest run of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

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


def test_wait_for_returns_the_first_true_answer_and_fails_naming_what_it_waited_for():
    from helpers.wait import wait_for
    answers = iter([None, 0, [], "ready"])
    assert wait_for("an answer", lambda: next(answers), timeout=5, interval=0) == "ready"
    with pytest.raises(AssertionError, match=r"the node drained: not within 0.1s"):
        wait_for("the node drained", lambda: False, timeout=0.1)


def test_temp_dir_and_script_are_owned_and_moded_as_asked():
    from helpers.files import script, temp_dir
    directory = temp_dir(owner=65534, mode=0o750)
    try:
        assert (directory.stat().st_uid, directory.stat().st_mode & 0o777) == (65534, 0o750)
        assert directory.parent == Path(tempfile.gettempdir())  # not pytest's tmp_path, which nobody cannot enter
        made = script(directory / "prolog.d", "10-check", "#!/bin/sh\nexit 0\n", mode=0o700, owner=65534)
        assert made.read_text() == "#!/bin/sh\nexit 0\n"
        assert (made.stat().st_uid, made.stat().st_mode & 0o777) == (65534, 0o700)
    finally:
        shutil.rmtree(directory)


def test_fake_sysfs_is_the_topology_the_gres_reader_reads(tmp_path):
    from helpers.files import fake_sysfs
    from slurm_ext.gres.topology import ranges
    root = fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0, 0)})
    cpu = root / "devices/system/cpu"
    assert (cpu / "online").read_text() == ranges({0: 0, 1: 0, 2: 0}) + "\n"
    assert (cpu / "cpu2/topology/physical_package_id").read_text() == "1\n"
    assert (cpu / "cpu2/topology/die_id").read_text() == "0\n"
    assert not (cpu / "cpu1/topology/die_id").exists()


def test_cli_runs_the_real_command_line_as_root_and_as_nobody(tmp_path):
    from helpers.cli import cli, cli_as_nobody
    done = cli("--help", timeout=60)
    assert done.returncode == 0 and "usage: slurm-ext" in done.stdout
    secret = tmp_path / "slurm-ext.toml"
    secret.write_text("[node]\nname = 'n1'\n")
    secret.chmod(0o600)
    code, stderr = cli_as_nobody("--config", str(secret), "health", "show")
    assert code != 0 and str(secret) in stderr  # nobody cannot read root's 0600 config, and is told which file


def test_the_stand_in_agents_answer_each_node_by_name_and_journals_are_stored_as_the_collector_does(tmp_path):
    from helpers.page import COMPONENTS, StandInAgents, journal_lines, stored_journal
    from slurm_ext.repair import nodeevents
    from slurm_ext.repair.store import open_sqlite
    assert StandInAgents(["a", "b"]).health("b").node == "b"
    store = open_sqlite(str(tmp_path / "r.db"))
    try:
        assert stored_journal(store, "a", journal_lines(5, 4, 1000.0)) == 4
        assert stored_journal(store, "a", journal_lines(9, 2, 1004.0)) == 2
        found = nodeevents.events(store, 0)
        assert [e.message for e in found] == [f"event {i}" for i in range(5, 11)]
        assert [e.component for e in found] == [COMPONENTS[i % 3] for i in range(5, 11)]
    finally:
        store.close()


def test_the_replay_answers_the_recorded_calls_in_order_and_refuses_any_other_naming_it():
    from slurm_ext.command import CommandResult
    from slurm_ext.errors import CommandError
    from helpers.slurmanswers import Recorder, Replay

    def daemons(argv, timeout, env=None, input=None, check=True):
        if "x" in argv:
            raise CommandError(argv, 1, "Node x not found")
        return CommandResult(tuple(argv), 0, "slurm-wlm 26.05.5\n", "")
    recorder = Recorder(daemons)
    assert recorder(["/usr/bin/sinfo", "--version"], 5).stdout == "slurm-wlm 26.05.5\n"
    with pytest.raises(CommandError):
        recorder(["scontrol", "show", "node", "x"], 5)
    assert [c["argv"] for c in recorder.calls] == [["sinfo", "--version"], ["scontrol", "show", "node", "x"]]
    replay = Replay(recorder.calls)
    assert replay(["sinfo", "--version"], 5).stdout == "slurm-wlm 26.05.5\n"
    with pytest.raises(AssertionError, match=r"the client ran \['squeue'\], the recording has \['scontrol'"):
        replay(["squeue"], 5)
    with pytest.raises(CommandError, match="Node x not found"):
        replay(["scontrol", "show", "node", "x"], 5)
    assert replay.done()

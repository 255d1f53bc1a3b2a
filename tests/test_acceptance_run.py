"""`slurm-ext accept run/show` through the real runner: each test in its own child process, a test over its
deadline or dying of a signal is an error (never a fail), one run at a time on a node, the run kept, told in
the journal and exposed as metrics. The tests here are storage (real files on a temporary path) and
network-rdma over a fake `ib_write_bw` that hangs or kills its parent, so that no GPU is needed."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest

from slurm_ext.acceptance.metrics import families
from slurm_ext.journal import read_events

from helpers.cli import cli


def _config(tmp_path: Path, acceptance: str) -> Path:
    config = tmp_path / "slurm-ext.toml"
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    config.write_text(f'[node]\nname = "accept-node"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'runtime_dir = "{tmp_path / "run"}"\n\n[acceptance]\nprofile = "h200-sxm"\n'
                      f'paths = ["{scratch}"]\n{acceptance}\n')
    return config


def _fake_ib_write_bw(tmp_path: Path, body: str) -> Path:
    """An `ib_write_bw` that runs `body` (sh) and records its PID, to prove it is gone after the run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ib_write_bw"
    script.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'fake.pids'}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_a_storage_run_passes_is_kept_told_and_exposed(tmp_path):
    config = _config(tmp_path, "")
    done = cli("--config", str(config), "accept", "run", "--level", "quick", "--only", "storage", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["verdict"] == "pass" and run["node"] == "accept-node" and run["trigger"] == "manual"
    (result,) = run["results"]
    assert result["test"] == "storage" and result["outcome"] == "pass"
    assert {f["name"] for f in result["figures"]} >= {"fsync_ms", "write_mbps", "read_mbps"}
    shown = cli("--config", str(config), "accept", "show")
    assert shown.returncode == 0 and "PASS  storage" in shown.stdout and "pass: 1 passed" in shown.stdout
    names = [e.event for e in read_events(str(tmp_path / "state"))]
    assert names[:1] == ["acceptance-started"] and names[-1] == "acceptance-done"
    done_event = list(read_events(str(tmp_path / "state")))[-1]
    assert done_event.fields["verdict"] == "pass" and done_event.fields["results"][0].startswith("storage ")
    metrics = {family.name: family for family in families(str(tmp_path / "state"))}
    assert metrics["slurm_ext_acceptance_verdict"].samples[0].value == 0
    figures = {s.labels["figure"] for s in metrics["slurm_ext_acceptance_figure"].samples}
    assert {"fsync_ms", "write_mbps"} <= figures


def test_a_path_that_cannot_be_written_fails_and_exits_1(tmp_path):
    config = _config(tmp_path, "")
    scratch = tmp_path / "scratch"
    os.chmod(scratch, 0o500)
    try:
        # root writes anyway: make the path a file instead, which no test can make a directory in
        scratch.rmdir()
        scratch.write_text("not a directory\n")
        done = cli("--config", str(config), "accept", "run", "--only", "storage", "--level", "quick")
    finally:
        if scratch.is_file():
            scratch.unlink()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  storage" in done.stdout and "fail: 0 passed, 1 failed" in done.stdout


def test_a_test_over_its_deadline_is_an_error_and_its_processes_are_killed(tmp_path):
    bin_dir = _fake_ib_write_bw(tmp_path, "exec sleep 600")
    config = _config(tmp_path, 'hcas = ["mlx5_0"]\nareas = ["network"]\n\n[acceptance.tests.network-rdma]\n'
                               'deadline = "3s"')
    done = cli("--config", str(config), "accept", "run", "--level", "standard", "--json",
               env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr  # not measured: never 1
    run = json.loads(done.stdout)
    (result,) = [r for r in run["results"] if r["test"] == "network-rdma"]
    assert result["outcome"] == "error" and "over its deadline of 3s" in result["message"]
    assert "[acceptance.tests.network-rdma] deadline" in result["message"]
    pids = [int(p) for p in (tmp_path / "fake.pids").read_text().split()]
    assert pids and all(_gone(pid) for pid in pids), "the hung test's process outlived its deadline"


def test_a_test_whose_process_dies_of_a_signal_is_an_error_naming_it(tmp_path):
    bin_dir = _fake_ib_write_bw(tmp_path, "kill -SEGV $PPID; sleep 5")
    config = _config(tmp_path, 'hcas = ["mlx5_0"]\nareas = ["network"]')
    done = cli("--config", str(config), "accept", "run", "--level", "standard", "--json",
               env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=60)
    run = json.loads(done.stdout)
    (result,) = [r for r in run["results"] if r["test"] == "network-rdma"]
    assert result["outcome"] == "error" and "died of SIGSEGV" in result["message"]
    assert done.returncode == 3


def test_a_second_run_is_refused_while_one_holds_the_node(tmp_path):
    config = _config(tmp_path, "")
    (tmp_path / "run").mkdir()
    fd = os.open(tmp_path / "run" / "acceptance.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        done = cli("--config", str(config), "accept", "run", "--only", "storage")
    finally:
        os.close(fd)
    assert done.returncode == 2
    assert "another acceptance run (pid 4242) holds this node" in done.stderr


def test_show_without_a_run_says_so_and_why_it_is_off(tmp_path):
    config = _config(tmp_path, "")
    shown = cli("--config", str(config), "accept", "show")
    assert shown.returncode == 3
    assert "no acceptance run kept" in shown.stdout and "short-lived" in shown.stdout


@pytest.mark.parametrize("option,value,word", [("--only", "gpus", "'gpus'"), ("--test", "gpu-memtest", "'gpu-memtest'")])
def test_an_unknown_area_or_test_is_refused_with_the_choices(tmp_path, option, value, word):
    done = cli("--config", str(_config(tmp_path, "")), "accept", "run", option, value)
    assert done.returncode == 2 and word in done.stderr and "gpu-memory" in done.stderr


def test_health_check_does_nothing_when_acceptance_is_off(tmp_path):
    done = cli("--config", str(_config(tmp_path, "")), "accept", "health-check")
    assert done.returncode == 0 and not (tmp_path / "state" / "acceptance").exists()


def test_the_health_check_program_entry_point_takes_no_arguments_and_runs_health_check(tmp_path):
    """Slurm runs HealthCheckProgram by path alone: `slurm-ext-accept-start` is `slurm-ext accept health-check`."""
    import subprocess
    import sys
    program = Path(sys.executable).parent / "slurm-ext-accept-start"
    config = _config(tmp_path, 'enabled = true\nareas = ["storage"]')
    done = subprocess.run([str(program)], env={**os.environ, "SLURM_EXT_CONFIG": str(config)}, capture_output=True,
                          text=True, timeout=120)
    # the run passed; lifting an acceptance drain needs Slurm, which this host's test has not: said, exit 2
    assert done.returncode == 2 and "slurm-ext accept health-check: " in done.stderr, done.stdout + done.stderr
    shown = json.loads(cli("--config", str(config), "accept", "show", "--json").stdout)
    assert (shown["trigger"], shown["verdict"]) == ("start", "pass")
    again = subprocess.run([str(program)], env={**os.environ, "SLURM_EXT_CONFIG": str(config)}, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and "ran at this boot's start already: pass" in again.stdout


def test_a_test_whose_runner_is_killed_ends_with_it(tmp_path):
    """The agent (or slurmd's HealthCheckTimeout) kills the runner mid-test: the test's process and what it
    started go too, with no deadline left to end them."""
    import signal
    import subprocess
    import sys
    import time
    bin_dir = _fake_ib_write_bw(tmp_path, "exec sleep 600")
    config = _config(tmp_path, 'hcas = ["mlx5_0"]\nareas = ["network"]')
    runner = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(config), "accept", "run",
                               "--level", "standard"], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids_file = tmp_path / "fake.pids"
    deadline = time.monotonic() + 30
    while not pids_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_file.exists(), "the test never started its ib_write_bw"
    runner.send_signal(signal.SIGKILL)
    runner.wait(10)
    pids = [int(p) for p in pids_file.read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(pid) for pid in pids), "the test's processes outlived their runner"


def test_a_storage_run_removes_what_a_killed_run_left_behind(tmp_path):
    config = _config(tmp_path, "")
    left = tmp_path / "scratch" / ".slurm-ext-accept-killed"
    left.mkdir()
    (left / "data").write_bytes(b"x" * 4096)
    done = cli("--config", str(config), "accept", "run", "--only", "storage", "--level", "quick")
    assert done.returncode == 0, done.stdout + done.stderr
    assert list((tmp_path / "scratch").iterdir()) == []

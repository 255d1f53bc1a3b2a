"""command.run: the one way slurm-ext runs an external program."""

import time

import pytest

from slurm_ext import command
from slurm_ext.procfs import pid_alive
from slurm_ext.errors import CommandError, CommandTimeout


def test_output_and_status():
    result = command.run(["sh", "-c", "echo out; echo err >&2; exit 0"], 10)
    assert (result.returncode, result.stdout, result.stderr) == (0, "out\n", "err\n")


def test_non_zero_exit_names_the_command_and_its_last_error_line():
    with pytest.raises(CommandError) as caught:
        command.run(["sh", "-c", "echo first >&2; echo 'the real problem' >&2; exit 4"], 10)
    assert caught.value.returncode == 4
    assert str(caught.value) == "sh -c echo first >&2; echo 'the real problem' >&2; exit 4 exited with status 4: " \
                                "the real problem"


def test_unchecked_non_zero_exit_is_returned():
    assert command.run(["sh", "-c", "exit 3"], 10, check=False).returncode == 3


def test_missing_program():
    with pytest.raises(CommandError, match="cannot execute /no/such/tool"):
        command.run(["/no/such/tool"], 10)


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as caught:
        command.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo partial >&2; wait"], 0.5)
    assert time.monotonic() - started < 5
    assert "did not finish within 0.5s" in str(caught.value)
    assert caught.value.stderr == "partial"
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(grandchild), "the command's background child survived the timeout"

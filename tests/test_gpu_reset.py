"""Issue 29, item 3: POST /health/reset-gpu?gpu=N on a real worker agent (its health monitor reading a fake NVML's
GPUs): only the agent credential gets a GPU reset; a GPU the node does not have is refused and nothing runs; the
reset is health.gpu_reset_command with {gpu} filled in, as an argv (never a shell), and clears that GPU's findings.
The reset tool here is a script that logs its argv, so the test sees exactly what ran and how often."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import sys
import textwrap
from pathlib import Path

from helpers.agent import health_only_worker
from helpers.wait import wait_for
from slurm_ext.agentapi import AgentAnswerError, AgentClient, GpuResetAnswer, create_credential


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_nobody(port: int, method: str, path: str) -> int:
    """The status of one request asked by a child that became nobody (a job's user), without the credential."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request(method, path)
            answer = connection.getresponse()
            answer.read()
            os.write(write_end, str(answer.status).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return int(text)


def _reset_tool(directory: Path, exit_code: int = 0) -> tuple[Path, Path]:
    """A stand-in for nvidia-smi that appends its argv to a log (one JSON list a line) and exits `exit_code`."""
    log = directory / "reset-argv.log"
    tool = directory / "fake-reset"
    tool.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        with open({str(log)!r}, "a") as out:
            out.write(json.dumps(sys.argv[1:]) + "\\n")
        print("GPU 00000000:3B:00.0 was reset" if {exit_code} == 0 else "Unable to reset GPU: in use by another client")
        sys.exit({exit_code})
        """))
    tool.chmod(stat.S_IRWXU)
    return tool, log


def _ran(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_only_the_credential_resets_a_gpu_the_node_has(agents, tmp_path, monkeypatch):
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib")
    spec = tmp_path / "gpus.json"
    fakenvml.write_spec(spec, fakenvml.default_gpus(4))
    for name, value in fakenvml.environ(lib.parent, spec).items():  # the health worker inherits the agent's
        monkeypatch.setenv(name, value)
    tool, log = _reset_tool(tmp_path)
    credential = tmp_path / "agent-credential"
    create_credential(credential)
    port = _free_port()
    body = health_only_worker(port, tmp_path, "1h") + f'gpu_reset_command = ["{tool}", "--gpu-reset", "-i", "{{gpu}}"]\n'
    agent = agents(body, role="worker", port=port, slurm=f'conf = "{tmp_path}/no-such-slurm.conf"',
                   node=f'agent_credential = "{credential}"')
    client = AgentClient(str(credential), 9810, {"testnode": f"127.0.0.1:{port}"}, 30.0)

    def gpus_read() -> bool:
        try:
            monitor = client.health("testnode").monitor
        except AgentAnswerError:  # not listening yet
            return False
        return monitor is not None and len(monitor.gpus) == 4

    try:
        wait_for("the health monitor's first readings of the 4 GPUs", gpus_read, timeout=60)
        assert _as_nobody(port, "POST", "/health/reset-gpu?gpu=2") == 401
        assert _ran(log) == [], "a caller without the credential had a GPU reset"

        try:
            client.reset_gpu("testnode", 7)
        except AgentAnswerError as err:
            assert err.status == 404 and "no GPU 7 on this node (its GPUs: 0, 1, 2, 3)" in str(err), err
        else:
            raise AssertionError("a GPU the node does not have was reset")
        assert _ran(log) == []

        answer = client.reset_gpu("testnode", 2)
        assert isinstance(answer, GpuResetAnswer)
        assert (answer.gpu, answer.ran, answer.ok, answer.held_by) == (2, True, True, ())
        assert answer.command == f"{tool} --gpu-reset -i 2" and "was reset" in answer.output
        assert _ran(log) == [["--gpu-reset", "-i", "2"]], "the reset ran once, for that GPU, as an argv"
    finally:
        stopped = agent.stop()
    assert stopped == 0


def test_a_failed_reset_says_so_with_the_tools_words(agents, tmp_path, monkeypatch):
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib")
    spec = tmp_path / "gpus.json"
    fakenvml.write_spec(spec, fakenvml.default_gpus(2))
    for name, value in fakenvml.environ(lib.parent, spec).items():
        monkeypatch.setenv(name, value)
    tool, log = _reset_tool(tmp_path, exit_code=1)
    credential = tmp_path / "agent-credential"
    create_credential(credential)
    port = _free_port()
    body = health_only_worker(port, tmp_path, "1h") + f'gpu_reset_command = ["{tool}", "-r", "-i", "{{gpu}}"]\n'
    agent = agents(body, role="worker", port=port, slurm=f'conf = "{tmp_path}/no-such-slurm.conf"',
                   node=f'agent_credential = "{credential}"')
    client = AgentClient(str(credential), 9810, {"testnode": f"127.0.0.1:{port}"}, 30.0)

    def gpus_read() -> bool:
        try:
            monitor = client.health("testnode").monitor
        except AgentAnswerError:
            return False
        return monitor is not None and len(monitor.gpus) == 2

    try:
        wait_for("the health monitor's first readings", gpus_read, timeout=60)
        answer = client.reset_gpu("testnode", 1)
        assert (answer.ran, answer.ok) == (True, False)
        assert "exited with status 1" in answer.output and "in use by another client" in answer.output
        assert _ran(log) == [["-r", "-i", "1"]]
    finally:
        stopped = agent.stop()
    assert stopped == 0

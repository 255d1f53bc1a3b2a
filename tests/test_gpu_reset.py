"""Issue 29, item 3: POST /health/reset-gpu?gpu=N on a real worker agent (its health monitor reading a fake NVML's
GPUs): only the agent credential gets a GPU reset; a GPU the node does not have is refused and nothing runs; the
reset is health.gpu_reset_command with {gpu} filled in, as an argv (never a shell), and clears that GPU's findings.
The reset tool here is a script that logs its argv, so the test sees exactly what ran and how often."""

from __future__ import annotations

import json
import socket
import stat
import sys
import textwrap
from pathlib import Path

from helpers.agent import ask_as_nobody, health_only_worker
from helpers.wait import wait_for
from slurm_ext.agentapi import AgentAnswerError, AgentClient, GpuResetAnswer, create_credential


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _agent_with_reset_tool(agents, tmp_path: Path, monkeypatch, gpus: int, exit_code: int, argv: str):
    """A worker agent whose health monitor reads `gpus` fake GPUs and resets one with a stand-in tool (`argv`: the
    tool's arguments in TOML, {gpu} among them), once it has read them all: (agent, client, tool, log)."""
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib")
    spec = tmp_path / "gpus.json"
    fakenvml.write_spec(spec, fakenvml.default_gpus(gpus))
    for name, value in fakenvml.environ(lib.parent, spec).items():  # the health worker inherits the agent's
        monkeypatch.setenv(name, value)
    tool, log = _reset_tool(tmp_path, exit_code)
    credential = tmp_path / "agent-credential"
    create_credential(credential)
    port = _free_port()
    body = health_only_worker(port, tmp_path, "1h") + f'gpu_reset_command = ["{tool}", {argv}]\n'
    agent = agents(body, role="worker", port=port, slurm=f'conf = "{tmp_path}/no-such-slurm.conf"',
                   node=f'agent_credential = "{credential}"')
    client = AgentClient(str(credential), 9810, {"testnode": f"127.0.0.1:{port}"}, 30.0)

    def gpus_read() -> bool:
        try:
            monitor = client.health("testnode").monitor
        except AgentAnswerError:  # not listening yet
            return False
        return monitor is not None and len(monitor.gpus) == gpus

    wait_for(f"the health monitor's first readings of the {gpus} GPUs", gpus_read, timeout=60)
    return agent, port, client, tool, log


def test_only_the_credential_resets_a_gpu_the_node_has(agents, tmp_path, monkeypatch):
    agent, port, client, tool, log = _agent_with_reset_tool(agents, tmp_path, monkeypatch, 4, 0,
                                                            '"--gpu-reset", "-i", "{gpu}"')
    try:
        assert ask_as_nobody(port, [("POST", "/health/reset-gpu?gpu=2")]) == [401]
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
    agent, _, client, _, log = _agent_with_reset_tool(agents, tmp_path, monkeypatch, 2, 1, '"-r", "-i", "{gpu}"')
    try:
        answer = client.reset_gpu("testnode", 1)
        assert (answer.ran, answer.ok) == (True, False)
        assert "exited with status 1" in answer.output and "in use by another client" in answer.output
        assert _ran(log) == [["-r", "-i", "1"]]
    finally:
        stopped = agent.stop()
    assert stopped == 0

"""The node agent (`slurm-ext supervise`) run by a test, with its log, journal and HTTP routes at hand."""

from __future__ import annotations

import http.client
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

PORT = 19870


class AgentProcess:
    """`slurm-ext supervise` run by a test, with its log and journal at hand."""

    def __init__(self, tmp_path: Path, body: str, role: str = "login", port: int = PORT, prefix: list[str] = (),
                 slurm: str = "", node: str = ""):
        self.dir = tmp_path
        self.slurm = slurm
        #: more of [node] (its agent_credential)
        self.node = node
        self.config = tmp_path / "slurm-ext.toml"
        self.port = port
        self.prefix = list(prefix)
        self.write_config(body)
        self.log = tmp_path / "agent.log"
        self.out = open(self.log, "ab")
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "slurm_ext.cli", "--config", str(self.config),
                                      "supervise", "--role", role, "--port", str(port)],
                                     stdout=self.out, stderr=self.out)

    def write_config(self, body: str) -> None:
        self.config.write_text(textwrap.dedent(f"""\
            [node]
            name = "testnode"
            state_dir = "{self.dir}/state"
            runtime_dir = "{self.dir}/run"
            {self.node}
            [slurm]
            timeout = "2s"
            {self.slurm}
            [supervisor]
            """) + textwrap.dedent(body))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def journal(self) -> list[dict]:
        path = self.dir / "state" / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def events(self, event: str, **want) -> list[dict]:
        """The journal's `event`s whose fields are `want`: a value equal, or a compiled pattern found in it."""
        def matches(record: dict) -> bool:
            return all(value.search(str(record.get(key, ""))) if isinstance(value, re.Pattern)
                       else record.get(key) == value for key, value in want.items())
        return [record for record in self.journal() if record["event"] == event and matches(record)]

    def wait_event(self, event: str, count: int = 1, timeout: float = 10.0, **want) -> list[dict]:
        """Wait until the journal holds `count` such events (see `events`), and return them all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(event, **want)
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{event} {want} x{count} not in the agent's journal; its log ends:\n"
                             f"{self.text()[-3000:]}")

    def wait_log(self, pattern: str, timeout: float = 10.0, count: int = 1) -> list[str]:
        """For what only the log says (a warning about a worker's sd_notify message); the agent's decisions are
        events: `wait_event`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.text())
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} x{count} not in the agent's log:\n{self.text()[-3000:]}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metric(self, name: str, **labels) -> float:
        _, text = self.get("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {name}{{{want}}} in /metrics")

    @property
    def pid(self) -> int:
        """The agent's PID (under `unshare --fork` it is unshare's child, PID 1 inside)."""
        if not self.prefix:
            return self.proc.pid
        return int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()[0])

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()


def health_only_worker(port: int, tmp_path: Path, interval: str) -> str:
    """The config of a worker-role agent on `port` whose only worker is the health monitor, polling every `interval`,
    its disk check on `tmp_path` and its link check on lo. No Slurm here: gres.conf cannot be checked (`slurmd -G`)
    nor the node drained; its start steps fail and the workers start anyway. Give the agent
    `slurm=f'conf = "{tmp_path}/no-such-slurm.conf"'` too."""
    return textwrap.dedent(f"""\
        ports = {{worker = {port}}}
        step_failure = {{"gres-regenerate" = "continue"}}
        [supervisor.workers.slurmd]
        roles = []
        [supervisor.workers.hooks]
        roles = []
        [health]
        interval = "{interval}"
        kernel_log = ""
        paths = ["{tmp_path}"]
        interfaces = ["lo"]
        """)


def page_only_controller(port: int, page_port: int, more: str = "") -> str:
    """The config of a controller-role agent on `port` whose only worker is the page, listening on `page_port`,
    with `more` (TOML) after its [web] keys. No Slurm here: the page says Slurm is away; its start steps that need
    a volume go on. Give the agent `slurm=f'conf = "{site}/no-such-slurm.conf"'` and its agent credential too."""
    return textwrap.dedent(f"""\
        ports = {{controller = {port}}}
        step_failure = {{"check-storage" = "continue"}}
        [supervisor.workers.slurmctld]
        roles = []
        [supervisor.workers.munged]
        roles = []
        [supervisor.workers.repair]
        roles = []
        [supervisor.workers.collector]
        roles = []
        [supervisor.workers.web]
        after = []
        [web]
        enabled = true
        listen = "127.0.0.1:{page_port}"
        """) + textwrap.dedent(more)


def page_user(name: str = "slurm-ext-web"):
    """The page's Unix user (pwd entry), made as the operator's docs say where the host lacks it (the dev cluster
    does the same)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, timeout=60)
        return pwd.getpwnam(name)


def ask_as_nobody(port: int, requests: list[tuple[str, str]]) -> list[int]:
    """The status of each (method, path) asked of 127.0.0.1:port by a child that became nobody (as a job's user
    would ask), without any credential."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            found = []
            for method, path in requests:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request(method, path)
                answer = connection.getresponse()
                answer.read()
                found.append(answer.status)
                connection.close()
            os.write(write_end, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)

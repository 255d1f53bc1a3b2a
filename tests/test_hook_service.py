"""The Prolog/Epilog hand-off: the compiled slurm-ext-hook client (hook.c) and the hook service (service.py).

Real processes over a real Unix socket: the client is compiled by build_hook, the service is
`slurm-ext hooks serve` in a child process, and the fallbacks are shell scripts that leave a mark of
how they ran (uid, arguments, environment) and exit 7, so a test can tell the service's answer from
the fallback's. Faults are real too: listeners that take a job and never answer, one whose backlog
is full, one run as nobody at the client's socket path, runtime dirs another uid owns.

The jobs belong to uid 64242, which no account and no process on the host has: the Epilog kills
every process of an exclusive job's user and removes its IPC objects, and a uid in use (nobody)
would let a test kill processes it did not start.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_ext.prolog_epilog.service import HOOK_DEADLINE_S, HookBuildError, build_hook

NOBODY = 65534
OTHER_UID = 4242  # owns the runtime dirs of the attacks; no process runs as it
JOB_UID = 64242
FALLBACK_EXIT = 7
WAIT = 30.0

FALLBACK_SCRIPT = """#!/bin/sh
# stands in for slurm-ext-{phase}: leaves a mark of how it ran, exits {code}
{{ echo "uid=$(id -u)"; echo "args=$*"; env; }} > "{marks}/{phase}.$$"
exit {code}
"""


def temp_dir(prefix: str = "slurm-ext-hook-") -> Path:
    """mkdtemp under /tmp, mode 0755: nobody must reach the socket so that only its mode refuses them."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def job_env(phase: str | None, job_id: int, **extra: str) -> dict[str, str]:
    """The environment slurmd gives a Prolog or Epilog (phase None: no SLURM_SCRIPT_CONTEXT)."""
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": str(JOB_UID), "SLURM_JOB_GID": str(JOB_UID),
           "SLURM_JOB_USER": "hooktest", "SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"}
    if phase:
        env["SLURM_SCRIPT_CONTEXT"] = f"{phase}_slurmd"
    return {**env, **extra}


def big_values(total: int = 600_000) -> dict[str, str]:
    """Variables that make a request larger than a Unix socket's buffer (the client blocks writing it)."""
    return {f"SLURM_EXT_TEST_BIG{i}": "x" * 100_000 for i in range(total // 100_000)}


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=WAIT)


class Node:
    """One node's worth of hook files in a temp dir: client, fallbacks, config, state; and the services run."""

    def __init__(self):
        self.root = temp_dir()
        self.run_dir = self.root / "run"
        self.socket = self.run_dir / "hooks.sock"
        self.state = self.root / "state"
        self.scripts = self.root / "scripts"
        self.marks_dir = self.root / "marks"
        self.marks_dir.mkdir()
        self.marks_dir.chmod(0o1777)  # a fallback that runs as nobody writes its mark here
        self.fallback = {}
        for phase in ("prolog", "epilog"):
            path = self.root / f"fallback-{phase}"
            path.write_text(FALLBACK_SCRIPT.format(phase=phase, marks=self.marks_dir, code=FALLBACK_EXIT))
            path.chmod(0o755)
            self.fallback[phase] = path
        self.hook = self.build_hook()
        self.config_file = self.root / "slurm-ext.toml"
        self.write_config()
        self.services: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def build_hook(self, deadline: int = HOOK_DEADLINE_S) -> Path:
        """The client for this node's socket and fallbacks; named after its deadline unless the default."""
        name = "slurm-ext-hook" if deadline == HOOK_DEADLINE_S else f"slurm-ext-hook-{deadline}s"
        return build_hook(self.root / "bin" / name, str(self.socket), str(self.fallback["prolog"]),
                          str(self.fallback["epilog"]), deadline=deadline)

    def write_config(self, extra: str = "", runtime_dir: Path | None = None) -> None:
        self.config_file.write_text(
            f'[node]\nstate_dir = "{self.state}"\nruntime_dir = "{runtime_dir or self.run_dir}"\n\n'
            f'[log]\nlevel = "debug"\n\n'
            f'[prolog_epilog]\nscripts_dir = "{self.scripts}"\n{extra}\n'
            f'[slurm]\nconf = "{self.root / "no-slurm.conf"}"\n')

    # -- the client ------------------------------------------------------------------------------

    def client(self, env: dict[str, str], *args: str, program: Path | None = None,
               as_nobody: bool = False) -> subprocess.CompletedProcess:
        cmd = [str(program or self.hook), *args]
        if as_nobody:
            cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WAIT)

    def marks(self, phase: str) -> list[dict[str, str]]:
        """One dict per run of the phase's fallback: uid, args and its environment."""
        found = []
        for path in sorted(self.marks_dir.glob(f"{phase}.*")):
            found.append(dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line))
        return found

    def any_marks(self) -> list[str]:
        return sorted(p.name for p in self.marks_dir.iterdir())

    # -- the service -----------------------------------------------------------------------------

    def start_service(self, wait: bool = True) -> subprocess.Popen:
        log = self.root / f"service-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(self.config_file),
                                     "hooks", "serve"], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.services.append(proc)
        if wait:
            self.wait_log(proc, "hook service listening on")
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        return self.logs[self.services.index(proc)].read_text()

    def wait_log(self, proc: subprocess.Popen, text: str) -> str:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            log = self.log(proc)
            if text in log:
                return log
            if proc.poll() is not None:
                raise AssertionError(f"service exited {proc.returncode} before logging {text!r}:\n{log}")
            time.sleep(0.05)
        raise AssertionError(f"service did not log {text!r} within {WAIT}s:\n{self.log(proc)}")

    def stop(self, proc: subprocess.Popen, signum: int = signal.SIGTERM) -> int:
        os.kill(proc.pid, signum)
        return proc.wait(timeout=WAIT)

    # -- what the service leaves -----------------------------------------------------------------

    def record(self, job_id: int) -> Path:
        return self.state / "jobs" / f"{job_id}.json"

    def journal(self) -> list[dict]:
        path = self.state / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def events_of(self, job_id: int) -> list[dict]:
        return [e for e in self.journal() if str(e.get("job")) == str(job_id)]

    def script(self, phase: str, name: str, text: str) -> Path:
        directory = self.scripts / "worker" / f"{phase}.d"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(text)
        os.chown(path, 0, 0)
        path.chmod(0o755)
        return path

    def cleanup(self) -> None:
        for proc in self.services:
            kill(proc)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node():
    made = Node()
    yield made
    made.cleanup()


class FakeService:
    """A listener at the client's socket path that answers one request with `reply` (None: no verdict)."""

    def __init__(self, path: Path, reply: bytes | None, read: bool = True):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.listener.settimeout(WAIT)
        self.reply, self.read = reply, read
        self.request = b""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
            with connection:
                if not self.read:
                    return  # gone before reading a byte: a service that refused or died
                connection.settimeout(WAIT)
                while chunk := connection.recv(65536):
                    self.request += chunk
                if self.reply is not None:
                    connection.sendall(self.reply)
        except BaseException as err:  # reported by done(): an assertion in a thread would be lost
            self.error = err

    def done(self) -> tuple[bytes, str, dict[str, str]]:
        """The request as (header, phase, environment), once the connection is over."""
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the fake service still waits for the client"
        if self.error:
            raise self.error
        header, phase, rest = self.request.split(b"\n", 2)
        assert rest.endswith(b"\0") or not rest, f"environment entries must each end with NUL: {rest[-40:]!r}"
        env = dict(entry.decode().split("=", 1) for entry in rest.split(b"\0") if entry)
        return header, phase.decode(), env

    def close(self) -> None:
        self.listener.close()


class SilentService:
    """A root listener at the client's socket path that never gives a verdict.

    accept=True: each connection is accepted, its request read to the end, and then held open (a
    service stuck in the job's hook). accept=False: connections wait in the backlog, unread (a service
    whose accept loop is stuck); `backlog` 0 with one connection queued by the test is a full backlog.
    """

    def __init__(self, path: Path, accept: bool = True, backlog: int = 8):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(backlog)
        self.held: list[socket.socket] = []
        self.requests: list[bytes] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True) if accept else None
        if self.thread:
            self.listener.settimeout(0.1)
            self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            self.held.append(connection)
            connection.settimeout(WAIT)
            request = b""
            try:
                while chunk := connection.recv(65536):
                    request += chunk
            except OSError:
                pass
            self.requests.append(request)

    def close(self) -> None:
        self.stopping.set()
        if self.thread:
            self.thread.join(WAIT)
        for connection in self.held:
            connection.close()
        self.listener.close()


@pytest.fixture
def silent(node):
    made: list[SilentService] = []

    def start(accept: bool = True, backlog: int = 8) -> SilentService:
        service = SilentService(node.socket, accept, backlog)
        made.append(service)
        return service

    yield start
    for service in made:
        service.close()


def request_bytes(phase: str, env: dict[str, str], end: bool = True) -> bytes:
    """A request as hook.c sends it; end=False leaves out the end marker (a request cut short)."""
    entries = b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items())
    return f"slurm-ext-hook 2\n{phase}\n".encode() + entries + (b"\0" if end else b"")


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(WAIT)
    client.connect(str(path))
    return client


def closed_by_peer(client: socket.socket, timeout: float = 0) -> bool:
    poller = select.poll()
    poller.register(client, select.POLLIN)
    return any(events & select.POLLHUP for _, events in poller.poll(timeout * 1000))


@pytest.fixture
def fake(node):
    made: list[FakeService] = []

    def start(reply: bytes | None, read: bool = True) -> FakeService:
        service = FakeService(node.socket, reply, read)
        made.append(service)
        return service

    yield start
    for service in made:
        service.close()


# -- build_hook ------------------------------------------------------------------------------------


def test_build_hook_compiles_once_per_arguments():
    root = temp_dir()
    try:
        output = root / "libexec" / "slurm-ext-hook"
        args = ("/run/slurm-ext/hooks.sock", "/usr/bin/slurm-ext-prolog", "/usr/bin/slurm-ext-epilog")
        assert build_hook(output, *args) == output
        first = output.stat()
        assert stat.S_ISREG(first.st_mode) and stat.S_IMODE(first.st_mode) == 0o755
        assert b"/run/slurm-ext/hooks.sock" in output.read_bytes()
        assert [p.name for p in output.parent.iterdir() if p.name.endswith(".tmp")] == []

        time.sleep(0.01)
        build_hook(output, *args)
        again = output.stat()
        assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns), "rebuilt for nothing"

        build_hook(output, "/run/other/hooks.sock", *args[1:])
        moved = output.stat()
        assert (moved.st_ino, moved.st_mtime_ns) != (first.st_ino, first.st_mtime_ns), "not rebuilt"
        assert b"/run/other/hooks.sock" in output.read_bytes()
        assert b"/run/slurm-ext/hooks.sock" not in output.read_bytes()

        build_hook(output, *args[:2], "/opt/slurm-ext-epilog")  # a fallback is part of the build too
        assert b"/opt/slurm-ext-epilog" in output.read_bytes()

        before = output.stat()
        build_hook(output, *args[:2], "/opt/slurm-ext-epilog", deadline=42)  # so is the deadline
        assert output.stat().st_ino != before.st_ino, "a new deadline must rebuild the client"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("deadline", [0, -5, 1.5, "60", True, 86401])
def test_build_hook_refuses_a_deadline_that_is_not_whole_seconds(deadline):
    root = temp_dir()
    try:
        with pytest.raises(HookBuildError, match="hook deadline .*: expected whole seconds from 1 to 86400"):
            build_hook(root / "slurm-ext-hook", "/run/x.sock", "/bin/true", "/bin/true", deadline=deadline)
        assert not (root / "slurm-ext-hook").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_build_hook_without_a_compiler_says_so(monkeypatch):
    root = temp_dir()
    try:
        monkeypatch.setenv("PATH", str(root))  # no cc on it
        with pytest.raises(HookBuildError, match="is a C compiler installed"):
            build_hook(root / "slurm-ext-hook", "/run/x.sock", "/bin/true", "/bin/true")
        assert not (root / "slurm-ext-hook").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_cli_hooks_build_names_the_config_socket():
    root = temp_dir()
    try:
        config = root / "slurm-ext.toml"
        config.write_text(f'[node]\nruntime_dir = "{root / "rt"}"\n')
        output = root / "out" / "slurm-ext-hook"
        done = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(config), "hooks", "build",
                               "--output", str(output)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"Prolog={output}" in done.stdout and f"Epilog={output}" in done.stdout
        binary = output.read_bytes()
        assert str(root / "rt" / "hooks.sock").encode() in binary
        launcher = output.parent / "slurm-ext-prolog.py"
        assert str(launcher).encode() in binary
        assert launcher.read_text().startswith(f"#!{sys.executable} -IS\n")
        assert os.access(output, os.X_OK)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the client without a service: the fallbacks ---------------------------------------------------


def test_no_service_prolog_runs_the_prolog_fallback_with_argv_and_env(node):
    done = node.client(job_env("prolog", 4242001, SLURM_EXT_TEST_MARK="passed through"), "one", "two")
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert f"no hook service at {node.socket}" in done.stderr
    assert f"running {node.fallback['prolog']} itself" in done.stderr
    [mark] = node.marks("prolog")
    assert node.marks("epilog") == []
    assert mark["args"] == "one two"
    assert mark["SLURM_JOB_ID"] == "4242001"
    assert mark["SLURM_EXT_TEST_MARK"] == "passed through"
    assert mark["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd"
    assert mark["SLURM_EXT_HOOK"] == str(node.hook.resolve())
    assert mark["uid"] == "0"


def test_no_service_epilog_runs_the_epilog_fallback(node):
    done = node.client(job_env("epilog", 4242002))
    assert done.returncode == FALLBACK_EXIT, done.stderr
    [mark] = node.marks("epilog")
    assert mark["SLURM_JOB_ID"] == "4242002"
    assert node.marks("prolog") == []


def test_phase_from_program_name_without_script_context(node):
    epilog = node.root / "bin" / "slurm-ext-epilog"
    epilog.symlink_to(node.hook)
    done = node.client(job_env(None, 4242003), program=epilog)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert "slurm-ext-hook: epilog:" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("epilog")] == ["4242003"]

    prolog = node.root / "bin" / "site-prolog"
    prolog.symlink_to(node.hook)
    done = node.client(job_env(None, 4242004), program=prolog)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242004"]


def test_script_context_wins_over_program_name(node):
    epilog = node.root / "bin" / "slurm-ext-epilog"
    epilog.symlink_to(node.hook)
    done = node.client(job_env("prolog", 4242005), program=epilog)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert len(node.marks("prolog")) == 1 and node.marks("epilog") == []


def test_neither_phase_exits_1_and_says_why(node):
    done = node.client(job_env(None, 4242006))  # named slurm-ext-hook: neither prolog nor epilog
    assert done.returncode == 1
    assert "neither slurmd's Prolog nor its Epilog" in done.stderr and "SLURM_SCRIPT_CONTEXT" in done.stderr
    assert node.any_marks() == []


def test_the_controller_side_prolog_is_refused_not_taken_for_slurmds(node):
    done = node.client(job_env(None, 4242008, SLURM_SCRIPT_CONTEXT="prolog_slurmctld"))
    assert done.returncode == 1
    assert "SLURM_SCRIPT_CONTEXT=prolog_slurmctld" in done.stderr and "PrologSlurmctld" in done.stderr
    assert node.any_marks() == []


def test_unexecutable_fallback_exits_1_and_says_so(node):
    node.fallback["prolog"].unlink()
    done = node.client(job_env("prolog", 4242007))
    assert done.returncode == 1
    assert f"cannot execute {node.fallback['prolog']}" in done.stderr


# -- the client against a fake service -------------------------------------------------------------


def test_client_sends_header_phase_and_its_environment(node, fake):
    service = fake(b"0 hello\n")
    env = job_env("epilog", 4242010, SLURM_EXT_TEST_EMPTY="", SLURM_EXT_TEST_EQ="a=b", SLURM_EXT_HOOK="/tmp/x")
    done = node.client(env)
    header, phase, sent = service.done()
    assert header == b"slurm-ext-hook 2"
    assert phase == "epilog"
    # the client names itself for the Epilog's uid sweep, whatever the environment said
    assert sent == {**env, "SLURM_EXT_HOOK": str(node.hook.resolve())}
    assert service.request.endswith(b"\0\0"), "no end marker: the service would take the request for cut short"
    assert done.returncode == 0
    assert done.stderr == "slurm-ext-hook: epilog: hello\n"
    assert node.any_marks() == []


@pytest.mark.parametrize("reply, code, stderr", [
    (b"0 hello\n", 0, "slurm-ext-hook: prolog: hello\n"),
    (b"1 nope\n", 1, "slurm-ext-hook: prolog: nope\n"),
    (b"0 \n", 0, ""),
    (b"3\n", 3, ""),
])
def test_client_exits_with_the_verdict(node, fake, reply, code, stderr):
    service = fake(reply)
    done = node.client(job_env("prolog", 4242011))
    service.done()
    assert (done.returncode, done.stderr) == (code, stderr)
    assert node.any_marks() == []


@pytest.mark.parametrize("reply", [None, b"", b"0 no newline", b"verdict? 0\n"],
                         ids=["closed", "empty", "no-newline", "garbage"])
def test_client_without_a_verdict_runs_the_fallback(node, fake, reply):
    service = fake(reply)
    done = node.client(job_env("prolog", 4242012))
    service.done()
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert "the hook service gave no verdict" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242012"]


def test_service_gone_while_the_client_writes_means_fallback_not_sigpipe(node, fake):
    """A service that closes before reading the whole request (refused, crashed) must not kill the
    client with SIGPIPE: slurmd would drain the node for a Prolog killed by a signal."""
    fake(None, read=False)
    done = node.client(job_env("prolog", 4242013, **big_values()))
    assert done.returncode == FALLBACK_EXIT, f"exit {done.returncode}: {done.stderr}"
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242013"]


# -- the client's deadlines: a service that takes the job and hangs ------------------------------------


def timed_client(node: Node, env: dict[str, str], program: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = node.client(env, program=program)
    return done, time.monotonic() - started


def test_prolog_with_no_verdict_by_the_deadline_exits_1_and_runs_no_second_prolog(node, silent):
    """The service has the whole request and may still be running the job-start scripts: the Prolog
    must neither hang the job's start nor run them again beside it, nor start the job unchecked."""
    service = silent()
    done, took = timed_client(node, job_env("prolog", 4242060), node.build_hook(deadline=2))
    assert done.returncode == 1, done.stderr
    assert 1.8 < took < 10, f"took {took:.1f}s with a 2 s deadline"
    assert "took the job but gave no verdict within 2 s; exiting 1" in done.stderr
    assert node.any_marks() == [], "the fallback Prolog ran beside a service that may still run it"
    [request] = service.requests
    assert request.startswith(b"slurm-ext-hook 2\nprolog\n") and request.endswith(b"\0\0")


def test_epilog_with_no_verdict_by_the_deadline_runs_the_epilog_fallback(node, silent):
    """The job is over and its cleanup is idempotent: the Epilog does it itself rather than hang."""
    silent()
    done, took = timed_client(node, job_env("epilog", 4242061), node.build_hook(deadline=2))
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert 1.8 < took < 10, f"took {took:.1f}s with a 2 s deadline"
    assert "took the job but gave no verdict within 2 s; running" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("epilog")] == ["4242061"]


def test_request_the_service_never_reads_falls_back_by_the_deadline(node, silent):
    """A stuck accept loop: the connection waits in the backlog and a large request fills the socket
    buffer. The request is incomplete, so the service will never act on it: the fallback is safe."""
    silent(accept=False)
    done, took = timed_client(node, job_env("prolog", 4242062, **big_values()), node.build_hook(deadline=2))
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert 1.8 < took < 10, f"took {took:.1f}s with a 2 s deadline"
    assert "the hook service did not take the job within 2 s" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242062"]


def test_full_backlog_falls_back_at_once_instead_of_blocking_in_connect(node, silent):
    silent(accept=False, backlog=0)
    queued = connect(node.socket)  # the one connection a backlog of 0 holds: the next one is refused
    try:
        done, took = timed_client(node, job_env("prolog", 4242063), node.hook)
    finally:
        queued.close()
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert took < 5, f"took {took:.1f}s"
    assert f"no hook service at {node.socket} (it accepts no more connections)" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242063"]


# -- the client trusts only a service that runs as root ---------------------------------------------

IMPOSTOR = """
import socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(1)
print("listening", flush=True)
connection, _ = listener.accept()
connection.settimeout(20)
got = b""
try:
    while chunk := connection.recv(65536):
        got += chunk
    connection.sendall(b"0 all clear from an impostor\\n")
except OSError:
    pass
print(f"received {len(got)} bytes", flush=True)
"""


def test_client_refuses_a_socket_served_by_a_non_root_process(node):
    """A runtime dir nobody can write (a mistake the service now refuses too) lets nobody serve the
    socket path: the client must neither send it the job nor take its verdict."""
    node.run_dir.mkdir()
    os.chown(node.run_dir, NOBODY, NOBODY)
    impostor = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                 sys.executable, "-I", "-c", IMPOSTOR, str(node.socket)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert impostor.stdout.readline() == "listening\n"
        done = node.client(job_env("prolog", 4242070))
        out, _ = impostor.communicate(timeout=WAIT)
    finally:
        kill(impostor)
    assert done.returncode == FALLBACK_EXIT, f"exit {done.returncode}: {done.stderr}"
    assert "impostor" not in done.stderr
    assert f"{node.socket} is served by uid {NOBODY} (pid {impostor.pid}), not root" in done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242070"]
    assert out == "received 0 bytes\n", "the job's environment went to a non-root listener"


# -- the real service --------------------------------------------------------------------------------


def test_service_socket_is_root_only(node):
    node.start_service()
    info = node.socket.lstat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert (info.st_uid, info.st_gid) == (0, 0)


def test_service_answers_prolog_and_epilog(node):
    service = node.start_service()
    job = 4242001
    done = node.client(job_env("prolog", job))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    record = json.loads(node.record(job).read_text())
    assert (record["job_id"], record["uid"], record["gid"], record["node"]) == (job, JOB_UID, JOB_UID, "n1")
    assert stat.S_IMODE(node.record(job).stat().st_mode) == 0o600
    node.wait_log(service, f"job {job}: prolog answered in")

    done = node.client(job_env("epilog", job))
    assert done.returncode == 0, done.stderr
    assert not node.record(job).exists()
    node.wait_log(service, f"job {job}: epilog answered in")
    assert node.any_marks() == [], "a fallback ran: the service did not answer"
    assert service.poll() is None


def test_service_failed_job_start_script_fails_the_prolog(node):
    node.script("job-start", "10-fail", "#!/bin/sh\nexit 3\n")
    node.start_service()
    job = 4242001
    done = node.client(job_env("prolog", job))
    assert done.returncode == 1, done.stderr
    assert f"job {job}: job-start scripts failed (policy drain)" in done.stderr
    assert node.any_marks() == []
    [event] = [e for e in node.events_of(job) if e["event"] == "script-failed"]
    assert event["component"] == "prolog_epilog"
    assert "10-fail" in json.dumps(event)


def test_service_reloads_a_changed_config_and_keeps_the_old_when_invalid(node):
    node.script("job-start", "10-fail", "#!/bin/sh\nexit 3\n")
    service = node.start_service()
    assert node.client(job_env("prolog", 4242021)).returncode == 1

    node.write_config('on_failure = { "job-start" = "ignore" }\n')
    done = node.client(job_env("prolog", 4242022))
    assert done.returncode == 0, done.stderr
    node.wait_log(service, "config reloaded from")

    node.config_file.write_text(node.config_file.read_text() + "\n[nonsense]\nkey = 1\n")
    done = node.client(job_env("prolog", 4242023))
    assert done.returncode == 0, f"the invalid config was not kept out: {done.stderr}"
    assert [e["event"] for e in node.journal() if e["event"] == "reload-failed"] == ["reload-failed"]
    assert service.poll() is None and node.any_marks() == []


def test_non_root_client_cannot_connect_and_falls_back(node):
    service = node.start_service()
    job = 4242030
    done = node.client(job_env("prolog", job), as_nobody=True)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert f"no hook service at {node.socket}" in done.stderr
    assert [(m["uid"], m["SLURM_JOB_ID"]) for m in node.marks("prolog")] == [(str(NOBODY), str(job))]
    assert not node.record(job).exists()
    assert node.events_of(job) == []
    assert f"job {job}" not in node.log(service)


def test_non_root_peer_is_refused_even_when_the_socket_lets_it_in(node):
    """SO_PEERCRED is the second lock: with the socket opened to all (a mistaken chmod), a non-root
    client is still refused and runs its own hook; its request is large, so the service closes
    while it is still writing."""
    service = node.start_service()
    node.socket.chmod(0o666)
    job = 4242031
    done = node.client(job_env("prolog", job, **big_values()), as_nobody=True)
    assert done.returncode == FALLBACK_EXIT, f"exit {done.returncode}: {done.stderr}"
    assert [(m["uid"], m["SLURM_JOB_ID"]) for m in node.marks("prolog")] == [(str(NOBODY), str(job))]
    node.wait_log(service, f"uid {NOBODY}: only root may ask")
    assert not node.record(job).exists()
    assert node.events_of(job) == []


def test_sigterm_stops_the_service_and_removes_its_socket(node):
    service = node.start_service()
    assert node.stop(service) == 0
    assert not node.socket.exists()
    log = node.log(service)
    assert "hook service stopping" in log and "Traceback" not in log
    done = node.client(job_env("prolog", 4242040))
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242040"]


def test_restart_replaces_a_stale_socket(node):
    first = node.start_service()
    assert node.stop(first, signal.SIGKILL) == -signal.SIGKILL
    assert stat.S_ISSOCK(node.socket.lstat().st_mode), "a killed service should leave its socket"
    done = node.client(job_env("prolog", 4242041))
    assert done.returncode == FALLBACK_EXIT, "nobody listens on a stale socket: the client must fall back"

    second = node.start_service()
    job = 4242042
    done = node.client(job_env("prolog", job))
    assert done.returncode == 0, done.stderr
    assert node.record(job).exists()
    assert [m["SLURM_JOB_ID"] for m in node.marks("prolog")] == ["4242041"]
    assert stat.S_IMODE(node.socket.lstat().st_mode) == 0o600
    assert second.poll() is None


def test_stopping_a_replaced_service_leaves_its_successor_reachable(node):
    first = node.start_service()
    second = node.start_service()  # takes the path over (the first's socket is unlinked)
    assert node.stop(first) == 0
    assert node.socket.exists(), "the stopped service removed the socket of the one still running"
    job = 4242043
    done = node.client(job_env("prolog", job))
    assert done.returncode == 0, done.stderr
    assert node.record(job).exists() and node.any_marks() == []
    assert second.poll() is None


@pytest.mark.parametrize("where", ["runtime-dir-under-a-file", "socket-path-is-a-file"])
def test_service_that_cannot_listen_exits_1_with_an_event(node, where):
    if where == "runtime-dir-under-a-file":
        blocker = node.root / "a-file"
        blocker.write_text("")
        runtime_dir = blocker / "run"
        node.write_config(runtime_dir=runtime_dir)
    else:
        runtime_dir = node.run_dir
        runtime_dir.mkdir()
        (runtime_dir / "hooks.sock").write_text("not a socket\n")
    service = node.start_service(wait=False)
    assert service.wait(timeout=WAIT) == 1
    log = node.log(service)
    assert "Traceback" not in log
    assert "hook-service-failed" in log
    [event] = [e for e in node.journal() if e["event"] == "hook-service-failed"]
    assert event["severity"] == "error"
    assert event["message"].startswith(f"cannot listen on {runtime_dir / 'hooks.sock'}: ")
    if where == "socket-path-is-a-file":
        assert (runtime_dir / "hooks.sock").read_text() == "not a socket\n", "a file that is not a socket was touched"


@pytest.mark.parametrize("case", ["owned-by-another-uid", "mode-0777", "missing-under-another-uids-dir"])
def test_service_refuses_a_runtime_dir_someone_else_can_change(node, case):
    """Whoever can write the runtime dir can put their own socket at the path the Prolog trusts (the
    client now refuses a non-root peer, but the service must not run there either)."""
    if case == "owned-by-another-uid":
        node.run_dir.mkdir()
        os.chown(node.run_dir, OTHER_UID, OTHER_UID)
        at_fault, said = node.run_dir, f"(runtime dir) is owned by uid {OTHER_UID}, not root"
        fix = f"chown root:root {node.run_dir} && chmod 0755 {node.run_dir}"
    elif case == "mode-0777":
        node.run_dir.mkdir()
        node.run_dir.chmod(0o777)
        at_fault, said = node.run_dir, "(runtime dir) is writable by group or others (mode 0777)"
        fix = f"chmod 0755 {node.run_dir}"
    else:
        at_fault = node.root / "users-dir"
        at_fault.mkdir()
        os.chown(at_fault, OTHER_UID, OTHER_UID)
        node.write_config(runtime_dir=at_fault / "run")
        said = f"(above runtime dir {at_fault / 'run'}) is owned by uid {OTHER_UID}, not root"
        fix = "set node.runtime_dir to a directory under a root-owned one"
    runtime_dir = at_fault if case != "missing-under-another-uids-dir" else at_fault / "run"
    service = node.start_service(wait=False)
    assert service.wait(timeout=WAIT) == 1
    log = node.log(service)
    assert "Traceback" not in log
    [event] = [e for e in node.journal() if e["event"] == "hook-service-failed"]
    assert event["severity"] == "error"
    assert event["message"].startswith(f"cannot listen on {runtime_dir / 'hooks.sock'}: {at_fault} {said}")
    assert "someone other than root could replace the hook socket" in event["message"]
    assert fix in event["message"]
    assert not (runtime_dir / "hooks.sock").exists()
    if case == "missing-under-another-uids-dir":
        assert not runtime_dir.exists(), "the runtime dir was made inside a directory another uid owns"


def test_request_cut_short_is_not_acted_on(node):
    """A client that dies (or gives up) while sending leaves a request that looks whole up to its
    end-of-file: without the end marker the service must not run the job's Prolog on it."""
    service = node.start_service()
    job = 4242080
    client = connect(node.socket)
    with client:
        client.sendall(request_bytes("prolog", job_env("prolog", job), end=False))
        client.shutdown(socket.SHUT_WR)
        assert client.recv(1024) == b"", "a verdict for a request cut short"
    node.wait_log(service, "prolog request cut short (no end marker)")
    assert not node.record(job).exists()
    assert node.events_of(job) == []


def test_request_of_a_client_that_gave_up_is_not_acted_on(node):
    """A client past its deadline has run its fallback (Epilog) or failed the job (Prolog): a service
    that reads the request only now must not run the hook a second time."""
    service = node.start_service()
    job = 4242081
    client = connect(node.socket)
    client.sendall(request_bytes("prolog", job_env("prolog", job)))
    client.close()  # gone, not just done writing
    node.wait_log(service, f"job {job}: prolog request dropped: its client gave up waiting")
    assert not node.record(job).exists()
    assert node.events_of(job) == []
    assert node.client(job_env("prolog", job + 1)).returncode == 0, "the service must keep answering"


def test_request_trickled_in_is_cut_off_after_the_read_timeout(node):
    """The read timeout is for the whole request, not for each byte: a client that sends one byte a
    second must not hold a service thread for as long as it likes."""
    node.start_service()
    client = connect(node.socket)
    with client:
        client.sendall(b"slurm-ext-hook 2\nprolog\n")
        started = time.monotonic()
        while not closed_by_peer(client) and time.monotonic() - started < 16:
            try:
                client.sendall(b"X")
            except OSError:
                break
            closed_by_peer(client, timeout=1.0)
        took = time.monotonic() - started
    assert 8 < took < 13, f"the service read a trickled request for {took:.1f}s (expected about 10 s)"


def test_client_that_never_reads_its_verdict_does_not_hold_the_service(node):
    """The verdict (at most ~1 KiB) fits in the socket buffer, and the send has a timeout besides: a
    client that never reads and never closes does not keep the request's thread."""
    service = node.start_service()
    job = 4242082
    client = connect(node.socket)
    with client:
        client.sendall(request_bytes("prolog", job_env("prolog", job)))
        client.shutdown(socket.SHUT_WR)
        node.wait_log(service, f"job {job}: prolog answered in")
        assert node.record(job).exists()
    assert node.client(job_env("prolog", job + 1)).returncode == 0

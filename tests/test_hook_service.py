"""The Prolog/Epilog hand-off: the compiled slurm-ext-hook client (hook.c) and the hook service (service.py).

Real processes over a real Unix socket: the client is compiled by build_hook, the service is
`slurm-ext hooks serve` in a child process, and the fallbacks are shell scripts that leave a mark of
how they ran (uid, arguments, environment) and exit 7, so a test can tell the service's answer from
the fallback's.

The jobs belong to uid 64242, which no account and no process on the host has: the Epilog kills
every process of an exclusive job's user and removes its IPC objects, and a uid in use (nobody)
would let a test kill processes it did not start.
"""

from __future__ import annotations

import json
import os
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

from slurm_ext.prolog_epilog.service import HookBuildError, build_hook

NOBODY = 65534
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
        self.hook = build_hook(self.root / "bin" / "slurm-ext-hook", str(self.socket), str(self.fallback["prolog"]),
                               str(self.fallback["epilog"]))
        self.config_file = self.root / "slurm-ext.toml"
        self.write_config()
        self.services: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def write_config(self, extra: str = "", runtime_dir: Path | None = None) -> None:
        self.config_file.write_text(
            f'[node]\nstate_dir = "{self.state}"\n\n[log]\nlevel = "debug"\n\n'
            f'[supervisor]\nruntime_dir = "{runtime_dir or self.run_dir}"\n\n'
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
        config.write_text(f'[supervisor]\nruntime_dir = "{root / "rt"}"\n')
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
    env = job_env("epilog", 4242010, SLURM_EXT_TEST_EMPTY="", SLURM_EXT_TEST_EQ="a=b")
    done = node.client(env)
    header, phase, sent = service.done()
    assert header == b"slurm-ext-hook 1"
    assert phase == "epilog"
    assert sent == env
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

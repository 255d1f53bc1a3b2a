"""The hook service under systemd: the units (`slurm-ext hooks install-units`) and socket activation.

The units are checked by the real `systemd-analyze verify` (it needs no systemd as PID 1). Socket
activation runs under the real `systemd-socket-activate`, which listens, waits for the first
connection and execs `slurm-ext hooks serve` with LISTEN_FDS/LISTEN_PID exactly as systemd does; the
real compiled client (build_hook) is that first connection. The fallbacks are shell scripts that leave
a mark and exit 7, so a test can tell the service's verdict from the Python hook's. Wrong descriptors
(a TCP socket, a file, a socket elsewhere) are handed to the service by a shell that puts them at fd 3.

Job uid 64242 belongs to no account and no process on the host (the Epilog kills that uid's processes).
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
from pathlib import Path

import pytest

from helpers.cli import cli
from helpers.files import script, temp_dir
from helpers.wait import wait_for
from slurm_ext.prolog_epilog.service import build_hook

SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
SOCKET_ACTIVATE = "/usr/bin/systemd-socket-activate"
JOB_UID = 64242
FALLBACK_EXIT = 7
WAIT = 30.0

pytestmark = pytest.mark.skipif(not (os.access(SYSTEMD_ANALYZE, os.X_OK) and os.access(SOCKET_ACTIVATE, os.X_OK)),
                                reason="needs systemd-analyze and systemd-socket-activate (Debian: systemd)")

FALLBACK_SCRIPT = """#!/bin/sh
# stands in for slurm-ext-{phase}: leaves a mark, exits {code}
env > "{marks}/{phase}.$$"
exit {code}
"""

# a job-start script that records what the service let it inherit: its environment and its open descriptors
INHERITED_SCRIPT = """#!/bin/sh
env > "{out}/env"
for fd in /proc/$$/fd/*; do readlink "$fd"; done > "{out}/fds"
"""

SERVE = [sys.executable, "-m", "slurm_ext.cli"]


def job_env(phase: str, job_id: int) -> dict[str, str]:
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": str(JOB_UID), "SLURM_JOB_GID": str(JOB_UID),
            "SLURM_JOB_USER": "hooktest", "SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin",
            "SLURM_SCRIPT_CONTEXT": f"{phase}_slurmd"}


class Node:
    """A node's hook files in a temp dir (client, fallbacks, config, state) and the processes a test starts."""

    def __init__(self):
        self.root = temp_dir()
        self.run_dir = self.root / "run"
        self.run_dir.mkdir(mode=0o755)
        self.socket = self.run_dir / "hooks.sock"
        self.state = self.root / "state"
        self.scripts = self.root / "scripts"
        self.marks_dir = self.root / "marks"
        self.marks_dir.mkdir()
        fallbacks = []
        for phase in ("prolog", "epilog"):
            path = self.root / f"fallback-{phase}"
            path.write_text(FALLBACK_SCRIPT.format(phase=phase, marks=self.marks_dir, code=FALLBACK_EXIT))
            path.chmod(0o755)
            fallbacks.append(str(path))
        self.hook = build_hook(self.root / "bin" / "slurm-ext-hook", str(self.socket), *fallbacks)
        self.config_file = self.root / "slurm-ext.toml"
        self.config_file.write_text(
            f'[node]\nstate_dir = "{self.state}"\nruntime_dir = "{self.run_dir}"\n\n'
            f'[log]\nlevel = "debug"\n\n'
            f'[prolog_epilog]\nscripts_dir = "{self.scripts}"\n\n'
            f'[slurm]\nconf = "{self.root / "no-slurm.conf"}"\n')
        self.log_file = self.root / "service.log"
        self.procs: list[subprocess.Popen] = []

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        with open(self.log_file, "a") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, **kwargs)
        self.procs.append(proc)
        return proc

    def activate(self, socket_mode: int = 0o600) -> subprocess.Popen:
        """`slurm-ext hooks serve` under systemd-socket-activate, listening (`socket_mode`, as SocketMode=)."""
        proc = self.popen([SOCKET_ACTIVATE, "-l", str(self.socket), *SERVE, "--config", str(self.config_file),
                           "hooks", "serve"])
        wait_for("systemd-socket-activate listening", lambda: self.log_text().count("Listening on"), WAIT)
        self.socket.chmod(socket_mode)  # what SocketMode= does (systemd-socket-activate makes it 0644)
        return proc

    def serve_with_fd3(self, fd: int | None, listen_fds: str = "1", listen_pid: str = "$$") -> subprocess.Popen:
        """`slurm-ext hooks serve` with `fd` at descriptor 3 (None: nothing there) and LISTEN_FDS/LISTEN_PID
        set (pid: its own)."""
        assert fd != 3, "the wrapper moves fd to 3: it must start elsewhere"
        move = "exec 3<&-" if fd is None else f"exec 3<&{fd} {fd}<&-"
        wrapper = f'{move}; export LISTEN_PID={listen_pid} LISTEN_FDS={listen_fds}; exec "$@"'
        # bash, not sh: dash redirects only descriptors 0 to 9
        return self.popen(["bash", "-c", wrapper, "bash", *SERVE, "--config", str(self.config_file), "hooks",
                           "serve"], pass_fds=() if fd is None else (fd,))

    def client(self, phase: str, job_id: int) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.hook)], env=job_env(phase, job_id), capture_output=True, text=True,
                              timeout=WAIT)

    def log_text(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def wait_log(self, proc: subprocess.Popen, text: str) -> str:
        def logged():
            if text in self.log_text():
                return True
            assert proc.poll() is None, f"exited {proc.returncode} before logging {text!r}:\n{self.log_text()}"
            return False
        wait_for(f"service log line {text!r}:\n{self.log_text()}", logged, WAIT)
        return self.log_text()

    def marks(self) -> list[str]:
        return sorted(p.name for p in self.marks_dir.iterdir())

    def journal(self) -> list[dict]:
        path = self.state / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def failure(self) -> str:
        """The message of the one hook-service-failed event."""
        [event] = [e for e in self.journal() if e["event"] == "hook-service-failed"]
        assert event["severity"] == "error"
        return event["message"]

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=WAIT)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node():
    made = Node()
    yield made
    made.cleanup()


def install_units(node: Node, unit_dir: Path) -> subprocess.CompletedProcess:
    return cli("--config", str(node.config_file), "hooks", "install-units", "--prefix", str(unit_dir))


def verify(*units: Path) -> subprocess.CompletedProcess:
    # --man=no: Documentation= names a web page, not a man page this host may lack
    return subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", *map(str, units)], capture_output=True,
                          text=True, timeout=WAIT)


def unit_lines(path: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith(f"{key}=")]


# -- the units ------------------------------------------------------------------------------------


def test_installed_units_pass_systemd_analyze_verify(node):
    unit_dir = node.root / "units"
    done = install_units(node, unit_dir)
    assert done.returncode == 0, done.stderr
    sock, service = unit_dir / "slurm-ext-hooks.socket", unit_dir / "slurm-ext-hooks.service"
    assert f"wrote {sock}" in done.stdout and f"wrote {service}" in done.stdout
    assert "systemctl enable --now slurm-ext-hooks.socket" in done.stdout
    for path in (sock, service):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644

    assert unit_lines(sock, "ListenStream") == [str(node.socket)], "systemd must listen where the client connects"
    assert unit_lines(sock, "SocketMode") == ["0600"]
    assert unit_lines(sock, "SocketUser") == ["root"] and unit_lines(sock, "SocketGroup") == ["root"]
    program = Path(sys.executable).parent / "slurm-ext"
    assert unit_lines(service, "ExecStart") == [f"{program} --config {node.config_file} hooks serve"]
    for sandbox in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ProtectControlGroups",
                    "PrivateIPC", "RuntimeDirectory", "DynamicUser", "User"):
        assert unit_lines(service, sandbox) == [], f"{sandbox}= breaks what the hook service does"

    checked = verify(sock, service)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


def test_systemd_analyze_verify_catches_what_these_units_would_get_wrong(node):
    """The verify check is not a formality: a mistyped key, or a service whose program is missing, is reported."""
    unit_dir = node.root / "units"
    assert install_units(node, unit_dir).returncode == 0
    sock, service = unit_dir / "slurm-ext-hooks.socket", unit_dir / "slurm-ext-hooks.service"
    sock.write_text(sock.read_text().replace("SocketMode=0600", "SocketMod=0600"))
    checked = verify(sock, service)
    assert "Unknown key 'SocketMod'" in checked.stderr

    assert install_units(node, unit_dir).returncode == 0  # puts the right text back
    program = f"{Path(sys.executable).parent}/slurm-ext"
    service.write_text(service.read_text().replace(program, "/nonexistent/slurm-ext"))
    checked = verify(sock, service)
    assert checked.returncode != 0 and "/nonexistent/slurm-ext" in checked.stderr


def test_install_units_rewrites_only_what_changed(node):
    unit_dir = node.root / "units"
    assert install_units(node, unit_dir).returncode == 0
    sock, service = unit_dir / "slurm-ext-hooks.socket", unit_dir / "slurm-ext-hooks.service"
    before = {path: path.stat().st_ino for path in (sock, service)}
    again = install_units(node, unit_dir)
    assert f"unchanged {sock}" in again.stdout and f"unchanged {service}" in again.stdout
    assert {path: path.stat().st_ino for path in (sock, service)} == before

    moved = node.root / "other-run"
    node.config_file.write_text(node.config_file.read_text().replace(f'"{node.run_dir}"', f'"{moved}"'))
    changed = install_units(node, unit_dir)
    assert f"wrote {sock}" in changed.stdout and f"unchanged {service}" in changed.stdout
    assert unit_lines(sock, "ListenStream") == [str(moved / "hooks.sock")]


@pytest.mark.parametrize("runtime_dir", ["/run/slurm ext", "/run/slurm-ext-%H", "/run/$ext"])
def test_install_units_refuses_a_path_a_unit_file_would_expand_or_split(node, runtime_dir):
    node.config_file.write_text(node.config_file.read_text().replace(f'"{node.run_dir}"', f'"{runtime_dir}"'))
    unit_dir = node.root / "units"
    done = install_units(node, unit_dir)
    assert done.returncode == 1
    assert "cannot install the hook service's systemd units: the hook socket (node.runtime_dir)" in done.stderr
    assert "must be an absolute path of letters, digits" in done.stderr
    assert "Traceback" not in done.stderr
    assert not unit_dir.exists() or list(unit_dir.iterdir()) == []


# -- socket activation --------------------------------------------------------------------------------


def test_first_prolog_starts_the_service_and_gets_its_verdict(node):
    """systemd-socket-activate execs the service on the first connection: that connection's job is
    answered by it (no fallback), the service passes on neither LISTEN_* nor the listening socket to the
    scripts it runs, and when it stops it leaves the socket file to its owner (systemd)."""
    inherited = node.root / "inherited"
    inherited.mkdir()
    script(node.scripts / "worker" / "job-start.d", "10-inherited", INHERITED_SCRIPT.format(out=inherited))
    proc = node.activate()
    assert "hook service listening" not in node.log_text(), "the service started before any connection"

    job = 4242101
    done = node.client("prolog", job)
    assert done.returncode == 0, f"{done.stderr}\n{node.log_text()}"
    assert done.stderr == ""
    assert node.marks() == [], "the Python fallback ran: the activated service did not answer"
    assert (node.state / "jobs" / f"{job}.json").exists()
    log = node.wait_log(proc, "(socket passed by systemd)")
    assert f"Execing {sys.executable}" in log
    assert proc.poll() is None, "the service (exec'd in place of systemd-socket-activate) is not running"

    env = (inherited / "env").read_text()
    assert "LISTEN_FDS=" not in env and "LISTEN_PID=" not in env and "LISTEN_FDNAMES=" not in env
    listening = os.readlink(f"/proc/{proc.pid}/fd/3")
    assert listening.startswith("socket:")
    assert listening not in (inherited / "fds").read_text().split(), "a script inherited the listening socket"

    done = node.client("epilog", job)
    assert done.returncode == 0, done.stderr
    assert not (node.state / "jobs" / f"{job}.json").exists()
    assert node.marks() == []

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=WAIT) == 0
    assert "new connections wait in systemd's socket" in node.log_text()
    assert stat.S_ISSOCK(node.socket.lstat().st_mode), "the service removed systemd's socket file"


def test_listen_pid_of_another_process_is_ignored_and_removed(node):
    """Inherited LISTEN_* (LISTEN_PID names someone else) are not this service's: it binds its own socket
    as without systemd, and its scripts do not inherit the variables."""
    inherited = node.root / "inherited"
    inherited.mkdir()
    script(node.scripts / "worker" / "job-start.d", "10-inherited", INHERITED_SCRIPT.format(out=inherited))
    with open(os.devnull) as unrelated:
        proc = node.serve_with_fd3(unrelated.fileno(), listen_pid="1")
    log = node.wait_log(proc, "hook service listening on")
    assert "LISTEN_FDS is for pid 1, not this process" in log and "(socket passed by systemd)" not in log
    info = node.socket.lstat()
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    done = node.client("prolog", 4242102)
    assert done.returncode == 0, done.stderr
    assert node.marks() == []
    assert "LISTEN_" not in (inherited / "env").read_text()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=WAIT) == 0
    assert not node.socket.exists(), "the socket it bound itself is removed as without systemd"


def unix_socket(path: Path, kind: int = socket.SOCK_STREAM, listen: bool = True) -> socket.socket:
    made = socket.socket(socket.AF_UNIX, kind)
    made.bind(str(path))
    if listen:
        made.listen(1)
    return made


@pytest.mark.parametrize("case", ["tcp", "file", "elsewhere", "datagram", "not-listening", "two-fds", "closed"])
def test_a_passed_descriptor_that_is_not_the_hook_socket_is_refused(node, case):
    """The service exits 1 with an event that says what it was given, and binds nothing of its own in its
    place (a unit pointing elsewhere must be fixed, not papered over)."""
    holder = None
    if case == "tcp":
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        said = f"fd 3 is an AF_INET socket at ('127.0.0.1', {holder.getsockname()[1]}), not a Unix socket"
    elif case == "file":
        holder = open(node.config_file)
        said = "fd 3 is a regular file"
    elif case == "elsewhere":
        holder = unix_socket(node.root / "other.sock")
        said = f"fd 3 is bound to {node.root / 'other.sock'}, but slurm-ext-hook connects to {node.socket}"
    elif case == "datagram":
        holder = unix_socket(node.socket, socket.SOCK_DGRAM, listen=False)
        said = "fd 3 is a Unix socket of type SOCK_DGRAM, not SOCK_STREAM"
    elif case == "not-listening":
        holder = unix_socket(node.socket, listen=False)
        said = "fd 3 is a Unix stream socket that is not listening"
    elif case == "two-fds":
        holder = unix_socket(node.socket)
        said = "LISTEN_FDS=2, expected 1"
    else:
        said = "fd 3 is not open (Bad file descriptor)"
    try:
        proc = node.serve_with_fd3(holder.fileno() if holder else None, listen_fds="2" if case == "two-fds" else "1")
        assert proc.wait(timeout=WAIT) == 1, node.log_text()
    finally:
        if holder:
            holder.close()
    log = node.log_text()
    assert "Traceback" not in log and "hook service listening" not in log
    message = node.failure()
    assert message.startswith(f"cannot listen on {node.socket}: systemd passed a socket (LISTEN_FDS) that is not "
                              f"the hook socket {node.socket}: {said}")
    assert "ListenStream= must be that path with SocketMode=0600" in message
    if case in ("tcp", "file", "elsewhere", "closed"):
        assert not node.socket.exists(), "the service bound a socket of its own instead"


def test_a_passed_socket_others_may_open_is_refused_and_the_job_falls_back(node):
    """systemd-socket-activate makes its socket 0644; without SocketMode=0600 the service refuses it. The
    connection that started it gets no verdict, so its client runs the Python hook."""
    proc = node.activate(socket_mode=0o644)
    done = node.client("prolog", 4242103)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert "the hook service gave no verdict" in done.stderr
    assert [name.split(".")[0] for name in node.marks()] == ["prolog"]
    assert proc.wait(timeout=WAIT) == 1
    assert f"{node.socket} is owned by uid 0 with mode 0644, expected root and 0600" in node.failure()
    assert "Traceback" not in node.log_text()


def test_a_passed_socket_in_a_runtime_dir_others_can_change_is_refused(node):
    """The runtime dir checks hold for systemd's socket too: a directory others can write is refused."""
    node.run_dir.chmod(0o777)
    proc = node.activate()
    done = node.client("prolog", 4242104)
    assert done.returncode == FALLBACK_EXIT, done.stderr
    assert proc.wait(timeout=WAIT) == 1
    message = node.failure()
    assert f"{node.run_dir} (runtime dir) is writable by group or others (mode 0777)" in message
    assert "someone other than root could replace the hook socket" in message

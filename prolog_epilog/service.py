"""The hook service: the warm side of the Prolog and the Epilog.

slurmd starts `slurm-ext-hook` (hook.c) twice per job. That client connects
to this service's Unix socket, sends the phase and its environment, and
exits with the verdict; the service does the work with its imports loaded,
NVML initialised and script verdicts cached, so a job pays a socket round
trip instead of a Python start. The node agent runs the service as one of
the worker role's workers (`slurm-ext hooks serve`): a separate process, so
the agent's reaper never steals the exit status of a script the service
waits for, and a fault here cannot take down the agent that keeps slurmd up.

Only root may talk to it: the socket is mode 0600 in a directory only root
can change (the service refuses to start otherwise), each peer's
credentials (SO_PEERCRED) must be uid 0, and the client in turn takes a
verdict only from a service that runs as root. Job records live on
disk (jobrecord), so a restart of the service loses nothing: a Prolog
answered by one service life is cleaned up by the Epilog of the next.

On bare metal without the agent, systemd can own the socket instead
(slurm-ext-hooks.socket, written by `slurm-ext hooks install-units`): it
listens from boot and starts the service on the first connection, passing
the listening socket as fd 3 (LISTEN_FDS/LISTEN_PID, sd_listen_fds(3)). The
service then checks that it is the Unix stream socket at the path the
client connects to, root's and 0600 in a runtime dir only root can change,
and leaves the file to systemd when it stops: connections made meanwhile
wait in systemd's socket for the next start.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import logging
import os
import select
import signal
import socket
import stat
import struct
import sys
import sysconfig
import threading
import time
from pathlib import Path

from slurm_ext import command, config as config_mod, events, log
from slurm_ext.config import Config
from slurm_ext.errors import CommandError, ConfigError, SlurmExtError
from slurm_ext.fileio import atomic_write

from . import gpus, hooks

__all__ = ["socket_path", "serve", "build_hook", "write_launchers", "HookBuildError", "UnsafeRuntimeDir",
           "PassedSocketError", "HOOK_SOURCE", "HOOK_DEADLINE_S"]

logger = logging.getLogger("prolog_epilog")

HOOK_SOURCE = Path(__file__).with_name("hook.c")
#: the fallback hooks' parsed config, beside them (`write_launchers`)
CONFIG_CACHE = "slurm-ext-config.cache.json"
_PROTOCOL = b"slurm-ext-hook 2"
_MAX_REQUEST = 1 << 20
#: longest a request may take to arrive in all (the client sends it at once, in well under a millisecond)
_READ_TIMEOUT = 10.0
#: longest the verdict may take to leave (at most ~1 KiB, so it fits in the socket buffer of a client that never reads)
_SEND_TIMEOUT = 10.0
_CC_TIMEOUT = 120.0

#: Seconds the C client gives the service for a verdict before its fail-safe outcome (hook.c explains it):
#: above the longest healthy Prolog (job-start scripts have 60 s each by default), far below forever,
#: which is how long slurmd waits for a Prolog or Epilog unless PrologEpilogTimeout is set (set it above this).
HOOK_DEADLINE_S = 300

#: the first descriptor systemd passes (SD_LISTEN_FDS_START in sd-daemon.h)
_LISTEN_FDS_START = 3
_ACTIVATION_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class HookBuildError(SlurmExtError):
    """The C hook client could not be compiled."""


class UnsafeRuntimeDir(SlurmExtError):
    """The hook socket's directory, or one above it, can be changed by someone other than root.

    Whoever can write there can put their own socket at the path the Prolog
    and Epilog trust, or move the service's away. `directory` is the
    directory at fault, `problem` what is wrong with it, `fix` what to do.
    """

    def __init__(self, directory: Path, problem: str, fix: str):
        self.directory = directory
        self.problem = problem
        self.fix = fix
        super().__init__(f"{directory} {problem}, so someone other than root could replace the hook socket; {fix}")


class PassedSocketError(SlurmExtError):
    """The socket systemd passed (LISTEN_FDS) is not the hook socket the client connects to.

    Serving it would answer nobody (another address), anybody (a TCP port,
    a socket others may open), or not work at all (a file, a datagram
    socket). `expected` is the hook socket's path, `problem` what the
    passed descriptor is instead.
    """

    def __init__(self, expected: Path, problem: str):
        self.expected = expected
        self.problem = problem
        super().__init__(f"systemd passed a socket (LISTEN_FDS) that is not the hook socket {expected}: {problem}; "
                         "the socket unit's ListenStream= must be that path with SocketMode=0600 "
                         "(`slurm-ext hooks install-units` writes it from this config)")


def socket_path(config: Config) -> Path:
    return Path(config.node.runtime_dir) / "hooks.sock"


def serve(config_path: str | None = None) -> int:
    """Answer hook clients until SIGTERM; returns the exit status.

    Serves the socket systemd passed when LISTEN_PID names this process
    (socket activation), else binds its own at `socket_path`.
    """
    holder = _ConfigHolder(config_path)
    config = holder.get()
    log.setup(config.log, "hooks")
    path = socket_path(config)
    bound = None  # the file this service made, and removes when it stops; systemd's socket stays systemd's
    try:
        listener = _passed_listener(path)
        if listener is None:
            listener = _listen(path)
            bound = path.lstat()
    except (OSError, UnsafeRuntimeDir, PassedSocketError) as err:
        problem = err.strerror or str(err) if isinstance(err, OSError) else str(err)
        events.emit(config.node.state_dir, "prolog_epilog", "hook-service-failed",
                    f"cannot listen on {path}: {problem}", "error")
        return 1
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        try:
            gpus.gpu_usage(())  # NVML initialised now, not in the first job's Prolog
        except gpus.GpuCheckError as err:
            logger.info("NVML not available (%s): jobs with GPUs will report it", err)
        logger.info("hook service listening on %s%s", path, " (socket passed by systemd)" if bound is None else "")
        while True:
            try:
                connection, _ = listener.accept()
            except OSError as err:  # EMFILE and the like: clients fall back meanwhile; never exit for it
                logger.error("hook service: accept on %s failed: %s", path, err)
                time.sleep(0.1)
                continue
            threading.Thread(target=_answer, args=(connection, holder), daemon=True,
                             name="hook-request").start()
    except SystemExit:
        logger.info("hook service stopping: clients still waiting run their hook themselves%s",
                    "" if bound is not None else "; new connections wait in systemd's socket for the next start")
        return 0
    finally:
        listener.close()
        if bound is not None:
            try:
                now = path.lstat()
                if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):  # not a successor's socket
                    path.unlink()
            except OSError:
                pass


def _stop(signum, frame) -> None:
    raise SystemExit(0)


def _listen(path: Path) -> socket.socket:
    """Bind the 0600 socket at `path`, in a directory only root can change.

    Raises:
        UnsafeRuntimeDir: the directory or one above it is not root's alone.
        OSError: it cannot be created, or something that is not a socket is at `path`.
    """
    _prepare_runtime_dir(path.parent)
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()  # left by a service that died: no one listens on it
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is created 0600: only root may connect
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(128)
    return listener


def _passed_listener(path: Path, environ: dict[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed for `path` (fd 3), or None when it passed none to this process.

    sd_listen_fds(3) semantics: the variables count only when LISTEN_PID is
    this process (a parent's, inherited, are not ours); they are removed in
    every case, and fd 3 is made close-on-exec, so the scripts and user
    hooks the service runs inherit neither. The socket must be the one the
    client connects to: a listening AF_UNIX stream socket bound to `path`,
    root's and 0600 there, in a runtime dir only root can change (the checks
    `_listen` makes on its own socket).

    Raises:
        PassedSocketError: more than one descriptor, or fd 3 is not that socket.
        UnsafeRuntimeDir: the socket's directory, or one above it, is not root's alone.
    """
    environ = os.environ if environ is None else environ
    values = {name: environ.pop(name, None) for name in _ACTIVATION_VARIABLES}
    if values["LISTEN_PID"] is None and values["LISTEN_FDS"] is None:
        return None
    if values["LISTEN_PID"] != str(os.getpid()):
        logger.info("LISTEN_FDS is for pid %s, not this process (%d): ignored, binding %s itself",
                    values["LISTEN_PID"], os.getpid(), path)
        return None
    if values["LISTEN_FDS"] != "1":
        raise PassedSocketError(path, f"LISTEN_FDS={values['LISTEN_FDS']}, expected 1 (a single ListenStream=)")
    fd = _LISTEN_FDS_START
    try:
        os.set_inheritable(fd, False)
        kind = os.fstat(fd).st_mode
    except OSError as err:
        raise PassedSocketError(path, f"fd {fd} is not open ({err.strerror})") from err
    if not stat.S_ISSOCK(kind):
        what = "a regular file" if stat.S_ISREG(kind) else "a directory" if stat.S_ISDIR(kind) else \
            "a pipe" if stat.S_ISFIFO(kind) else "a device" if stat.S_ISCHR(kind) or stat.S_ISBLK(kind) else \
            "not a socket"
        raise PassedSocketError(path, f"fd {fd} is {what}")
    listener = socket.socket(fileno=fd)
    try:
        _check_passed(listener, path)
    except BaseException:
        listener.detach()  # refused, but the descriptor is still systemd's to hand to the next start
        raise
    listener.setblocking(True)
    return listener


def _check_passed(listener: socket.socket, path: Path) -> None:
    """`listener` must be a listening Unix stream socket bound to `path`, root's alone, in a safe directory."""
    fd = listener.fileno()
    if listener.family != socket.AF_UNIX:
        family = getattr(listener.family, "name", listener.family)
        raise PassedSocketError(path, f"fd {fd} is an {family} socket at {listener.getsockname()}, not a Unix socket")
    if listener.type != socket.SOCK_STREAM:
        kind = getattr(listener.type, "name", listener.type)
        raise PassedSocketError(path, f"fd {fd} is a Unix socket of type {kind}, not SOCK_STREAM")
    if not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise PassedSocketError(path, f"fd {fd} is a Unix stream socket that is not listening")
    address = listener.getsockname()
    address = os.fsdecode(address) if isinstance(address, bytes) else address
    if not address or address.startswith("\0"):
        raise PassedSocketError(path, f"fd {fd} is bound to {'no path' if not address else 'an abstract address'}")
    if os.path.abspath(address) != os.path.abspath(path):
        raise PassedSocketError(path, f"fd {fd} is bound to {address}, but slurm-ext-hook connects to {path} "
                                "(node.runtime_dir)")
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise PassedSocketError(path, f"fd {fd} is bound to {path}, but no file is there any more (removed, "
                                "or replaced by another service's socket and then removed)") from None
    _prepare_runtime_dir(path.parent)  # it holds the socket, so it exists: checked, nothing made
    if not stat.S_ISSOCK(info.st_mode):
        raise PassedSocketError(path, f"{path} is no longer a socket")
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
        raise PassedSocketError(path, f"{path} is owned by uid {info.st_uid} with mode "
                                f"{stat.S_IMODE(info.st_mode):04o}, expected root and 0600 (SocketUser=root, "
                                "SocketMode=0600): only root may hand this service a job")


def _prepare_runtime_dir(directory: Path) -> None:
    """Make `directory` (0755, with any missing parents) unless it exists; check that only root can change it.

    Like sshd's StrictModes: the directory must be root's, a directory, and
    writable by root alone; every directory above it must be root's and not
    writable by group or others, except sticky ones such as /tmp (there
    nobody can move away what root made). The checks run before anything is
    created, so nothing is made 0755 inside a directory someone else owns.

    Raises:
        UnsafeRuntimeDir: naming the directory at fault and the fix.
        OSError: a directory cannot be created (a file in the way, read-only).
    """
    directory = Path(os.path.abspath(directory))
    existing, missing = directory, []
    while not os.path.lexists(existing):
        missing.append(existing)
        existing = existing.parent
    resolved = Path(os.path.realpath(existing))
    if missing:  # `existing` is the nearest directory above: checked with all above it
        above = [existing, *existing.parents, resolved, *resolved.parents]
    else:
        above = [*existing.parents, *resolved.parents]
    for ancestor in dict.fromkeys(above):  # by name and as resolved: a link cannot lead around the check
        _check_ancestor(ancestor, directory)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
    _check_own_dir(directory)


def _check_ancestor(path: Path, directory: Path) -> None:
    """`path`, above the runtime dir `directory`, must be root's and writable by root alone (or sticky)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return  # only who can write the directory holding it can change a link: that directory is checked too
    fix = f"set node.runtime_dir to a directory under a root-owned one such as /run (not under {path})"
    if info.st_uid != 0:
        raise UnsafeRuntimeDir(path, f"(above runtime dir {directory}) is owned by uid {info.st_uid}, not root",
                               f"chown root {path}, or {fix}")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UnsafeRuntimeDir(path, f"(above runtime dir {directory}) is writable by group or others "
                               f"(mode {stat.S_IMODE(info.st_mode):04o})", f"chmod go-w {path}, or {fix}")


def _check_own_dir(directory: Path) -> None:
    """The runtime dir itself (a link to it is followed: its holder is checked above) must be root's alone."""
    info = directory.stat()
    fix = "or set node.runtime_dir to another directory"
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{directory} is not a directory")
    if info.st_uid != 0:
        raise UnsafeRuntimeDir(directory, f"(runtime dir) is owned by uid {info.st_uid}, not root",
                               f"chown root:root {directory} && chmod 0755 {directory}, {fix}")
    if info.st_mode & 0o022:
        raise UnsafeRuntimeDir(directory, f"(runtime dir) is writable by group or others "
                               f"(mode {stat.S_IMODE(info.st_mode):04o})", f"chmod 0755 {directory}, {fix}")


class _ConfigHolder:
    """The config, reloaded when its file changes (the service is long-lived)."""

    def __init__(self, path: str | None):
        self.path = path
        self.config = config_mod.load(path)
        self._stamp = self._file_stamp()
        self._lock = threading.Lock()

    def _file_stamp(self) -> tuple | None:
        try:
            info = os.stat(self.config.source) if self.config.source else None
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size) if info else None

    def get(self) -> Config:
        with self._lock:
            if self._file_stamp() != self._stamp:
                try:
                    self.config = config_mod.load(self.path)
                    logger.info("config reloaded from %s", self.config.source)
                except ConfigError as err:
                    events.emit(self.config.node.state_dir, "prolog_epilog", "reload-failed",
                                f"config changed but is invalid, keeping the running one: {err}", "error")
                self._stamp = self._file_stamp()
            return self.config


def _answer(connection: socket.socket, holder: _ConfigHolder) -> None:
    started = time.monotonic()
    with connection:
        try:
            pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                    struct.calcsize("3i")))
            if uid != 0:
                logger.warning("refused a hook request from pid %d uid %d: only root may ask", pid, uid)
                return
            phase, env = _read_request(connection)
        except (OSError, ValueError) as err:
            logger.warning("bad hook request: %s", err)
            return
        if _client_gone(connection):
            logger.warning("job %s: %s request dropped: its client gave up waiting before the service read it "
                           "(it ran its fallback or failed the job)", env.get("SLURM_JOB_ID"), phase)
            return
        verdict = hooks.handle(phase, env, holder.get(), protect=(pid,))
        message = verdict.message.replace("\n", " ")[:900]
        try:
            connection.settimeout(_SEND_TIMEOUT)  # a client that never reads must not hold this thread
            connection.sendall(f"{verdict.exit_code} {message}\n".encode())
        except OSError as err:
            logger.warning("job %s: %s verdict not delivered: %s", env.get("SLURM_JOB_ID"), phase, err)
    logger.debug("job %s: %s answered in %.1f ms", env.get("SLURM_JOB_ID"), phase,
                 (time.monotonic() - started) * 1000)


def _client_gone(connection: socket.socket) -> bool:
    """Has the client closed its end (not just its writing half)?

    A client that gave up (hook.c's deadline) has already run its fallback
    or failed the job: a service that reads its request only now, after a
    stall, must not run the job's hook a second time.
    """
    poller = select.poll()
    poller.register(connection, select.POLLIN)
    return any(events & select.POLLHUP for _, events in poller.poll(0))


def _read_request(connection: socket.socket) -> tuple[str, dict[str, str]]:
    """Phase and environment of one request, read within _READ_TIMEOUT in all.

    Raises:
        ValueError: not a slurm-ext-hook request, too large, or cut short
            (no end marker: the client gave up or died while sending).
        OSError: the client did not finish in time (socket.timeout) or the read failed.
    """
    deadline = time.monotonic() + _READ_TIMEOUT
    chunks, size = [], 0
    while True:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = connection.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_REQUEST:
            raise ValueError(f"request larger than {_MAX_REQUEST} bytes")
    data = b"".join(chunks)
    header, _, rest = data.partition(b"\n")
    phase, _, environ = rest.partition(b"\n")
    if header != _PROTOCOL or phase not in (b"prolog", b"epilog"):
        raise ValueError(f"not a slurm-ext-hook request (header {header[:40]!r}; expected {_PROTOCOL!r}: "
                         "rebuild the client with `slurm-ext hooks build`)")
    if not (environ == b"\0" or environ.endswith(b"\0\0")):
        raise ValueError(f"{phase.decode()} request cut short (no end marker): its client gave up or died "
                         "while sending it")
    env = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return phase.decode(), env


def build_hook(output: Path, socket_file: str, prolog_fallback: str, epilog_fallback: str, *,
               deadline: int = HOOK_DEADLINE_S) -> Path:
    """Compile hook.c into `output` (atomically; skipped when nothing changed).

    `deadline`: seconds the client waits for the service's verdict before its
    fail-safe outcome (hook.c): the Prolog exits 1, the Epilog runs its
    fallback. Keep it above the longest healthy Prolog and under Slurm's
    PrologEpilogTimeout where that is set.

    Raises:
        HookBuildError: no C compiler, or it failed (its message is kept);
            a deadline that is not a whole number of seconds from 1 to 86400.
    """
    output = Path(output)
    if isinstance(deadline, bool) or not isinstance(deadline, int) or not 1 <= deadline <= 86400:
        raise HookBuildError(f"hook deadline {deadline!r}: expected whole seconds from 1 to 86400")
    for what, value in (("socket", socket_file), ("Prolog fallback", prolog_fallback),
                        ("Epilog fallback", epilog_fallback)):
        if '"' in value or "\\" in value or "\n" in value:
            raise HookBuildError(f"{what} path {value!r}: quotes, backslashes and newlines are not allowed")
    if len(os.fsencode(socket_file)) > 107:
        raise HookBuildError(f"socket path {socket_file} is longer than a Unix socket address allows (107 bytes): "
                             "choose a shorter node.runtime_dir")
    defines = [f'-DHOOK_SOCKET="{socket_file}"', f'-DPROLOG_FALLBACK="{prolog_fallback}"',
               f'-DEPILOG_FALLBACK="{epilog_fallback}"', f"-DHOOK_DEADLINE={deadline}"]
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", *defines]
    stamp = hashlib.sha256(HOOK_SOURCE.read_bytes() + "\0".join(flags).encode()).hexdigest()
    stamp_file = output.with_name(f".{output.name}.sha256")
    try:
        if output.is_file() and stamp_file.read_text().strip() == stamp:
            return output
    except OSError:
        pass
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        command.run(["cc", *flags, "-o", str(tmp), str(HOOK_SOURCE)], _CC_TIMEOUT)
    except CommandError as err:
        raise HookBuildError(f"cannot compile {HOOK_SOURCE} into {output}: {err} (is a C compiler installed? "
                             "apt-get install gcc)") from err
    # not atomic_write: cc writes the file, so it gets the temporary name; the rename is the same
    tmp.chmod(0o755)
    os.replace(tmp, output)
    atomic_write(stamp_file, stamp + "\n")
    return output


_LAUNCHER = """\
#!{python} -IS
# written by slurm-ext: the Python {phase} that slurm-ext-hook runs when no hook service answers.
# -I -S: no site processing (.pth files, editable finders) and no PYTHON* variables; the
# paths it needs were found when this file was written.
import sys
sys.path[:0] = {paths!r}
import slurm_ext
slurm_ext.__path__[:0] = {components!r}
from slurm_ext.prolog_epilog.hooks import {phase}_main
# the parsed config, kept here for the next run: parsing it costs this hook a sixth of its time
{phase}_main({cache!r})
"""


def write_launchers(directory: Path) -> tuple[Path, Path]:
    """Write `slurm-ext-prolog.py` and `slurm-ext-epilog.py` into `directory`: the fallback hooks.

    Why not the console scripts: a plain Python start processes site-packages'
    .pth files, which on a node can cost more than the whole hook; with
    `python -I -S` and the few paths it needs written in, the fallback starts
    in about half the time. They keep the parsed config in CONFIG_CACHE
    beside them (`config.load`'s parsed_cache), which saves tomllib: trust
    the directory as the hooks themselves, writable by root only. Re-run
    after moving or reinstalling slurm-ext.
    """
    spec = importlib.util.find_spec("slurm_ext")
    core_parent = str(Path(spec.origin).parent.parent)
    components = []
    for name in ("prolog_epilog", "supervisor"):
        found = importlib.util.find_spec(f"slurm_ext.{name}")
        parent = str(Path(found.origin).parent.parent)
        if parent not in components and parent != str(Path(spec.origin).parent):
            components.append(parent)
    paths = list(dict.fromkeys([core_parent, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    written = []
    for phase in ("prolog", "epilog"):
        path = Path(directory) / f"slurm-ext-{phase}.py"
        text = _LAUNCHER.format(python=sys.executable, phase=phase, paths=paths, components=components,
                                cache=str(Path(directory) / CONFIG_CACHE))
        if not path.is_file() or path.read_text() != text:
            atomic_write(path, text, mode=0o755)
        written.append(path)
    return written[0], written[1]

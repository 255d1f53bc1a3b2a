"""Run lifecycle scripts (node-boot, job-start, job-end) the way run-parts would.

`run_scripts(phase, config, role=..., env=...)` runs every script of
`<scripts dir>/<role>/<phase>.d/` in lexical order, one after another, then,
for job-start and job-end when the operator allows it, the job user's own
hooks, and returns a `ScriptsOutcome`; the Prolog or Epilog exits with its
`exit_code`. `scripts_dir(config)` says where the directories are.

Why it is built this way:

- Every script is validated (`validate.VerdictCache`) before it runs: a
  script that a user could rewrite is a root shell, and one with a syntax
  error fails every job of the cluster. A refused script does not run and
  counts as a failure of the phase.
- Each script runs in its own session with a clean environment, stdin from
  /dev/null and cwd /: what it sees does not depend on what slurmd or the
  agent happened to have, and its whole process group can be killed. A
  script that runs too long, or that exits but leaves a background child
  holding its output, never wedges the hook: its group is killed and the
  runner moves on.
- Every script leaves one event in the node journal (script-ok,
  script-failed, script-timeout, script-refused) with its exit code, run
  time and the last 4 KiB of its output, so an operator learns what failed
  without logging in to the node. Nothing a script does makes the runner
  raise.
- What a failure does is the phase's policy (`prolog_epilog.on_failure`).
  job-start defaults to drain: a job whose node did not finish its start
  scripts is not on the node it expects, and a non-zero Prolog makes Slurm
  put the job back in the queue and drain the node, which is cheap. job-end
  defaults to ignore: the job is already over, the Epilog's own cleanup
  checks the node and drains it with an owned reason on a real fault, and a
  failing report script must not take a healthy node out. node-boot
  failures are reported (`failed`) but never give a non-zero exit: the node
  agent decides what a failed boot step means.
"""

from __future__ import annotations

import os
import pwd
import selectors
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_ext import events, procfs
from slurm_ext.config import Config

from .places import DEFAULT_SCRIPTS_DIR, PHASES, SCRIPT_ROLES, phase_dir, scripts_dir, user_hook_dir
from .validate import VerdictCache, script_names

__all__ = ["ScriptResult", "ScriptsOutcome", "run_scripts", "scripts_dir", "user_hook_dir", "CLEAN_PATH",
           "DEFAULT_SCRIPTS_DIR", "OUTPUT_LIMIT"]

#: PATH of every script and hook; nothing of the caller's PATH is kept
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: bytes of a script's output (stdout and stderr together) kept for the journal: the last ones
OUTPUT_LIMIT = 4096

_COMPONENT = "prolog_epilog"
_USER_HOOK_PHASES = ("job-start", "job-end")
# between SIGTERM and SIGKILL of a process group
_KILL_GRACE = 1.0
# after the script itself exited, how long its output may stay open (a background child holding it)
_EOF_GRACE = 1.0
# how often a silent script is checked for having exited
_POLL = 0.05
_LEFTOVERS_NOTE = b"\n[slurm-ext: killed the processes it left behind holding its output]\n"


@dataclass(frozen=True, slots=True)
class ScriptResult:
    """What became of one script or user hook."""

    path: str
    #: the user it ran as (or would have run as, when refused)
    user: str
    #: its exit status; negative: killed by that signal; None: it did not run, could not start, or timed out
    exit_code: int | None
    #: it ran past its timeout and its process group was killed
    timed_out: bool = False
    #: seconds from start until it was done (or killed)
    seconds: float = 0.0
    #: the last OUTPUT_LIMIT bytes of its stdout and stderr (one stream), decoded as UTF-8
    output: str = ""
    #: why it was not run (validation problems); empty when it ran
    refused: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.refused

    @property
    def event(self) -> str:
        """The journal event name of this result."""
        if self.refused:
            return "script-refused"
        if self.timed_out:
            return "script-timeout"
        return "script-ok" if self.ok else "script-failed"


@dataclass(frozen=True, slots=True)
class ScriptsOutcome:
    """Every script of one phase, and what the hook should tell slurmd."""

    phase: str
    #: drain or ignore: what a failure of this phase does (node-boot: always ignore)
    policy: str
    #: admin scripts in run order, then user hooks
    results: tuple[ScriptResult, ...] = ()

    @property
    def failed(self) -> bool:
        """A script was refused, exited non-zero, timed out or could not start."""
        return any(not result.ok for result in self.results)

    @property
    def exit_code(self) -> int:
        """The hook's exit status for slurmd: non-zero only for a failure under policy drain."""
        return 1 if self.failed and self.policy == "drain" else 0


@dataclass(frozen=True, slots=True)
class _Identity:
    """Who a script runs as; uid None means as this process (root, for admin scripts)."""

    name: str
    home: str
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()

    def popen_args(self) -> dict:
        if self.uid is None:
            return {}
        # subprocess does setgroups, setgid, setuid in the child, in that order, without preexec_fn
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def _passwd_home(uid: int) -> str:
    return pwd.getpwuid(uid).pw_dir


def run_scripts(
    phase: str,
    config: Config,
    *,
    role: str = "worker",
    env: dict[str, str] | None = None,
    cache: VerdictCache | None = None,
    home_of: Callable[[int], str] = _passwd_home,
) -> ScriptsOutcome:
    """Run the scripts of `phase` for `role`, then the job user's hooks; never raises for a script.

    `env` is the hook's job environment from slurmd (SLURM_JOB_ID,
    SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER, SLURMD_NODENAME, ...);
    None at node boot. Its SLURM_* and SLURMD_* variables are passed on;
    nothing else of it or of this process's environment is. `cache` keeps
    validation verdicts between calls (a long-running agent passes one; its
    owner must be root). `home_of` maps the job's uid to its home directory
    (passwd by default).

    Each script may run for `prolog_epilog.script_timeouts[<file name>]`,
    else `prolog_epilog.script_timeout`; user hooks always get the latter,
    so a user cannot pick a longer limit by naming a hook like an admin
    script. User hooks run only for job-start and job-end, only when
    `prolog_epilog.allow_user_hooks` is true, as the job's user with its
    groups; they fail the phase like an admin script does.

    Raises:
        ValueError: `phase` or `role` is not one slurm-ext knows (a caller's bug).
    """
    if phase not in PHASES:
        raise ValueError(f"lifecycle phase {phase!r} (expected one of {', '.join(PHASES)})")
    if role not in SCRIPT_ROLES:
        raise ValueError(f"lifecycle script role {role!r} (expected one of {', '.join(SCRIPT_ROLES)})")
    job_env = dict(env or {})
    cache = cache if cache is not None else VerdictCache(owner=0)
    settings = config.prolog_epilog
    admin = _admin_identity()
    results = []
    directory = phase_dir(config, role, phase)
    paths, error = _listing(directory)
    if error:
        results.append(_refuse(config, phase, job_env, str(directory), admin.name, error))
    for path in paths:
        problems = _validate(cache, path)
        if problems:
            results.append(_refuse(config, phase, job_env, str(path), admin.name, problems))
            continue
        timeout = settings.script_timeouts.get(path.name, settings.script_timeout)
        results.append(_run_one(config, phase, role, job_env, path, admin, timeout))
    if phase in _USER_HOOK_PHASES and settings.allow_user_hooks:
        results += _user_hooks(config, phase, role, job_env, home_of)
    policy = "ignore" if phase == "node-boot" else settings.failure_policy(phase)
    return ScriptsOutcome(phase, policy, tuple(results))


def _admin_identity() -> _Identity:
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        return _Identity(entry.pw_name, entry.pw_dir)
    except KeyError:
        return _Identity(str(uid), "/")


def _listing(directory: Path) -> tuple[list[Path], str]:
    """The scripts of `directory` in run order; a missing directory has none."""
    try:
        return script_names(directory), ""
    except OSError as err:
        return [], f"cannot list the directory: {err.strerror}"


def _validate(cache: VerdictCache, path: Path) -> str:
    """The error-severity problems of `path`, joined; warnings (shellcheck's) never refuse."""
    try:
        problems = cache.problems(path)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{path}: error: cannot check it: {err}"
    return "; ".join(str(problem) for problem in problems if problem.severity == "error")


def _user_hooks(config: Config, phase: str, role: str, env: dict[str, str],
                home_of: Callable[[int], str]) -> list[ScriptResult]:
    """The job user's hooks of `phase`, each run as that user.

    A hook must be a regular file owned by the user, checked with lstat
    before anything reads it: a symbolic link could point at a file only
    root may read, and its content would end up in validation messages.
    (A user who swaps the file for a link in the moment between that check
    and validation can still get a few tokens of such a file quoted in the
    root-only journal; running it is always done as the user.)
    Where the user or the home cannot be found or read, the hooks are
    skipped with a warning event: that is the user's setup, not a fault of
    the node.
    """
    def skipped(reason: str) -> list[ScriptResult]:
        events.emit(config.node.state_dir, _COMPONENT, "user-hooks-skipped",
                    f"{phase} user hooks of job {env.get('SLURM_JOB_ID', '?')} not run: {reason}", "warning",
                    **_job_field(env), phase=phase, user=env.get("SLURM_JOB_USER", ""), reason=reason)
        return []

    try:
        uid, gid = int(env["SLURM_JOB_UID"]), int(env["SLURM_JOB_GID"])
    except (KeyError, ValueError):
        return skipped("the job environment has no numeric SLURM_JOB_UID and SLURM_JOB_GID")
    name = env.get("SLURM_JOB_USER") or _user_name(uid)
    try:
        home = str(home_of(uid))
        groups = tuple(os.getgrouplist(name, gid))
    except KeyError:
        return skipped(f"uid {uid} has no passwd entry")
    except OSError as err:
        return skipped(f"cannot look up uid {uid}: {err.strerror or err}")
    user = _Identity(name, home, uid, gid, groups)
    paths, error = _listing(user_hook_dir(home, phase))
    if error:
        return skipped(f"{user_hook_dir(home, phase)}: {error}")
    cache = VerdictCache(owner=uid)
    results = []
    for path in paths:
        problems = _hook_file_problem(path, uid) or _validate(cache, path)
        if problems:
            results.append(_refuse(config, phase, env, str(path), name, problems))
            continue
        results.append(_run_one(config, phase, role, env, path, user, config.prolog_epilog.script_timeout))
    return results


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _hook_file_problem(path: Path, uid: int) -> str:
    """Why a user hook must not even be read, from lstat alone; empty when it may be validated."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"{path}: error: cannot read: {err.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return (f"{path}: error: a symbolic link: user hooks must be regular files (a link could point at a "
                "file the user may not read)")
    if not stat.S_ISREG(info.st_mode):
        return f"{path}: error: not a regular file"
    if info.st_uid != uid:
        return f"{path}: error: owned by uid {info.st_uid} (expected the job's user, uid {uid})"
    return ""


def _refuse(config: Config, phase: str, env: dict[str, str], path: str, user: str, problems: str) -> ScriptResult:
    result = ScriptResult(path, user, None, refused=problems)
    events.emit(config.node.state_dir, _COMPONENT, result.event, f"{phase} script {path} not run: {problems}",
                "error", **_job_field(env), phase=phase, script=path, user=user, exit_code=None, seconds=0.0,
                output="")
    return result


def _run_one(config: Config, phase: str, role: str, env: dict[str, str], path: Path, who: _Identity,
             timeout: float) -> ScriptResult:
    exit_code, timed_out, seconds, output = _execute(path, timeout, _environment(phase, role, env, who), who)
    result = ScriptResult(str(path), who.name, exit_code, timed_out, round(seconds, 3), output)
    events.emit(config.node.state_dir, _COMPONENT, result.event, _message(phase, result, timeout),
                "info" if result.ok else "error", **_job_field(env), phase=phase, script=result.path,
                user=who.name, exit_code=exit_code, seconds=result.seconds, output=output)
    return result


def _message(phase: str, result: ScriptResult, timeout: float) -> str:
    head = f"{phase} script {result.path} (as {result.user})"
    if result.timed_out:
        return (f"{head}: still running after {timeout:g}s (expected at most prolog_epilog.script_timeout, or "
                "its entry in prolog_epilog.script_timeouts); its process group was killed")
    if result.exit_code == 0:
        return f"{head}: exit 0 in {result.seconds:.1f}s"
    lines = result.output.strip().splitlines()
    last = f": {lines[-1]}" if lines else ""
    if result.exit_code is None:
        return f"{head}: did not start{last}"
    if result.exit_code < 0:
        return f"{head}: killed by {_signal_name(-result.exit_code)} after {result.seconds:.1f}s{last}"
    return f"{head}: exit {result.exit_code} after {result.seconds:.1f}s (expected 0){last}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _job_field(env: dict[str, str]) -> dict[str, str]:
    return {"job": env["SLURM_JOB_ID"]} if env.get("SLURM_JOB_ID") else {}


def _environment(phase: str, role: str, env: dict[str, str], who: _Identity) -> dict[str, str]:
    """A clean environment: a script must not depend on what its caller happened to export."""
    clean = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": who.home, "USER": who.name, "LOGNAME": who.name}
    clean.update({key: value for key, value in env.items() if key.startswith(("SLURM_", "SLURMD_"))})
    clean.update(SLURM_EXT_PHASE=phase, SLURM_EXT_ROLE=role)
    return clean


def _execute(path: Path, timeout: float, env: dict[str, str], who: _Identity) -> tuple[int | None, bool, float, str]:
    """Run one script: (exit code, timed out, seconds, output tail)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen([str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd="/", env=env, start_new_session=True,
                                **who.popen_args())
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return None, False, time.monotonic() - start, f"cannot execute {path}: {reason}\n"
    try:
        output, timed_out = _collect(proc, start + timeout)
    finally:
        proc.stdout.close()  # not `with proc`: its exit waits without a limit
    return (None if timed_out else proc.returncode), timed_out, time.monotonic() - start, output


def _collect(proc: subprocess.Popen, deadline: float) -> tuple[str, bool]:
    """Read `proc`'s output until EOF, its deadline, or a short while after it exited.

    Reading with a deadline, not until EOF: a background child (`sleep 1000
    &`) keeps the pipe open long after the script is gone. Returns the output
    tail and whether the script timed out; on return the script has been
    waited for and, unless its output ended by itself, its group killed.
    """
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    tail = bytearray()
    exited_at = None
    eof = timed_out = False
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not eof:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            end = deadline if exited_at is None else exited_at + _EOF_GRACE
            if now >= end:
                timed_out = exited_at is None
                break
            if selector.select(min(end - now, _POLL)):
                eof = _read_into(fd, tail)
    if eof and proc.poll() is None:  # it closed its output but runs on
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out or not eof:
        _stop_group(proc)
        _read_into(fd, tail)  # what was written before the kill
        if not timed_out:
            tail += _LEFTOVERS_NOTE
    del tail[:-OUTPUT_LIMIT]
    return tail.decode("utf-8", "replace"), timed_out


def _read_into(fd: int, tail: bytearray) -> bool:
    """Append what the pipe holds now to `tail` (keeping the last OUTPUT_LIMIT bytes); True at EOF."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not chunk:
            return True
        tail += chunk
        del tail[:-OUTPUT_LIMIT]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the script's process group, SIGKILL it after a grace, wait until it is gone.

    Started with start_new_session, the script leads its own group and
    session (both ids are its pid). Zombies count as gone: the orphans'
    new parent reaps them, not us.
    """
    group = proc.pid
    _signal_group(group, signal.SIGTERM)
    end = time.monotonic() + _KILL_GRACE
    while time.monotonic() < end and _session_running(proc, group):
        time.sleep(0.02)
    _signal_group(group, signal.SIGKILL)
    end = time.monotonic() + _KILL_GRACE  # SIGKILL takes a moment too: return once they are gone
    while time.monotonic() < end and _session_running(proc, group):
        time.sleep(0.01)
    try:
        proc.wait(timeout=max(0.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:  # stuck in the kernel (state D): not worth wedging the hook
        pass


def _session_running(proc: subprocess.Popen, session: int) -> bool:
    proc.poll()
    return any(s.session == session and s.state not in ("Z", "X") for s in procfs.all_stats())


def _signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except (ProcessLookupError, PermissionError):
        pass

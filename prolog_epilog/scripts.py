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
  counts as a failure of the phase. What runs is the very file that was
  checked: its open descriptor (`/proc/self/fd/N`), not its path again, so
  `$0` of a script is that descriptor and its path is in SLURM_EXT_SCRIPT.
- Each script runs in its own session with a clean environment, stdin from
  /dev/null and cwd /: what it sees does not depend on what slurmd or the
  agent happened to have, and its whole process group can be killed. A
  script that runs too long, or that exits but leaves a background child
  holding its output, never wedges the hook: its group is killed and the
  runner moves on.
- A user hook is the user's code started by root, so it gets no more than
  the user's job would: it runs as the user in a cgroup of its own
  (`<cgroup root>/<hierarchy>/slurm-ext/hook_<job>_...`) that it joins
  before it can run anything, with the job's GPUs only (cgroup v1 devices),
  pids.max, and rlimits (no core files, HOOK_NOFILE, HOOK_FSIZE); when it
  ends everything left in that cgroup is killed (`setsid`, `nohup` and
  daemons included) and the cgroup removed. At most MAX_USER_HOOKS run per
  phase, all of them together within `prolog_epilog.script_timeout`.
- Every script leaves one event in the node journal (script-ok,
  script-failed, script-timeout, script-refused) with its exit code, run
  time and the last 4 KiB of its output, so an operator learns what failed
  without logging in to the node. Nothing a script does makes the runner
  raise, and each script's failure is its own: whatever goes wrong while a
  user hook is checked or run becomes that hook's result, and never changes
  what the admin scripts' results say.
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

import errno
import itertools
import os
import pwd
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_ext import cgroupfs, events, procfs
from slurm_ext.config import Config

from .places import CLEAN_PATH, DEFAULT_SCRIPTS_DIR, PHASES, SCRIPT_ROLES, phase_dir, scripts_dir, user_hook_dir
from .validate import ScriptFile, VerdictCache, script_names

__all__ = ["ScriptResult", "ScriptsOutcome", "run_scripts", "scripts_dir", "user_hook_dir", "CLEAN_PATH",
           "DEFAULT_SCRIPTS_DIR", "OUTPUT_LIMIT", "MAX_USER_HOOKS", "MAX_HOOK_ENTRIES", "HOOK_NOFILE", "HOOK_FSIZE",
           "HOOK_PIDS_MAX", "CGROUP_ROOT"]

#: bytes of a script's output (stdout and stderr together) kept for the journal: the last ones
OUTPUT_LIMIT = 4096
#: user hooks run per phase, in run order; the ones after them are refused together
MAX_USER_HOOKS = 16
#: entries of a user's hook directory that are read: with more, none of its hooks runs (root sorts every name)
MAX_HOOK_ENTRIES = 256
#: RLIMIT_NOFILE of a user hook (the hook service raises its own limit for its pidfds)
HOOK_NOFILE = 1024
#: RLIMIT_FSIZE of a user hook, in bytes: no file it writes grows past this
HOOK_FSIZE = 16 << 30
#: pids.max of a user hook's cgroup. Not RLIMIT_NPROC: that counts every process of the uid on the node,
#: its running jobs included, so a user with a busy job could not even start a hook.
HOOK_PIDS_MAX = 512
#: where the cgroup hierarchies are mounted
CGROUP_ROOT = Path("/sys/fs/cgroup")

_COMPONENT = "prolog_epilog"
_USER_HOOK_PHASES = ("job-start", "job-end")
# between SIGTERM and SIGKILL of a process group
_KILL_GRACE = 1.0
# after the script itself exited, how long its output may stay open (a background child holding it)
_EOF_GRACE = 1.0
# how often a silent script is checked for having exited
_POLL = 0.05
_LEFTOVERS_NOTE = b"\n[slurm-ext: killed the processes it left behind holding its output]\n"
_CGROUP_NOTE = "\n[slurm-ext: killed the processes it left running in its cgroup]\n"
# the hook cgroups' parent directory in each hierarchy (left in place: other hooks may be using it)
_CGROUP_PARENT = "slurm-ext"
# v1 hierarchies a hook gets a directory in; the freezer is required (it stops the hook's processes together)
_V1_CONTROLLERS = ("freezer", "devices", "pids")
# nvidia GPUs are character devices 195:<minor>; 254 (nvidia-modeset) and 255 (nvidiactl) are not GPUs
_GPU_MAJOR = 195
_GPU_MINORS = range(254)
_SEQUENCE = itertools.count(1)

# Started as root, in the hook's own session: joins the hook's cgroups, sets its limits, drops to the user
# (groups, gid, uid: nothing of root is left) and execs the checked descriptor. Not subprocess's `user=`:
# that drops privileges before anything could join a cgroup, and a process of the user's that ran outside
# the cgroup even for a moment could have forked out of it (or been ptraced into doing so).
_LAUNCHER = """\
import os, resource, sys
fd, uid, gid, nofile, fsize = (int(arg) for arg in sys.argv[1:6])
groups, name, procs = sys.argv[6], sys.argv[7], sys.argv[8:]
def fail(what, err):
    sys.stderr.write("slurm-ext: user hook %s not started: %s: %s\\n" % (name, what, err))
    sys.exit(126)
for path in procs:
    try:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    except OSError as err:
        fail("cannot join its cgroup " + path, err)
try:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    os.setgroups([int(g) for g in groups.split(",") if g])
    os.setgid(gid)
    os.setuid(uid)
except (OSError, ValueError) as err:
    fail("cannot become uid %d" % uid, err)
try:
    os.execv("/proc/self/fd/%d" % fd, [name])
except OSError as err:
    fail("cannot execute it", err)
"""


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
    cgroup_root: Path = CGROUP_ROOT,
) -> ScriptsOutcome:
    """Run the scripts of `phase` for `role`, then the job user's hooks; never raises for a script.

    `env` is the hook's job environment from slurmd (SLURM_JOB_ID,
    SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER, SLURMD_NODENAME, ...);
    None at node boot. Its SLURM_* and SLURMD_* variables are passed on;
    nothing else of it or of this process's environment is. `cache` keeps
    validation verdicts between calls (a long-running agent passes one; its
    owner must be root). `home_of` maps the job's uid to its home directory
    (passwd by default). `cgroup_root` is where the cgroup hierarchies of
    the user hooks' cgroups are.

    Each script may run for `prolog_epilog.script_timeouts[<file name>]`,
    else `prolog_epilog.script_timeout`; a user cannot pick a longer limit
    by naming a hook like an admin script: the user hooks of a phase run
    within one `script_timeout` all together, and at most MAX_USER_HOOKS of
    them. User hooks run only for job-start and job-end, only when
    `prolog_epilog.allow_user_hooks` is true, as the job's user with its
    groups, each in a cgroup of its own; they fail the phase like an admin
    script does.

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
        timeout = settings.script_timeouts.get(path.name, settings.script_timeout)
        results.append(_guarded(config, phase, job_env, str(path), admin.name, _admin_script,
                                config, phase, role, job_env, path, admin, cache, timeout))
    if phase in _USER_HOOK_PHASES and settings.allow_user_hooks:
        hooks_dir = f"user hooks of {job_env.get('SLURM_JOB_USER') or job_env.get('SLURM_JOB_UID', '?')}"
        results += _guarded(config, phase, job_env, hooks_dir, job_env.get("SLURM_JOB_USER", ""), _user_hooks,
                            config, phase, role, job_env, home_of, cgroup_root, many=True)
    policy = "ignore" if phase == "node-boot" else settings.failure_policy(phase)
    return ScriptsOutcome(phase, policy, tuple(results))


def _guarded(config: Config, phase: str, env: dict[str, str], path: str, user: str, work: Callable, *args,
             many: bool = False):
    """`work(*args)`, or, should it raise, a refused result for `path` ([that result] when `many`).

    Why catch everything: a hostile hook (or a bug the next hook finds) must
    cost that hook alone. Letting it escape would throw away the results of
    the admin scripts that already ran, and the hook then exits 0 after a
    failed job-start script.
    """
    try:
        return work(*args)
    except Exception as err:
        result = _refuse(config, phase, env, path, user, f"{path}: error: cannot check or run it: {err!r}")
        return [result] if many else result


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


def _checked(cache: VerdictCache, path: Path) -> tuple[ScriptFile | None, str]:
    """The checked, open script (None when it must not run) and its errors joined (warnings never refuse)."""
    try:
        script, problems = cache.open(path)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{path}: error: cannot check it: {err}"
    errors = "; ".join(str(problem) for problem in problems if problem.severity == "error")
    if errors and script is not None:
        script.close()
        return None, errors
    return script, errors


def _admin_script(config: Config, phase: str, role: str, env: dict[str, str], path: Path, who: _Identity,
                  cache: VerdictCache, timeout: float) -> ScriptResult:
    script, problems = _checked(cache, path)
    if script is None:
        return _refuse(config, phase, env, str(path), who.name, problems)
    with script:
        return _run_one(config, phase, role, env, script, who, timeout)


def _user_hooks(config: Config, phase: str, role: str, env: dict[str, str], home_of: Callable[[int], str],
                cgroup_root: Path) -> list[ScriptResult]:
    """The job user's hooks of `phase`, each run as that user in a cgroup of its own.

    The hook directory is reached without following a link the user
    controls and is listed through its descriptor; each hook is opened with
    O_NOFOLLOW and judged on that descriptor before anything reads it (a
    link could point at a file only root may read, and its content would
    end up in validation messages), and that descriptor is what runs.
    Where the user, the home or the hook directory cannot be found or read,
    the hooks are skipped with a warning event: that is the user's setup,
    not a fault of the node.
    """
    def skipped(reason: str) -> list[ScriptResult]:
        events.emit(config.node.state_dir, _COMPONENT, "user-hooks-skipped",
                    f"{phase} user hooks of job {env.get('SLURM_JOB_ID', '?')} not run: {reason}",
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
    directory = user_hook_dir(home, phase)
    try:
        paths = script_names(directory, owner=uid, limit=MAX_HOOK_ENTRIES)
    except OSError as err:
        return skipped(f"{directory}: cannot list the directory: {err.strerror or err}")
    cache = VerdictCache(owner=uid)
    budget = config.prolog_epilog.script_timeout
    end = time.monotonic() + budget
    results = []
    for path in paths[:MAX_USER_HOOKS]:
        left = end - time.monotonic()
        if left <= 0:
            results.append(_refuse(config, phase, env, str(path), name, f"{path}: error: not run: the {phase} user "
                                   f"hooks had {budget:g}s (prolog_epilog.script_timeout) all together and used it up"))
            continue
        results.append(_guarded(config, phase, env, str(path), name, _user_hook,
                                config, phase, role, env, path, user, cache, left, cgroup_root))
    if len(paths) > MAX_USER_HOOKS:
        rest = paths[MAX_USER_HOOKS:]
        shown = ", ".join(p.name for p in rest[:5]) + (", ..." if len(rest) > 5 else "")
        results.append(_refuse(config, phase, env, str(directory), name, f"{directory}: error: {len(paths)} user hooks "
                               f"(expected at most {MAX_USER_HOOKS} per phase): {len(rest)} not run ({shown})"))
    return results


def _user_hook(config: Config, phase: str, role: str, env: dict[str, str], path: Path, who: _Identity,
               cache: VerdictCache, timeout: float, cgroup_root: Path) -> ScriptResult:
    script, problems = _checked(cache, path)
    if script is None:
        return _refuse(config, phase, env, str(path), who.name, problems)
    with script:
        try:
            cgroup = _HookCgroup.make(cgroup_root, env.get("SLURM_JOB_ID", ""), _gpu_minors(env))
        except OSError as err:
            return _refuse(config, phase, env, str(path), who.name,
                           f"{path}: error: not run: cannot make its cgroup under {cgroup_root}: "
                           f"{err.strerror or err} (a user hook runs only in a cgroup of its own, killed when it ends)")
        try:
            return _run_one(config, phase, role, env, script, who, timeout, cgroup)
        finally:
            left = cgroup.close()
            if left:
                events.emit(config.node.state_dir, _COMPONENT, "hook-cgroup-left",
                            f"{phase} user hook {path}: cgroup {', '.join(left)} still holds processes after "
                            f"SIGKILL (state D?); left in place", **_job_field(env), phase=phase,
                            script=str(path), cgroups=left)


def _gpu_minors(env: dict[str, str]) -> tuple[int, ...] | None:
    """The device minors of the job's GPUs (SLURM_JOB_GPUS, asked of NVML); None when the job has none.

    An empty tuple, which denies every GPU, when the indexes are unreadable
    or NVML cannot say: a hook is never let at a GPU on a guess.
    """
    text = env.get("SLURM_JOB_GPUS", "")
    if not text.strip():
        return None
    try:
        indexes = [int(gpu) for gpu in text.split(",") if gpu.strip()]
    except ValueError:
        return ()
    from . import gpus  # only for a job with GPUs and user hooks
    try:
        return tuple(gpus.minor_numbers(indexes).values())
    except gpus.GpuCheckError:
        return ()


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _refuse(config: Config, phase: str, env: dict[str, str], path: str, user: str, problems: str) -> ScriptResult:
    result = ScriptResult(path, user, None, refused=problems)
    events.emit(config.node.state_dir, _COMPONENT, result.event, f"{phase} script {path} not run: {problems}",
                **_job_field(env), phase=phase, script=path, user=user, exit_code=None, seconds=0.0, output="")
    return result


def _run_one(config: Config, phase: str, role: str, env: dict[str, str], script: ScriptFile, who: _Identity,
             timeout: float, cgroup: _HookCgroup | None = None) -> ScriptResult:
    exit_code, timed_out, seconds, output = _execute(script, timeout, _environment(phase, role, env, who, script.path),
                                                     who, cgroup)
    result = ScriptResult(script.path, who.name, exit_code, timed_out, round(seconds, 3), output)
    # severity: the catalogue's for result.event (script-ok info, the others error)
    events.emit(config.node.state_dir, _COMPONENT, result.event, _message(phase, result, timeout),
                **_job_field(env), phase=phase, script=result.path, user=who.name, exit_code=exit_code,
                seconds=result.seconds, output=output)
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


def _environment(phase: str, role: str, env: dict[str, str], who: _Identity, path: str) -> dict[str, str]:
    """A clean environment: a script must not depend on what its caller happened to export.

    SLURM_EXT_JOB_ID repeats SLURM_JOB_ID under a name the Epilog's cleanup
    does not read: a daemon an admin script starts should drop SLURM_JOB_ID
    (`env -u SLURM_JOB_ID`), or that job's Epilog takes it for the job's own.
    SLURM_EXT_SCRIPT is the script's path ($0 is the descriptor it runs from).
    """
    clean = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": who.home, "USER": who.name, "LOGNAME": who.name}
    clean.update({key: value for key, value in env.items() if key.startswith(("SLURM_", "SLURMD_"))})
    clean.update(SLURM_EXT_PHASE=phase, SLURM_EXT_ROLE=role, SLURM_EXT_SCRIPT=path)
    if env.get("SLURM_JOB_ID"):
        clean["SLURM_EXT_JOB_ID"] = env["SLURM_JOB_ID"]
    return clean


def _execute(script: ScriptFile, timeout: float, env: dict[str, str], who: _Identity,
             cgroup: _HookCgroup | None) -> tuple[int | None, bool, float, str]:
    """Run one checked script from its descriptor: (exit code, timed out, seconds, output tail).

    With `cgroup` (a user hook), through the launcher that joins it and
    drops to the user; everything left in it is killed once the hook is done.
    """
    start = time.monotonic()
    if cgroup is None:
        argv, executable = [script.path], script.exec_path
    else:
        argv, executable = _launcher(script, who, cgroup), None
    try:
        proc = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd="/", env=env, start_new_session=True,
                                pass_fds=(script.fd,))
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return None, False, time.monotonic() - start, f"cannot execute {script.path}: {reason}\n"
    try:
        output, timed_out = _collect(proc, start + timeout)
        if cgroup is not None and cgroup.kill():
            output = _noted(output, _CGROUP_NOTE)
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        proc.stdout.close()  # not `with proc`: its exit waits without a limit
    return (None if timed_out else proc.returncode), timed_out, time.monotonic() - start, output


def _launcher(script: ScriptFile, who: _Identity, cgroup: _HookCgroup) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(script.fd), str(who.uid), str(who.gid), str(HOOK_NOFILE),
            str(HOOK_FSIZE), ",".join(map(str, who.groups)), script.path, *cgroup.procs_files()]


def _noted(output: str, note: str) -> str:
    """`output` with `note` at its end, still within OUTPUT_LIMIT bytes."""
    if _LEFTOVERS_NOTE.decode() in output:
        return output
    tail = (output + note).encode()[-OUTPUT_LIMIT:]
    return tail.decode("utf-8", "replace")


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


# -- the cgroup of a user hook ------------------------------------------------------------------


class _HookCgroup:
    """The cgroup of one user hook: made before it starts, emptied and removed when it ends.

    cgroup v1: a directory in the freezer hierarchy (required: it is how the
    hook's processes are stopped together, so none forks away while they are
    killed) and in devices and pids where they are mounted. cgroup v2 (where
    `<root>/cgroup.controllers` exists): one directory, emptied with
    cgroup.kill (or frozen and killed on kernels before 5.14).

    Devices (v1): the hook may open the job's GPUs only, as under Slurm's
    ConstrainDevices: every nvidia GPU device 195:<minor> (minors 0-253)
    that is not one of the job's GPUs (SLURM_JOB_GPUS, their minors asked of
    NVML; every GPU when NVML cannot say) is denied. nvidiactl (255),
    nvidia-modeset (254), nvidia-uvm and nvidia-caps stay open, as Slurm
    leaves them. v2 has no devices files (its device control is eBPF): there
    the hooks of a job with GPUs do not run at all.
    """

    def __init__(self, directories: list[Path]):
        #: the hook's directory in each hierarchy; the first one freezes or kills
        self.directories = directories

    @classmethod
    def make(cls, root: Path, job: str, minors: tuple[int, ...] | None) -> _HookCgroup:
        """Make the directories and set their limits; `minors`: the job's GPU devices (None: no GPUs).

        Raises:
            OSError: no cgroup v1 freezer or v2 hierarchy under `root`, a directory or limit cannot be
                made, or the job has GPUs and the hierarchy is v2 (which cannot hold the hook to them).
        """
        name = f"hook_{job if job.isdigit() else 'nojob'}_{os.getpid()}_{next(_SEQUENCE)}"
        unified = (root / "cgroup.controllers").is_file()
        if unified and minors is not None:
            raise OSError(errno.EOPNOTSUPP, f"cgroup v2 at {root} cannot hold a hook to its job's GPUs (device "
                          "control there needs eBPF): the user hooks of jobs with GPUs run only on cgroup v1")
        if unified:
            parents = [root / _CGROUP_PARENT]
        else:
            parents = [root / c / _CGROUP_PARENT for c in _V1_CONTROLLERS if (root / c / "cgroup.procs").is_file()]
            if not parents or parents[0].parent.name != "freezer":
                raise OSError(errno.ENOENT, f"no cgroup v1 freezer hierarchy at {root / 'freezer'} and no cgroup v2 "
                              f"at {root}")
        made = cls([])
        try:
            for parent in parents:
                made.directories.append(_make_child(parent, name, unified))
            made._limit(minors)
        except BaseException:
            made.close()
            raise
        return made

    def _limit(self, minors: tuple[int, ...] | None) -> None:
        for directory in self.directories:
            if (directory / "devices.deny").exists():
                cgroupfs.write_each(directory / "devices.deny",
                            [f"c {_GPU_MAJOR}:{minor} rwm" for minor in _GPU_MINORS if minor not in (minors or ())])
            if (directory / "pids.max").exists():
                cgroupfs.write_each(directory / "pids.max", [str(HOOK_PIDS_MAX)])

    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories]

    def kill(self) -> int:
        """SIGKILL everything in the cgroup and wait (a short while) until it is empty; returns how many there were."""
        members = self._members()
        count = len(members)
        deadline = time.monotonic() + 2 * _KILL_GRACE
        while members and time.monotonic() < deadline:
            top = self.directories[0]
            if (top / "cgroup.kill").exists():
                cgroupfs.write(top / "cgroup.kill", "1")  # the kernel's own: nothing forks past it
            else:
                frozen = cgroupfs.freeze(top, True)  # while frozen nothing forks or exits: the pids read are the members
                for pid in self._members():
                    _kill(pid)
                if frozen:
                    cgroupfs.freeze(top, False)
            time.sleep(0.01)
            members = self._members()
        return count

    def close(self) -> list[str]:
        """Kill what is left and remove the directories; returns those still there (a process stuck in state D).

        The `slurm-ext` parent goes too once no other hook uses it: nothing
        of the hooks stays on the node.
        """
        if self.directories:
            self.kill()
        left = [str(directory) for directory in self.directories if not cgroupfs.rmdir(directory, wait=_KILL_GRACE)]
        for directory in self.directories:
            try:
                directory.parent.rmdir()
            except OSError:  # another hook's directory is in it (EBUSY), or it is gone already
                pass
        self.directories = []
        return left

    def _members(self) -> set[int]:
        return cgroupfs.members(self.directories[:1])


def _make_child(parent: Path, name: str, unified: bool) -> Path:
    """mkdir `parent/name`, making the parent as needed (another hook's close may remove it meanwhile)."""
    for _ in range(10):
        parent.mkdir(exist_ok=True)
        if unified:  # so that the hook's directory gets pids.max; not there when the root lacks pids
            cgroupfs.write(parent / "cgroup.subtree_control", "+pids")
        try:
            (parent / name).mkdir()
            return parent / name
        except FileNotFoundError:
            continue
    raise OSError(errno.EAGAIN, f"{parent} keeps disappearing", str(parent))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

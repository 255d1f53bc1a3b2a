"""One acceptance run on this node: each test in a child process with a deadline, the run kept and told.

The tests run one after another (two GPU tests at once would measure each other), each in
`python -I -m slurm_ext.acceptance.child`, in a session of its own whose process group is
killed at the test's deadline: a hung driver call, a segfaulting libcuda or a test over its time
is an `error` result naming what happened, and the run goes on with the next test. One run at a
time on a node (a lock under the runtime directory): a second is refused, not queued.

The last run of each trigger is kept as JSON under `<state_dir>/acceptance/` (the agent's
/acceptance, its metrics and `accept show` read it), and every run is told in the node journal:
`acceptance-started`, one `acceptance-test` per result that is not a pass, and
`acceptance-done` with the verdict and its figures.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from slurm_ext.config import Config
from slurm_ext.errors import SlurmExtError
from slurm_ext.fileio import atomic_write
from slurm_ext.procfs import boot_id

from .catalog import TestSpec, specs_for
from .records import ERROR, FAIL, PASS, TRIGGERS, Result, Run

__all__ = ["RunBusy", "run_tests", "planned", "last_run", "runs_path", "TRIGGERS"]

#: a child's answer larger than this is a broken test, not a result
_MAX_ANSWER = 4 << 20
#: after the deadline's SIGKILL, how long to wait for the child to be reaped
_REAP_WAIT = 5.0
_SEVERITY = {PASS: "info", FAIL: "critical", ERROR: "error"}


class RunBusy(SlurmExtError):
    """Another acceptance run holds this node."""


def runs_path(state_dir: str) -> Path:
    """Where the last run of each trigger is kept."""
    return Path(state_dir) / "acceptance"


def planned(config: Config, level: str, areas: tuple[str, ...] = (), only: tuple[str, ...] = ()) -> list[TestSpec]:
    """The tests a run of `level` runs: of the configured areas (narrowed by `areas`), enabled, `only` if given."""
    settings = config.acceptance
    wanted = tuple(a for a in settings.areas if not areas or a in areas)
    return [spec for spec in specs_for(level, wanted)
            if settings.test_enabled(spec.name) and (not only or spec.name in only)]


def run_tests(config: Config, node: str, level: str, *, trigger: str = "manual", areas: tuple[str, ...] = (),
              only: tuple[str, ...] = (), emit: Callable[..., dict] | None = None,
              on_result: Callable[[Result], None] | None = None) -> Run:
    """Run the acceptance tests of `level` here, now; the run, also saved and told in the journal.

    Raises:
        RunBusy: another run holds the node.
        SlurmExtError: the config has no file for the tests' processes to read (a Config built in memory).
    """
    if not config.source or not os.path.isfile(config.source):
        raise SlurmExtError(f"acceptance tests read the config file the run was given; {config.origin} is none")
    from slurm_ext import events
    emit = emit or events.emitter(config.node.state_dir, "acceptance")
    specs = planned(config, level, areas, only)
    with _node_lock(config.node.runtime_dir):
        run = Run(node, level, trigger, time.time(), boot_id=boot_id(config.node.boot_id_file))
        emit("acceptance-started", f"acceptance {level} on {node} ({trigger}): {', '.join(s.name for s in specs)}",
             level=level, trigger=trigger, tests=[s.name for s in specs])
        for spec in specs:
            answer = _in_child(config, spec, level)
            if answer.get("profile"):
                if not run.profile:
                    run.profile = answer["profile"]
                    if answer.get("profile_note"):
                        emit("acceptance-profile", answer["profile_note"], "warning", profile=run.profile)
            if "not_applicable" in answer:
                run.not_applicable[spec.name] = str(answer["not_applicable"])
                continue
            for result in _results(spec, answer):
                run.results.append(result)
                if result.outcome != PASS:
                    emit("acceptance-test", f"{node}: {result.outcome}: {result.told()}", _SEVERITY[result.outcome], test=result.test, target=result.target,
                         outcome=result.outcome, action=result.action, level=level,
                         figures={f.name: f.value for f in result.figures})
                if on_result is not None:
                    on_result(result)
        run.finished = time.time()
        _save(config.node.state_dir, run)
    verdict = run.verdict
    emit("acceptance-done", _summary(run), _SEVERITY[verdict], level=level, trigger=trigger, verdict=verdict,
         profile=run.profile, seconds=round(run.finished - run.started, 1),
         failed=[f"{r.test} {r.target}".strip() for r in run.failures()],
         errors=[f"{r.test} {r.target}".strip() for r in run.errors()], results=[_line(r) for r in run.results])
    return run


def _line(result: Result) -> str:
    """'gpu-bandwidth gpu 0: pass: h2d 55.4 GB/s (>= 48); ...': a result with its figures, as history shows it."""
    figures = "; ".join(f.text() for f in result.figures)
    where, said = result.told().split(": ", 1)
    return f"{where}: {result.outcome}: " + (figures if result.outcome == PASS and figures else said)


def _summary(run: Run) -> str:
    counts = {outcome: sum(r.outcome == outcome for r in run.results) for outcome in (PASS, FAIL, ERROR)}
    text = (f"acceptance {run.level} on {run.node} ({run.trigger}): {run.verdict}: {counts[PASS]} passed, "
            f"{counts[FAIL]} failed, {counts[ERROR]} could not run, in {run.finished - run.started:.1f}s "
            f"(profile {run.profile or 'none'})")
    worst = run.failures() or run.errors()
    if worst:
        text += "; " + "; ".join(r.told() for r in worst[:3])
        if len(worst) > 3:
            text += f"; +{len(worst) - 3} more"
    return text


def _in_child(config: Config, spec: TestSpec, level: str) -> dict:
    """The child's answer for one test, or {"error": why} when it died, hung or answered nonsense."""
    deadline = config.acceptance.deadline(spec.name, level)
    request = json.dumps({"test": spec.name, "level": level, "config": config.source, "deadline": deadline})
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-I", "-m", "slurm_ext.acceptance.child"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, err = child.communicate(request.encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        return {"error": f"over its deadline of {deadline:g}s: its process was killed (a hung GPU or driver call? "
                         f"[acceptance.tests.{spec.name}] deadline sets the time it may take)",
                "seconds": time.monotonic() - started}
    finally:
        _kill_group(child)  # whatever the test left in its session (a server it started) goes with it
    tail = err.decode(errors="replace").strip().splitlines()[-3:]
    if child.returncode != 0:
        how = (f"died of {signal.Signals(-child.returncode).name}" if child.returncode < 0
               else f"exited {child.returncode}")
        return {"error": f"its process {how}" + (f": {' | '.join(tail)}" if tail else ""),
                "seconds": time.monotonic() - started}
    try:
        if len(out) > _MAX_ANSWER:
            raise ValueError(f"{len(out)} bytes")
        answer = json.loads(out)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError as why:
        return {"error": f"its process answered no result ({why})" + (f": {' | '.join(tail)}" if tail else ""),
                "seconds": time.monotonic() - started}
    answer.setdefault("seconds", time.monotonic() - started)
    return answer


def _results(spec: TestSpec, answer: dict) -> list[Result]:
    if "error" in answer:
        return [Result(spec.name, spec.area, "", ERROR, str(answer["error"]), seconds=float(answer["seconds"]))]
    try:
        results = [Result.from_json(item) for item in answer.get("results") or ()]
    except (KeyError, TypeError, ValueError) as why:
        return [Result(spec.name, spec.area, "", ERROR, f"its process answered a malformed result ({why})",
                       seconds=float(answer["seconds"]))]
    if not results:
        return [Result(spec.name, spec.area, "", ERROR, "its process answered no result",
                       seconds=float(answer["seconds"]))]
    return results


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(_REAP_WAIT)
    except subprocess.TimeoutExpired:  # in the kernel (state D): left to the agent's reaper
        pass


class _node_lock:
    """One run at a time on a node: a flock under the runtime directory, its holder's PID inside."""

    def __init__(self, runtime_dir: str):
        self.path = Path(runtime_dir) / "acceptance.lock"

    def __enter__(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:  # not root, or [node] runtime_dir on a full or read-only file system
            raise SlurmExtError(f"cannot take the acceptance lock {self.path}: {err.strerror} (the tests run as "
                                "root, the node agent's user)") from err
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise RunBusy(f"another acceptance run (pid {holder}) holds this node ({self.path}); wait for it") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _save(state_dir: str, run: Run) -> None:
    """The run as the last of its trigger, and as the node's last (`last.json`)."""
    folder = runs_path(state_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(run.to_json(), indent=1)
        atomic_write(folder / f"{run.trigger}.json", text, fsync="file")
        atomic_write(folder / "last.json", text, fsync="file")
    except OSError as err:
        raise SlurmExtError(f"cannot keep the acceptance run under {folder}: {err.strerror}") from err


def last_run(state_dir: str, trigger: str = "") -> Run | None:
    """The node's last run (of `trigger`, when given), or None when there is none.

    Raises:
        SlurmExtError: the file is there and unreadable or corrupt (said, never taken as no run).
    """
    path = runs_path(state_dir) / f"{trigger or 'last'}.json"
    try:
        return Run.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SlurmExtError(f"acceptance run {path}: unreadable ({err})") from err

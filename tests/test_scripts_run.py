"""Lifecycle scripts run like run-parts: validated, in order, bounded in time, in a clean environment,
journaled, and user hooks only as the job's user."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from helpers.files import script, temp_dir
from slurm_ext import procfs
from slurm_ext.config import Config, from_dict
from slurm_ext.prolog_epilog.scripts import CLEAN_PATH, DEFAULT_SCRIPTS_DIR, OUTPUT_LIMIT, run_scripts, scripts_dir
from slurm_ext.prolog_epilog.validate import VerdictCache, validate_script

NOBODY = 65534
NOGROUP = 65534
JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOGROUP),
           "SLURM_JOB_USER": "nobody", "SLURMD_NODENAME": "node7", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


class Tree:
    """A scripts dir, a state dir, a scratch dir, and the process sessions to kill at the end."""

    def __init__(self):
        self.root, self.state, self.scratch = temp_dir(), temp_dir(), temp_dir()
        self.scratch.chmod(0o777)  # user hooks (nobody) write their marks here
        self.dirs = [self.root, self.state, self.scratch]

    def phase(self, phase: str, role: str = "worker") -> Path:
        return self.root / role / f"{phase}.d"

    def config(self, **prolog_epilog) -> Config:
        return from_dict({"node": {"state_dir": str(self.state)},
                          "prolog_epilog": {"scripts_dir": str(self.root), **prolog_epilog}})

    def journal(self) -> list[dict]:
        path = self.state / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def sessions(self) -> list[int]:
        return [int(p.read_text()) for p in self.scratch.glob("*.sid")]

    def cleanup(self) -> None:
        for session in self.sessions():  # a failed test must not leave its sleeps behind
            try:
                os.killpg(session, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def tree():
    made = Tree()
    yield made
    made.cleanup()


@pytest.fixture
def hooks(tree):
    """A home of user nobody holding ~/.config/slurm-ext/job-start/, and home_of pointing at it."""
    home = temp_dir(owner=NOBODY)
    tree.dirs.append(home)
    directory = home / ".config" / "slurm-ext" / "job-start"
    directory.mkdir(parents=True)
    for part in (home / ".config", home / ".config" / "slurm-ext", directory):
        os.chown(part, NOBODY, NOGROUP)
    return directory, lambda uid: str(home)


def live_members(session: int) -> list[int]:
    return [s.pid for s in procfs.all_stats() if s.session == session and s.state not in ("Z", "X")]


def test_scripts_run_in_lexical_order(tree):
    log = tree.scratch / "order"
    for name in ("30-c", "2-b", "10-a"):
        script(tree.phase("job-start"), name, f"#!/bin/sh\necho {name} >> {log}\n")
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV)
    assert log.read_text().split() == ["10-a", "2-b", "30-c"]
    assert [Path(r.path).name for r in outcome.results] == ["10-a", "2-b", "30-c"]
    assert all(r.ok and r.user == "root" for r in outcome.results)
    assert not outcome.failed and outcome.exit_code == 0 and outcome.policy == "drain"


def test_missing_dir_is_nothing_to_run(tree):
    outcome = run_scripts("node-boot", tree.config(), role="login")
    assert outcome.results == () and not outcome.failed and outcome.exit_code == 0


def test_timeouts_and_background_children_never_wedge_the_runner(tree):
    directory = tree.phase("job-start")
    sid = 'echo $$ > {scratch}/{name}.sid\n'
    script(directory, "10-hang", "#!/bin/sh\n" + sid.format(scratch=tree.scratch, name="10-hang") +
           "echo hanging\nsleep 1000\n")
    script(directory, "20-bg-exit", "#!/bin/sh\n" + sid.format(scratch=tree.scratch, name="20-bg-exit") +
           "sleep 1000 &\necho started\nexit 0\n")
    script(directory, "30-bg-hang", "#!/bin/sh\n" + sid.format(scratch=tree.scratch, name="30-bg-hang") +
           "sleep 1000 &\necho $! > " + f"{tree.scratch}/bg.pid\n" + "sleep 1000\n")
    config = tree.config(script_timeouts={"10-hang": "1s", "30-bg-hang": "1s"})
    start = time.monotonic()
    outcome = run_scripts("job-start", config, env=JOB_ENV)
    elapsed = time.monotonic() - start
    assert elapsed < 8, f"runner took {elapsed:.1f}s for two 1s timeouts and a 1s EOF grace"
    hang, bg_exit, bg_hang = outcome.results
    assert hang.timed_out and hang.exit_code is None and "hanging" in hang.output
    assert bg_exit.ok and "started" in bg_exit.output and "killed the processes it left behind" in bg_exit.output
    assert bg_hang.timed_out and bg_hang.exit_code is None
    assert outcome.failed and outcome.exit_code == 1
    sessions = tree.sessions()
    assert len(sessions) == 3
    for session in sessions:
        assert live_members(session) == [], f"session {session} still has processes"
    assert not procfs.pid_alive(int((tree.scratch / "bg.pid").read_text()))
    timeouts = [e for e in tree.journal() if e["event"] == "script-timeout"]
    assert [Path(e["script"]).name for e in timeouts] == ["10-hang", "30-bg-hang"]
    assert all(e["severity"] == "error" and "1s" in e["message"] for e in timeouts)


def test_script_closing_its_output_is_still_bounded(tree):
    script(tree.phase("job-end"), "10-quiet", f"#!/bin/sh\necho $$ > {tree.scratch}/quiet.sid\n"
           "exec >/dev/null 2>&1\nsleep 1000\n")
    start = time.monotonic()
    outcome = run_scripts("job-end", tree.config(script_timeout="1s"), env=JOB_ENV)
    assert time.monotonic() - start < 5
    assert outcome.results[0].timed_out and outcome.failed and outcome.exit_code == 0  # job-end: ignore
    assert live_members(tree.sessions()[0]) == []


def test_a_child_ignoring_sigterm_is_killed(tree):
    script(tree.phase("job-start"), "10-stubborn", f"#!/bin/sh\necho $$ > {tree.scratch}/stubborn.sid\n"
           "trap '' TERM\nsh -c \"trap '' TERM; sleep 1000\" &\nsleep 1000\n")
    start = time.monotonic()
    outcome = run_scripts("job-start", tree.config(script_timeout="500ms"), env=JOB_ENV)
    assert time.monotonic() - start < 5 and outcome.results[0].timed_out
    assert live_members(tree.sessions()[0]) == []


def test_clean_environment(tree, monkeypatch):
    monkeypatch.setenv("FOO_LEAK", "from the caller")
    out = tree.scratch / "env.json"
    script(tree.phase("job-start"), "10-env",
           f"#!/usr/bin/python3\nimport json, os\njson.dump(dict(os.environ), open({str(out)!r}, 'w'))\n"
           f"print(os.getcwd())\n")
    env = {**JOB_ENV, "FOO_LEAK": "from slurmd", "PATH": "/evil", "HOME": "/nowhere", "LD_PRELOAD": "x.so"}
    outcome = run_scripts("job-start", tree.config(), role="worker", env=env)
    assert outcome.results[0].ok, outcome.results[0]
    assert outcome.results[0].output.strip() == "/"
    assert json.loads(out.read_text()) == {
        "PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": "/root", "USER": "root", "LOGNAME": "root",
        "SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOGROUP),
        "SLURM_JOB_USER": "nobody", "SLURMD_NODENAME": "node7", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_EXT_PHASE": "job-start", "SLURM_EXT_ROLE": "worker", "SLURM_EXT_JOB_ID": "42",
        "SLURM_EXT_SCRIPT": str(tree.phase("job-start") / "10-env")}


def test_stdin_is_dev_null_and_stderr_is_captured(tree):
    script(tree.phase("job-start"), "10-io", "#!/bin/sh\ncat\necho to-stderr >&2\necho to-stdout\n")
    result = run_scripts("job-start", tree.config(), env=JOB_ENV).results[0]
    assert result.ok and result.output == "to-stderr\nto-stdout\n"


def test_journal_has_output_job_and_exit_code(tree):
    script(tree.phase("job-start"), "10-report", "#!/bin/sh\necho hello from report\n")
    script(tree.phase("job-start"), "20-fail", "#!/bin/sh\necho about to fail\nexit 3\n")
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV)
    assert [r.exit_code for r in outcome.results] == [0, 3]
    ok, failed = tree.journal()
    assert ok["component"] == "prolog_epilog" and ok["event"] == "script-ok" and ok["severity"] == "info"
    assert ok["job"] == "42" and ok["phase"] == "job-start" and ok["exit_code"] == 0
    assert ok["script"] == str(tree.phase("job-start") / "10-report")
    assert ok["output"] == "hello from report\n" and isinstance(ok["seconds"], float)
    assert failed["event"] == "script-failed" and failed["severity"] == "error" and failed["exit_code"] == 3
    assert failed["output"] == "about to fail\n" and "exit 3" in failed["message"]
    assert "about to fail" in failed["message"]


def test_node_boot_events_have_no_job(tree):
    script(tree.phase("node-boot", "controller"), "10-x", "#!/bin/sh\nexit 1\n")
    outcome = run_scripts("node-boot", tree.config(), role="controller")
    assert outcome.failed and outcome.exit_code == 0 and outcome.policy == "ignore"
    (event,) = tree.journal()
    assert "job" not in event and event["event"] == "script-failed"


def test_output_keeps_the_last_4_kib(tree):
    script(tree.phase("job-start"), "10-loud", "#!/bin/sh\ni=0\nwhile [ $i -lt 3000 ]; do echo line $i; "
           "i=$((i+1)); done\n")
    result = run_scripts("job-start", tree.config(), env=JOB_ENV).results[0]
    assert result.ok and len(result.output.encode()) <= OUTPUT_LIMIT and result.output.endswith("line 2999\n")


@pytest.mark.parametrize("phase, on_failure, exit_code", [
    ("job-start", None, 1),
    ("job-end", None, 0),
    ("job-start", {"job-start": "ignore"}, 0),
    ("job-end", {"job-end": "drain"}, 1),
    ("node-boot", None, 0),
])
def test_failure_policy(tree, phase, on_failure, exit_code):
    script(tree.phase(phase), "10-fail", "#!/bin/sh\nexit 1\n")
    config = tree.config(**({"on_failure": on_failure} if on_failure else {}))
    outcome = run_scripts(phase, config, env=None if phase == "node-boot" else JOB_ENV)
    assert outcome.failed and outcome.exit_code == exit_code


def test_no_failure_no_drain(tree):
    script(tree.phase("job-start"), "10-ok", "#!/bin/sh\ntrue\n")
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV)
    assert outcome.policy == "drain" and not outcome.failed and outcome.exit_code == 0


@pytest.mark.parametrize("text, mode, owner, words", [
    ("#!/bin/sh\ntouch {mark}\nif then\n", 0o755, 0, "sh syntax"),
    ("#!/usr/bin/no-such-shell\ntouch {mark}\n", 0o755, 0, "interpreter /usr/bin/no-such-shell does not exist"),
    ("#!/bin/sh\ntouch {mark}\n", 0o757, 0, "lets group or others change it"),
    ("#!/bin/sh\ntouch {mark}\n", 0o755, NOBODY, f"owned by uid {NOBODY} (expected 0)"),
    ("#!/bin/sh\ntouch {mark}\n", 0o644, 0, "not executable"),
])
def test_invalid_scripts_are_refused_not_run(tree, text, mode, owner, words):
    mark, later = tree.scratch / "ran", tree.scratch / "later-ran"
    bad = script(tree.phase("job-start"), "10-bad", text.format(mark=mark), mode=mode, owner=owner)
    script(tree.phase("job-start"), "20-good", f"#!/bin/sh\ntouch {later}\n")
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV)
    refused, good = outcome.results
    assert not mark.exists() and later.exists()
    assert refused.exit_code is None and words in refused.refused and str(bad) in refused.refused
    assert good.ok and outcome.failed and outcome.exit_code == 1
    event = tree.journal()[0]
    assert event["event"] == "script-refused" and event["severity"] == "error" and event["job"] == "42"
    assert event["script"] == str(bad) and words in event["message"]


def test_shellcheck_warnings_do_not_refuse(tree):
    mark = tree.scratch / "warned-ran"
    path = script(tree.phase("job-start"), "10-warn", f"#!/bin/sh\nx=$(echo {mark})\ntouch $x\n")
    assert shutil.which("shellcheck"), "shellcheck is not installed (README's test command installs it)"
    severities = {p.severity for p in validate_script(path)}
    assert severities == {"warning"}, "the script should draw shellcheck warnings only"
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV, cache=VerdictCache(shellcheck=True))
    assert outcome.results[0].ok and mark.exists()


def test_user_hook_runs_as_the_job_user(tree, hooks):
    directory, home_of = hooks
    order = tree.scratch / "order"
    order.touch()
    order.chmod(0o666)  # the hook appends as nobody
    script(tree.phase("job-start"), "10-admin", f"#!/bin/sh\necho admin >> {order}\n")
    script(directory, "10-mine", f"#!/bin/sh\necho hook >> {order}\nid -u\nid -g\nid -G\necho $HOME $USER\n",
           owner=NOBODY)
    outcome = run_scripts("job-start", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=home_of)
    admin, hook = outcome.results
    assert order.read_text().split() == ["admin", "hook"]
    assert hook.ok and hook.user == "nobody" and hook.path == str(directory / "10-mine")
    uid, gid, groups, who = hook.output.splitlines()
    assert (uid, gid) == (str(NOBODY), str(NOGROUP))
    assert sorted(map(int, groups.split())) == sorted(set(os.getgrouplist("nobody", NOGROUP)))
    assert who == f"{home_of(NOBODY)} nobody"
    assert tree.journal()[-1]["user"] == "nobody"


def test_user_hooks_off_by_default(tree, hooks):
    directory, home_of = hooks
    mark = tree.scratch / "hook-ran"
    script(directory, "10-mine", f"#!/bin/sh\ntouch {mark}\n", owner=NOBODY)
    outcome = run_scripts("job-start", tree.config(), env=JOB_ENV, home_of=home_of)
    assert outcome.results == () and not mark.exists()


def test_user_hook_symlink_is_refused_unread(tree, hooks):
    directory, home_of = hooks
    secret = tree.scratch / "secret"
    script(tree.scratch, "secret", f"#!/bin/sh\ntouch {tree.scratch}/linked-ran\n# SECRET-CONTENT\nif then\n",
           mode=0o700)
    (directory / "10-link").symlink_to(secret)
    outcome = run_scripts("job-start", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=home_of)
    (refused,) = outcome.results
    assert "symbolic link" in refused.refused and not (tree.scratch / "linked-ran").exists()
    assert outcome.failed and outcome.exit_code == 1
    text = (tree.state / "journal.jsonl").read_text()
    assert "script-refused" in text and "SECRET" not in text and "syntax" not in text


def test_user_hook_owned_by_someone_else_is_refused(tree, hooks):
    directory, home_of = hooks
    script(directory, "10-root", f"#!/bin/sh\ntouch {tree.scratch}/root-ran\n", owner=0)
    outcome = run_scripts("job-start", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=home_of)
    assert "owned by uid 0 (expected the job's user, uid 65534)" in outcome.results[0].refused
    assert not (tree.scratch / "root-ran").exists()


def test_user_hook_failure_follows_the_phase_policy(tree, hooks):
    directory, home_of = hooks
    job_end = directory.parent / "job-end"
    job_end.mkdir()
    os.chown(job_end, NOBODY, NOGROUP)
    for where in (directory, job_end):
        script(where, "10-fail", "#!/bin/sh\nexit 7\n", owner=NOBODY)
    config = tree.config(allow_user_hooks=True)
    start = run_scripts("job-start", config, env=JOB_ENV, home_of=home_of)
    end = run_scripts("job-end", config, env=JOB_ENV, home_of=home_of)
    assert start.results[0].exit_code == 7 and start.exit_code == 1
    assert end.results[0].exit_code == 7 and end.failed and end.exit_code == 0


def test_user_hooks_never_at_node_boot(tree, hooks):
    directory, home_of = hooks
    node_boot = directory.parent / "node-boot"
    script(node_boot, "10-mine", f"#!/bin/sh\ntouch {tree.scratch}/boot-ran\n", owner=NOBODY)
    run_scripts("node-boot", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=home_of)
    assert not (tree.scratch / "boot-ran").exists()


def test_user_without_home_is_an_event_not_a_crash(tree):
    def no_such_user(uid):
        raise KeyError(uid)

    outcome = run_scripts("job-start", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=no_such_user)
    assert outcome.results == () and not outcome.failed
    (event,) = tree.journal()
    assert event["event"] == "user-hooks-skipped" and "no passwd entry" in event["message"]


def test_missing_hook_dir_is_nothing_to_run(tree):
    home = temp_dir(owner=NOBODY)
    tree.dirs.append(home)
    outcome = run_scripts("job-end", tree.config(allow_user_hooks=True), env=JOB_ENV, home_of=lambda uid: str(home))
    assert outcome.results == () and tree.journal() == []


def test_scripts_dir():
    assert scripts_dir(from_dict({"prolog_epilog": {"scripts_dir": "/srv/scripts"}})) == Path("/srv/scripts")
    assert scripts_dir(from_dict({}, source="/etc/cluster/slurm-ext.toml")) == Path("/etc/cluster")
    assert scripts_dir(Config()) == DEFAULT_SCRIPTS_DIR == Path("/etc/slurm-ext")


def test_unknown_phase_or_role_is_a_caller_bug(tree):
    with pytest.raises(ValueError, match="job-begin"):
        run_scripts("job-begin", tree.config())
    with pytest.raises(ValueError, match="compute"):
        run_scripts("job-start", tree.config(), role="compute")

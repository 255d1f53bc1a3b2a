"""Lifecycle scripts and user hooks under attack (issue 9): each test plays the attack for real, as
`nobody`, on real files, processes and cgroups, and passes only when the runner and the validator
hold.

What they show: nothing a user names runs as root (1); a hook is opened once, with O_NOFOLLOW, judged
on that descriptor, never read when it is huge, and that descriptor is what runs (10, 15); a user
hook's failure to be checked never hides an admin script's failure (11); directories from / down must
be root's (15); a hook's leftovers die with its cgroup, v1 and v2 (5); a hook sees only its job's GPUs
and runs with limits (12); admin scripts get the job id as SLURM_EXT_JOB_ID (9).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers.cli import cli
from helpers.files import script, temp_dir
from slurm_ext import procfs
from slurm_ext.config import from_dict
from slurm_ext.prolog_epilog import validate
from slurm_ext.prolog_epilog.scripts import MAX_USER_HOOKS, run_scripts
from slurm_ext.prolog_epilog.validate import MAX_SCRIPT_SIZE, VerdictCache, open_script, validate_script

NOBODY = 65534
NOGROUP = 65534
JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOGROUP),
           "SLURM_JOB_USER": "nobody", "SLURMD_NODENAME": "node7"}
V1 = Path("/sys/fs/cgroup")
V2 = Path("/sys/fs/cgroup/unified")  # this host's hybrid v2 hierarchy: a real cgroup v2, no controllers


class Node:
    """Admin scripts, a state dir, a scratch dir (world-writable) and nobody's home, all removed after."""

    def __init__(self):
        self.root, self.state, self.scratch, self.home = temp_dir(), temp_dir(), temp_dir(mode=0o777), \
            temp_dir(owner=NOBODY)
        self.dirs = [self.root, self.state, self.scratch, self.home]
        self.pids: list[int] = []

    def phase(self, phase: str) -> Path:
        return self.root / "worker" / f"{phase}.d"

    def hooks(self, phase: str) -> Path:
        directory = self.home / ".config" / "slurm-ext" / phase
        directory.mkdir(parents=True, exist_ok=True)
        for part in (self.home / ".config", self.home / ".config" / "slurm-ext", directory):
            os.chown(part, NOBODY, NOGROUP)
        return directory

    def config(self, **prolog_epilog):
        return from_dict({"node": {"state_dir": str(self.state)},
                          "prolog_epilog": {"scripts_dir": str(self.root), "allow_user_hooks": True,
                                            **prolog_epilog}})

    def run(self, phase: str, env: dict | None = None, **kwargs):
        config = kwargs.pop("config", None) or self.config()
        return run_scripts(phase, config, env=env or JOB_ENV, home_of=lambda uid: str(self.home), **kwargs)

    def journal(self) -> list[dict]:
        path = self.state / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def cleanup(self) -> None:
        for pid in self.pids:  # a failed test must not leave its sleeps behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node():
    made = Node()
    yield made
    made.cleanup()


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# -- 1: nothing a user names runs as root ---------------------------------------------------------


def test_a_user_hooks_own_interpreter_never_runs_as_root(node):
    """`#!/home/u/bin/bash` used to be run as root for the syntax check (`bash -n`)."""
    ids = node.scratch / "ids"
    fake_bash = script(node.home / "bin", "bash", f"#!/bin/sh\nid -u >> {ids}\n", owner=NOBODY)
    os.chown(node.home / "bin", NOBODY, NOGROUP)
    script(node.hooks("job-start"), "10-mine", f"#!{fake_bash}\necho hello\n", owner=NOBODY)
    outcome = node.run("job-start")
    assert "0" not in lines(ids), "the user's interpreter ran as root"
    assert lines(ids) == [str(NOBODY)], "the hook should have run, as nobody, through its own interpreter"
    assert outcome.results[0].ok, outcome.results


@pytest.mark.parametrize("where", ["nobody's directory", "a sticky world-writable directory"])
def test_an_admin_script_naming_an_interpreter_others_control_is_refused(node, where):
    """An admin script's `#!/tmp/x` is a root shell for whoever can change /tmp/x."""
    ids = node.scratch / "ids"
    if where == "nobody's directory":
        directory = temp_dir(owner=NOBODY)
        owner = NOBODY
    else:
        directory = temp_dir(mode=0o1777)
        owner = 0
    node.dirs.append(directory)
    interpreter = script(directory, "bash", f"#!/bin/sh\nid -u >> {ids}\n", owner=owner)
    admin = script(node.phase("job-start"), "10-admin", f"#!{interpreter}\ntrue\n")
    outcome = node.run("job-start")
    (refused,) = outcome.results
    assert lines(ids) == [], "the interpreter ran"
    assert refused.refused and f"{admin}:1: error: interpreter {interpreter}" in refused.refused
    assert outcome.exit_code == 1
    problems = [str(p) for p in validate_script(admin, shellcheck=False)]
    expected = (f"is owned by uid {NOBODY} (expected 0)" if owner else
                f"directory {directory} is writable by group or others: chmod go-w {directory}")
    assert any(expected in p for p in problems), problems
    assert lines(ids) == []


def test_a_user_hooks_syntax_is_not_checked_by_the_service(node):
    """No checker runs for a user's hook (as root it would run what the user names; as the user, outside
    the hook's cgroup, the user's other processes could ptrace it): a broken hook fails when it runs."""
    hook = script(node.hooks("job-start"), "10-broken", "#!/bin/bash\necho ok\nif then\n", owner=NOBODY)
    outcome = node.run("job-start")
    (result,) = outcome.results
    assert not result.refused and result.exit_code == 2, result
    assert "syntax error" in result.output and str(hook) not in result.refused


# -- 10 and 15: one descriptor, opened without following links, judged, read and run -------------


def test_a_huge_sparse_hook_is_refused_without_reading_it(node):
    hook = script(node.hooks("job-start"), "10-huge", "#!/bin/sh\nexit 0\n", owner=NOBODY)
    with open(hook, "r+b") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse: costs no disk, costs root's memory to read
    code = textwrap.dedent(f"""\
        import json, sys
        from slurm_ext.config import from_dict
        from slurm_ext.prolog_epilog.scripts import run_scripts
        config = from_dict({{"node": {{"state_dir": {str(node.state)!r}}},
                            "prolog_epilog": {{"scripts_dir": {str(node.root)!r}, "allow_user_hooks": True}}}})
        outcome = run_scripts("job-start", config, env={JOB_ENV!r}, home_of=lambda uid: {str(node.home)!r})
        peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(json.dumps([[r.refused for r in outcome.results], peak_kib]))
        """)
    # the child's own high-water mark (VmHWM of its address space since its exec): wait4's ru_maxrss would also
    # count the forking pytest worker's memory, which Linux carries across the exec
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    results, peak_kib = json.loads(done.stdout)
    assert peak_kib / 1024 < 200, f"peak RSS {peak_kib / 1024:.0f} MiB: the hook was read"
    (refused,) = results
    assert f"{2 << 30} bytes (expected at most {MAX_SCRIPT_SIZE}" in refused and "not read" in refused


def test_opening_a_hook_never_follows_a_link(node):
    secret_dir = temp_dir(mode=0o700)
    node.dirs.append(secret_dir)
    secret = script(secret_dir, "shadow", "#!/bin/sh\n# SECRET-CONTENT\nif then\n", mode=0o700)
    hooks = node.hooks("job-start")
    (hooks / "10-link").symlink_to(secret)
    os.lchown(hooks / "10-link", NOBODY, NOGROUP)
    opened, problems = open_script(hooks / "10-link", owner=NOBODY)
    assert opened is None and "symbolic link" in str(problems)
    # the same through a link in the directory chain, which the user controls
    hooks.rename(hooks.with_name("job-start.real"))
    hooks.symlink_to(secret_dir)
    opened, problems = open_script(hooks / "shadow", owner=NOBODY)
    assert opened is None and f"{hooks} is a symbolic link in {hooks.parent}" in str(problems)
    with pytest.raises(OSError, match="symbolic link"):
        validate.script_names(hooks, owner=NOBODY)
    assert "SECRET" not in str(problems) and "syntax" not in str(problems)


def test_a_hook_swapped_for_a_link_right_after_the_lstat_is_never_read(node, monkeypatch):
    """The race window made deterministic: the swap happens just after the lstat returns."""
    secret_dir = temp_dir(mode=0o700)
    node.dirs.append(secret_dir)
    secret = script(secret_dir, "shadow", "#!/bin/sh\n# SECRET-CONTENT\nif then\n", mode=0o700)
    hooks = node.hooks("job-start")
    hook = script(hooks, "10-hook", "#!/bin/sh\nexit 0\n", owner=NOBODY)
    (hooks / ".link").symlink_to(secret)
    real_lstat = validate._lstat

    def lstat_then_swap(base, dir_fd):
        info = real_lstat(base, dir_fd)
        if (hooks / ".link").is_symlink():
            os.rename(hooks / ".link", hook)  # what the user does at that moment
        return info

    monkeypatch.setattr(validate, "_lstat", lstat_then_swap)
    opened, problems = open_script(hook, owner=NOBODY)
    assert opened is None and "symbolic link" in str(problems), problems
    assert hook.is_symlink()


def test_a_hook_flipping_to_a_link_is_never_read_by_root(node):
    """A real race: nobody swaps the hook and a link to a root-only file, as fast as it can."""
    secret_dir = temp_dir(mode=0o700)
    node.dirs.append(secret_dir)
    secret = script(secret_dir, "shadow", "#!/bin/sh\n# SECRET-CONTENT\nif then\n", mode=0o600)
    hooks = node.hooks("job-start")
    hook = script(hooks, "10-hook", "#!/bin/sh\nexit 0\n", owner=NOBODY)
    (hooks / ".alt").symlink_to(secret)
    os.lchown(hooks / ".alt", NOBODY, NOGROUP)
    flipper = subprocess.Popen(["/usr/bin/python3", "-c", textwrap.dedent(f"""\
        import ctypes, sys
        libc = ctypes.CDLL(None, use_errno=True)
        a, b = {str(hook).encode()!r}, {str(hooks / ".alt").encode()!r}
        print("flipping", flush=True)
        while True:
            libc.renameat2(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE
        """)], user=NOBODY, group=NOGROUP, extra_groups=[], stdout=subprocess.PIPE, text=True)
    node.pids.append(flipper.pid)
    try:
        assert flipper.stdout.readline().strip() == "flipping"
        config = node.config()
        results = [result for _ in range(200) for result in node.run("job-start", config=config).results]
    finally:
        flipper.kill()
        flipper.wait()
    text = (node.state / "journal.jsonl").read_text()
    assert "SECRET" not in text and "syntax" not in text and "uid 0" not in text, "root read the secret"
    ran = [r for r in results if r.ok]
    refused = [r for r in results if "symbolic link" in r.refused or "no such file" in r.refused]
    assert len(ran) + len(refused) == len(results), [r for r in results if r not in ran + refused][:3]
    assert ran and refused, f"the race was not on: {len(ran)} ran, {len(refused)} refused as links"


def test_the_checked_descriptor_runs_not_the_path(node):
    """A rename between the check and the exec changes nothing: what was checked is what runs."""
    marks = node.scratch / "marks"
    path = script(node.phase("job-start"), "10-report", f"#!/bin/sh\necho checked >> {marks}\n")
    other = script(node.root, "evil", f"#!/bin/sh\necho swapped >> {marks}\n")

    class SwappingCache(VerdictCache):
        def _swap(self):
            if other.exists():
                os.rename(other, path)

        def open(self, target):
            opened = super().open(target)
            self._swap()
            return opened

        def problems(self, target):  # the runner before the fix asked this, then ran the path
            found = super().problems(target)
            self._swap()
            return found

    outcome = node.run("job-start", cache=SwappingCache())
    assert lines(marks) == ["checked"] and outcome.results[0].ok
    assert "swapped" in path.read_text()  # the swap did happen


def test_directories_must_be_roots_from_the_top_down(node):
    marks = node.scratch / "marks"
    path = script(node.phase("job-start"), "10-admin", f"#!/bin/sh\necho ran >> {marks}\n")
    worker = node.root / "worker"
    node.phase("job-start").chmod(0o775)
    outcome = node.run("job-start")
    assert (f"{path}: error: directory {node.phase('job-start')} is writable by group or others: chmod go-w "
            f"{node.phase('job-start')}") in outcome.results[0].refused
    node.phase("job-start").chmod(0o755)
    os.chown(worker, NOBODY, NOGROUP)
    outcome = node.run("job-start")
    assert (f"directory {worker} is owned by uid {NOBODY} (expected 0): chown 0 {worker}"
            in outcome.results[0].refused)
    assert lines(marks) == [] and outcome.exit_code == 1
    os.chown(worker, 0, 0)
    assert node.run("job-start").results[0].ok and lines(marks) == ["ran"]


def test_a_sticky_ancestor_is_accepted_but_not_as_the_script_directory():
    sticky = temp_dir(mode=0o1777)
    try:
        inner = sticky / "scripts"
        inner.mkdir(mode=0o755)
        good = script(inner, "10-ok", "#!/bin/sh\ntrue\n")
        assert validate_script(good, shellcheck=False) == []
        bad = script(sticky, "10-in-sticky", "#!/bin/sh\ntrue\n")
        assert [str(p) for p in validate_script(bad, shellcheck=False)] == [
            f"{bad}: error: directory {sticky} is writable by group or others: chmod go-w {sticky}"]
    finally:
        shutil.rmtree(sticky)


def test_a_users_writable_home_refuses_the_hooks(node):
    marks = node.scratch / "marks"
    script(node.hooks("job-start"), "10-mine", f"#!/bin/sh\necho ran >> {marks}\n", owner=NOBODY)
    node.home.chmod(0o777)  # anyone could replace ~/.config and plant hooks that run as nobody
    outcome = node.run("job-start")
    assert f"directory {node.home} is writable by group or others" in outcome.results[0].refused
    assert lines(marks) == []


def test_a_link_out_of_the_script_directory_is_refused(node):
    marks = node.scratch / "marks"
    elsewhere = script(node.root / "elsewhere", "tool", f"#!/bin/sh\necho ran >> {marks}\n")
    (node.phase("job-start")).mkdir(parents=True)
    (node.phase("job-start") / "10-tool").symlink_to(elsewhere)
    outcome = node.run("job-start")
    assert "outside" in outcome.results[0].refused and "its own directory" in outcome.results[0].refused
    assert lines(marks) == []


def test_a_configmap_volume_runs(node):
    """Kubernetes mounts a ConfigMap read-only, its directory mode 0777, its files as links
    `name -> ..data/name`, `..data -> ..<timestamp>/`: links inside the directory, no one can write."""
    marks = node.scratch / "marks"
    directory = node.phase("job-start")
    script(directory / "..2026_01_01_00_00_00.1", "10-report", f"#!/bin/sh\necho ran >> {marks}\n")
    (directory / "..data").symlink_to("..2026_01_01_00_00_00.1")
    (directory / "10-report").symlink_to("..data/10-report")
    directory.chmod(0o777)
    assert "is writable by group or others" in node.run("job-start").results[0].refused  # not read-only yet
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(directory)], check=True)
        outcome = node.run("job-start")
    finally:
        subprocess.run(["umount", str(directory)], check=True)
    assert [r.ok for r in outcome.results] == [True], outcome.results
    assert lines(marks) == ["ran"]


def test_cli_names_the_directory_to_fix(node):
    directory = node.phase("job-end")
    path = script(directory, "10-x", "#!/bin/sh\ntrue\n")
    directory.chmod(0o777)
    result = cli("scripts", "validate", "--no-shellcheck", str(directory))
    assert result.returncode == 1
    assert (f"{path}: error: directory {directory} is writable by group or others: chmod go-w {directory}"
            in result.stdout.splitlines()), result.stdout


def test_more_hooks_than_the_cap_are_refused_with_an_event(node):
    marks = node.scratch / "marks"
    hooks = node.hooks("job-start")
    count = MAX_USER_HOOKS + 4
    for number in range(count):
        script(hooks, f"{number:02d}-hook", f"#!/bin/sh\necho {number} >> {marks}\n", owner=NOBODY)
    outcome = node.run("job-start")
    assert len(lines(marks)) == MAX_USER_HOOKS
    *ran, rest = outcome.results
    assert len(ran) == MAX_USER_HOOKS and all(r.ok for r in ran)
    assert f"{count} user hooks (expected at most {MAX_USER_HOOKS} per phase): 4 not run" in rest.refused
    assert outcome.exit_code == 1
    event = node.journal()[-1]
    assert event["event"] == "script-refused" and event["script"] == str(hooks)


def test_a_hook_directory_with_too_many_entries_is_not_read(node):
    hooks = node.hooks("job-start")
    for number in range(300):
        (hooks / f"{number:03d}.disabled").touch()
    outcome = node.run("job-start")
    assert outcome.results == ()
    (event,) = node.journal()
    assert event["event"] == "user-hooks-skipped" and "more than 256 entries" in event["message"]


def test_the_user_hooks_of_a_phase_share_one_timeout(node):
    hooks = node.hooks("job-start")
    for name in ("10-a", "20-b", "30-c"):
        script(hooks, name, "#!/bin/sh\nsleep 0.7\n", owner=NOBODY)
    start = time.monotonic()
    outcome = node.run("job-start", config=node.config(script_timeout="1s"))
    assert time.monotonic() - start < 4
    first, second, third = outcome.results
    assert first.ok and second.timed_out
    assert "used it up" in third.refused


# -- 11: a user hook's failure is its own ------------------------------------------------------


def test_a_hook_that_breaks_its_check_does_not_hide_a_failed_admin_script(node):
    script(node.phase("job-start"), "10-admin", "#!/bin/sh\nexit 1\n")
    # compile() of this raises RecursionError, not SyntaxError (it used to escape the service's own check;
    # user hooks are no longer checked by the service, and the hook fails by itself when it runs)
    script(node.hooks("job-start"), "10-deep", "#!/usr/bin/python3\nx = " + "+".join(["1"] * 20000) + "\n",
           owner=NOBODY)
    outcome = node.run("job-start")
    admin, hook = outcome.results
    assert admin.exit_code == 1 and not hook.ok and "RecursionError" in hook.refused + hook.output
    assert outcome.exit_code == 1


def test_any_exception_in_a_hooks_check_is_that_hooks_refusal(node, monkeypatch):
    script(node.phase("job-start"), "10-admin", "#!/bin/sh\nexit 1\n")
    script(node.hooks("job-start"), "10-mine", "#!/bin/sh\nexit 0\n", owner=NOBODY)
    real_open = VerdictCache.open

    def failing_open(self, path):
        if self.owner == NOBODY:
            raise RuntimeError("a bug the next hook finds")
        return real_open(self, path)

    monkeypatch.setattr(VerdictCache, "open", failing_open)
    outcome = node.run("job-start")
    admin, hook = outcome.results
    assert admin.exit_code == 1 and "a bug the next hook finds" in hook.refused
    assert outcome.exit_code == 1


# -- 5: a hook's leftovers die with its cgroup ---------------------------------------------------


@pytest.mark.parametrize("cgroup_root", [V1, V2], ids=["v1", "v2"])
def test_a_user_hooks_leftovers_are_killed_with_its_cgroup(node, cgroup_root):
    pids, where = node.scratch / "pids", node.scratch / "cgroup"
    script(node.hooks("job-end"), "10-leave", textwrap.dedent(f"""\
        #!/bin/sh
        setsid sleep 1000 >/dev/null 2>&1 &
        echo $! >> {pids}
        nohup sleep 1000 &
        echo $! >> {pids}
        cat /proc/self/cgroup > {where}
        exit 0
        """), owner=NOBODY)
    outcome = node.run("job-end", **({} if cgroup_root == V1 else {"cgroup_root": cgroup_root}))  # V1: the default
    left = [int(pid) for pid in lines(pids)]
    node.pids += left
    assert outcome.results[0].exit_code == 0 and len(left) == 2
    assert [pid for pid in left if procfs.pid_alive(pid)] == [], "a hook's process outlived it"
    memberships = dict(line.split(":", 2)[1:] for line in where.read_text().splitlines())
    if cgroup_root == V1:
        hook_cgroup = V1 / "freezer" / memberships["freezer"].lstrip("/")
    else:
        hook_cgroup = V2 / memberships[""].lstrip("/")
    assert hook_cgroup.name.startswith("hook_42_") and hook_cgroup.parent.name == "slurm-ext"
    assert not hook_cgroup.exists()


def test_without_a_cgroup_a_user_hook_does_not_run(node):
    """Fail closed: no hierarchy to make the hook's cgroup in (an unprivileged pod), no hook."""
    marks = node.scratch / "marks"
    script(node.hooks("job-start"), "10-mine", f"#!/bin/sh\necho ran >> {marks}\n", owner=NOBODY)
    outcome = node.run("job-start", cgroup_root=node.scratch)
    assert "cannot make its cgroup" in outcome.results[0].refused and lines(marks) == []


# -- 12: a hook sees only its job's GPUs, and runs with limits ----------------------------------


def test_a_user_hook_may_open_only_its_jobs_gpus(node, tmp_path):
    """The job has NVML GPU 1, whose device is /dev/nvidia7 (minors need not follow the indexes): the hook
    may open 195:7 and not 195:0. Run in a child with the real pynvml over the fake NVML."""
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib").parent
    spec = fakenvml.default_gpus(2)
    spec["gpus"][0]["minor"], spec["gpus"][1]["minor"] = 0, 7
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    devices = temp_dir()
    node.dirs.append(devices)
    for minor in (0, 7):
        os.mknod(devices / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))  # S_IFCHR
        (devices / f"nvidia{minor}").chmod(0o666)
    script(node.hooks("job-start"), "10-gpus", textwrap.dedent(f"""\
        #!/usr/bin/python3
        import errno, os
        for minor in (0, 7):
            try:
                os.close(os.open("{devices}/nvidia%d" % minor, os.O_RDWR))
                print(minor, "opened")
            except OSError as err:
                print(minor, errno.errorcode[err.errno])
        """), owner=NOBODY)
    child = textwrap.dedent(f"""\
        from slurm_ext.config import from_dict
        from slurm_ext.prolog_epilog.scripts import run_scripts
        config = from_dict({{"node": {{"state_dir": {str(node.state)!r}}},
                            "prolog_epilog": {{"scripts_dir": {str(node.root)!r}, "allow_user_hooks": True}}}})
        env = {{**{JOB_ENV!r}, "SLURM_JOB_GPUS": "1"}}
        outcome = run_scripts("job-start", config, env=env, home_of=lambda uid: {str(node.home)!r})
        print(outcome.results[0].refused or outcome.results[0].output, end="")
        """)
    ran = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **fakenvml.environ(lib, tmp_path / "gpus.json")})
    assert ran.returncode == 0, ran.stderr
    result = dict(line.split() for line in ran.stdout.splitlines())
    assert result["0"] == "EPERM", "the hook opened a GPU of another job"
    assert result["7"] in ("ENXIO", "ENODEV"), "its own GPU must pass the cgroup (no driver here: ENXIO)"


def test_without_nvml_a_user_hook_may_open_no_gpu(node):
    """NVML cannot say which devices the job's GPUs are (no library in this process): every GPU is denied."""
    devices = temp_dir()
    node.dirs.append(devices)
    os.mknod(devices / "nvidia0", 0o666 | 0o020000, os.makedev(195, 0))
    (devices / "nvidia0").chmod(0o666)
    script(node.hooks("job-start"), "10-gpu", textwrap.dedent(f"""\
        #!/usr/bin/python3
        import errno, os
        try:
            os.close(os.open("{devices}/nvidia0", os.O_RDWR))
        except OSError as err:
            print(errno.errorcode[err.errno])
        """), owner=NOBODY)
    outcome = node.run("job-start", env={**JOB_ENV, "SLURM_JOB_GPUS": "0"})
    assert outcome.results[0].output.strip() == "EPERM", outcome.results[0]


def test_on_cgroup_v2_the_hooks_of_a_job_with_gpus_do_not_run(node):
    """cgroup v2 cannot hold a hook to its job's GPUs without eBPF: fail closed."""
    marks = node.scratch / "marks"
    script(node.hooks("job-start"), "10-mine", f"#!/bin/sh\necho ran >> {marks}\n", owner=NOBODY)
    outcome = node.run("job-start", env={**JOB_ENV, "SLURM_JOB_GPUS": "0"}, cgroup_root=V2)
    assert "cannot hold a hook to its job's GPUs" in outcome.results[0].refused and lines(marks) == []
    assert outcome.exit_code == 1


def test_a_user_hook_runs_with_limits(node):
    script(node.hooks("job-start"), "10-limits", textwrap.dedent("""\
        #!/usr/bin/python3
        import resource
        for name in ("RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_FSIZE"):
            print(name, *resource.getrlimit(getattr(resource, name)))
        pids = [line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()
                if line.split(":")[1] == "pids"][0]
        print("pids.max", open("/sys/fs/cgroup/pids" + pids + "/pids.max").read().strip())
        """), owner=NOBODY)
    outcome = node.run("job-start")
    found = {line.split()[0]: line.split()[1:] for line in outcome.results[0].output.splitlines()}
    assert found == {"RLIMIT_CORE": ["0", "0"], "RLIMIT_NOFILE": ["1024", "1024"],
                     "RLIMIT_FSIZE": [str(16 << 30)] * 2, "pids.max": ["512"]}, outcome.results[0]


# -- 9: the job id under a name the Epilog does not read -----------------------------------------


def test_admin_scripts_get_the_job_id_as_slurm_ext_job_id(node):
    script(node.phase("job-start"), "10-env", "#!/bin/sh\necho \"$SLURM_EXT_JOB_ID $SLURM_EXT_SCRIPT\"\n")
    (result,) = node.run("job-start").results
    assert result.output.split() == ["42", str(node.phase("job-start") / "10-env")]

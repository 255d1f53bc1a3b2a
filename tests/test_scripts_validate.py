"""`slurm-ext scripts validate`: every reason a lifecycle script must not run, with file and line."""

from pathlib import Path

import pytest

from helpers.cli import cli
from helpers.files import script
from slurm_ext.prolog_epilog import script_dirs, validate_dir, validate_script
from slurm_ext.prolog_epilog.validate import VerdictCache, script_names

NOBODY = 65534


@pytest.fixture
def scripts(tmp_path) -> Path:
    directory = tmp_path / "job-start.d"
    directory.mkdir()
    return directory


def messages(path: Path, **kwargs) -> list[str]:
    return [str(p) for p in validate_script(path, **kwargs)]


def test_good_scripts_pass(scripts):
    for name, text in (("10-sh", "#!/bin/sh\necho $SLURM_JOB_ID\n"),
                       ("20-bash", "#!/bin/bash\nset -eu\n[[ -n ${SLURM_JOB_ID:-} ]] && echo ok\n"),
                       ("30-env-python", "#!/usr/bin/env python3\nimport os\nprint(os.environ.get('X'))\n")):
        assert validate_script(script(scripts, name, text), shellcheck=False) == [], name


@pytest.mark.parametrize("text, line, words", [
    ("#!/bin/bash\necho ok\nif then\n", 3, ["bash syntax", "unexpected token `then'"]),
    ("#!/bin/sh\nfoo() {\n", 3, ["sh syntax", "end of file unexpected"]),
    ("#!/usr/bin/python3\nimport os\ndef broken(:\n", 3, ["python syntax"]),
])
def test_syntax_errors_name_file_and_line(scripts, text, line, words):
    path = script(scripts, "10-broken", text)
    found = messages(path, shellcheck=False)
    assert len(found) == 1 and found[0].startswith(f"{path}:{line}: error: "), found
    for word in words:
        assert word in found[0], found


def test_missing_interpreter(scripts):
    path = script(scripts, "10-x", "#!/usr/bin/no-such-shell\necho\n")
    assert messages(path) == [f"{path}:1: error: interpreter /usr/bin/no-such-shell does not exist or is not "
                              "executable"]
    path = script(scripts, "20-x", "#!/usr/bin/env no-such-interpreter\necho\n")
    assert messages(path) == [f"{path}:1: error: interpreter 'no-such-interpreter' (via env) is not in PATH"]
    path = script(scripts, "30-x", "echo no shebang\n")
    assert "no shebang" in messages(path)[0]


def test_world_and_group_writable(scripts):
    for mode in (0o757, 0o775):
        path = script(scripts, f"10-w{mode:o}", "#!/bin/sh\ntrue\n", mode=mode)
        assert messages(path, shellcheck=False) == [
            f"{path}: error: mode {mode:04o} lets group or others change it: chmod go-w {path}"]


def test_wrong_owner_for_admin_scripts_and_right_owner_for_user_hooks(scripts):
    path = script(scripts, "10-user", "#!/bin/sh\ntrue\n", owner=NOBODY)
    assert messages(path, shellcheck=False) == [f"{path}: error: owned by uid {NOBODY} (expected 0): chown 0 {path}"]
    assert validate_script(path, owner=NOBODY, shellcheck=False) == []


def test_not_executable_and_not_regular(scripts):
    path = script(scripts, "10-x", "#!/bin/sh\ntrue\n", mode=0o644)
    assert messages(path, shellcheck=False) == [f"{path}: error: not executable: chmod u+x {path}"]
    (scripts / "20-dir").mkdir()
    assert messages(scripts / "20-dir") == [f"{scripts / '20-dir'}: error: not a regular file"]
    (scripts / "30-dangling").symlink_to(scripts / "nowhere")
    assert "dangling" in messages(scripts / "30-dangling")[0]


def test_a_link_is_judged_by_what_it_points_at(scripts):
    # the target is in the script's own directory: a link that leaves it is refused outright
    target = script(scripts, ".writable-target", "#!/bin/sh\ntrue\n", mode=0o777)
    (scripts / "10-link").symlink_to(target)
    assert "lets group or others change it" in messages(scripts / "10-link")[0]


def test_run_order_and_what_is_not_a_script(scripts):
    for name in ("20-b", "10-a", ".hidden", "30-c~", "40-d.bak", "50-e.dpkg-old", "60-f.disabled", "05-z"):
        script(scripts, name, "#!/bin/sh\ntrue\n")
    assert [p.name for p in script_names(scripts)] == ["05-z", "10-a", "20-b"]
    assert list(validate_dir(scripts, shellcheck=False)) == [scripts / "05-z", scripts / "10-a", scripts / "20-b"]


def test_verdict_cache_sees_changes(scripts):
    cache = VerdictCache()
    path = script(scripts, "10-a", "#!/bin/sh\ntrue\n")
    assert cache.problems(path) == []
    path.chmod(0o777)
    assert "lets group or others" in str(cache.problems(path)[0])
    path.chmod(0o755)
    path.write_text("#!/bin/sh\nif\n")
    assert "sh syntax" in str(cache.problems(path)[0])


def test_cli_exit_codes_and_summary(scripts, tmp_path):
    script(scripts, "10-good", "#!/bin/sh\ntrue\n")
    result = cli("scripts", "validate", "--no-shellcheck", str(scripts))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("1 scripts in 1 directories: 0 errors, 0 warnings")
    bad = script(scripts, "20-bad", "#!/bin/bash\nif then\n")
    result = cli("scripts", "validate", "--no-shellcheck", str(scripts))
    assert result.returncode == 1
    assert f"{bad}:2: error: bash syntax" in result.stdout
    result = cli("scripts", "validate", str(tmp_path / "missing.d"))
    assert result.returncode == 2 and "no such directory" in result.stderr


def test_cli_default_dirs_follow_the_config_file(tmp_path):
    config = tmp_path / "slurm-ext.toml"
    config.write_text("")
    job_end = tmp_path / "worker" / "job-end.d"
    job_end.mkdir(parents=True)
    bad = script(job_end, "10-x", "#!/bin/sh\ntrue\n", mode=0o646)
    assert job_end in script_dirs(tmp_path)
    result = cli("--config", str(config), "scripts", "validate", "--no-shellcheck")
    assert result.returncode == 1 and f"{bad}: error: mode 0646" in result.stdout


def test_shellcheck_warnings_come_with_their_line(scripts):
    path = script(scripts, "10-sc", "#!/bin/bash\nfor f in $(ls /tmp); do\n  echo $f\ndone\n")
    found = validate_script(path)
    assert found and all(p.severity == "warning" and p.line for p in found), found
    assert any(p.line == 2 and "shellcheck" in p.message for p in found), found
    assert validate_script(path, shellcheck=False) == []

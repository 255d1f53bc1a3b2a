"""An operator's commands never answer "healthy" from state no monitor wrote, and see the GPUs the agents see.

Before: without SLURM_EXT_CONFIG, `health check`, `health show` and `events` read
the defaults' empty state directory and said "healthy" / "no open findings",
exit 0, while the dev node was drained for an Xid 79; and from the CLI the dev
cluster's fake GPUs needed three environment variables the README never named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from slurm_ext import config
from slurm_ext.devcluster import cli as dev_cli
from slurm_ext.devcluster.fakenvml import DEV_DIR_ENV, SPEC_ENV

#: what the agents' environment has and an operator's shell does not
_AGENTS_ONLY = ("LD_LIBRARY_PATH", SPEC_ENV, DEV_DIR_ENV, config.ENV_VAR)


def _shell_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in _AGENTS_ONLY}


def _run(*args: str) -> subprocess.CompletedProcess:
    """The CLI as an operator's shell runs it: none of the agents' variables."""
    return subprocess.run([sys.executable, "-m", "slurm_ext.cli", *args], capture_output=True, text=True,
                          env=_shell_env(), timeout=120)


def test_the_node_config_shows_the_fake_gpus_and_the_monitors_findings_without_variables(cluster):
    conf = str(cluster.layout.slurm_ext_conf)
    inventory = _run("--config", conf, "gres", "inventory", "--json")
    assert inventory.returncode == 0, inventory.stderr
    assert len(json.loads(inventory.stdout)["gpus"]) == cluster.settings.gpu_count, inventory.stdout
    check = _run("--config", conf, "health", "check", "--json")
    report = json.loads(check.stdout)
    assert report["monitor"] == "ran this boot" and report["config"] == conf, report
    assert "gpu-count" in report["ran"], report
    shown = _run("--config", conf, "health", "show")
    assert shown.returncode == 0 and f"config {conf}; state dir" in shown.stderr, shown


def test_a_state_dir_no_monitor_wrote_is_never_healthy(tmp_path):
    conf = tmp_path / "slurm-ext.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[health]\ninterfaces = []\n')
    check = _run("--config", str(conf), "health", "check")
    assert check.returncode == 3, (check.stdout, check.stderr)
    assert check.stdout.startswith("unknown:") and "healthy:" not in check.stdout, check.stdout
    assert f"no health monitor has written {tmp_path / 'state'}/health/findings.json" in check.stderr
    assert f"config {conf}; state dir {tmp_path / 'state'}" in check.stderr
    as_json = _run("--config", str(conf), "health", "check", "--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["healthy"] is None
    shown = _run("--config", str(conf), "health", "show")
    assert shown.returncode == 3 and "no open findings" not in shown.stdout, shown
    assert "no health monitor has written" in shown.stderr
    events = _run("--config", str(conf), "events")
    assert events.returncode == 3 and f"no journal in {tmp_path / 'state'} (config {conf})" in events.stderr


def test_dev_up_links_the_default_config_only_where_the_host_has_none(tmp_path, monkeypatch):
    default = tmp_path / "etc" / "slurm-ext.toml"
    monkeypatch.setattr(config, "DEFAULT_PATH", default)
    conf = tmp_path / "dev" / "etc" / "slurm-ext.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text("")
    assert "now links to it" in dev_cli._link_default_config(conf)
    assert os.readlink(default) == str(conf)
    assert "with no option" in dev_cli._link_default_config(conf)  # again: kept
    other = tmp_path / "other.toml"
    other.write_text("")
    assert f"links to {conf}: run them with --config {other}" in dev_cli._link_default_config(other)
    default.unlink()
    default.write_text("[node]\n")  # the host's own
    assert "this host's own config" in dev_cli._link_default_config(conf)
    assert not default.is_symlink()

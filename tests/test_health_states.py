"""What a check's state says before its first verdict (review of issue 29.2): the page's check table and /metrics
read "ok" for a check that had judged nothing yet, an answer of healthy that was not measured.

A real health monitor's state written to its real files (no NVML is asked: nothing here reads a GPU)."""

from __future__ import annotations

import json

from slurm_ext import config
from slurm_ext.health.monitor import Monitor, metrics_path
from slurm_ext.health.settings import CHECKS


def _monitor(tmp_path, health: str = "") -> Monitor:
    for name in ("state", "run"):
        (tmp_path / name).mkdir()
    (tmp_path / "boot").write_text("b1\n")
    conf = tmp_path / "slurm-ext.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
                    f'boot_id_file = "{tmp_path / "boot"}"\n[health]\n{health}')
    return Monitor(config.load(str(conf)))


def _states(monitor: Monitor) -> dict[str, str]:
    monitor._write_metrics()
    return json.loads(metrics_path(monitor.runtime_dir).read_text())["checks"]


def test_a_polled_check_is_pending_until_it_has_judged_a_reading_never_ok(tmp_path):
    monitor = _monitor(tmp_path, f'kernel_log = "{tmp_path / "kmsg"}"\npaths = ["{tmp_path}"]\n')
    states = _states(monitor)
    assert set(states) == set(CHECKS)
    for check in ("gpu-lost", "ecc", "temperature", "filesystem", "slurmd", "nvml"):
        assert states[check] == "pending", (check, states)
    # an event check judges by the absence of events, while something delivers them
    assert (states["xid"], states["sxid"], states["kernel"]) == ("ok", "ok", "ok"), states
    # one real reading of the file systems judged: that check, and only it, says ok now
    monitor._polled("filesystem", monitor._read_filesystems())
    states = _states(monitor)
    assert states["filesystem"] == "ok" and states["ecc"] == "pending", states


def test_a_check_with_nothing_to_read_is_not_applicable(tmp_path):
    states = _states(_monitor(tmp_path, 'kernel_log = ""\ninterfaces = []\nnvml_events = false\n'))
    for check in ("xid", "sxid", "kernel", "link-down", "link-flap"):
        assert states[check] == "not-applicable", (check, states)

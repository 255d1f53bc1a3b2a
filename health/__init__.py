"""Passive GPU and node health checks: caught as they happen, judged by NVIDIA's catalog, owned drains.

The worker agent runs `slurm-ext health monitor` as its `health` worker
(`monitor.serve`): a check that hangs or crashes is the monitor's problem,
never the agent's or slurmd's. Each check is a module of `checks/` with a
pure judge, listed in `checks.REGISTRY`; settings.CHECKS holds their
defaults ([health.checks.<id>] overrides). A critical finding drains the
node through the node-state owner as `health/<check>` with reason
`slurm-ext: <check> <evidence> action=<action>`; the check lifts it once
its condition has stayed away for its quiet window.

Public surface: `serve` (the monitor), `check_now` (`health check`),
`open_findings` (`health show`), `monitor_missing` (why `health show` and
`health check` cannot vouch for the node), `request_clear` (`health clear`),
`metrics_path` (what the agent's /metrics reads), OWNER.
"""

from __future__ import annotations

from slurm_ext.lazy import lazy_names

__all__ = ["serve", "check_now", "open_findings", "monitor_missing", "request_clear", "metrics_path", "OWNER"]

#: the owner of health drains in the node-state catalogue (each check drains as health/<check>)
OWNER = "health"

# Imported on first use: the agent reads metrics_path at every scrape and needs none of the checks for it.
_LAZY = {"serve": "monitor", "check_now": "oneshot"}


__getattr__ = lazy_names(__name__, _LAZY)


def metrics_path(runtime_dir: str):
    from .monitor import metrics_path as path
    return path(runtime_dir)


def open_findings(node: "slurm_ext.config.NodeSection") -> list[dict]:
    """The node's open findings of this boot as the monitor last saved them (oldest first)."""
    from slurm_ext.procfs import boot_id
    from .monitor import load_state
    found = [f for f in load_state(node.state_dir, boot_id(node.boot_id_file)).get("findings") or ()
             if isinstance(f, dict) and f.get("opened")]
    return sorted(found, key=lambda f: f["opened"])


def monitor_missing(node: "slurm_ext.config.NodeSection") -> str:
    """Why no monitor's findings can be read for `node` ('' when a monitor wrote them this boot).

    An empty answer read from a state directory that no monitor ever wrote would be "healthy" without having
    been measured: an Xid the monitor drained for is invisible to a command pointed at another directory."""
    from slurm_ext.procfs import boot_id
    from .monitor import load_state, state_path
    path = state_path(node.state_dir)
    if not path.exists():
        return (f"no health monitor has written {path}: its findings (Xids, windows, drains) are unknown here; "
                "is this the worker agent's config (--config, $SLURM_EXT_CONFIG)?")
    if not load_state(node.state_dir, boot_id(node.boot_id_file)):
        return f"the health monitor has not written {path} since this boot: is the worker agent's health worker running?"
    return ""


def request_clear(state_dir: str, check: str = "", subject: str = "", action: str = "", by: str = "",
                  why: str = "operator") -> str:
    """Ask the running monitor to clear open findings (of `check`, about `subject`: a GPU index, UUID, bus id;
    whose action is `action`: a GPU reset clears only what a reset repairs) for operator `by`, or because the GPU
    was reset (`why` "reset"); returns the request file. The monitor takes it up within a second and journals what
    it cleared, why, and who asked."""
    import json

    from slurm_ext.fileio import atomic_write

    from .monitor import clear_path
    path = clear_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"check": check, "subject": subject, "action": action, "by": by,
                                  "why": why}) + "\n", mode=0o600)
    return str(path)

"""Active acceptance tests: GPU, network and storage, before a node takes work, on demand and after repairs.

`run_tests(config, node, level)` runs them here, each test in a child process with a deadline, and keeps
the run; `last_run(state_dir)` reads it back; `apply_verdict(config, run, full)` drains the node on a
fail and lifts that drain on a full pass, through the node-state owner. The worker agent runs the
at-start level before slurmd registers the node (acceptance.plugin). Off by default: [acceptance] enabled.
"""

from __future__ import annotations

__all__ = ["run_tests", "last_run", "apply_verdict", "settle", "drain_reason", "OWNER", "RunBusy", "health_check_main"]


def health_check_main() -> int:
    """`slurm-ext-accept-start`: Slurm's HealthCheckProgram (a path, no arguments) at slurmd's start, which is
    `slurm-ext accept health-check` (HealthCheckNodeState=START_ONLY, Slurm 25.11 and later)."""
    import sys

    from slurm_ext.cli import main
    sys.exit(main(["accept", "health-check", *sys.argv[1:]]))


def __getattr__(name: str):
    # light: the agent and the CLI import this package; the runner is imported when a run starts
    if name in ("run_tests", "last_run", "RunBusy"):
        from . import runner
        return getattr(runner, name)
    if name in ("apply_verdict", "settle", "drain_reason", "OWNER"):
        from . import verdict
        return getattr(verdict, name)
    raise AttributeError(name)

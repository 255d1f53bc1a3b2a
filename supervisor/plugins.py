"""The plug-ins the node agent loads: the one place in `supervisor/` that names other components.

Each name is a component's `plugin` module (`slurm_ext.plugin.Plugin`), imported by name as the
core CLI imports the components' commands: the agent sits on the top floor beside web/, whose
plug-in it still runs. Their order is the order of their start steps (after the agent's own) and of
the workers they add after the agent's own daemons. Adding a component to the agent is one line here.
"""

from __future__ import annotations

import functools
import importlib

from slurm_ext.plugin import Plugin, WorkerSpec

__all__ = ["PLUGINS", "plugins", "builtin_workers", "health_readings_path", "acceptance_enabled", "last_acceptance",
           "acceptance_refused", "run_acceptance"]

PLUGINS = (
    "slurm_ext.accounting.plugin",
    "slurm_ext.gres.plugin",
    "slurm_ext.prolog_epilog.plugin",
    "slurm_ext.health.plugin",
    "slurm_ext.acceptance.plugin",
    "slurm_ext.repair.plugin",
    "slurm_ext.web.plugin",
)


@functools.cache
def plugins() -> tuple[Plugin, ...]:
    """Every plug-in, in PLUGINS' order."""
    return tuple(importlib.import_module(name).PLUGIN for name in PLUGINS)


def builtin_workers(own: tuple[WorkerSpec, ...]) -> tuple[WorkerSpec, ...]:
    """The agent's `own` workers with each plug-in's in its place: before the one it names, else at the end."""
    before: dict[str, list[WorkerSpec]] = {}
    last: list[WorkerSpec] = []
    for plugin in plugins():
        for worker in plugin.workers:
            (before.setdefault(worker.before, []) if worker.before else last).append(worker.spec)
    unknown = sorted(set(before) - {spec.name for spec in own})
    if unknown:
        raise RuntimeError(f"a plug-in's worker starts before {', '.join(unknown)}, which is none of the agent's own")
    return tuple(spec for own_spec in own for spec in (*before.get(own_spec.name, ()), own_spec)) + tuple(last)


def reset_gpu(config, gpu: int):
    """Reset one GPU of this node for the repair service (health.gpureset.reset_gpu's ResetOutcome).

    Raises:
        health.gpureset.NoSuchGpu (a SlurmExtError): the node has no such GPU."""
    from slurm_ext.health.gpureset import reset_gpu as reset  # a floor below the agent's: imported, not named
    return reset(config.health, config.node.state_dir, health_readings_path(config.node.runtime_dir), gpu)


def request_clear(state_dir: str, check: str, subject: str, by: str) -> str:
    """Write an operator's clear request for the health monitor (health.request_clear); its file's path."""
    from slurm_ext.health import request_clear as request  # a floor below the agent's: imported, not named
    return request(state_dir, check, subject, by=by)


def clear_checks() -> tuple[str, ...]:
    """The health checks a clear may name."""
    from slurm_ext.health.settings import CHECKS  # a floor below the agent's: imported, not named
    return tuple(CHECKS)


def health_readings_path(runtime_dir: str):
    """Where the health monitor writes its readings each poll, which the agent's /health serves as they are."""
    from slurm_ext.health import metrics_path  # a floor below the agent's: imported, not named
    return metrics_path(runtime_dir)


def acceptance_enabled(config) -> bool:
    """[acceptance] enabled on this node: the controller may ask it for runs (POST /acceptance/run)."""
    return bool(config.acceptance.enabled)


def last_acceptance(config, trigger: str = "") -> dict | None:
    """The node's last acceptance run (of `trigger`, when given) as acceptance.records.Run.to_json writes it, or None.

    Raises:
        SlurmExtError: the kept run is there and unreadable (acceptance.last_run)."""
    from slurm_ext.acceptance import last_run  # a floor below the agent's: imported, not named
    run = last_run(config.node.state_dir, trigger)
    return None if run is None else run.to_json()


def acceptance_refused(err: Exception) -> bool:
    """Whether `err` is acceptance's refusal of a run because another holds the node (acceptance.RunBusy)."""
    from slurm_ext.acceptance import RunBusy  # a floor below the agent's: imported, not named
    return isinstance(err, RunBusy)


def run_acceptance(config, node: str, level: str, trigger: str, node_state, began) -> str:
    """Run the acceptance tests of `level` here now, for `trigger` (a run the controller asked for), and apply the
    verdict through the agent's node-state owner `node_state`: a fail wants acceptance's drain (its reason names the
    test, the target and what was measured), a pass of its drain's level lifts it (acceptance.settle), a run with a
    test that could not run does neither (nothing measured). `began()` is called once the run holds the node.
    Returns the verdict.

    Raises:
        acceptance.RunBusy (a SlurmExtError): another run holds the node; nothing ran.
        SlurmExtError: the run could not start."""
    from slurm_ext import events
    from slurm_ext.acceptance import OWNER, run_tests, settle  # a floor below the agent's: imported, not named
    emit = events.emitter(config.node.state_dir, "acceptance", role="worker")

    def told(event: str, *args, **fields):
        if event == "acceptance-started":
            began()
        return emit(event, *args, **fields)
    run = run_tests(config, node, level, trigger=trigger, emit=told)
    settle(config.node.state_dir, run, True, want=lambda reason: node_state.want(OWNER, reason),
           clear=lambda: node_state.clear(OWNER), emit=emit)
    return run.verdict

"""The node agent's config and its reload (SIGHUP): which workers the role runs, added, changed and removed.

A reloaded config is checked whole before any of it is adopted; a changed
worker is restarted with its new definition, a removed one stopped (its
crash-loop drain lifted), an added one started; the plug-ins are told.
"""

from __future__ import annotations

import dataclasses
import signal
import time

from slurm_ext import config as config_mod, credentials, events
from slurm_ext.config import Config
from slurm_ext.errors import ConfigError
from slurm_ext.plugin import WorkerSpec

from . import slurmd_args
from .lifecycle import Life, Policy
from .plugins import plugins
from .processes import Worker, close_channels, send_signal
from .states import WorkerState
from .stopping import request_stop
from .workers import workers_for

__all__ = ["apply_config", "fit_to_slurmd", "new_worker", "forget", "reload", "spec_changes", "switched_off"]


def apply_config(agent, config: Config, first: bool = False) -> None:
    """Adopt a (new) config, fitted to slurmd's command line (fit_to_slurmd): worker specs, restart settings."""
    agent.config = config
    #: emit(event, message, severity=None, **fields): a journal event of this agent
    agent.emit = events.emitter(config.node.state_dir, "supervisor", role=agent.role)
    s = config.supervisor
    agent.life.backoff_initial, agent.life.backoff_max = s.backoff_initial, s.backoff_max  # for the start steps
    try:
        specs = workers_for(agent.role, s, agent.daemon_args, agent.slurmd_notify, spec_changes(config, agent.role))
    except ValueError as err:
        raise ConfigError(config.source or "<defaults>", str(err)) from None
    off = switched_off(config, agent.role)
    specs = [spec for spec in specs if spec.name not in off]
    if first:
        agent.workers = [new_worker(agent, spec) for spec in specs]
        return
    old = {w.spec.name: w for w in agent.workers}
    updated = []
    for spec in specs:
        worker = old.pop(spec.name, None)
        if worker is not None and worker.removed and worker.state != WorkerState.STOPPING:
            forget(agent, worker)  # removed by an earlier reload and gone: added anew
            worker = None
        if worker is None:
            worker = new_worker(agent, spec)
            agent.emit("worker-added", f"worker {spec.name} added by the reloaded config", worker=spec.name)
            agent.start(worker)
        elif worker.removed:  # removed by an earlier reload, still stopping: started again once it has stopped
            worker.removed, worker.restart_after_stop, worker.pending_spec = False, True, spec
            agent.emit("worker-added", f"worker {spec.name} added by the reloaded config: started once its "
                       "stop is over", worker=spec.name)
        elif spec != worker.spec:
            respec(agent, worker, spec)
        worker.life.adopt(Policy.of(s, spec.restart))
        updated.append(worker)
    for worker in old.values():
        # a restart an earlier reload asked for (a changed spec, an add-back) is off: the worker goes
        worker.restart_after_stop, worker.pending_spec = False, None
        if not worker.removed:
            worker.removed = True
            agent.emit("worker-removed", f"worker {worker.spec.name} removed by the reloaded config: stopping it",
                       worker=worker.spec.name)
            if agent.liaison:
                agent.liaison.clear(worker.drain_owner)  # its crash loop, if any, ends with it
        request_stop(agent, worker)
        if worker.state == WorkerState.STOPPED:
            forget(agent, worker)
        else:
            updated.append(worker)  # kept until it has stopped (the exit forgets it then)
    agent.workers = updated


def fit_to_slurmd(agent, config: Config) -> Config:
    """The config as slurmd's arguments make it: `-N` names the node; configless, gres.conf goes where
    the controller's `Include` finds it (slurmd_args.CONFIGLESS_GRES), unless gres.output says otherwise.

    Raises:
        ConfigError: `-N` and node.name disagree.
    """
    if not slurmd_args.runs_slurmd(agent.role):
        return config
    own = config.supervisor.workers.get(slurmd_args.WORKER)
    command = (own.command or ()) if own else ()
    layout = agent.layout = slurmd_args.layout_of((*command, *agent.daemon_args))
    node, changes = config.node, {}
    if layout.node and node.name and layout.node != node.name:
        raise ConfigError(config.source or "<defaults>", f"slurmd's -N {layout.node} names another node than "
                          f"node.name = {node.name!r}: give one of them", key="node.name")
    if layout.node:
        changes["node"] = dataclasses.replace(node, name=layout.node)
    if layout.configless and not config.gres.output:
        changes["gres"] = dataclasses.replace(config.gres, output=slurmd_args.CONFIGLESS_GRES)
    return dataclasses.replace(config, **changes) if changes else config


def new_worker(agent, spec: WorkerSpec) -> Worker:
    return Worker(spec=spec, life=Life(Policy.of(agent.config.supervisor, spec.restart)))


def forget(agent, worker: Worker) -> None:
    """A removed worker has stopped: out of the list (readiness, metrics) and its notify and event sockets
    closed; the plug-ins are told (a removed health monitor may have posted a drain while it was stopping)."""
    agent.workers = [w for w in agent.workers if w is not worker]
    close_channels(agent, worker)
    credentials.remove_all(agent.config.node.runtime_dir, [worker.spec.name])  # its copies of root's secrets
    for live in agent.live_plugins:
        live.worker_gone(worker.spec.name)


def respec(agent, worker: Worker, spec: WorkerSpec) -> None:
    """A worker's definition changed: run the new one."""
    agent.emit("worker-changed", f"worker {spec.name}: definition changed by the reloaded config",
               worker=spec.name)
    if worker.state == WorkerState.RUNNING:
        worker.pending_spec = spec
        worker.restart_after_stop = True
        request_stop(agent, worker)
        return
    worker.spec = spec
    if worker.state == WorkerState.BACKOFF and not worker.life.awaiting_steps:  # e.g. the command was fixed: try now
        worker.life.failures = 0
        worker.life.next_start = time.monotonic()


def reload(agent) -> None:
    """SIGHUP: load the config file again; an invalid one is an event and the running config stays."""
    try:
        new = fit_to_slurmd(agent, config_mod.load(agent.config_path))
        workers_for(agent.role, new.supervisor, agent.daemon_args, agent.slurmd_notify, spec_changes(new, agent.role))
    except (ConfigError, ValueError) as err:
        agent.emit("reload-failed", f"SIGHUP: config not reloaded, keeping the running one: {err}",
                   severity="error")
        return
    agent.emit("reload", f"SIGHUP: config reloaded from {new.source or 'defaults'}")
    old = agent.config
    apply_config(agent, new)
    for live in agent.live_plugins:
        live.reloaded(old, new)
    for worker in agent.workers:
        if worker.spec.reload_signal and worker.state == WorkerState.RUNNING:
            send_signal(worker, getattr(signal, f"SIG{worker.spec.reload_signal}"))
    agent.liaison.ready_interval = new.supervisor.ready_interval
    agent.liaison.watch_node = any(w.spec.ready == "slurm-node" for w in agent.workers)
    agent.liaison.owner.runs_slurmd = agent.liaison.watch_node
    agent.liaison.poke()


def spec_changes(config: Config, role: str) -> dict[str, dict]:
    """The plug-ins' changes of built-in workers for `config` and `role` (accounting's own database)."""
    return {name: change for plugin in plugins() for name, change in plugin.spec_changes(config, role).items()}



def switched_off(config: Config, role: str) -> set[str]:
    """The plug-ins' workers the config switches off (health.enabled, repair.enabled, history.enabled, ...)."""
    return {worker.spec.name for plugin in plugins() for worker in plugin.workers
            if not plugin.enabled(config, role) or worker.enabled is not None and not worker.enabled(config, role)}



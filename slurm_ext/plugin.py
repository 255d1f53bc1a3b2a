"""The plug-in protocol: what a component gives the node agent for a role.

Each component that the agent runs something of has a `plugin.py` with a
`PLUGIN = Plugin(...)`: the workers it adds to the agent's own (Slurm's
daemons), the start steps it runs before the workers, the built-in workers'
settings a config changes, whether the config switches its workers off, and
a live part (`attach`) for what it does while the agent runs: watches,
metrics, stop holds, reactions to a reloaded config, which of its workers
take SIGUSR1. `slurm_ext.supervisor.plugins` lists the plug-ins; the agent
knows no component by name (as gpud's components/all/all.go).

This module is the core (floor 0): it imports no component, and a
component's plugin.py imports only it, its own modules and lower floors,
lazily where an import is heavy (the agent loads every plug-in at start).
"""

from __future__ import annotations

import dataclasses
import signal as _signal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from .config import Config

__all__ = ["WorkerSpec", "StepContext", "StartStep", "PluginWorker", "KillHold", "Host", "Live", "Plugin"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One program the node agent runs: its own daemons' and the plug-ins' (merged with [supervisor.workers.*])."""

    name: str
    roles: tuple[str, ...]
    command: tuple[str, ...]
    environment: dict = dataclasses.field(default_factory=dict)
    #: always, on-failure, never
    restart: str = "always"
    stop_signal: str = "TERM"
    #: seconds between stop_signal and SIGKILL
    stop_grace: float = 10.0
    notify: bool = False
    #: running, notify, slurm-node
    ready: str = "running"
    drain_on_crash_loop: bool = False
    #: workers that must be ready before this one starts (slurmdbd after its database)
    after: tuple[str, ...] = ()
    #: the user it speaks sd_notify as, when it drops root before it is ready (mariadbd: mysql)
    notify_user: str = ""
    #: sent to it after the agent reloaded its config (the health monitor rereads the same file)
    reload_signal: str = ""
    #: the role is ready only while it runs: false for a helper whose failure must not take the node out of
    #: service (a health monitor that crash-loops is its own problem, reported, not the node's)
    gates_ready: bool = True
    #: the user it runs as (its primary group and supplementary groups too); "": the agent's own (root)
    user: str = ""
    #: the settings naming the secret files it reads, copied for its user at each start (slurm_ext.credentials):
    #: only for a worker with a `user`, which cannot read root's originals
    credentials: tuple[str, ...] = ()
    #: the component whose events it may have the agent write (supervisor/eventchannel.py), when it runs as a
    #: `user` that cannot write the journal: "" none
    events: str = ""

    @property
    def signal(self) -> int:
        return getattr(_signal, f"SIG{self.stop_signal}")


@dataclass(frozen=True)
class StepContext:
    role: str
    config: Config
    node: str
    #: emit(event, message, severity="info", **fields): record a node event
    emit: Callable[..., dict]
    #: the node-state owner (the agent's Slurm thread): want(owner, reason), clear(owner), look() -> Ticket
    node_state: Any = None
    #: slurmd gets its config from slurmctld (--conf-server)
    configless: bool = False
    #: the names of the workers the agent runs for the role (its own and the plug-ins', as the config left them)
    workers: tuple[str, ...] = ()
    #: told the node's gpu GRES ("gpu:h200:2", "" for none) once NVML has been read: a dynamic
    #: slurmd's --conf carries it
    gpus_found: Callable[[str], None] = lambda gres: None


@dataclass(frozen=True, slots=True)
class StartStep:
    name: str
    #: does the work; raises on failure (the message is the event's text)
    run: Callable[[StepContext], None]
    once_per_boot: bool = False
    #: block or continue, unless supervisor.step_failure names this step
    on_failure: str = "continue"
    #: also run before every restart of this worker (e.g. slurmd), not only at the agent's start
    before_restart_of: str | None = None


@dataclass(frozen=True, slots=True)
class PluginWorker:
    """A worker a plug-in adds, and where it goes in the start order (whose reverse is the stop order)."""

    spec: WorkerSpec
    #: the agent's own worker it starts before ("hooks" before "slurmd", whose first job runs a hook); "": after
    #: all of the agent's own, in the plug-ins' order
    before: str = ""
    #: enabled(config, role): this worker runs, where the plug-in's are on (repair's collector, with
    #: history.enabled, beside its service, with repair.enabled); None: as the plug-in's
    enabled: Callable[[Config, str], bool] | None = None


#: a worker's hold on SIGKILL once its stop grace is over: called with the time (monotonic), it returns a
#: later time to SIGKILL at (the hold keeps it), or None (SIGKILL now); it says each of the two in an event
KillHold = Callable[[float], "float | None"]


class Host(Protocol):
    """What the agent shows a plug-in's live part: read it at each call, a reload replaces the config."""

    role: str
    config: Config
    #: the node-state owner: want(owner, reason), clear(owner), look()
    liaison: Any
    #: the Slurm client the agent's thread uses
    slurm: Any

    def emit(self, event: str, message: str, severity: str | None = None, **fields) -> dict:
        """A journal event of the agent (component supervisor)."""


class Live:
    """A plug-in's part in one running agent; every method has a do-nothing default."""

    def close(self) -> None:
        """The agent exits: stop what `attach` started."""

    def metrics(self) -> Iterable:
        """prometheus_client metric families, collected at each scrape of /metrics (import it here, lazily)."""
        return ()

    def stop_hold(self, spec: WorkerSpec, pid: int, requested: float) -> KillHold | None:
        """Asked when a worker is told to stop (at `requested`, monotonic): whether SIGKILL may wait past its
        stop grace, and until when."""
        return None

    def reloaded(self, old: Config, new: Config) -> None:
        """The agent has adopted a reloaded config (its workers are updated already)."""

    def worker_gone(self, name: str) -> None:
        """A worker removed by a reloaded config has stopped and is forgotten."""

    def takes_usr1(self, name: str, running_since: float) -> bool:
        """Whether the running worker `name` (up for `running_since` seconds) takes the agent's SIGUSR1 now."""
        return False


def _no_steps(role: str) -> list[StartStep]:
    return []


def _no_changes(config: Config, role: str) -> dict[str, dict]:
    return {}


def _always(config: Config, role: str) -> bool:
    return True


def _nothing_live(host: Host) -> Live | None:
    return None


@dataclass(frozen=True)
class Plugin:
    """What one component gives the node agent."""

    #: the component's name (its folder)
    name: str
    #: the workers it adds, each with its roles
    workers: tuple[PluginWorker, ...] = ()
    #: steps(role): its start steps for the role, in order, run after the agent's own and the earlier plug-ins'
    steps: Callable[[str], list[StartStep]] = _no_steps
    #: spec_changes(config, role): field changes of workers of other plug-ins or of the agent's own, by worker
    #: name (accounting's own database for slurmdbd); the config's [supervisor.workers.*] still wins
    spec_changes: Callable[[Config, str], dict[str, dict]] = _no_changes
    #: enabled(config, role): its workers run (False: the config switched them off, e.g. health.enabled)
    enabled: Callable[[Config, str], bool] = _always
    #: environment variables of the agent that no worker gets (a password meant for a start step)
    private_env: tuple[str, ...] = ()
    #: attach(host): its live part in a starting agent, called before the agent's first look at Slurm
    attach: Callable[[Host], Live | None] = _nothing_live

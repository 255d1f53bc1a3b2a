"""What acceptance gives the node agent (slurm_ext.plugin): the tests before the node takes work, and their metrics.

The start step runs once per boot, before slurmd starts, so that a node that fails registers drained
(our reason names the test, the GPU and what was measured) and takes no job; a node that passes has
an acceptance drain of an earlier run lifted. A test that could not run drains nothing.
"""

from __future__ import annotations

import logging
import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Live, Plugin, PluginWorker, StartStep, StepContext, WorkerSpec

__all__ = ["PLUGIN"]

log = logging.getLogger("acceptance")


def accept_at_start(context: StepContext) -> None:
    """The at-start level, before slurmd registers the node: drain on a fail, lift our old drain on a pass.

    Switched off ([acceptance] enabled = false, or at_start = off), an acceptance drain of an earlier run is
    lifted as health's are when health is switched off: no run will lift it otherwise."""
    from slurm_ext import events
    from slurm_ext.errors import SlurmExtError

    from .runner import run_tests
    from .verdict import OWNER, settle
    settings = context.config.acceptance
    if not settings.enabled or settings.at_start == "off":
        context.node_state.clear(OWNER)
        return
    emit = events.emitter(context.config.node.state_dir, "acceptance", role=context.role)
    run = run_tests(context.config, context.node, settings.at_start, trigger="start", emit=emit)
    ticket = settle(context.config.node.state_dir, run, True, want=lambda reason: context.node_state.want(OWNER, reason),
                    clear=lambda: context.node_state.clear(OWNER), emit=emit)
    if run.verdict != "fail":
        return
    timeout = 2.0 if context.configless else context.config.slurm.timeout + 1.0
    if ticket.wait(timeout) is None and not context.configless:
        raise SlurmExtError(f"node {context.node} failed its acceptance and needs a drain that Slurm has not shown "
                            f"within {timeout:g}s; slurmd stays down until it does")


def _steps(role: str) -> list[StartStep]:
    if role != "worker":
        return []
    return [StartStep("acceptance", accept_at_start, once_per_boot=True, on_failure="block")]


class _Results(Live):
    def __init__(self, host):
        self.host = host

    def metrics(self):
        from .metrics import families
        return families(self.host.config.node.state_dir)


class _Offer(Live):
    """The controller's: turning acceptance on for a running cluster offers `accept cluster` once (acceptance.offer),
    seen at the agent's start and at each reload of its config."""

    def __init__(self, host):
        self.host = host
        self._look(host.config)

    def reloaded(self, old, new) -> None:
        self._look(new)

    def _look(self, config) -> None:
        from slurm_ext import events

        from .offer import OFFER, noted
        try:
            turned_on = noted(config.node.state_dir, config.acceptance.enabled)
        except OSError as err:
            log.warning("acceptance: cannot keep the switch's state under %s: %s", config.node.state_dir, err)
            return
        if turned_on:
            events.emitter(config.node.state_dir, "acceptance", role=self.host.role)("acceptance-offer", OFFER)


def _attach(host) -> Live | None:
    if host.role == "controller":
        return _Offer(host)
    return _Results(host) if host.role == "worker" else None


def _enabled(config: Config, role: str) -> bool:
    """The controller's idle testing runs with [acceptance] enabled and an idle_period (a reload starts or stops it);
    acceptance has no worker of another role."""
    return role != "controller" or (config.acceptance.enabled and config.acceptance.idle_period > 0)


PLUGIN = Plugin(
    name="acceptance",
    # idle nodes tested at the lowest priority (acceptance.idle): a helper, never the controller's readiness; SIGHUP
    # after the agent's reload (a new period or QOS). Not `after` slurmctld: a pass with Slurm away is skipped, and a
    # controller that runs no slurmctld (a page-only host) must not need to take out a worker it does not run
    workers=(PluginWorker(WorkerSpec("accept-idle", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli",
                                                                      "accept", "idle"),
                                     reload_signal="HUP", gates_ready=False)),),
    enabled=_enabled,
    steps=_steps,
    attach=_attach,
)

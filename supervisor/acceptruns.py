"""The acceptance runs the controller asks of this node over the agent's HTTP (POST /acceptance/run).

A run takes seconds (quick) to an hour (extended), and an HTTP answer must go out within HEAD_TIMEOUT, so
the run goes on a thread of the agent's own and the POST is answered once it holds the node (202), or
refused (409) when another run holds it: this agent's, the at-start step's, an operator's `accept run`, a
job of `accept cluster` (the runner's lock says so at once: RunBusy). The asker learns how it ended from
GET /acceptance: whether this agent's run is under way, and the node's last run. The verdict is applied
here, through the agent's own node-state owner (the liaison), as the at-start step applies its own.
"""

from __future__ import annotations

import logging
import threading

from slurm_ext.errors import SlurmExtError

__all__ = ["AcceptanceRuns", "START_WAIT"]

log = logging.getLogger("supervisor")

#: how long a POST waits for its run to hold the node (the runner's lock is its first step), well inside HEAD_TIMEOUT
START_WAIT = 2.0


class AcceptanceRuns:
    """This agent's asked-for runs: one at a time."""

    def __init__(self, agent):
        self.agent = agent
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """A run this agent was asked for is under way."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self, level: str, trigger: str, wait: float = START_WAIT) -> tuple[int, str]:
        """Start a run of `level` for `trigger` and wait up to `wait` seconds for it to hold the node: (202, what)
        once it does (or is still getting there), (409, why) when another run holds the node, (503, why) when it
        could not start (the message says why)."""
        with self._lock:
            if self.running:
                return 409, "an acceptance run asked of this agent is under way: ask again once it has ended"
            began, settled, problem = threading.Event(), threading.Event(), []
            self._thread = threading.Thread(target=self._run, args=(level, trigger, began, settled, problem),
                                            name="acceptance-run", daemon=True)
            self._thread.start()
        settled.wait(wait)
        if began.is_set():
            return 202, f"acceptance {level} ({trigger}) started"
        if problem:
            busy, why = problem[0]
            return (409 if busy else 503), why
        return 202, f"acceptance {level} ({trigger}) asked; it had not begun within {wait:g}s"

    def _run(self, level: str, trigger: str, began: threading.Event, settled: threading.Event,
             problem: list) -> None:
        from .plugins import acceptance_refused, run_acceptance
        agent = self.agent

        def holds() -> None:
            began.set()
            settled.set()
        try:
            verdict = run_acceptance(agent.config, agent.node, level, trigger, agent.liaison, holds)
            log.info("acceptance %s (%s) asked by the controller: %s", level, trigger, verdict)
        except SlurmExtError as err:
            busy = acceptance_refused(err)
            problem.append((busy, str(err)))
            (log.warning if busy else log.error)("acceptance %s (%s) asked by the controller: %s", level, trigger, err)
        except Exception:  # a bug: said, and the next request is taken as usual
            problem.append((False, "the run failed: see the agent's log"))
            log.exception("acceptance %s (%s) asked by the controller failed", level, trigger)
        finally:
            settled.set()

"""The node agent: PID 1 or subreaper that keeps Slurm's daemons alive in place.

`supervise(config, role)` runs the agent until SIGTERM; `probe(config, kind,
role)` asks a running agent's /livez or /readyz (for Kubernetes exec probes
and scripts). Other components plug in through a `plugin.py` of their own
(`slurm_ext.plugin`: workers, start steps, watches, metrics, stop holds,
config reactions), listed in `plugins.PLUGINS`.
"""

from __future__ import annotations

from slurm_ext.config import Config

__all__ = ["supervise", "probe"]

# The agent and the HTTP client are imported where they are used: the core imports this package (for
# `settings`, its config section) whenever a config names [supervisor], the hook fallback too.


def supervise(config: Config, role: str, config_path: str | None = None, port: int | None = None,
              pidfile: str | None = None, daemon_args: tuple[str, ...] = ()) -> int:
    """Run the agent for `role`; returns its exit status (0: clean stop).

    `daemon_args`: appended to the command of the role's Slurm daemon (what a container gets as its
    arguments, e.g. a Slinky NodeSet's for slurmd)."""
    from .agent import Agent
    return Agent(config, role, config_path=config_path, port=port, pidfile=pidfile, daemon_args=daemon_args).run()


def probe(config: Config, kind: str, role: str = "worker", port: int | None = None,
          timeout: float = 5.0) -> tuple[bool, str]:
    """(ok, text) from the agent's /livez or /readyz, read with agentapi's caps (`timeout` for the whole answer,
    at most 64 KiB): a process on the port that trickles or floods cannot hold the kubelet's probe."""
    from slurm_ext.agentapi import FetchError, fetch
    settings = config.supervisor
    if port is None:
        port = settings.port(role)
    url = f"http://{settings.listen}:{port}/{'livez' if kind == 'live' else 'readyz'}"
    try:
        status, body = fetch(url, timeout, _PROBE_LIMIT)
    except FetchError as err:
        return False, f"no agent answers at {url}: {err.problem}"
    text = body.decode("utf-8", "replace").strip()
    if status != 200:
        return False, text or f"HTTP {status}"
    return True, text


#: most bytes of a probe's answer read
_PROBE_LIMIT = 65536

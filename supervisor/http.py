"""The agent's HTTP listener: /livez, /readyz and /metrics (Prometheus).

Served from a thread; handlers only read the agent's state. Metrics are
collected at scrape time from that state, so the loop never updates them.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from slurm_ext.errors import AgentError

from .states import WorkerState

__all__ = ["serve", "AgentCollector"]

log = logging.getLogger("supervisor")


class AgentCollector:
    """Prometheus view of one agent."""

    def __init__(self, agent):
        self.agent = agent

    def collect(self):
        agent = self.agent
        now = time.monotonic()
        labels = ["role", "worker"]
        restarts = CounterMetricFamily("slurm_ext_supervisor_restarts", "Restarts of a worker after it died "
                                       "or failed to start", labels=labels)
        up = GaugeMetricFamily("slurm_ext_supervisor_worker_up", "1 while the worker runs", labels=labels)
        uptime = GaugeMetricFamily("slurm_ext_supervisor_worker_uptime_seconds", "Seconds since the worker "
                                   "last started (0 when not running)", labels=labels)
        loop = GaugeMetricFamily("slurm_ext_supervisor_crash_loop", "1 while the worker is in a crash loop",
                                 labels=labels)
        for worker in list(agent.workers):
            key = [agent.role, worker.spec.name]
            running = worker.state == WorkerState.RUNNING
            restarts.add_metric(key, worker.restarts)
            up.add_metric(key, 1 if running else 0)
            uptime.add_metric(key, now - worker.started if running else 0)
            loop.add_metric(key, 1 if worker.crash_loop else 0)
        yield from (restarts, up, uptime, loop)
        orphans = CounterMetricFamily("slurm_ext_supervisor_orphans_reaped", "Exited processes reaped that "
                                      "were not workers (orphans re-parented to the agent)", labels=["role"])
        orphans.add_metric([agent.role], agent.orphans_reaped)
        yield orphans
        ready = GaugeMetricFamily("slurm_ext_supervisor_ready", "1 when the role is ready for work",
                                  labels=["role"])
        ready.add_metric([agent.role], 1 if agent.ready()[0] else 0)
        yield ready


def serve(agent, host: str, port: int) -> ThreadingHTTPServer:
    """Start the listener in a daemon thread; returns the server (call .shutdown())."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/livez":
                ok = agent.live()
                self._reply(200 if ok else 503, "ok\n" if ok else "agent loop stalled\n")
            elif self.path == "/readyz":
                ok, why = agent.ready()
                self._reply(200 if ok else 503, why + "\n")
            elif self.path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, "try /livez, /readyz or /metrics\n")

        def _reply(self, code: int, body, content_type: str = "text/plain; charset=utf-8") -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # probes every few seconds: keep them out of the log
            pass

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as err:
        raise AgentError(f"cannot listen on {host}:{port} for probes and metrics: {err.strerror} "
                         "(another agent of this role running? set supervisor.ports or --port)") from err
    server.daemon_threads = True
    # No shutdown() is ever called (the thread dies with the agent), so the
    # listener need not wake up to check for one: idle agents stay idle.
    threading.Thread(target=server.serve_forever, args=(3600.0,), name="http", daemon=True).start()
    log.info("probes and metrics on http://%s:%d/ (livez, readyz, metrics)", host, port)
    return server

"""Alerts where operators look, on the session's dev cluster: the real Prometheus, loaded with the shipped rules,
scrapes the real agents and fires SlurmExtNodeDrained for a fault drilled in the fake NVML; the repair service's
notifier posts the critical finding, its recommendation and its approval to a webhook on 127.0.0.1, each once, in
both formats.

The fault is drilled as test_health_cluster.py does (the fake GPU's spec rewritten: GPU 1 lost, a critical finding
and a health drain); its `Health` handle puts the node back. The shipped rules wait minutes (`for:`); the copy
given to this Prometheus has every duration cut to a second, nothing else changed."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from test_alerts import RULES
from test_health_cluster import Health, _monitor_pid

from slurm_ext import config as config_mod
from slurm_ext.repair.store import open_store

from helpers import prometheus as prometheus_server
from helpers.idp import not_http
from helpers.prometheus import get as _get
from helpers.wait import wait_for

pytestmark = pytest.mark.cluster

#: what the tests set on the cluster's [health] checks: a lost GPU is found at its first poll
_FAST = """
[health.checks.gpu-lost]
quiet = "3s"
"""


@pytest.fixture
def drill(running_cluster):
    wait_for("the health worker", lambda: _monitor_pid(running_cluster.layout), timeout=20)
    handle = Health(running_cluster)
    handle.configure(_FAST)
    yield handle
    handle.restore()


def _fast_copy(tmp_path: Path) -> Path:
    """The shipped rules with every `for:` and range cut to 1s (the expressions and labels as shipped)."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def prometheus(tmp_path):
    """Prometheus on 127.0.0.1 scraping the given targets every second with the rules' fast copy; stopped by PID."""
    started: list[prometheus_server.Server] = []

    def start(targets: list[str]) -> str:
        started.append(prometheus_server.start(tmp_path, "slurm-ext", targets, rule_files=(_fast_copy(tmp_path),)))
        return started[-1].base

    yield start
    for server in started:
        server.stop()


def _alerts(base: str) -> list[dict]:
    status, body = _get(f"{base}/api/v1/alerts")
    assert status == 200, body
    return json.loads(body)["data"]["alerts"]


def test_prometheus_with_the_shipped_rules_fires_node_drained_for_a_drilled_fault(drill, prometheus):
    node = drill.cluster.node
    worker = f"127.0.0.1:{drill.cluster.settings.worker_probe_port}"
    controller = f"127.0.0.1:{drill.cluster.settings.controller_probe_port}"
    base = prometheus([worker, controller])
    wait_for("both agents scraped", lambda: (lambda t: len(t) == 2 and all(x["health"] == "up" for x in t))(
        json.loads(_get(f"{base}/api/v1/targets")[1])["data"]["activeTargets"]), timeout=30, interval=0.3)
    status, body = _get(f"{base}/api/v1/rules")
    assert status == 200 and len(json.loads(body)["data"]["groups"][0]["rules"]) == len(
        yaml.safe_load(RULES.read_text())["groups"][0]["rules"])
    time.sleep(3)  # a few evaluations of a healthy node: nothing fires
    assert not [a for a in _alerts(base) if a["labels"]["alertname"] == "SlurmExtNodeDrained"], _alerts(base)

    drill.gpus(gpu1={"lost": True})
    drill.wait_reason(lambda r: r.startswith("slurm-ext: gpu-lost "), "the gpu-lost drain", timeout=20)
    firing = wait_for("SlurmExtNodeDrained firing", lambda: [
        a for a in _alerts(base) if a["labels"]["alertname"] == "SlurmExtNodeDrained" and a["state"] == "firing"],
        timeout=60, interval=0.5)
    [alert] = firing
    assert alert["labels"]["hostname"] == node and alert["labels"]["owner"] == "health/gpu-lost", alert
    assert alert["labels"]["severity"] == "warning" and node in alert["annotations"]["summary"]
    # the recommendation awaits approval: its age is served by the controller, its alert rule evaluates it
    ages = wait_for("the recommendation's age in Prometheus", lambda: json.loads(_get(
        f"{base}/api/v1/query?query=slurm_ext_repair_awaiting_approval_seconds")[1])["data"]["result"], timeout=60,
        interval=0.5)
    assert ages[0]["metric"]["hostname"] == node and ages[0]["metric"]["signature"] == "gpu-lost"


class Webhook(http.server.ThreadingHTTPServer):
    """A webhook on 127.0.0.1 that keeps every body it is posted."""

    daemon_threads = True

    def __init__(self):
        self.bodies: list = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(inner):
                self.bodies.append(json.loads(inner.rfile.read(int(inner.headers["Content-Length"]))))
                inner.send_response(200)
                inner.send_header("Content-Length", "0")
                inner.end_headers()

            def log_message(inner, *args):
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _controller_pid(layout) -> int:
    return int(layout.pidfile("supervise-controller").read_text().split()[0])


def _repair_pid(layout) -> int:
    """The repair service: the controller agent's child whose command line is `... repair serve`."""
    agent = _controller_pid(layout)
    for pid in map(int, Path(f"/proc/{agent}/task/{agent}/children").read_text().split()):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"repair" in argv and b"serve" in argv:
            return pid
    raise AssertionError(f"no repair service among the children of the controller agent {agent}")


@pytest.mark.parametrize("form", ["slack", "alertmanager"])
def test_the_webhook_gets_the_critical_finding_the_recommendation_and_the_approval_once(drill, tmp_path, form):
    layout, node = drill.layout, drill.cluster.node
    hook = Webhook()
    url_file = tmp_path / "webhook-url"
    url_file.write_text(hook.url + "\n")
    url_file.chmod(0o600)
    config = layout.slurm_ext_conf.read_text()
    # a dry run: the approval is recorded and its steps too, and nothing is done to the session's node
    keys = f'notify_url_file = "{url_file}"\nnotify_format = "{form}"\nnotify_backoff = "100ms"\ndry_run = true\n'
    try:
        layout.slurm_ext_conf.write_text(config.replace("[repair]\n", "[repair]\n" + keys, 1))
        os.kill(_controller_pid(layout), signal.SIGHUP)  # passed on to the repair service: a notifier starts
        time.sleep(2 * drill.cluster.settings.repair_interval + 1)  # its first pass, with the notifier

        started = time.time()
        drill.gpus(gpu1={"lost": True})
        drill.wait_reason(lambda r: r.startswith("slurm-ext: gpu-lost "), "the gpu-lost drain", timeout=20)

        def texts():
            if form == "slack":
                return [b["text"] for b in hook.bodies]
            return [f"slurm-ext {a['labels']['severity']}: node {a['labels']['node']}: {a['labels']['event']}: "
                    f"{a['annotations']['description']}" for b in hook.bodies for a in b]
        wait_for("the finding and the recommendation posted", lambda: any("health-finding" in t for t in texts())
                 and any("repair-recommended" in t for t in texts()), timeout=60, interval=0.3)
        approved = drill.cli("repair", "approve", node, check=False)
        assert approved.returncode == 0, approved.stderr
        wait_for("the approval posted", lambda: any("repair-approved" in t for t in texts()), timeout=60,
                 interval=0.3)
        # the service killed and started again by its agent: what it posted before is not posted again
        restarts = drill.count("repair-started")
        os.kill(_repair_pid(layout), signal.SIGKILL)
        wait_for("the repair service started again", lambda: drill.count("repair-started") > restarts, timeout=60)
        time.sleep(2 * drill.cluster.settings.repair_interval + 1)  # passes more: nothing is posted twice
        said = texts()
        kinds = [re.search(r": (health-finding|repair-[a-z]+): ", t).group(1) for t in said]
        # the dry run ends at once and the drain it left recommends a new repair: one post per store event
        store = open_store(config_mod.load(layout.slurm_ext_conf))
        try:
            recorded = [e.event for e in store.events(node=node, since=started)]
        finally:
            store.close()
        assert kinds.count("health-finding") == 1 and kinds.count("repair-approved") == 1, said
        assert kinds.count("repair-recommended") == recorded.count("repair-recommended") >= 1, (said, recorded)
        assert set(kinds) == {"health-finding", "repair-approved", "repair-recommended"}, said
        finding = next(t for t in said if "health-finding" in t)
        assert finding.startswith(f"slurm-ext critical: node {node}: health-finding: critical: gpu-lost gpu 1"), said
        if form == "alertmanager":
            keys = [a["labels"]["slurm_ext_key"] for b in hook.bodies for a in b]
            assert len(set(keys)) == len(keys) == len(said), keys  # each its own alert: none grouped away
    finally:
        layout.slurm_ext_conf.write_text(config)
        os.kill(_controller_pid(layout), signal.SIGHUP)
        hook.shutdown()
        hook.server_close()


#: the webhook URL's path: its secret, never to be in the journal or a log
_SECRET = "/hooks/T0KEN-SECRET"


@pytest.mark.parametrize("down", ["refused", "never-answers", "not-http"])
def test_a_webhook_that_is_down_costs_retries_and_a_counted_drop_while_the_repair_completes(drill, tmp_path, down):
    layout, node, settings = drill.layout, drill.cluster.node, drill.cluster.settings
    webhook = contextlib.ExitStack()
    if down == "not-http":  # every connection answered with an SSH server's greeting
        port = webhook.enter_context(not_http(b"SSH-2.0-OpenSSH_9.2\r\n"))
    else:
        listener = webhook.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if down == "refused":
            listener.close()  # nothing listens: every post is refused
        else:
            listener.listen(16)  # connections wait in the kernel's queue, never accepted: every post times out
    url_file = tmp_path / "webhook-url"
    url_file.write_text(f"http://127.0.0.1:{port}{_SECRET}\n")
    url_file.chmod(0o600)
    config = layout.slurm_ext_conf.read_text()
    keys = (f'notify_url_file = "{url_file}"\nnotify_retries = 2\nnotify_backoff = "200ms"\nnotify_timeout = "1s"\n'
            "dry_run = true\n")
    controller = f"http://127.0.0.1:{settings.controller_probe_port}"
    try:
        layout.slurm_ext_conf.write_text(config.replace("[repair]\n", "[repair]\n" + keys, 1))
        os.kill(_controller_pid(layout), signal.SIGHUP)
        drill.wait_event("repair-notify-started", timeout=30)
        drill.gpus(gpu1={"lost": True})
        record = wait_for("the recommendation", lambda: next((r for r in _records(drill) if r["node"] == node and
                                                              r["state"] == "recommended"), None), timeout=60,
                          interval=0.5)
        approved = drill.cli("repair", "approve", node, check=False)
        assert approved.returncode == 0, approved.stderr
        wait_for("the repair done", lambda: drill.events("repair-done", node=node), timeout=60, interval=0.3)
        failed = drill.wait_event("repair-notify-failed", timeout=60)
        assert "3 tries" in failed["message"] and str(port) not in failed["message"]
        assert _get(f"{controller}/livez")[0] == 200

        def dropped():
            text = _get(f"{controller}/metrics")[1]
            found = re.search(r'^slurm_ext_repair_notify_dropped_total\{why="failed"\} (\S+)$', text, re.M)
            retried = re.search(r"^slurm_ext_repair_notify_retries_total (\S+)$", text, re.M)
            return found and float(found.group(1)) >= 1 and retried and float(retried.group(1)) >= 2
        wait_for("the drop counted on the controller's /metrics", dropped, timeout=30, interval=0.5)
        assert record["action"] == "reboot"
        # the URL's secret path is in no journal and no log of the cluster's
        read = [path for path in [*layout.log.rglob("*"), *layout.root.rglob("*.jsonl")] if path.is_file()]
        assert any(path.name == "journal.jsonl" for path in read) and any(path.suffix == ".log" for path in read)
        said = [path for path in read if "T0KEN" in path.read_text(errors="replace")]
        assert said == [], said
    finally:
        layout.slurm_ext_conf.write_text(config)
        os.kill(_controller_pid(layout), signal.SIGHUP)
        webhook.close()


def _records(drill) -> list[dict]:
    done = drill.cli("repair", "list", "--json", check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["records"]

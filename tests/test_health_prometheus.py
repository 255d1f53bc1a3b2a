"""The health metrics through a real Prometheus, and the Grafana dashboard's queries against it.

A worker-role agent (no slurmd, no hooks, no Slurm: slurm.conf does not exist) runs its `health` worker on 8 fake
GPUs; Debian's /usr/bin/prometheus, started here as a child on 127.0.0.1 with its own TSDB in tmp_path, scrapes the
agent's /metrics every second. Then every query of docs/grafana/slurm-ext-health.json, with its variables filled in
as Grafana would, must be valid PromQL that returns data on this healthy node.

The README's test command installs the `prometheus` package (apt-get); without it this test fails, never skips.
Nothing outlives the test: Prometheus is stopped by its PID, the agent stops its health worker, and a health worker
left behind (an agent that had to be killed) is stopped by the PID the agent logged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from slurm_ext.devcluster import fakenvml

from helpers import prometheus as prometheus_server
from helpers.agent import health_only_worker
from helpers.prometheus import PROMETHEUS, free_port
from helpers.prometheus import get as _get
from helpers.prometheus import reachable as _reachable
from helpers.wait import wait_for

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "slurm-ext-health.json"
#: ports of their own: the session cluster, other tests and benchmarks use 13307, 16817-16819, 17817+, 19810-19812
AGENT_PORTS = range(29810, 29860)
GPUS = 8
#: conftest's AgentProcess names the node so
NODE = "testnode"
#: the labels dcgm-exporter's dashboards select on (an empty hpc_job is no label at all in Prometheus)
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"}
#: what the dashboard must show (the brief of docs/grafana/slurm-ext-health.json)
DASHBOARD_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "slurm_ext_health_xid_errors_total", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "slurm_ext_health_nvlink_active_links", "slurm_ext_health_check_state", "slurm_ext_health_findings",
    "slurm_ext_health_monitor_up",
}

def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _stop_pid(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace`: for a process that is not our child (no waitpid)."""
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)


@pytest.fixture
def prometheus_binary() -> Path:
    if not PROMETHEUS.is_file() or not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} is missing: this test runs Debian's Prometheus server; install its package with "
                    "`apt-get install -y prometheus` (the README's test command does)", pytrace=False)
    return PROMETHEUS


@pytest.fixture
def fake_gpus(tmp_path) -> tuple[Path, dict]:
    """The fake NVML with 8 healthy GPUs, GPU i at 30+i C: (library, spec file, spec)."""
    lib = fakenvml.build(tmp_path / "lib")
    spec = fakenvml.default_gpus(GPUS)
    for index, gpu in enumerate(spec["gpus"]):
        gpu["temperature"] = 30 + index
        gpu["utilization_gpu"] = 5 * index
    path = tmp_path / "gpus.json"
    fakenvml.write_spec(path, spec)
    return lib, path, spec


@pytest.fixture
def worker_agent(prometheus_binary, fake_gpus, agents, tmp_path, monkeypatch):
    """A worker-role agent whose only worker is the health monitor, on the fake GPUs, with /metrics on a port of
    its own; stopped (workers and all) at the end, whatever the test did."""
    lib, spec_path, _ = fake_gpus
    # the agent's environment is its workers': the health worker loads the fake NVML (set before the Popen; the
    # dynamic loader of this process never rereads LD_LIBRARY_PATH)
    for name, value in fakenvml.environ(lib.parent, spec_path).items():
        monkeypatch.setenv(name, value)
    port = free_port(AGENT_PORTS)
    agent = agents(health_only_worker(port, tmp_path, "1s"), role="worker", port=port,
                   slurm=f'conf = "{tmp_path}/no-such-slurm.conf"')
    try:
        yield agent
    finally:
        monitors = [event["pid"] for event in agent.events("worker-state", worker="health", state="running")]
        if agent.proc.poll() is None:
            try:
                agent.stop(20)
            except (subprocess.TimeoutExpired, OSError):
                pass  # the agents fixture kills it
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait(10)
        # a health worker the agent could not stop (it was killed): ours by its environment, then stopped by PID
        mark = f"{fakenvml.SPEC_ENV}={spec_path}".encode()
        for pid in monitors:
            try:
                ours = mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if ours and _alive(pid):
                _stop_pid(pid)


@pytest.fixture
def prometheus(prometheus_binary, tmp_path):
    """start(target) -> base URL: Prometheus on 127.0.0.1 scraping `target` every second; stopped by its PID."""
    started: list[prometheus_server.Server] = []

    def start(target: str) -> str:
        started.append(prometheus_server.start(tmp_path, "slurm-ext-worker", [target], binary=prometheus_binary))
        return started[-1].base

    yield start
    for server in started:
        server.stop()


def _query(base: str, expr: str) -> list[dict]:
    status, body = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    assert status == 200 and answer.get("status") == "success", f"{expr!r}: HTTP {status}: {body[:500]}"
    assert answer["data"]["resultType"] in ("vector", "scalar"), (expr, answer["data"]["resultType"])
    result = answer["data"]["result"]
    return result if answer["data"]["resultType"] == "vector" else [{"metric": {}, "value": result}]


def _fill(expr: str, values: dict[str, str]) -> str:
    """The query as Grafana sends it: $name, ${name} and [[name]] replaced by the variable's value."""
    for name, value in values.items():
        expr = re.sub(rf"\$\{{{name}(?::\w+)?\}}|\$\b{name}\b|\[\[{name}\]\]", lambda _: value, expr)
    return expr


def _dashboard_targets(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows' nested panels included."""
    found = []

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels") or ())
            if panel.get("type") == "row":
                continue
            targets = panel.get("targets") or []
            assert targets, f"panel {panel.get('title')!r} has no queries"
            for target in targets:
                assert target.get("expr"), f"panel {panel.get('title')!r}: a target without expr: {target}"
                found.append((panel["title"], target["expr"]))

    walk(dashboard["panels"])
    return found


def test_dashboard_is_grafana_json_with_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name, label in (("hostname", "hostname"), ("gpu", "gpu")):
        definition = variables[name]["query"]["query"] if isinstance(variables[name]["query"], dict) \
            else variables[name]["query"]
        assert re.fullmatch(rf"label_values\(DCGM_FI_DEV_GPU_TEMP(\{{[^}}]*\}})?, {label}\)", definition), definition
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {p["type"] for p in panels} <= {"timeseries", "stat", "table"}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    exprs = " ".join(expr for _, expr in _dashboard_targets(dashboard))
    assert DASHBOARD_METRICS <= set(re.findall(r"\b(?:DCGM_FI_DEV_\w+|slurm_ext_health_\w+)\b", exprs)), \
        DASHBOARD_METRICS - set(re.findall(r"\b\w+\b", exprs))
    assert re.search(r"rate\(DCGM_FI_DEV_PCIE_REPLAY_COUNTER\{[^}]*\}\[\w+\]\)", exprs)
    assert re.search(r"increase\(slurm_ext_health_xid_errors_total\{[^}]*\}\[\w+\]\)", exprs)


def test_prometheus_scrapes_the_health_metrics_and_every_dashboard_query_returns_data(worker_agent, fake_gpus,
                                                                                      prometheus):
    agent = worker_agent
    _, _, spec = fake_gpus
    started = time.monotonic()

    def metrics_served():
        if agent.proc.poll() is not None:
            raise AssertionError(f"the agent exited with {agent.proc.returncode}:\n{agent.text()[-3000:]}")
        answer = _reachable(f"http://127.0.0.1:{agent.port}/metrics")
        return answer is not None and answer[0] == 200 and "\nDCGM_FI_DEV_GPU_TEMP{" in answer[1]

    try:
        wait_for("DCGM_FI_DEV_GPU_TEMP on the agent's /metrics", metrics_served, timeout=60, interval=0.2)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{agent.text()[-3000:]}") from None

    base = prometheus(f"127.0.0.1:{agent.port}")

    def target_up():
        status, body = _get(f"{base}/api/v1/targets")
        active = json.loads(body)["data"]["activeTargets"] if status == 200 else []
        return active and all(t["health"] == "up" for t in active) and active

    try:
        [target] = wait_for("the agent's target up in Prometheus", target_up, timeout=30, interval=0.2)
    except AssertionError as err:
        raise AssertionError(f"{err}: {_get(f'{base}/api/v1/targets')[1][:2000]}") from None
    assert target["scrapeUrl"] == f"http://127.0.0.1:{agent.port}/metrics"

    # the GPUs, with dcgm-exporter's labels and the fake's readings
    series = wait_for("8 series of DCGM_FI_DEV_GPU_TEMP in Prometheus",
                      lambda: (lambda r: r if len(r) == GPUS else None)(_query(base, "DCGM_FI_DEV_GPU_TEMP")),
                      timeout=15, interval=0.2)
    by_gpu = {s["metric"].get("gpu"): s for s in series}
    assert sorted(by_gpu, key=int) == [str(i) for i in range(GPUS)]
    for index, gpu in enumerate(spec["gpus"]):
        labels = by_gpu[str(index)]["metric"]
        assert GPU_LABELS <= set(labels), labels
        assert (labels["UUID"], labels["pci_bus_id"], labels["device"], labels["modelName"], labels["hostname"]) \
            == (gpu["uuid"], gpu["pci_bus_id"], f"nvidia{gpu['minor']}", gpu["name"], NODE), labels
        assert labels["job"] == "slurm-ext-worker" and labels["instance"] == f"127.0.0.1:{agent.port}"
        assert float(by_gpu[str(index)]["value"][1]) == 30 + index

    # the dashboard's variables, as Grafana's label_values() asks Prometheus
    def label_values(label: str, match: str) -> list[str]:
        status, body = _get(f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match}))
        assert status == 200, body
        return json.loads(body)["data"]

    assert label_values("hostname", "DCGM_FI_DEV_GPU_TEMP") == [NODE]
    assert sorted(label_values("gpu", 'DCGM_FI_DEV_GPU_TEMP{hostname=~".*"}'), key=int) == \
        [str(i) for i in range(GPUS)]

    # every query of every panel: valid PromQL with data on this healthy node, for "All" and for chosen values
    # (Grafana sends a multi-value regex variable as (a|b)); rate() and increase() need two scrapes in their window
    targets = _dashboard_targets(json.loads(DASHBOARD.read_text()))
    assert len(targets) >= 15
    choices = {"all": {"hostname": ".*", "gpu": ".*"}, "chosen": {"hostname": NODE, "gpu": "(0|3)"}}
    queries = [(name, title, _fill(expr, values)) for name, values in choices.items() for title, expr in targets]
    for name, title, expr in queries:
        assert "$" not in expr and "[[" not in expr, f"{title!r}: a Grafana variable left in {expr!r}"
    empty: list[str] = []
    deadline = time.monotonic() + 20
    while True:
        empty = [f"{title!r} ({name}): {expr}" for name, title, expr in queries if not _query(base, expr)]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not empty, "dashboard queries without data on a healthy node:\n" + "\n".join(empty)

    # the chosen GPUs only
    chosen = _query(base, _fill(next(e for t, e in targets if t == "GPU and memory temperature"),
                                choices["chosen"]))
    assert {s["metric"].get("gpu") for s in chosen if s["metric"].get("gpu")} == {"0", "3"}
    print(f"health metrics through Prometheus: {len(targets)} dashboard queries, all with data, "
          f"{time.monotonic() - started:.1f}s after the agent started")

    # the cluster page's usage panels, asked of this Prometheus (web.prometheus_url): the fake GPUs' numbers and the
    # agent's interface counters (lo, watched) as a rate
    from slurm_ext.agentapi import get_text
    from slurm_ext.web import usage
    figures = wait_for("the page's figures from Prometheus", lambda: (lambda u: u if u.tx_bps is not None else None)(
        usage.prometheus_usage(base, lambda url: get_text(url, 5.0))), timeout=30, interval=0.5)
    total_mib = sum(gpu["memory_total"] for gpu in spec["gpus"]) / 2**20
    assert (figures.gpus, figures.gpu_utilization, figures.memory_used_mib, figures.memory_total_mib) == \
        (GPUS, sum(5 * i for i in range(GPUS)) / GPUS, 0.0, total_mib), figures  # idle: nothing beyond the reserve
    assert figures.rx_bps >= 0 and figures.tx_bps >= 0

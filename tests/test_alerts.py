"""The shipped alerting rules (docs/prometheus/slurm-ext.rules.yml): valid for Prometheus's own checker, and every
metric they name one the agents serve. The real Prometheus firing them on a dev cluster is test_alerts_cluster.py.

promtool comes with Debian's prometheus package, which the README's test command installs; without it this test
fails, never skips."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from test_docs import metrics_in_code

RULES = Path(__file__).resolve().parents[1] / "docs" / "prometheus" / "slurm-ext.rules.yml"
PROMTOOL = Path("/usr/bin/promtool")
METRICS_DOC = RULES.parents[1] / "reference" / "metrics.md"
#: what the issue asks alerts for, by the metric each rests on
WANTED = {"slurm_ext_nodestate_drained", "slurm_ext_repair_awaiting_approval_seconds",
          "slurm_ext_health_xid_errors_total", "slurm_ext_health_monitor_up", "slurm_ext_accounting_dbd_queue",
          "slurm_ext_accounting_missing_jobs", "slurm_ext_supervisor_worker_up"}
#: PromQL's own words that look like metric names
_PROMQL = {"sum", "by", "without", "increase", "rate", "delta", "deriv", "and", "or", "unless", "on", "ignoring",
           "max", "min", "avg", "count", "abs", "absent", "time", "bool"}
#: the series Prometheus itself writes for each target it scrapes
PROMETHEUS_OWN = {"up"}


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def metrics_of(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers outside label matchers, ranges and strings."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    return {name for name in re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*\b", bare)
            if name not in _PROMQL and not name.isdigit()}


def test_promtool_checks_the_shipped_rules():
    if not PROMTOOL.is_file():
        pytest.fail(f"{PROMTOOL} is missing: it comes with Debian's prometheus package (`apt-get install -y "
                    "prometheus`, the README's test command does)", pytrace=False)
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def served_metrics() -> set[str]:
    """The names the code serves: literal ones, and those made by an f-string that docs/reference/metrics.md lists
    (test_docs holds that table to the code both ways)."""
    names, patterns = metrics_in_code()
    documented = set(re.findall(r"^\| `([A-Za-z_]+)` \|", METRICS_DOC.read_text(), flags=re.M))
    return names | {name for name in documented if any(p.fullmatch(name) for p in patterns)}


def test_every_metric_a_rule_names_is_one_the_agents_serve_and_each_wanted_alert_is_there():
    served = served_metrics()
    named = {}
    for rule in rules():
        assert rule["alert"].startswith("SlurmExt") and rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        found = metrics_of(rule["expr"])
        assert found, f"{rule['alert']}: no metric in {rule['expr']!r}"
        named[rule["alert"]] = found
    unknown = {alert: sorted(names - served - PROMETHEUS_OWN) for alert, names in named.items()
               if names - served - PROMETHEUS_OWN}
    assert not unknown, f"rules name metrics no agent serves: {unknown}"
    assert WANTED <= set().union(*named.values()), WANTED - set().union(*named.values())
    assert metrics_of(next(r["expr"] for r in rules() if r["alert"] == "SlurmExtAgentDown")) == {"up"}


def test_the_metric_check_catches_a_rule_on_a_metric_that_does_not_exist():
    served = served_metrics()
    assert metrics_of('sum by (hostname) (increase(slurm_ext_health_xid_error_total{xid="79"}[5m])) > 0') \
        - served == {"slurm_ext_health_xid_error_total"}
    assert metrics_of("slurm_ext_accounting_dbd_queue > 0 and delta(slurm_ext_accounting_dbd_queue[10m]) > 0") \
        == {"slurm_ext_accounting_dbd_queue"}


def test_the_drained_gauge_says_whose_drain_it_is_and_nothing_for_an_admins():
    from slurm_ext.nodestate.metrics import drain_owner, drained_families
    from slurm_ext.slurm import Node
    drained = frozenset({"DRAIN"})
    cases = [
        (Node("n1", "IDLE", drained, "slurm-ext: xid 79 gpu 1 GPU has fallen off the bus action=reboot"), "health/xid"),
        (Node("n1", "IDLE", drained, "slurm-ext: repair reboot: xid/79 by alice"), "repair"),
        (Node("n1", "DOWN", frozenset(), "slurm-ext: slurmd crash loop: 5 exits in 10s"), "crash-loop/slurmd"),
        (Node("n1", "IDLE", drained, "slurm-ext: something an older slurm-ext wrote"), "slurm-ext"),
        (Node("n1", "IDLE", drained, "maintenance"), ""),  # an admin's: not ours to alert on
        (Node("n1", "IDLE", frozenset(), "slurm-ext: xid 79 gpu 1 x action=reboot"), ""),  # resumed, reason left
    ]
    for node, owner in cases:
        assert drain_owner(node) == owner, (node.reason, owner)
    [family] = drained_families(cases[0][0], "n1")
    [sample] = family.samples
    assert (sample.labels, sample.value) == ({"hostname": "n1", "owner": "health/xid"}, 1)
    [family] = drained_families(cases[4][0], "n1")
    assert [(s.labels["owner"], s.value) for s in family.samples] == [("", 0)]
    [family] = drained_families(None, "n1")  # before the owner's first look: no sample rather than a guess
    assert family.samples == []


def _promtool_test(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    """`promtool test rules`: Prometheus's own rule evaluator over the given series, against the shipped file."""
    if not PROMTOOL.is_file():
        pytest.fail(f"{PROMTOOL} is missing: it comes with Debian's prometheus package", pytrace=False)
    path = tmp_path / "rules-test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([str(PROMTOOL), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


def _annotations(alert: str, labels: dict) -> dict:
    """The rule's annotations as Prometheus fills them for `labels` (the templates use only $labels)."""
    [rule] = [r for r in rules() if r["alert"] == alert]
    return {key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
            for key, text in rule["annotations"].items()}


def test_an_agent_that_does_not_answer_and_a_monitor_that_never_wrote_readings_fire(tmp_path):
    """Neither has a slurm_ext_health_monitor_up series for SlurmExtHealthMonitorDown to see at 0: the agent down is
    Prometheus's own up == 0, the monitor that never wrote is a health worker without readings."""
    down = {"job": "slurm-ext", "instance": "n1:9100"}
    silent = {"job": "slurm-ext", "instance": "n2:9100", "role": "worker", "worker": "health"}
    healthy = {"job": "slurm-ext", "instance": "n3:9100", "role": "worker", "worker": "health"}

    def series(name, labels, values):
        return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}
    inputs = [series("up", down, "0x20"), series("up", {"job": "slurm-ext", "instance": "n2:9100"}, "1x20"),
              series("slurm_ext_supervisor_worker_up", silent, "1x20"),
              series("slurm_ext_supervisor_worker_up", healthy, "1x20"),
              series("slurm_ext_health_monitor_up", {"job": "slurm-ext", "instance": "n3:9100", "hostname": "n3"},
                     "1x20")]
    agent_down = {**down, "severity": "critical"}
    never_wrote = {**silent, "severity": "critical"}
    done = _promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "3m", "alertname": "SlurmExtAgentDown", "exp_alerts": []},  # for: 5m
        {"eval_time": "6m", "alertname": "SlurmExtAgentDown", "exp_alerts": [
            {"exp_labels": agent_down, "exp_annotations": _annotations("SlurmExtAgentDown", agent_down)}]},
        {"eval_time": "15m", "alertname": "SlurmExtHealthMonitorAbsent", "exp_alerts": [
            {"exp_labels": never_wrote,
             "exp_annotations": _annotations("SlurmExtHealthMonitorAbsent", never_wrote)}]},
        {"eval_time": "15m", "alertname": "SlurmExtHealthMonitorDown", "exp_alerts": []},  # it has no series
    ]}])
    assert done.returncode == 0, done.stdout + done.stderr

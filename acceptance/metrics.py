"""The node's last acceptance run as Prometheus metric families, for the node agent's /metrics (acceptance.plugin).

Imported at the first scrape; read from the run's file at each scrape, so a run by hand (`accept
run`) shows as one the agent ran.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from slurm_ext.errors import SlurmExtError

from .records import ERROR, FAIL, PASS
from .runner import last_run

__all__ = ["families", "OUTCOME_VALUES"]

#: an outcome as a number: 0 pass, 1 fail, -1 could not run (a dashboard alerts on 1, not on a missing library)
OUTCOME_VALUES = {PASS: 0, FAIL: 1, ERROR: -1}


def families(state_dir: str):
    try:
        run = last_run(state_dir)
    except SlurmExtError:
        run = None
    if run is None:
        return ()
    verdict = GaugeMetricFamily("slurm_ext_acceptance_verdict", "The node's last acceptance run: 0 pass, 1 fail "
                                "(measured bad: drained), -1 a test could not run.", labels=["level", "trigger"])
    verdict.add_metric([run.level, run.trigger], OUTCOME_VALUES[run.verdict])
    when = GaugeMetricFamily("slurm_ext_acceptance_last_run_timestamp_seconds", "When the node's last acceptance run "
                             "ended (Unix time).", labels=["level", "trigger"])
    when.add_metric([run.level, run.trigger], run.finished)
    outcome = GaugeMetricFamily("slurm_ext_acceptance_test_outcome", "Each test's outcome in the last run: 0 pass, "
                                "1 fail, -1 could not run.", labels=["test", "target"])
    figure = GaugeMetricFamily("slurm_ext_acceptance_figure", "A test's measured figure in the last run (its unit in "
                               "the label).", labels=["test", "target", "figure", "unit"])
    limit = GaugeMetricFamily("slurm_ext_acceptance_limit", "The limit a figure was judged by.",
                              labels=["test", "target", "figure", "unit"])
    for result in run.results:
        outcome.add_metric([result.test, result.target], OUTCOME_VALUES[result.outcome])
        for item in result.figures:
            labels = [result.test, result.target, item.name, item.unit]
            figure.add_metric(labels, item.value)
            if item.limit is not None:
                limit.add_metric(labels, item.limit)
    return (verdict, when, outcome, figure, limit)

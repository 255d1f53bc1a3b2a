"""Every node in one of five states: `slurm-ext status`.

From one Slurm query for the whole cluster and one read of the repair
records, never a query per node:
- booting: Slurm is rebooting it, or a repair waits for it to come back;
- paused: drained or down by an admin or another tool (its reason is not
  ours): slurm-ext leaves it alone; its agent's critical findings are
  shown as held behind that drain (`held_findings` asks the paused nodes'
  agents only: an admin's resume would otherwise put a faulty GPU back);
- pending: a repair is recommended and awaits an operator;
- unhealthy: drained with our reason (a health finding, a repair under way
  or failed), or not answering Slurm;
- healthy: the rest.

`with_agents` adds what every node's agent says, as the cluster page shows
it: its open findings, warnings that drain nothing included, beside what its
drain states, each once, and its last acceptance run (verdict, level, trigger,
when). It reads what the controller's collector took (`taken_lately`: each
node's /health within a few intervals, its journal's last acceptance-done),
so that `status` at 10,000 nodes asks no agent; an agent the collector does
not cover is asked itself (/health, then /acceptance). `warnings` says what
the page's banners say: node agents that do not answer, repairs paused.
`acceptance_state` says whether acceptance is on for the cluster (the
controller's [acceptance] enabled), why it is off in the setting's own words,
and the offer of `accept cluster` while it stands.
"""

from __future__ import annotations

import dataclasses
import json
import re

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurm_ext.agentapi import AgentAnswerError, AgentClient
from slurm_ext.config import section_class
from slurm_ext.nodestate.catalogue import HEALTH
from slurm_ext.slurm import Node, is_our_reason
from slurm_ext.words import counted, moment

from .flow import REBOOT_FLAGS
from .recommend import fault_of
from .store import IN_PROGRESS, Event, Record

__all__ = ["STATES", "NodeStatus", "classify", "node_statuses", "counts", "held", "held_findings", "finding_lines",
           "with_agents", "Taken", "taken_lately", "done_summary", "warnings", "run_summary", "acceptance_line",
           "acceptance_state", "OFFER"]

STATES = ("healthy", "booting", "unhealthy", "pending", "paused")
#: Slurm's flags of a node on its way back (a reboot asked or under way, a node powering up)
_REBOOTING = REBOOT_FLAGS | {"POWERING_UP"}
#: what the offer of `accept cluster` says (acceptance.offer.OFFER, which a test holds to this: acceptance is on
#: this floor, read, not imported)
OFFER = ("acceptance is on: nodes are tested at their next start; run `slurm-ext accept cluster` once to test the "
         "nodes running now")
#: failures and errors a run's summary names, of each
_SUMMARY_NAMED = 3


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    state: str
    #: Slurm's own words: IDLE+DRAIN, ALLOCATED, ...
    slurm_state: str
    reason: str
    #: who owns the reason: slurm-ext, or the user Slurm names (an admin, another tool)
    reason_owner: str
    gpus: str
    gpus_used: int
    #: open findings as the node's drain states them (`signature: evidence`); with_agents: its agent's open
    #: findings (`severity: check gpu N evidence`) and what the drain states that no finding says
    findings: list = field(default_factory=list)
    #: the node's repair: recommended, approved, running (step), failed, rejected
    repair: str = ""
    #: its latest repair events, newest last
    events: list = field(default_factory=list)
    #: paused: the critical findings its agent holds behind someone else's drain, as our drain would state them
    held: list = field(default_factory=list)
    #: its last acceptance run (run_summary: verdict, level, trigger, finished, what failed), None when none is known
    acceptance: dict | None = None


def classify(node: Node, record: Record | None) -> str:
    drained = node.drained or node.state == "DOWN"
    if node.flags & _REBOOTING or record is not None and record.state in IN_PROGRESS and \
            record.step in ("wait-boot", "verify"):
        return "booting"
    if drained and node.reason and not is_our_reason(node.reason):
        return "paused"
    if record is not None and record.state == "recommended":
        return "pending"
    if drained or not node.responding or node.state in ("UNKNOWN", "ERROR"):
        return "unhealthy"
    return "healthy"


def node_statuses(nodes: list[Node], records: list[Record], events: list[Event], per_node: int = 3
                  ) -> list[NodeStatus]:
    """Each node's status. `records`: the open ones; `events`: recent repair events (any order)."""
    live = {r.node: r for r in records}
    recent: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: e.time):
        recent.setdefault(event.node, []).append(event)
    statuses = []
    for node in nodes:
        record = live.get(node.name)
        fault = fault_of(node)
        owner = "slurm-ext" if is_our_reason(node.reason) else (node.reason_user or ("?" if node.reason else ""))
        repair = ""
        if record is not None:
            repair = record.state + (f" ({record.step})" if record.step and record.state == "running" else "")
        statuses.append(NodeStatus(
            node.name, classify(node, record), "+".join([node.state, *sorted(node.flags)]), node.reason, owner,
            node.gres, node.gpus_used, [f"{fault.signature}: {fault.evidence}"] if fault else [], repair,
            [f"{e.event}: {e.message}" for e in recent.get(node.name, [])[-per_node:]]))
    return statuses


def held(findings) -> list[str]:
    """The critical findings of an agent's answer, as our drain reason would state them."""
    return [HEALTH.format(check=str(f.get("check")), evidence=str(f.get("evidence")), action=str(f.get("action")))
            for f in findings or () if isinstance(f, dict) and f.get("severity") == "critical"]


def held_findings(statuses: list[NodeStatus], nodes: list[Node], agents: AgentClient, timeout: float = 3.0
                  ) -> list[NodeStatus]:
    """`statuses` with each paused node's held findings, from its agent's /health (asked at once, paused nodes
    only); an agent that does not answer is said as such."""
    from concurrent.futures import ThreadPoolExecutor

    addrs = {n.name: n.addr for n in nodes}
    paused = [s for s in statuses if s.state == "paused"]
    if not paused:
        return statuses

    def ask(status: NodeStatus) -> list[str]:
        try:
            answer = agents.health(status.name, addrs[status.name], timeout)
        except AgentAnswerError as err:
            return [f"unknown: {err}"]
        return held(answer.monitor.findings if answer.monitor else ())
    with ThreadPoolExecutor(max_workers=min(16, len(paused))) as pool:
        found = dict(zip((s.name for s in paused), pool.map(ask, paused)))
    return [replace(s, held=found[s.name]) if s.name in found else s for s in statuses]


def finding_lines(drained: list[str], findings) -> list[str]:
    """A node's faults, each once, as `status` and the page's findings cell list them: its agent's open findings
    (severity, check, GPU, evidence; the GPU not said twice where the evidence names it: `critical: xid 79 gpu 1 GPU
    has fallen off the bus`), then what its drain states (`signature: evidence`) only where no finding says it
    already (the drain is written from the finding: listing both showed one Xid twice), and no line twice."""
    lines: list[str] = []
    told = []
    for found in findings or ():
        if not isinstance(found, dict):
            continue
        gpu, evidence = found.get("gpu"), str(found.get("evidence", ""))
        where = "" if gpu is None or re.search(rf"\bgpu {re.escape(str(gpu))}\b", evidence) else f"gpu {gpu} "
        lines.append(f"{found.get('severity')}: {found.get('check')} {where}{evidence}".rstrip())
        told.append((str(found.get("check", "")), evidence))
    for line in drained:
        signature, _, evidence = line.partition(": ")
        check = signature.split("/", 1)[0]
        if any(check == c and evidence and (e.startswith(evidence) or evidence.startswith(e)) for c, e in told):
            continue
        lines.append(line)
    return list(dict.fromkeys(lines))


def run_summary(run: dict | None) -> dict | None:
    """A node's acceptance run (acceptance.records.Run.to_json, as agentapi checked it) as `status` and the page's
    node row show it: verdict, level, trigger, profile, when it ended, and the tests that failed or could not run
    (`test target: message`, the first few); None for no run."""
    if not run:
        return None

    def named(outcome: str) -> list[str]:
        found = [f"{r['test']} {r['target']}".strip() + f": {r['message']}" for r in run["results"]
                 if r["outcome"] == outcome]
        return found[:_SUMMARY_NAMED] + ([f"+{len(found) - _SUMMARY_NAMED} more"] if len(found) > _SUMMARY_NAMED
                                         else [])
    return {"verdict": run["verdict"], "level": run["level"], "trigger": run["trigger"], "profile": run["profile"],
            "finished": run["finished"] or run["started"], "tests": len(run["results"]),
            "failed": named("fail"), "errors": named("error")}


def acceptance_line(summary: dict | None) -> str:
    """`acceptance fail (quick, start) 2026-12-05T09:00:00+00:00: gpu-memory gpu 1: ...`, or "" for no run."""
    if not summary:
        return ""
    line = (f"acceptance {summary['verdict']} ({summary['level']}, {summary['trigger']}) "
            f"{moment(summary['finished'])}")
    worst = summary["failed"] or summary["errors"]
    return line + (f": {'; '.join(worst)}" if worst else "")


def with_agents(statuses: list[NodeStatus], nodes: list[Node], agents: AgentClient, timeout: float = 3.0,
                taken: Taken | None = None) -> tuple[list[NodeStatus], dict[str, str]]:
    """`statuses` with what every node's agent says: its open findings beside its drain's (finding_lines), for a
    paused node the critical ones held behind that drain, and its last acceptance run; and node -> why its agent
    gave no answer. Where the collector took a node's /health lately (`taken`), that answer and its journal's
    newest acceptance-done say it, and a node whose agent it cannot reach is said so from its record: at 10,000
    nodes `status` asks no agent. The other nodes' agents are asked at once, as the page asks them (/health, then
    /acceptance: an agent that does not serve it, one older than it, says no run)."""
    from concurrent.futures import ThreadPoolExecutor

    taken = taken or Taken()
    addrs = {n.name: n.addr for n in nodes}

    def ask(status: NodeStatus) -> tuple[tuple, str, dict | None]:
        addr = addrs.get(status.name, "")
        try:
            answer = agents.health(status.name, addr, timeout)
        except AgentAnswerError as err:
            return (), str(err), None
        try:
            run = agents.acceptance(status.name, addr, timeout=timeout).run
        except AgentAnswerError:
            run = None  # its health stands; a run it cannot say is not known (`accept show` on the node says why)
        return (answer.monitor.findings if answer.monitor else ()), "", run_summary(run)
    answers, asked = {}, []
    for status in statuses:
        if status.name in taken.findings:
            answers[status.name] = (taken.findings[status.name], "", taken.accepted.get(status.name))
        elif status.name in taken.unreachable:
            answers[status.name] = ((), taken.unreachable[status.name], None)
        else:
            asked.append(status)
    if asked:
        with ThreadPoolExecutor(max_workers=min(16, len(asked))) as pool:
            answers.update(zip((s.name for s in asked), pool.map(ask, asked)))
    told, unreachable = [], {}
    for status in statuses:
        findings, error, accepted = answers[status.name]
        if error:
            unreachable[status.name] = error
        paused = status.state == "paused"
        if not (findings or status.findings or paused or accepted):  # nothing to add: most nodes, at 10,000
            told.append(status)
            continue
        told.append(replace(status, findings=finding_lines(status.findings, findings),
                            held=([f"unknown: {error}"] if error else held(findings)) if paused else [],
                            acceptance=accepted))
    return told, unreachable


@dataclass
class Taken:
    """What the collector took of the nodes lately (`taken_lately`): the open findings of their /health answers,
    their journals' newest acceptance runs, and why it could not reach the others."""

    findings: dict = field(default_factory=dict)
    accepted: dict = field(default_factory=dict)
    unreachable: dict = field(default_factory=dict)


def taken_lately(store, config, now: float) -> Taken:
    """What the collector took within 3 of its intervals (the interval its control row says): the nodes it covers
    need no question of their own, and a node whose agent it failed to reach is said so from its record. Empty
    without a collector (history.enabled false, or none said it ran lately): every agent is then asked, as before
    the collector. A few queries, whatever the number of nodes.

    Raises:
        StoreError: the repair database cannot be read."""
    from . import nodeevents
    from .collector import CONTROL, LATE, running
    settings = config.history  # its retention: how far back a node's last acceptance run is looked for
    interval = running(store.control(CONTROL), now)
    if not interval:
        return Taken()
    findings = nodeevents.findings(store, now - LATE * interval)
    # an agent the collector failed to reach after its last answer: that answer is not what the node says now
    unreachable = {name: f"the collector cannot reach its agent since {moment(cursor.failing_since)}: {cursor.error}"
                   for name, cursor in nodeevents.failing(store).items()}
    findings = {name: found for name, found in findings.items() if name not in unreachable}
    accepted = {name: done_summary(found.time, found.data())
                for name, found in nodeevents.newest_runs(store, now - settings.keep).items()}
    return Taken(findings, accepted, unreachable)


def done_summary(finished: float, data: dict) -> dict:
    """An acceptance-done event as run_summary says a run (the names of what failed, not their messages: the event's
    own message has them), for a node whose run is known from its journal."""
    def texts(key: str) -> list[str]:
        found = data.get(key)
        return [str(item) for item in found[:4]] if isinstance(found, list) else []
    results = data.get("results")
    return {"verdict": str(data.get("verdict", "")), "level": str(data.get("level", "")),
            "trigger": str(data.get("trigger", "")), "profile": str(data.get("profile", "")), "finished": finished,
            "tests": len(results) if isinstance(results, list) else 0, "failed": texts("failed"),
            "errors": texts("errors")}


def acceptance_state(config, statuses: list[NodeStatus] = ()) -> dict:
    """Whether acceptance is on for the cluster (this config's [acceptance], the controller's): when on, the levels it
    runs at; when off, why, in the words of the setting's own description (acceptance.settings.WHY_OFF: what it is off
    for and when to turn it on); and the offer of `accept cluster` while it stands (acceptance.offer: made when the
    controller saw the switch turned on, until a cluster run ends after it, by the controller's record or by a
    node's last run of trigger cluster in `statuses`)."""
    settings = config.acceptance
    why_off = {f.name: f.metadata["doc"] for f in dataclasses.fields(section_class("acceptance"))}["enabled"]
    ran = tuple(s.acceptance["finished"] for s in statuses if s.acceptance and s.acceptance["trigger"] == "cluster")
    offered = _offered(config.node.state_dir, ran) if settings.enabled else None
    return {"enabled": settings.enabled, "at_start": settings.at_start if settings.enabled else None,
            "after_repair": settings.after_repair if settings.enabled else None,
            "after_reset": settings.after_reset if settings.enabled else None,
            "why_off": None if settings.enabled else why_off,
            "offer": OFFER if offered is not None else None, "offered": offered}


def _offered(state_dir: str, cluster_runs: tuple[float, ...]) -> float | None:
    """acceptance.offer.pending's answer, read from the file it keeps (the controller's switch.json); None where
    the file is absent or unreadable (at worst no offer is said)."""
    try:
        seen = json.loads((Path(state_dir) / "acceptance" / "switch.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(seen, dict) or not seen.get("enabled") or not isinstance(seen.get("offered"), (int, float)):
        return None
    offered = float(seen["offered"])
    ran = [float(seen["cluster_run"])] if isinstance(seen.get("cluster_run"), (int, float)) else []
    return None if any(t >= offered for t in (*ran, *cluster_runs)) else offered


def warnings(paused: tuple[str, float] | None, unreachable: dict[str, str]) -> list[str]:
    """What the cluster page's banners say besides the nodes: repairs paused, node agents that do not answer."""
    said = []
    if paused:
        said.append(f"repairs are paused by {paused[0]} since {moment(paused[1])}: no approval until "
                    "`slurm-ext repair unpause`")
    if unreachable:
        names = sorted(unreachable)
        said.append(f"no answer from {counted(len(names), 'node agent')}: "
                    + ", ".join(f"{name} ({unreachable[name]})" for name in names[:10])
                    + (" ..." if len(names) > 10 else ""))
    return said


def counts(statuses: list[NodeStatus]) -> dict[str, int]:
    found = Counter(s.state for s in statuses)
    return {state: found.get(state, 0) for state in STATES}

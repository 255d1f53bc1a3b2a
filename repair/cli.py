"""`slurm-ext repair ...`: list recommendations and repairs, approve or reject them, pause them; the service."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from slurm_ext import config
from slurm_ext.log import printable
from slurm_ext.words import moment, stamped

from .settings import ACTIONS

__all__ = ["add_commands"]


def _store(args: argparse.Namespace):
    """The config and the repair database, as the service keeps it (never a new empty one made here)."""
    from .store import open_store
    loaded = config.load(args.config)
    return loaded, open_store(loaded, create=False)


def _say(line: str, stream=None) -> None:
    """Print one line for the operator's terminal, control characters escaped as `slurm-ext events` does: journal
    messages hold what scripts printed, and an escape sequence in them would act on the terminal."""
    print(printable(line), file=stream or sys.stdout)


def _print_json(data: dict) -> None:
    """`--json`'s answer: indented for a terminal, one line for a script (Python's C encoder: indented, 10,000
    nodes' status took 0.3 s more to write)."""
    print(json.dumps(data, indent=1 if sys.stdout.isatty() else None))


#: the epoch-seconds fields of a repair record, said twice in JSON (slurm_ext.words.stamped)
_RECORD_TIMES = ("opened", "updated", "closed", "decided_at")


def _when(epoch: float | None) -> str:
    return moment(epoch) if epoch else "-"


def _list(args: argparse.Namespace) -> int:
    from slurm_ext.slurm import SlurmClient
    from .decide import paused
    from slurm_ext.agentapi import AgentClient
    from .status import held_findings, node_statuses
    loaded, store = _store(args)
    records = store.records(open_only=True)
    stop = paused(store)
    nodes = SlurmClient(loaded.slurm).nodes()
    # a fault behind someone else's drain has no recommendation (that drain is theirs), but must not be unseen
    held = [s for s in held_findings(node_statuses(nodes, records, []), nodes, AgentClient.of(loaded)) if s.held]
    if args.json:
        _print_json({"paused": stamped({"by": stop[0], "since": stop[1]}, "since") if stop else None,
                     "records": [stamped(asdict(r), *_RECORD_TIMES) for r in records],
                     "held": [{"node": s.name, "reason": s.reason, "owner": s.reason_owner, "findings": s.held}
                              for s in held]})
        return 0
    if stop:
        print(f"repairs are PAUSED by {stop[0]} since {_when(stop[1])}: `slurm-ext repair unpause` to go on")
    if not records:
        print("no recommendations and no repairs under way")
    else:
        print(f"{'NODE':<14} {'STATE':<12} {'ACTION':<12} {'STEP':<10} {'SINCE':<25} {'BY':<12} WHAT")
    for r in records:
        jobs = f" jobs {','.join(map(str, r.jobs))}" if r.jobs else ""
        note = f" ({r.note})" if r.note else ""
        _say(f"{r.node:<14} {r.state:<12} {r.action:<12} {r.step or '-':<10} {_when(r.opened):<25} "
             f"{r.decided_by or '-':<12} {r.signature}: {r.evidence}{jobs}{note}")
    for s in held:
        _say(f"{s.name:<14} paused, held behind {s.reason!r} (by {s.reason_owner}): {'; '.join(s.held)}")
    return 0


def _approve(args: argparse.Namespace) -> int:
    from slurm_ext.slurm import SlurmClient
    from .decide import approve, operator
    loaded, store = _store(args)
    cluster = len(SlurmClient(loaded.slurm).nodes())
    _, said = approve(store, args.node, operator(), loaded.repair, cluster, action=args.action, dry_run=args.dry_run)
    print(said + ("" if args.dry_run else f": the repair service takes it up within "
                  f"{loaded.repair.interval:g}s (`slurm-ext repair list`, `slurm-ext history --node {args.node}`)"))
    return 0


def _reject(args: argparse.Namespace) -> int:
    from .decide import operator, reject
    _, store = _store(args)
    record = reject(store, args.node, operator(), args.why)
    print(f"rejected {record.action} of node {args.node}: recorded; the node stays drained with its reason")
    return 0


def _reopen(args: argparse.Namespace) -> int:
    from .decide import operator, reopen
    _, store = _store(args)
    record = reopen(store, args.node, operator())
    print(f"reopened {record.action} of node {args.node}: it awaits approval again (`slurm-ext repair approve "
          f"{args.node}`); recorded in the history")
    return 0


def _pause(args: argparse.Namespace) -> int:
    """Exit 0 also when there was nothing to do (already paused, not paused): the state asked for is the state
    there is, as `systemctl start` of a running unit; the line says so, and nothing is recorded."""
    from .decide import operator, pause, paused, unpause
    _, store = _store(args)
    if args.verb == "pause":
        if pause(store, operator()):
            print("repairs paused: no approval until `slurm-ext repair unpause`; repairs under way go on")
        else:
            by, since = paused(store) or ("?", 0.0)
            print(f"repair is paused already (by {by} since {_when(since)}): nothing to do")
        return 0
    print("repairs unpaused" if unpause(store, operator()) else "repair is not paused: nothing to do")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from .service import serve
    log.setup(config.load(args.config).log, "repair")
    return serve(args.config)


def _collect(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from .collector import collect
    log.setup(config.load(args.config).log, "collector")
    return collect(args.config, args.once)


def _status(args: argparse.Namespace) -> int:
    import time
    from concurrent.futures import ThreadPoolExecutor
    from slurm_ext.slurm import SlurmClient
    from slurm_ext.agentapi import AgentClient
    from .decide import paused
    from .status import (NodeStatus, Taken, acceptance_line, acceptance_state, counts, node_statuses, taken_lately,
                         warnings, with_agents)
    from .store import open_store
    loaded = config.load(args.config)
    print(f"{loaded.origin}; slurm.conf {loaded.slurm.conf_path()}", file=sys.stderr)
    store = open_store(loaded, create=False)
    with ThreadPoolExecutor(max_workers=1) as pool:
        table = pool.submit(SlurmClient(loaded.slurm).nodes)  # Slurm answers while the repair database is read
        records, events = store.records(open_only=True), store.events(since=time.time() - 7 * 86400, limit=5000)
        taken = Taken() if args.live else taken_lately(store, loaded, time.time())
        nodes = table.result()
    statuses = node_statuses(nodes, records, events)
    statuses, unreachable = with_agents(statuses, nodes, AgentClient.of(loaded), taken=taken)
    summary = counts(statuses)
    said = warnings(paused(store), unreachable)
    accepting = acceptance_state(loaded, statuses)
    for line in said:  # what the page's banners say
        _say(f"slurm-ext: warning: {line}", sys.stderr)
    if args.json:
        named = NodeStatus.__dataclass_fields__  # its fields are plain already: asdict's deep copy cost 0.1 s at 10,000
        nodes = [{**{name: getattr(s, name) for name in named},
                  "acceptance": stamped(s.acceptance, "finished") if s.acceptance else None} for s in statuses]
        _print_json({"counts": summary, "acceptance": stamped(accepting, "offered"), "nodes": nodes,
                     "warnings": said})
        return 0
    print("  ".join(f"{state} {count}" for state, count in summary.items()))
    if accepting["enabled"]:
        print(f"acceptance on: at start {accepting['at_start']}, after a repair {accepting['after_repair']}, after a "
              f"reset or reprovision {accepting['after_reset']}")
    else:
        print(f"acceptance {accepting['why_off']}")
    if accepting["offer"]:
        print(f"{accepting['offer']} (offered {_when(accepting['offered'])})")
    print(f"{'NODE':<14} {'STATUS':<10} {'SLURM':<24} {'GPUS':<8} {'REPAIR':<18} REASON / FINDINGS / LAST EVENT")
    for s in statuses:
        gpus = f"{s.gpus_used}/{s.gpus.rsplit(':', 1)[-1] if s.gpus else 0}"
        told = "; ".join(s.findings) if s.findings else (f"{s.reason} (by {s.reason_owner})" if s.reason else "")
        told += f"; held: {'; '.join(s.held)}" if s.held else ""
        last = f"  [{s.events[-1]}]" if s.events else ""
        _say(f"{s.name:<14} {s.state:<10} {s.slurm_state:<24} {gpus:<8} {s.repair or '-':<18} {told}{last}")
        if s.acceptance:
            _say(f"{'':<14} {acceptance_line(s.acceptance)}")
    return 0


def _history(args: argparse.Namespace) -> int:
    import time
    from slurm_ext.journal import parse_since
    from slurm_ext.slurm import SlurmClient
    from .history import gather
    try:
        since = parse_since(args.since).timestamp() if args.since else time.time() - 7 * 86400
    except ValueError as err:
        print(f"slurm-ext: error: {err}", file=sys.stderr)
        return 2
    loaded, store = _store(args)
    timeline = gather(store, SlurmClient(loaded.slurm), since, node=args.node, limit=args.limit)
    if args.json:
        _print_json({"entries": [stamped(asdict(e), "time") for e in timeline.entries],
                     "unreachable": timeline.unreachable, "incomplete": timeline.incomplete,
                     "collector": timeline.collector, "cut": timeline.cut})
        return 0
    for e in timeline.entries:
        who = f" [{e.user}]" if e.user and e.source == "repair" else ""
        _say(f"{_when(e.time)}  {e.node:<12} {e.source:<6} {e.event}: {e.message}{who}")
        for line in e.lines:  # an acceptance run's results, each with its figures
            _say(f"{'':<47}  {line}")
    if timeline.cut:
        _say(f"slurm-ext: {timeline.cut} older entr{'y' if timeline.cut == 1 else 'ies'} (at least) not shown: "
             f"--limit {args.limit} keeps the newest; narrow with --node or --since, or raise --limit", sys.stderr)
    if timeline.collector:
        _say(f"slurm-ext: warning: {timeline.collector}", sys.stderr)
    if timeline.unreachable:
        _say(f"slurm-ext: warning: the collector has no journal from {len(timeline.unreachable)} node agent(s): "
             + ", ".join(f"{n} ({why})" for n, why in sorted(timeline.unreachable.items())[:10])
             + (" ..." if len(timeline.unreachable) > 10 else ""), sys.stderr)
    for name, shortfall in sorted(timeline.incomplete.items()):
        _say(f"slurm-ext: warning: node {name}'s journal is incomplete: {shortfall}", sys.stderr)
    return 0


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10**7:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number from 1 to 10000000")
    return int(text)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `repair`, `status` and `history` to the core CLI."""
    repair = commands.add_parser(
        "repair", help="the cluster's recommended repairs: list, approve, reject, reopen, pause",
        description="Recommendations come from the nodes' health drains; an approved repair drains the node, waits "
                    "for its jobs, runs its action (reset-gpu through the node's agent, waiting only for the jobs "
                    "on that GPU; reboot through Slurm; reprovision, failover, remove through the executor), waits "
                    "for the node, runs its checks and resumes it. Every decision and step is "
                    "recorded ([repair] database) and shown by `slurm-ext history`.")
    actions = repair.add_subparsers(dest="verb", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="open recommendations and repairs under way")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    listing.set_defaults(func=_list)
    approve = actions.add_parser("approve", help="approve a node's recommended repair (recorded with your user name)")
    approve.add_argument("node")
    approve.add_argument("--action", choices=ACTIONS, help="do this instead of the recommended action")
    approve.add_argument("--dry-run", action="store_true", help="say whether it would be approved; record nothing")
    approve.set_defaults(func=_approve)
    reject = actions.add_parser("reject", help="reject a node's recommendation: recorded, nothing runs")
    reject.add_argument("node")
    reject.add_argument("--why", required=True, metavar="TEXT", help="the reason, kept in the history")
    reject.set_defaults(func=_reject)
    reopen = actions.add_parser("reopen", help="make a node's rejected recommendation await approval again "
                                "(recorded with your user name)")
    reopen.add_argument("node")
    reopen.set_defaults(func=_reopen)
    for name, text in (("pause", "approve nothing more (operators' and auto-approve) until unpaused; exit 0, "
                        "saying so, when paused already"),
                       ("unpause", "let approvals through again; exit 0, recording nothing, when not paused")):
        actions.add_parser(name, help=text).set_defaults(func=_pause)
    actions.add_parser("serve", help="the repair service (the controller agent runs it as its `repair` worker)"
                       ).set_defaults(func=_serve)
    collect = actions.add_parser(
        "collect", help="take the node agents' journals into the repair database, each event once (the controller "
                        "agent runs it as its `collector` worker)",
        description="Asks every node's agent for its journal lines after its cursor (GET /journal), and stores them "
                    "with the cursor in one transaction: what `slurm-ext history` and the cluster page read. "
                    "[history] sets how often, how many at once, and how long events are kept.")
    collect.add_argument("--once", action="store_true", help="one pass: every node's journal up to its end now, "
                         "then exit (0, or 1 when an agent gave no page)")
    collect.set_defaults(func=_collect)

    status = commands.add_parser(
        "status", help="every node: healthy, booting, unhealthy, pending (a repair awaits approval) or paused (an "
                       "admin's drain)",
        description="One Slurm query for the whole cluster, one read of the repair records and of what the "
                    "controller's collector took of every node agent (its /health within 3 history.interval, its "
                    "journal's last acceptance run; the agents it does not cover are asked at once): each node's "
                    "status, Slurm state, GPUs in use, open findings (warnings included, beside what its drain "
                    "states), latest repair events and, under it, its last acceptance run (verdict, level, trigger, "
                    "when); whether acceptance is on for the cluster (why not, when off); on standard error (and in "
                    "--json's warnings) what the cluster page's banners say: node agents that do not answer, "
                    "repairs paused. Exits 0: a report, whatever it finds.")
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.add_argument("--live", action="store_true",
                        help="ask every node's agent now instead of reading what the collector took (a few seconds "
                             "fresher; at thousands of nodes, thousands of requests)")
    status.set_defaults(func=_status)
    history = commands.add_parser(
        "history", help="what happened on the cluster: Slurm's node events, the agents' journals and the repairs, "
                        "in time order",
        description="Merges `sacctmgr show event` (one query), the node agents' journals as the controller's "
                    "collector stored them (one query of the repair database, whatever the number of nodes) and the "
                    "repair records (recommendations, decisions with who made them, each step). Nodes whose agent "
                    "the collector cannot reach, and lines a journal lost before they were taken, are said on "
                    "standard error.")
    history.add_argument("--node", metavar="NODE", help="only this node")
    history.add_argument("--since", metavar="T", help="from T on: a duration back from now (30m, 2h, 7d) or an "
                         "ISO time; default 7 days")
    history.add_argument("--limit", type=_count, default=1000, metavar="N",
                         help="the newest N entries (default 1000); how many older ones were left out is said")
    history.add_argument("--json", action="store_true", help="one JSON document")
    history.set_defaults(func=_history)

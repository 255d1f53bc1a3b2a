"""`slurm-ext repair ...`: list recommendations and repairs, approve or reject them, pause them; the service."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime

from slurm_ext import config

from .settings import ACTIONS

__all__ = ["add_commands"]


def _store(args: argparse.Namespace):
    from .store import open_store
    loaded = config.load(args.config)
    return loaded, open_store(loaded)


def _when(epoch: float | None) -> str:
    return datetime.fromtimestamp(epoch).astimezone().strftime("%Y-%m-%d %H:%M:%S") if epoch else "-"


def _list(args: argparse.Namespace) -> int:
    from .decide import paused
    _, store = _store(args)
    records = store.records(open_only=True)
    stop = paused(store)
    if args.json:
        print(json.dumps({"paused": {"by": stop[0], "since": stop[1]} if stop else None,
                          "records": [asdict(r) for r in records]}, indent=1))
        return 0
    if stop:
        print(f"repairs are PAUSED by {stop[0]} since {_when(stop[1])}: `slurm-ext repair unpause` to go on")
    if not records:
        print("no recommendations and no repairs under way")
        return 0
    print(f"{'NODE':<14} {'STATE':<12} {'ACTION':<12} {'STEP':<10} {'SINCE':<20} {'BY':<12} WHAT")
    for r in records:
        jobs = f" jobs {','.join(map(str, r.jobs))}" if r.jobs else ""
        note = f" ({r.note})" if r.note else ""
        print(f"{r.node:<14} {r.state:<12} {r.action:<12} {r.step or '-':<10} {_when(r.opened):<20} "
              f"{r.decided_by or '-':<12} {r.signature}: {r.evidence}{jobs}{note}")
    return 0


def _approve(args: argparse.Namespace) -> int:
    from slurm_ext.slurm import SlurmClient
    from .decide import approve, operator
    loaded, store = _store(args)
    cluster = len(SlurmClient(loaded.slurm).nodes())
    record, said = approve(store, args.node, operator(), loaded.repair, cluster, action=args.action,
                           dry_run=args.dry_run)
    print(said + ("" if args.dry_run else f": the repair service takes it up within "
                  f"{loaded.repair.interval:g}s (`slurm-ext repair list`, `slurm-ext history --node {args.node}`)"))
    return 0


def _reject(args: argparse.Namespace) -> int:
    from .decide import operator, reject
    _, store = _store(args)
    record = reject(store, args.node, operator(), args.why)
    print(f"rejected {record.action} of node {args.node}: recorded; the node stays drained with its reason")
    return 0


def _pause(args: argparse.Namespace) -> int:
    from .decide import operator, pause, unpause
    _, store = _store(args)
    (pause if args.verb == "pause" else unpause)(store, operator())
    print("repairs paused: no approval until `slurm-ext repair unpause`; repairs under way go on"
          if args.verb == "pause" else "repairs unpaused")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from .service import serve
    log.setup(config.load(args.config).log, "repair")
    return serve(args.config)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `repair` and its actions to the core CLI."""
    repair = commands.add_parser(
        "repair", help="the cluster's recommended repairs: list, approve, reject, pause",
        description="Recommendations come from the nodes' health drains; an approved repair drains the node, waits "
                    "for its jobs, runs its action (reboot through Slurm; reprovision, failover, remove through the "
                    "executor), waits for the node, runs its checks and resumes it. Every decision and step is "
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
    for name, text in (("pause", "approve nothing more (operators' and auto-approve) until unpaused"),
                       ("unpause", "let approvals through again")):
        actions.add_parser(name, help=text).set_defaults(func=_pause)
    actions.add_parser("serve", help="the repair service (the controller agent runs it as its `repair` worker)"
                       ).set_defaults(func=_serve)

"""`slurm-ext health ...`: the node's passive checks, now or as the monitor sees them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from slurm_ext import config
from slurm_ext.words import counted

__all__ = ["add_commands"]

#: how long `health clear` waits for the monitor to take its request up
_CLEAR_WAIT = 5.0


def _monitor(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from . import serve
    loaded = config.load(args.config)
    log.setup(loaded.log, "health")
    return serve(args.config)


#: the exit code of an answer that was not measured (Nagios's UNKNOWN): never 0, and not 1 (measured unhealthy)
NOT_MEASURED = 3


def _check(args: argparse.Namespace) -> int:
    from . import check_now, monitor_missing
    loaded = config.load(args.config)
    report = check_now(loaded)
    missing = monitor_missing(loaded.node)
    healthy = report.healthy and not missing
    if args.json:
        print(json.dumps({"healthy": report.healthy if not missing else None, "config": loaded.source,
                          "state_dir": loaded.node.state_dir, "monitor": missing or "ran this boot",
                          "ran": report.ran, "not_applicable": report.not_applicable, "findings": report.findings},
                         indent=1))
    else:
        print(f"{loaded.origin}; state dir {loaded.node.state_dir}", file=sys.stderr)
        for row in report.findings:
            print(_line(row))
        absent = f"; not applicable here: {', '.join(report.not_applicable)}" if report.not_applicable else ""
        verdict = "unhealthy" if not report.healthy else "unknown" if missing else "healthy"
        print(f"{verdict}: {counted(len(report.findings), 'finding')}; {counted(len(report.ran), 'check')} ran now, "
              f"the monitor's open findings {'added' if not missing else 'unknown'}{absent}")
    if missing:
        print(f"slurm-ext: {missing}", file=sys.stderr)
    return 1 if not report.healthy else NOT_MEASURED if not healthy else 0


def _show(args: argparse.Namespace) -> int:
    from . import monitor_missing, open_findings
    loaded = config.load(args.config)
    print(f"{loaded.origin}; state dir {loaded.node.state_dir}", file=sys.stderr)
    missing = monitor_missing(loaded.node)
    if missing:
        print(f"slurm-ext: {missing}", file=sys.stderr)
        return NOT_MEASURED
    found = open_findings(loaded.node)
    unhealthy = any(row.get("severity") == "critical" for row in found)
    if args.json:
        print(json.dumps(found, indent=1))
        return 1 if unhealthy else 0
    if not found:
        print("no open findings")
    for row in found:
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["opened"]))
        print(f"{opened} {_line(row)}" + (f" (seen {row['count']} times)" if row.get("count", 1) > 1 else ""))
    return 1 if unhealthy else 0


def _clear(args: argparse.Namespace) -> int:
    from . import request_clear
    from .settings import CHECKS
    if args.check and args.check not in CHECKS:
        print(f"slurm-ext: error: --check {args.check}: not a check; checks: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    path = request_clear(config.load(args.config).node.state_dir, args.check or "", args.gpu or "")
    deadline = time.monotonic() + _CLEAR_WAIT
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.path.exists(path):
        print(f"slurm-ext: warning: no health monitor took up {path} within {_CLEAR_WAIT:g}s (is the worker agent's "
              "health worker running?); it is taken up when one starts", file=sys.stderr)
        return 1
    print("clear taken up by the health monitor: `slurm-ext events --event health-cleared` lists what it cleared")
    return 0


def _line(row: dict) -> str:
    gpu = " ".join(("", "gpu", str(row["gpu"]), row.get("uuid") or "")).rstrip() if row.get("gpu") is not None else ""
    jobs = f" jobs={','.join(map(str, row['jobs']))}" if row.get("jobs") else ""
    return f"{row['severity']:8} {row['check']}{gpu}: {row['evidence']} action={row['action']}{jobs}"


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add this component's commands to the core CLI's subcommands."""
    health = commands.add_parser("health", help="passive GPU and node checks: now, or as the monitor sees them",
                                 description="The worker agent runs the health monitor as its `health` worker; "
                                             "these commands ask the node now or read what the monitor found.")
    actions = health.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="run every check once, now; exit 1 when the node is unhealthy "
                               "(a critical finding), 3 when no health monitor wrote this config's state dir "
                               "this boot (its findings unknown)",
                               description="Runs each polled check on one reading of the node and adds the "
                                           "monitor's open findings (windows and events need the monitor).")
    check.add_argument("--json", action="store_true", help="machine-readable")
    check.set_defaults(func=_check)
    show = actions.add_parser("show", help="the node's open findings, as the monitor last saved them; exit 1 when one "
                              "is critical (as `check`), 3 when no monitor wrote this config's state dir this boot")
    show.add_argument("--json", action="store_true", help="machine-readable")
    show.set_defaults(func=_show)
    clear = actions.add_parser("clear", help="clear open findings (a sticky Xid after a GPU reset) and their drains",
                               description="A polled condition that still holds is found again after its hold.")
    clear.add_argument("--check", metavar="ID", help="only this check's findings")
    clear.add_argument("--gpu", metavar="GPU", help="only findings about this GPU (index, UUID or bus id)")
    clear.set_defaults(func=_clear)
    actions.add_parser("monitor", help="run the monitor in the foreground (the worker agent's `health` worker)"
                       ).set_defaults(func=_monitor)

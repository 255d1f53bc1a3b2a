"""`slurm-ext health ...`: the node's passive checks, now or as the monitor sees them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from slurm_ext import config
from slurm_ext.words import counted, moment, stamped

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
        print(json.dumps([stamped(row, "first_seen", "last_seen", "opened") for row in found], indent=1))
        return 1 if unhealthy else 0
    if not found:
        print("no open findings")
    for row in found:
        seen = f" (seen {row['count']} times)" if row.get("count", 1) > 1 else ""
        print(f"{moment(row['opened'])} {_line(row)}{seen}")
    return 1 if unhealthy else 0


def _clear(args: argparse.Namespace) -> int:
    from .settings import CHECKS
    if args.check and args.check not in CHECKS:
        print(f"slurm-ext: error: --check {args.check}: not a check; checks: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    return _clear_from_controller(args) if args.node else _clear_here(args)


def _clear_here(args: argparse.Namespace) -> int:
    """The clear on the node itself, recorded with the invoking user's name."""
    from slurm_ext.whoami import invoking_user
    from . import request_clear
    by = invoking_user()
    path = request_clear(config.load(args.config).node.state_dir, args.check or "", args.gpu or "", by=by)
    deadline = time.monotonic() + _CLEAR_WAIT
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.path.exists(path):
        print(f"slurm-ext: warning: no health monitor took up {path} within {_CLEAR_WAIT:g}s (is the worker agent's "
              "health worker running?); it is taken up when one starts", file=sys.stderr)
        return 1
    print(f"clear taken up by the health monitor, recorded as {by}: `slurm-ext events --event health-cleared` lists "
          "what it cleared")
    return 0


def _clear_from_controller(args: argparse.Namespace) -> int:
    """The clear of NODE from the controller: through the page, which checks the operator's token as for a browser
    and asks the node's agent with the agent credential; recorded with the token's operator."""
    from slurm_ext.pageclient import TOKEN_VARIABLE, PageClient, PageRefused, page_url
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        print(f"slurm-ext: error: health clear {args.node}: set {TOKEN_VARIABLE} to your operator token (`slurm-ext "
              "web add-token USER` makes one), or run `slurm-ext health clear` on the node itself", file=sys.stderr)
        return 2
    loaded = config.load(args.config)
    url = args.page or page_url(loaded.web.listen)
    try:
        said = PageClient(url, token).operate(args.node, "clear", {"check": args.check or "", "gpu": args.gpu or ""})
    except PageRefused as err:
        print(f"slurm-ext: error: health clear {args.node}: {err}", file=sys.stderr)
        return 1
    print(str(said.get("message") or f"clear of node {args.node} asked"))
    return 0 if said.get("taken") else 1


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
    clear = actions.add_parser("clear", help="clear open findings (a sticky Xid after a GPU reset) and their drains; "
                               "recorded with who cleared them",
                               description="On the node: recorded with the invoking user (SUDO_USER, else the login "
                                           "user). With NODE, from the controller: the page checks the operator token "
                                           "in SLURM_EXT_TOKEN and asks the node's agent; recorded with the token's "
                                           "operator. Exit 0 once the node's monitor took the clear up, 1 when it did "
                                           "not or the page refused (its words), 2 without a token. A polled "
                                           "condition that still holds is found again after its hold.")
    clear.add_argument("node", nargs="?", metavar="NODE", help="clear on this node, from the controller, as the "
                       "operator of the token in SLURM_EXT_TOKEN (default: this node, as the invoking user)")
    clear.add_argument("--check", metavar="ID", help="only this check's findings")
    clear.add_argument("--gpu", metavar="GPU", help="only findings about this GPU (index, UUID or bus id)")
    clear.add_argument("--page", metavar="URL", help="with NODE: the page's address (default: http:// and "
                       "web.listen)")
    clear.set_defaults(func=_clear)
    actions.add_parser("monitor", help="run the monitor in the foreground (the worker agent's `health` worker)"
                       ).set_defaults(func=_monitor)

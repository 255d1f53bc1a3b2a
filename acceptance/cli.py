"""`slurm-ext accept ...`: run the acceptance tests on this node, show the last run, list the tests."""

from __future__ import annotations

import argparse
import json
import sys

from slurm_ext import config
from slurm_ext.words import moment

__all__ = ["add_commands"]

#: exit codes: 0 pass, 1 fail (measured bad), 3 a test could not run (not measured: Nagios's UNKNOWN), 2 refused
_EXIT = {"pass": 0, "fail": 1, "error": 3}


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _run(args: argparse.Namespace) -> int:
    from slurm_ext.errors import SlurmExtError

    from . import apply_verdict
    from .catalog import TESTS
    from .records import AREAS
    from .runner import run_tests
    loaded = config.load(args.config)
    areas, only = _csv(args.only or ""), _csv(args.test or "")
    bad = [a for a in areas if a not in AREAS] + [t for t in only if t not in TESTS]
    if bad:
        print(f"slurm-ext accept run: unknown area or test {bad[0]!r}; areas: {', '.join(AREAS)}; tests: "
              f"{', '.join(TESTS)}", file=sys.stderr)
        return 2
    node = loaded.node.slurm_name
    level = args.level or (loaded.acceptance.at_start if loaded.acceptance.at_start != "off" else "quick")
    if not args.json:
        print(f"{loaded.origin}; acceptance {level} on {node}", file=sys.stderr)
    try:
        run = run_tests(loaded, node, level, trigger=args.trigger, areas=areas, only=only,
                        on_result=None if args.json else _print_result)
    except SlurmExtError as err:
        print(f"slurm-ext accept run: {err}", file=sys.stderr)
        return 2
    outcome, unapplied = "", ""
    if args.apply:  # the verdict stands whether or not the node's state could be changed: both are said
        try:
            outcome = apply_verdict(loaded, run, full=not areas and not only) or ""
        except SlurmExtError as err:
            unapplied = f"the {run.verdict} was not applied to node {node}'s state: {err}"
    if args.json:
        print(json.dumps({**run.to_json(), "drain": outcome, "drain_error": unapplied}, indent=1))
    else:
        _print_tail(run)
        if outcome:
            print(f"node state: {outcome}", file=sys.stderr)
    if unapplied:
        print(f"slurm-ext accept run: {unapplied}", file=sys.stderr)
    return _EXIT[run.verdict]


def _print_result(result) -> None:
    figures = "; ".join(f.text() for f in result.figures)
    where = f" {result.target}" if result.target else ""
    print(f"{result.outcome.upper():5} {result.test}{where} ({result.seconds:.1f}s): {result.message}"
          + (f" [{figures}]" if figures and figures not in result.message else ""))


def _print_tail(run) -> None:
    for test, why in run.not_applicable.items():
        print(f"n/a   {test}: {why}")
    counts = {o: sum(r.outcome == o for r in run.results) for o in ("pass", "fail", "error")}
    print(f"{run.verdict}: {counts['pass']} passed, {counts['fail']} failed, {counts['error']} could not run, "
          f"{len(run.not_applicable)} not applicable; profile {run.profile or 'none'}; "
          f"{run.finished - run.started:.1f}s")


def _show(args: argparse.Namespace) -> int:
    from slurm_ext.errors import SlurmExtError

    from .runner import last_run
    loaded = config.load(args.config)
    try:
        run = last_run(loaded.node.state_dir, args.trigger or "")
    except SlurmExtError as err:
        print(f"slurm-ext accept show: {err}", file=sys.stderr)
        return 2
    if run is None:
        if args.json:
            print(json.dumps(None))
        else:
            print(f"no acceptance run kept under {loaded.node.state_dir}"
                  + ("" if loaded.acceptance.enabled else f" ([acceptance] is {_off()})"))
        return 3
    if args.json:
        print(json.dumps(run.to_json(), indent=1))
        return _EXIT[run.verdict]
    print(f"acceptance {run.level} on {run.node} ({run.trigger}), {moment(run.started)}, profile "
          f"{run.profile or 'none'}")
    for result in run.results:
        _print_result(result)
    _print_tail(run)
    return _EXIT[run.verdict]


def _off() -> str:
    from .settings import WHY_OFF
    return WHY_OFF


def _list(args: argparse.Namespace) -> int:
    from .catalog import TESTS, limit_words
    loaded = config.load(args.config)
    settings = loaded.acceptance
    print(f"[acceptance] enabled = {str(settings.enabled).lower()}: "
          + ("tests run at node start, after repairs and on demand" if settings.enabled else _off()))
    for spec in TESTS.values():
        state = "" if settings.test_enabled(spec.name) else " (disabled)"
        limits = f"; limits: {limit_words(spec.limits)}" if spec.limits else ""
        print(f"{spec.name:14} {spec.area:8} {'/'.join(spec.levels)}{state}{limits}\n    {spec.doc}")
    return 0


def _health_check(args: argparse.Namespace) -> int:
    """Slurm's HealthCheckProgram at slurmd's start (HealthCheckNodeState=START_ONLY): the at-start level, unless
    the worker agent's start step has run it on this boot already; its verdict applied through the node-state
    owner (slurmd does nothing with the exit code but log it)."""
    from slurm_ext.errors import SlurmExtError
    from slurm_ext.procfs import boot_id

    from . import apply_verdict
    from .runner import last_run, run_tests
    loaded = config.load(args.config)
    settings = loaded.acceptance
    if not settings.enabled or settings.at_start == "off":
        return 0
    try:
        done = last_run(loaded.node.state_dir, "start")
        if done is not None and done.boot_id and done.boot_id == boot_id(loaded.node.boot_id_file):
            print(f"acceptance {done.level} ran at this boot's start already: {done.verdict}")
            if done.verdict == "fail":  # its drain again (the same want): an earlier try may not have reached Slurm
                apply_verdict(loaded, done, full=True)
            return _EXIT[done.verdict]
        run = run_tests(loaded, loaded.node.slurm_name, settings.at_start, trigger="start")
        apply_verdict(loaded, run, full=True)
    except SlurmExtError as err:
        print(f"slurm-ext accept health-check: {err}", file=sys.stderr)
        return 2
    _print_tail(run)
    return _EXIT[run.verdict]


def _idle(args: argparse.Namespace) -> int:
    from slurm_ext import log

    from .idle import serve
    log.setup(config.load(args.config).log, "acceptance")
    return serve(args.config)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add this component's commands to the core CLI's subcommands."""
    from .records import LEVELS, TRIGGERS
    accept = commands.add_parser("accept", help="active acceptance tests: GPU memory and bandwidth, NVLink, network, "
                                 "storage (off by default: [acceptance] enabled)",
                                 description="Active tests that prove a node before it takes work: at node start "
                                             "(the worker agent, when [acceptance] enabled), after every repair, and "
                                             "here by hand. Each test runs in a process of its own with a deadline "
                                             "and ends pass, fail (measured bad: the node is drained with a "
                                             "recommendation) or error (it could not run: never a drain).")
    actions = accept.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="run the tests on this node now; exit 0 pass, 1 fail, 3 a test could not "
                             "run, 2 refused (another run holds the node, a bad option)",
                             description="Runs the tests of a level here, one at a time, each in a child process "
                                         "killed at its deadline. Run it on a node with no jobs (the GPU tests use "
                                         "most of each GPU's free memory). With --apply, a fail drains the node and "
                                         "a full pass lifts an acceptance drain, through the node's agent.")
    run.add_argument("--level", choices=LEVELS, help="quick (seconds), standard (about two minutes), extended (up to "
                     "an hour); default: acceptance.at_start, or quick")
    run.add_argument("--only", metavar="AREAS", help="comma-separated areas: gpu,network,storage (default: "
                     "acceptance.areas)")
    run.add_argument("--test", metavar="TESTS", help="comma-separated test names (`accept list`)")
    run.add_argument("--json", action="store_true", help="machine-readable: the run with every figure")
    run.add_argument("--apply", action="store_true", help="drain the node on a fail, lift an acceptance drain on a "
                     "pass of every test (not with --only or --test), through the node-state owner")
    run.add_argument("--trigger", choices=TRIGGERS, default="manual", help=argparse.SUPPRESS)
    run.set_defaults(func=_run)
    show = actions.add_parser("show", help="the node's last acceptance run with its figures; exit as `run`, 3 when "
                              "there is none")
    show.add_argument("--json", action="store_true", help="machine-readable")
    show.add_argument("--trigger", choices=TRIGGERS, help="the last run of this trigger (start, cluster, repair, "
                      "idle, manual)")
    show.set_defaults(func=_show)
    check = actions.add_parser("health-check", help="Slurm's HealthCheckProgram with HealthCheckNodeState="
                               "START_ONLY (Slurm 25.11 and later): the at-start level when slurmd starts, where the "
                               "worker agent has not run it on this boot",
                               description="For a slurmd that slurm-ext's worker agent does not start. Drains the "
                                           "node on a fail, lifts an acceptance drain on a pass. Exit as `run`. "
                                           "slurm.conf: HealthCheckProgram=<a script running this> and "
                                           "HealthCheckNodeState=START_ONLY (no HealthCheckInterval needed); on "
                                           "26.05, HealthCheckTimeout above the level's time (quick: 60s is enough).")
    check.set_defaults(func=_health_check)
    from .clustercli import add_command as add_cluster
    add_cluster(actions)
    idle = actions.add_parser("idle", help="test idle nodes at the lowest priority every [acceptance] idle_period (the "
                              "controller agent runs it as its `accept-idle` worker)")
    idle.set_defaults(func=_idle)
    listing = actions.add_parser("list", help="the tests, their levels and the limits each judges by")
    listing.set_defaults(func=_list)

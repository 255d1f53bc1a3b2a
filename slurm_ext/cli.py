"""The `slurm-ext` command: one CLI, one subcommand per task.

Errors an operator can fix (a bad config, a missing package, a port taken)
print one line and exit non-zero (2 for a bad config or bad usage); a
traceback means a bug in slurm-ext.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

from . import __version__, config
from .errors import SlurmExtError

__all__ = ["main"]

#: The components with commands, in `--help` order after the core's own (config, events).
#: Each has a `cli` module whose `add_commands(commands)` adds its subcommands; the core names
#: them here, like the config's sections (`slurm_ext.config`), and imports nothing else of a
#: component: those modules import their component's work only when a command runs.
_COMMAND_OWNERS = ("supervisor", "prolog_epilog", "gres", "accounting", "health", "repair", "web", "devcluster")


def _config_check(args: argparse.Namespace) -> int:
    path = args.file or args.config
    loaded = config.load(path)
    print(f"{loaded.source or 'no config file (' + str(config.DEFAULT_PATH) + '): defaults'}: OK")
    return 0


def _config_show(args: argparse.Namespace) -> int:
    print(config.render(config.load(args.config)), end="")
    return 0


def _events(args: argparse.Namespace) -> int:
    from .eventnames import CATALOGUE
    from .events import journal_files
    from .journal import EventFilter, follow_events, format_event, parse_since, read_events
    state_dir = args.state_dir or config.load(args.config).node.state_dir
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as err:
        print(f"slurm-ext: error: {err}", file=sys.stderr)
        return 2
    for name in args.event or ():
        if name not in CATALOGUE:
            print(f"slurm-ext: warning: --event {name}: not an event of this slurm-ext (the README lists them); "
                  "only older journals can have it", file=sys.stderr)
    if not args.follow and not any(path.exists() for path in journal_files(state_dir)):
        print(f"slurm-ext: no journal in {state_dir} (no events yet, or another node.state_dir?)", file=sys.stderr)
        return 0

    def bad_line(path: Path, number: int, problem: str) -> None:
        print(f"slurm-ext: warning: {path}, line {number}: {problem}", file=sys.stderr)

    selection = EventFilter(since, tuple(args.component or ()), tuple(args.event or ()), args.severity or "")
    reader = (follow_events if args.follow else read_events)(state_dir, selection, bad_line)
    try:
        for event in reader:
            print(event.line if args.json else format_event(event), flush=args.follow)
    except BrokenPipeError:  # `slurm-ext events | head`
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as err:
        print(f"slurm-ext: error: cannot read the journal: {err.filename or state_dir}: {err.strerror or err}",
              file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurm-ext",
        description="Self-healing for Slurm GPU nodes: node agent, job cleanup, GRES from NVML, accounting.")
    parser.add_argument("--version", action="version", version=f"slurm-ext {__version__}")
    parser.add_argument("--config", metavar="FILE",
                        help=f"config file (default: ${config.ENV_VAR} or {config.DEFAULT_PATH})")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug lines")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    cfg = commands.add_parser("config", help="check or show the configuration")
    cfg_commands = cfg.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = cfg_commands.add_parser("check", help="validate a config file; exit 2 when it is bad")
    check.add_argument("file", nargs="?", help="file to check (default: the effective config file)")
    check.set_defaults(func=_config_check)
    cfg_commands.add_parser("show", help="print the effective config with every default filled in"
                            ).set_defaults(func=_config_show)

    from .eventnames import SEVERITIES
    evs = commands.add_parser(
        "events", help="the node journal: what slurm-ext did on this node, and why",
        description="Print the events of <node.state_dir>/journal.jsonl and its rotated files (.3 .2 .1), oldest "
                    "first, as `time severity component: event: message`. The README's table of events says what "
                    "each one means. Lines that are not events are skipped with a warning.")
    evs.add_argument("--since", metavar="T", help="only events from T on: a duration back from now (30s, 10m, 2h, 1d) "
                     "or an ISO time (2025-01-31T14:00, local time without an offset)")
    evs.add_argument("--component", action="append", metavar="C",
                     help="only events of this component (supervisor, nodestate, prolog_epilog, gres); repeatable")
    evs.add_argument("--event", action="append", metavar="NAME", help="only events of this name; repeatable")
    evs.add_argument("--severity", choices=SEVERITIES, help="only events at least this severe")
    evs.add_argument("--json", action="store_true", help="print the journal lines as written, one JSON object each")
    evs.add_argument("-f", "--follow", action="store_true",
                     help="then keep printing new events as they are written (across rotations) until interrupted")
    evs.add_argument("--state-dir", metavar="DIR", help="the journal's directory (default: node.state_dir)")
    evs.set_defaults(func=_events)

    for component in _COMMAND_OWNERS:
        importlib.import_module(f"slurm_ext.{component}.cli").add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="slurm-ext %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except SlurmExtError as err:
        print(f"slurm-ext: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

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

__all__ = ["main", "GLOBAL_OPTIONS"]

#: the dests of the options every command takes, before or after its name
GLOBAL_OPTIONS = ("config", "verbose")

#: The components with commands, in `--help` order after the core's own (config, events).
#: Each has a `cli` module whose `add_commands(commands)` adds its subcommands; the core names
#: them here, like the config's sections (`slurm_ext.config`), and imports nothing else of a
#: component: those modules import their component's work only when a command runs.
_COMMAND_OWNERS = ("supervisor", "prolog_epilog", "gres", "accounting", "health", "repair", "acceptance", "oidc", "web",
                   "devcluster")


def _config_check(args: argparse.Namespace) -> int:
    path = args.file or args.config
    loaded = config.load(path)
    print(f"{loaded.source or loaded.origin}: OK")
    return 0


def _config_show(args: argparse.Namespace) -> int:
    print(config.render(config.load(args.config)), end="")
    return 0


def _events(args: argparse.Namespace) -> int:
    from .eventnames import CATALOGUE
    from .events import journal_files
    from .journal import EventFilter, follow_events, format_event, parse_since, read_events
    if args.state_dir:
        state_dir, origin = args.state_dir, "--state-dir"
    else:
        loaded = config.load(args.config)
        state_dir, origin = loaded.node.state_dir, loaded.origin
        print(f"{origin}; state dir {state_dir}", file=sys.stderr)
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as err:
        print(f"slurm-ext: error: {err}", file=sys.stderr)
        return 2
    for name in args.component or ():
        if name not in _components():
            print(f"slurm-ext: error: --component {name}: not a component (one of {', '.join(_components())})",
                  file=sys.stderr)
            return 2
    for name in args.event or ():
        if name not in CATALOGUE:
            print(f"slurm-ext: warning: --event {name}: not an event of this slurm-ext (docs/reference/events.md "
                  "lists them); only older journals can have it", file=sys.stderr)
    if not args.follow and not any(path.exists() for path in journal_files(state_dir)):
        # nothing to show is not "nothing happened": no agent or monitor of this config ever wrote here
        hint = "" if args.state_dir else "; is this the node's config (--config, $SLURM_EXT_CONFIG)?"
        print(f"slurm-ext: no journal in {state_dir} ({origin}): no node agent or monitor has written it{hint}",
              file=sys.stderr)
        return 3

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
        description="Self-healing for Slurm GPU nodes: the node agent (slurmd and the daemons kept running), job "
                    "cleanup and lifecycle scripts, GRES from NVML, durable accounting, passive health checks, "
                    "repair approved by an operator with one history, the cluster page, and a dev cluster on "
                    "this host.")
    parser.add_argument("--version", action="version", version=f"slurm-ext {__version__}")
    _global_options(parser, argparse.SUPPRESS)
    parser.set_defaults(config=None, verbose=False)
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
                    "first, as `time severity component: event: message`. docs/reference/events.md says what "
                    "each one means. Lines that are not events are skipped with a warning.")
    evs.add_argument("--since", metavar="T", help="only events from T on: a duration back from now (30s, 10m, 2h, 1d, "
                     "1w) or an ISO time (2025-01-31T14:00, local time without an offset)")
    evs.add_argument("--component", action="append", metavar="C",
                     help=f"only events of this component ({', '.join(_components())}); repeatable")
    evs.add_argument("--event", action="append", metavar="NAME", help="only events of this name; repeatable")
    evs.add_argument("--severity", choices=SEVERITIES, help="only events at least this severe")
    evs.add_argument("--json", action="store_true", help="print the journal lines as written, one JSON object each")
    evs.add_argument("-f", "--follow", action="store_true",
                     help="then keep printing new events as they are written (across rotations) until interrupted")
    evs.add_argument("--state-dir", metavar="DIR", help="the journal's directory (default: node.state_dir)")
    evs.set_defaults(func=_events)

    for component in _COMMAND_OWNERS:
        importlib.import_module(f"slurm_ext.{component}.cli").add_commands(commands)
    for command in _commands(parser):
        _global_options(command, argparse.SUPPRESS)
    return parser


def _global_options(parser: argparse.ArgumentParser, default) -> None:
    """--config and -v, taken before a command and after it (`slurm-ext events --config FILE`): where not
    given (SUPPRESS) the other place's value stays."""
    parser.add_argument("--config", metavar="FILE", default=default,
                        help=f"config file (default: ${config.ENV_VAR} or {config.DEFAULT_PATH})")
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log debug lines")


def _commands(parser: argparse.ArgumentParser):
    """Every parser under `parser`'s commands, at any depth (`dev up`, `web tokens add`)."""
    for action in parser._actions:  # argparse keeps no public list of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias is the same parser again
                yield sub
                yield from _commands(sub)


def _components() -> list[str]:
    """The components that write journal events, from the catalogue."""
    from .eventnames import CATALOGUE
    return sorted({component for entry in CATALOGUE.values() for component in entry.components})


def _node_environment(args: argparse.Namespace, argv: list[str]) -> None:
    """Run again with the config's `[node] environment` when this process lacks it.

    The dynamic loader reads LD_LIBRARY_PATH only when a process starts, so a
    command that must see the GPUs the node's agents see (the dev cluster's
    fake NVML) cannot take it on later: it is started again, once, with it.
    """
    path = args.config or os.environ.get(config.ENV_VAR) or config.DEFAULT_PATH
    if not os.path.exists(path):
        return
    wanted = config.load(path).node.environment
    if all(os.environ.get(name) == value for name, value in wanted.items()):
        return
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "slurm_ext.cli", *argv], {**os.environ, **wanted})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="slurm-ext %(name)s: %(message)s", stream=sys.stderr)
    try:
        _node_environment(args, argv)
        return args.func(args)
    except SlurmExtError as err:
        print(f"slurm-ext: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

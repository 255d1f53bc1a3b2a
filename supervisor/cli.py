"""`slurm-ext supervise` and `slurm-ext probe`: the node agent's commands, registered with the core CLI.

`add_commands(commands)` is what `slurm_ext.cli` calls while it builds the
parser; the agent itself is imported only when `supervise` runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from slurm_ext import config

__all__ = ["add_commands"]


def _supervise(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from . import supervise
    loaded = config.load(args.config)
    log.setup(loaded.log, "supervisor")
    return supervise(loaded, args.role, config_path=args.config, port=args.port, pidfile=args.pidfile,
                     daemon_args=daemon_args(args.role, args.daemon_args, os.environ))


def daemon_args(role: str, given: list[str], environ: dict[str, str]) -> tuple[str, ...]:
    """The arguments after `--`, then the words of the role's options variable (SLURMD_OPTIONS for a worker).

    Raises:
        ConfigError: the variable does not split as shell words (an unclosed quote).
    """
    from slurm_ext.errors import ConfigError
    from .workers import ROLE_DAEMON_OPTIONS
    name = ROLE_DAEMON_OPTIONS.get(role)
    try:
        extra = shlex.split(environ.get(name, "")) if name else []
    except ValueError as err:
        raise ConfigError(f"${name}", f"does not split into words: {err}") from None
    return (*given, *extra)


def _probe(args: argparse.Namespace) -> int:
    from . import probe
    ok, text = probe(config.load(args.config), args.kind, args.role, port=args.port)
    print(f"{args.role} {args.kind}: {text}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add this component's commands to the core CLI's subcommands."""
    sup = commands.add_parser(
        "supervise", help="run the node agent for a role (PID 1 of a container, or a systemd service)",
        description="Start the role's workers, reap every orphan, restart dead workers in place with backoff, "
                    "drain the node while slurmd crash-loops, serve /livez /readyz /metrics. SIGTERM stops the "
                    "workers in reverse order; SIGHUP reloads the config.")
    sup.add_argument("--role", required=True, metavar="ROLE",
                     help="worker, controller, accounting or login")
    sup.add_argument("--port", type=int, help="HTTP port for probes and metrics (default: supervisor.ports)")
    sup.add_argument("--pidfile", metavar="PATH", help="write the agent's PID here")
    sup.add_argument("daemon_args", nargs="*", metavar="-- ARG",
                     help="after --: arguments for the role's Slurm daemon (worker: slurmd, controller: slurmctld, "
                          "accounting: slurmdbd, login: sshd), appended to its command; a Slinky NodeSet's "
                          "container arguments (-Z --conf-server HOST:6817 --conf 'Features=...') land here. "
                          "$SLURMD_OPTIONS ($SLURMCTLD_OPTIONS, $SLURMDBD_OPTIONS, $SSHD_OPTS) adds more")
    sup.set_defaults(func=_supervise)

    prb = commands.add_parser("probe", help="ask the local agent whether it is live or ready (exit 0 or 1)")
    prb.add_argument("kind", choices=("live", "ready"))
    prb.add_argument("--role", default="worker", choices=config.ROLES, help="whose agent (default: worker)")
    prb.add_argument("--port", type=int, help="the agent's HTTP port (default: supervisor.ports)")
    prb.set_defaults(func=_probe)

"""`slurm-ext scripts ...` and `slurm-ext hooks ...`: the Prolog/Epilog commands, registered with the core CLI.

`add_commands(commands)` is what `slurm_ext.cli` calls while it builds the
parser; the validator, the service and the hook client's build are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurm_ext import config

__all__ = ["add_commands"]


def _scripts_validate(args: argparse.Namespace) -> int:
    from . import script_dirs, validate_dir
    if args.dirs:
        dirs = [Path(d) for d in args.dirs]
        missing = [str(d) for d in dirs if not d.is_dir()]
        if missing:
            print(f"slurm-ext: error: no such directory: {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        from . import scripts_dir
        dirs = [d for d in script_dirs(scripts_dir(config.load(args.config))) if d.is_dir()]
    checked = errors = warnings = 0
    for directory in dirs:
        for path, problems in validate_dir(directory, shellcheck=not args.no_shellcheck).items():
            checked += 1
            for problem in problems:
                print(problem)
                errors += problem.severity == "error"
                warnings += problem.severity == "warning"
    print(f"{checked} scripts in {len(dirs)} directories: {errors} errors, {warnings} warnings")
    return 1 if errors else 0


def _hooks_serve(args: argparse.Namespace) -> int:
    from . import serve
    return serve(args.config)


def _hooks_build(args: argparse.Namespace) -> int:
    from . import build_hook, socket_path, write_launchers
    loaded = config.load(args.config)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fallbacks = [str(path) for path in write_launchers(output.parent)]
    output = build_hook(output, str(socket_path(loaded)), *fallbacks, deadline=args.deadline)
    print(f"built {output}: it hands each job to the hook service at {socket_path(loaded)}, else runs "
          f"{fallbacks[0]} / {fallbacks[1]}; it waits at most {args.deadline}s for a verdict")
    print(f"slurm.conf:\n  Prolog={output}\n  Epilog={output}\n  PrologFlags=Alloc,Contain\n"
          f"  PrologEpilogTimeout={args.deadline + 30}  (above the client's deadline)")
    return 0


def _hooks_install_units(args: argparse.Namespace) -> int:
    from . import install_units
    loaded = config.load(args.config)
    written = install_units(loaded, Path(args.prefix), Path(args.program) if args.program else None)
    for unit in written:
        print(f"{'wrote' if unit.changed else 'unchanged'} {unit.path}")
    print("enable it where slurmd runs under systemd and no slurm-ext agent does:\n"
          "  systemctl daemon-reload && systemctl enable --now slurm-ext-hooks.socket")
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add this component's commands to the core CLI's subcommands."""
    scripts = commands.add_parser("scripts", help="lifecycle scripts (node-boot, job-start, job-end)")
    scripts_commands = scripts.add_subparsers(dest="action", metavar="ACTION", required=True)
    validate = scripts_commands.add_parser(
        "validate", help="check scripts before they run (exit 1 when one must not run)",
        description="Each script must be a regular file owned by root, not writable by group or others, "
                    "executable, with a shebang whose interpreter exists and clean syntax (bash -n, sh -n, "
                    "Python's compiler); shellcheck's warnings are shown when it is installed.")
    validate.add_argument("dirs", nargs="*", metavar="DIR",
                          help="directories to check (default: <config dir>/<role>/<phase>.d)")
    validate.add_argument("--no-shellcheck", action="store_true", help="skip shellcheck's warnings")
    validate.set_defaults(func=_scripts_validate)

    hooks = commands.add_parser(
        "hooks", help="the Prolog/Epilog client and the hook service that does their work",
        description="slurmd runs slurm-ext-hook (a small C program) as Prolog= and Epilog=; it hands each job "
                    "to the hook service, which the worker role's agent runs, and falls back to "
                    "slurm-ext-prolog / slurm-ext-epilog when no service answers.")
    hooks_commands = hooks.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = hooks_commands.add_parser("serve", help="answer hook clients on <node.runtime_dir>/hooks.sock "
                                      "(run by the worker agent)")
    serve.set_defaults(func=_hooks_serve)
    build = hooks_commands.add_parser("build", help="compile slurm-ext-hook for this node's config (needs cc)")
    build.add_argument("--output", default="/usr/local/libexec/slurm-ext/slurm-ext-hook", metavar="PATH",
                       help="where to put it (default: %(default)s)")
    build.add_argument("--deadline", type=int, default=300, metavar="SECONDS",
                       help="longest wait for the service's verdict; then the Prolog exits 1 (drain, requeue) "
                            "and the Epilog runs the Python hook (default: %(default)s)")
    build.set_defaults(func=_hooks_build)
    units = hooks_commands.add_parser(
        "install-units", help="write systemd units that start the hook service on the first Prolog "
                              "(bare metal without the agent)",
        description="Write slurm-ext-hooks.socket and slurm-ext-hooks.service for this node's config: systemd "
                    "listens on <node.runtime_dir>/hooks.sock (root only, mode 0600) and starts "
                    "`slurm-ext hooks serve` on the first connection. Unchanged files are left as they are; "
                    "nothing is enabled or started. Not for nodes whose worker agent runs the service.")
    units.add_argument("--prefix", default="/etc/systemd/system", metavar="DIR",
                       help="directory to write the units into (default: %(default)s)")
    units.add_argument("--program", metavar="PATH",
                       help="the slurm-ext the service runs (default: the one installed beside this Python, "
                            "else on PATH)")
    units.set_defaults(func=_hooks_install_units)

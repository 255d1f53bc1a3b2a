"""The `slurm-ext` command: one CLI, one subcommand per task.

Errors an operator can fix (a bad config, a missing package, a port taken)
print one line and exit non-zero (2 for a bad config or bad usage); a
traceback means a bug in slurm-ext.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from . import __version__, config
from .errors import SlurmExtError

__all__ = ["main"]


def _config_check(args: argparse.Namespace) -> int:
    path = args.file or args.config
    loaded = config.load(path)
    print(f"{loaded.source or 'no config file (' + str(config.DEFAULT_PATH) + '): defaults'}: OK")
    return 0


def _config_show(args: argparse.Namespace) -> int:
    print(config.render(config.load(args.config)), end="")
    return 0


def _dev_settings(args: argparse.Namespace) -> config.DevSection:
    settings = config.load(args.config).dev
    if getattr(args, "state_dir", None):
        settings = replace(settings, state_dir=args.state_dir)
    if getattr(args, "proctrack", None):
        settings = replace(settings, proctrack=args.proctrack)
    return settings


def _dev_install_deps(args: argparse.Namespace) -> int:
    from . import dev
    dev.install_deps()
    return 0


def _dev_up(args: argparse.Namespace) -> int:
    from . import dev
    state = dev.up(_dev_settings(args))
    _print_status(state)
    print(f"\nUse it:  export SLURM_CONF={state.state_dir}/etc/slurm.conf; sinfo")
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    from . import dev
    stopped = dev.down(_dev_settings(args))
    print(f"stopped {len(stopped)} daemons" + (f" (pids {' '.join(map(str, stopped))})" if stopped else ""))
    return 0


def _dev_status(args: argparse.Namespace) -> int:
    from . import dev
    state = dev.status(_dev_settings(args))
    _print_status(state)
    return 0 if state.node else 3


def _dev_demo(args: argparse.Namespace) -> int:
    from . import dev
    result = dev.demo(_dev_settings(args))
    job = result.job
    print(f"job {job.job_id} ({job.name}) {job.state} exit code {job.exit_code} on {job.nodes}, "
          f"as seen by sacct")
    print("its output:")
    print("".join(f"  {line}\n" for line in result.output.splitlines()), end="")
    return 0 if job.state == "COMPLETED" else 1


def _supervise(args: argparse.Namespace) -> int:
    from . import log
    from .supervisor import supervise
    loaded = config.load(args.config)
    log.setup(loaded.log, "supervisor")
    return supervise(loaded, args.role, config_path=args.config, port=args.port, pidfile=args.pidfile)


def _probe(args: argparse.Namespace) -> int:
    from .supervisor import probe
    ok, text = probe(config.load(args.config), args.kind, args.role, port=args.port)
    print(f"{args.role} {args.kind}: {text}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _scripts_validate(args: argparse.Namespace) -> int:
    from .prolog_epilog import script_dirs, validate_dir
    if args.dirs:
        dirs = [Path(d) for d in args.dirs]
        missing = [str(d) for d in dirs if not d.is_dir()]
        if missing:
            print(f"slurm-ext: error: no such directory: {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        from .prolog_epilog import scripts_dir
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
    from .prolog_epilog import serve
    return serve(args.config)


def _hooks_build(args: argparse.Namespace) -> int:
    from .prolog_epilog import build_hook, socket_path, write_launchers
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


def _gres_emitter(loaded: config.Config, journal: bool):
    """Events of `slurm-ext gres ...`: into the node journal, or (dry runs) onto standard error only."""
    from . import events

    def emit(event: str, message: str, severity: str = "info", **fields) -> None:
        if journal:
            events.emit(loaded.node.state_dir, "gres", event, message, severity, **fields)
        else:
            print(f"gres: {event}: {message}", file=sys.stderr)
    return emit


def _gres_generate(args: argparse.Namespace) -> int:
    from .gres import generate
    loaded = config.load(args.config)
    if args.output:
        loaded = replace(loaded, gres=replace(loaded.gres, output=args.output))
    dry = args.dry_run or args.diff
    try:
        generation = generate(loaded, loaded.node.slurm_name, emit=_gres_emitter(loaded, journal=not dry), dry_run=dry,
                              accept=args.accept)
    except OSError as err:
        from .gres import output_path
        print(f"slurm-ext: error: cannot write {err.filename or output_path(loaded)}: {err.strerror or err}",
              file=sys.stderr)
        return 1
    if generation.inventory is None:
        print(f"slurm-ext: error: no GPU inventory; {generation.path} left as it is", file=sys.stderr)
        return 1
    if args.diff:
        import difflib
        try:
            old = generation.path.read_text().splitlines(keepends=True)
        except OSError:
            old = []
        sys.stdout.writelines(difflib.unified_diff(old, generation.text.splitlines(keepends=True),
                                                   str(generation.path), "generated"))
    elif args.dry_run:
        print(generation.text, end="")
    else:
        print(f"{'wrote' if generation.changed else 'unchanged'} {generation.path}: Gres={generation.gres or '(none)'}")
    if generation.drain:
        print(f"slurm-ext: the node should be drained: {generation.drain}", file=sys.stderr)
        return 1
    return 0


def _gres_inventory(args: argparse.Namespace) -> int:
    from .gres import read_inventory
    from .gres.inventory import to_json
    loaded = config.load(args.config)
    inventory = read_inventory(dev_dir=Path(loaded.gres.dev_dir), types=loaded.gres.types)
    if args.json:
        print(to_json(inventory))
        return 0
    if args.slurmd_conf:
        from .gres.render import dynamic_node_conf
        print(dynamic_node_conf(inventory))
        return 0
    print(f"driver {inventory.driver_version}: {len(inventory.gpus)} GPUs, by PCI bus id")
    for gpu in inventory.gpus:
        print(f"  {gpu.pci_bus_id}  {gpu.device:<14} {gpu.type:<10} {gpu.uuid}  {gpu.name}"
              + (f"  MIG: {len(gpu.mig)}" if gpu.mig else ""))
    for line in (*inventory.lost, *inventory.problems):
        print(f"  ! {line}")
    return 1 if inventory.lost else 0


def _gres_check(args: argparse.Namespace) -> int:
    from .gres import read_inventory, slurm_conf_path
    from .gres.check import compare_counts, nvml_counts, parse_gres, slurmd_counts
    from .gres.render import gres_conf
    from .slurm import SlurmClient
    loaded = config.load(args.config)
    node = loaded.node.slurm_name
    inventory = read_inventory(dev_dir=Path(loaded.gres.dev_dir), types=loaded.gres.types)
    expected = nvml_counts(inventory)
    problems = compare_counts(expected, slurmd_counts(slurm_conf_path(loaded), gres_conf(inventory, node), node),
                              "slurmd -G")
    running = SlurmClient(loaded.slurm).node(node)
    problems += compare_counts(expected, parse_gres(running.gres), f"node {node} in slurmctld")
    summary = ", ".join(f"gpu:{kind}:{n}" for kind, n in sorted(expected.items())) or "no GPUs"
    for line in problems:
        print(line)
    print(f"NVML: {summary}; node {node}: Gres={running.gres or '(none)'}: "
          + ("differs" if problems else "agrees"))
    return 1 if problems else 0


def _print_status(state) -> None:
    print(f"dev cluster in {state.state_dir}")
    for daemon in state.daemons:
        print(f"  {daemon.name:<21} {'running, pid ' + str(daemon.pid) if daemon.pid else 'stopped'}")
    node = state.node
    if node:
        flags = "+".join(sorted(node.flags))
        reason = f" reason {node.reason!r}" if node.reason else ""
        print(f"  node {node.name}: {node.state}{'+' + flags if flags else ''} gres {node.gres or '-'}{reason}")
    else:
        print(f"  node: unknown ({state.problem})")


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

    sup = commands.add_parser(
        "supervise", help="run the node agent for a role (PID 1 of a container, or a systemd service)",
        description="Start the role's workers, reap every orphan, restart dead workers in place with backoff, "
                    "drain the node while slurmd crash-loops, serve /livez /readyz /metrics. SIGTERM stops the "
                    "workers in reverse order; SIGHUP reloads the config.")
    sup.add_argument("--role", required=True, metavar="ROLE",
                     help="worker, controller, accounting or login")
    sup.add_argument("--port", type=int, help="HTTP port for probes and metrics (default: supervisor.ports)")
    sup.add_argument("--pidfile", metavar="PATH", help="write the agent's PID here")
    sup.set_defaults(func=_supervise)

    prb = commands.add_parser("probe", help="ask the local agent whether it is live or ready (exit 0 or 1)")
    prb.add_argument("kind", choices=("live", "ready"))
    prb.add_argument("--role", default="worker", choices=config.ROLES, help="whose agent (default: worker)")
    prb.add_argument("--port", type=int, help="the agent's HTTP port (default: supervisor.ports)")
    prb.set_defaults(func=_probe)

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
    serve = hooks_commands.add_parser("serve", help="answer hook clients on <supervisor.runtime_dir>/hooks.sock "
                                      "(run by the worker agent)")
    serve.set_defaults(func=_hooks_serve)
    build = hooks_commands.add_parser("build", help="compile slurm-ext-hook for this node's config (needs cc)")
    build.add_argument("--output", default="/usr/local/libexec/slurm-ext/slurm-ext-hook", metavar="PATH",
                       help="where to put it (default: %(default)s)")
    build.add_argument("--deadline", type=int, default=300, metavar="SECONDS",
                       help="longest wait for the service's verdict; then the Prolog exits 1 (drain, requeue) "
                            "and the Epilog runs the Python hook (default: %(default)s)")
    build.set_defaults(func=_hooks_build)

    gres = commands.add_parser("gres", help="gres.conf from NVML, and whether Slurm agrees",
                               description="Read the GPUs through NVML, write gres.conf for this node, and compare "
                                           "with what slurmd and slurmctld see.")
    gres_commands = gres.add_subparsers(dest="action", metavar="ACTION", required=True)
    generate = gres_commands.add_parser("generate", help="write gres.conf from NVML (only when it changed); "
                                        "exit 1 when the node should be drained")
    generate.add_argument("--output", metavar="PATH", help="write here instead of gres.output / beside slurm.conf")
    generate.add_argument("--dry-run", action="store_true", help="print the file instead of writing it")
    generate.add_argument("--diff", action="store_true", help="print the change against the current file")
    generate.add_argument("--accept", action="store_true", help="take the GPUs NVML shows now as the node's: "
                          "forget GPUs that were removed on purpose")
    generate.set_defaults(func=_gres_generate)
    inventory = gres_commands.add_parser("inventory", help="the GPUs as NVML reports them, in Slurm's order")
    inventory.add_argument("--json", action="store_true", help="machine-readable")
    inventory.add_argument("--slurmd-conf", action="store_true",
                           help="print only what a dynamic node passes as `slurmd -Z --conf` (Gres=...)")
    inventory.set_defaults(func=_gres_inventory)
    check = gres_commands.add_parser("check", help="compare NVML with slurmd -G and with the node in slurmctld "
                                     "(exit 1 when they differ)")
    check.set_defaults(func=_gres_check)

    dev = commands.add_parser(
        "dev", help="a local Slurm cluster on this host (root), for trying slurm-ext and for its tests",
        description="Real munge, MariaDB, slurmdbd, slurmctld and slurmd on 127.0.0.1 with fake GPUs, "
                    "all under one state directory ([dev] state_dir).")
    dev_commands = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("install-deps", _dev_install_deps, "apt-get install the Debian packages the cluster needs"),
        ("up", _dev_up, "start what is not running and wait for the node (idempotent)"),
        ("down", _dev_down, "cancel jobs, stop every daemon by its pidfile, remove job cgroups"),
        ("status", _dev_status, "say what runs and the node's state (exit 3 when the node is unknown)"),
        ("demo", _dev_demo, "submit a GPU job and show it completed in sacct"),
    ):
        sub = dev_commands.add_parser(name, help=text, description=text)
        if name != "install-deps":
            sub.add_argument("--state-dir", metavar="DIR", help="override [dev] state_dir")
        if name == "up":
            sub.add_argument("--proctrack", choices=("cgroup", "linuxproc"),
                             help="Slurm's ProctrackType (override [dev] proctrack; default cgroup); linuxproc "
                                  "shows the Epilog's cleanup where Slurm cannot track jobs by cgroup, as in pods")
        sub.set_defaults(func=func)
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

"""`slurm-ext dev ...`: the local cluster's commands, registered with the core CLI.

`add_commands(commands)` is what `slurm_ext.cli` calls while it builds the
parser; the cluster code itself is imported only when a command runs.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from slurm_ext import config
from slurm_ext.words import counted

from .settings import DevSection

__all__ = ["add_commands"]


def _dev_settings(args: argparse.Namespace) -> DevSection:
    settings = config.load(args.config).dev
    if getattr(args, "state_dir", None):
        settings = replace(settings, state_dir=args.state_dir)
    if getattr(args, "proctrack", None):
        settings = replace(settings, proctrack=args.proctrack)
    if getattr(args, "nodes", None):
        settings = replace(settings, nodes=args.nodes)
    return settings


def _dev_fleet(args: argparse.Namespace) -> int:
    from . import cluster, fleet
    from .layout import Layout
    settings = cluster.with_present_nodes(_dev_settings(args))
    return fleet.run(Layout(settings), fleet.FleetSettings(args.rate, args.burst_rate, args.burst_after,
                                                           args.burst_for, args.seconds, args.processes))


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e9:
        raise argparse.ArgumentTypeError(f"{text!r}: a number, 0 or more")
    return value


def _node_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of nodes from 1 to 64")
    return int(text)


def _dev_install_deps(args: argparse.Namespace) -> int:
    from .deps import install
    install()
    return 0


def _dev_up(args: argparse.Namespace) -> int:
    from . import cluster
    from .layout import Layout
    settings = _dev_settings(args)
    state = cluster.up(settings)
    _print_status(state)
    conf = Layout(settings).slurm_ext_conf
    print(f"\nUse it:  export SLURM_CONF={state.state_dir}/etc/slurm.conf; sinfo")
    if _chosen_by_default(args):
        print(f"slurm-ext's commands: {_link_default_config(conf)}")
    else:
        print(f"slurm-ext's commands: slurm-ext --config {conf} health show (the first node's config)")
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    from . import cluster
    from .layout import Layout
    settings = _dev_settings(args)
    stopped = cluster.down(settings)
    print(f"stopped {counted(len(stopped), 'daemon')}" + (f" (pids {' '.join(map(str, stopped))})" if stopped else ""))
    default = config.DEFAULT_PATH
    if default.is_symlink() and Path(os.readlink(default)) == Layout(settings).slurm_ext_conf:
        default.unlink()
        print(f"removed {default}, which made this cluster's config the one commands read")
    return 0


def _chosen_by_default(args: argparse.Namespace) -> bool:
    """The cluster `dev up` starts with no config and no state directory named: the one a newcomer starts."""
    return not (args.config or os.environ.get(config.ENV_VAR) or getattr(args, "state_dir", None))


def _link_default_config(conf: Path) -> str:
    """Make the dev cluster's first node's config the one slurm-ext's commands read when no --config nor
    $SLURM_EXT_CONFIG is given, unless this host has a config of its own there; says which it is.

    Without it a newcomer's `slurm-ext health show` read the defaults' empty state directory while the dev
    node was drained for an Xid."""
    default = config.DEFAULT_PATH
    if default.is_symlink():
        target = Path(os.readlink(default))
        if target == conf:
            return f"they read {conf} with no option ({default} links to it)"
        if target.exists():
            return f"{default} links to {target}: run them with --config {conf}"
        default.unlink()  # a cluster removed without `dev down`
    elif default.exists():
        return f"{default} is this host's own config: run them with --config {conf}"
    default.parent.mkdir(parents=True, exist_ok=True)
    default.symlink_to(conf)
    return f"they read {conf} with no option ({default} now links to it; `dev down` removes the link)"


def _dev_status(args: argparse.Namespace) -> int:
    from . import cluster
    state = cluster.status(_dev_settings(args))
    _print_status(state)
    return 0 if state.node else 3


def _dev_demo(args: argparse.Namespace) -> int:
    from . import cluster
    result = cluster.demo(_dev_settings(args))
    job = result.job
    print(f"job {job.job_id} ({job.name}) {job.state} exit code {job.exit_code} on {job.nodes}, "
          f"as seen by sacct")
    print("its output:")
    print("".join(f"  {line}\n" for line in result.output.splitlines()), end="")
    return 0 if job.state == "COMPLETED" else 1


def _dev_reboot_node(args: argparse.Namespace) -> int:
    from . import cluster
    pid = cluster.reboot_node(_dev_settings(args), args.node)
    print(f"node {args.node} booted: its agent runs as pid {pid}")
    return 0


def _dev_inject(args: argparse.Namespace) -> int:
    from . import cluster, drills
    injected = drills.inject(cluster.with_present_nodes(_dev_settings(args)), args.node, args.fault, args.gpu)
    print(f"DRILL {injected.drill.where}: {injected.done}")
    print("expect (this node's config):")
    for line in injected.expect:
        print(f"  {line}")
    print(f"watch:  sinfo -R -o '%60E %N'   slurm-ext repair list   slurm-ext events --since 5m\n"
          f"then:   slurm-ext repair approve {args.node} (where a repair is recommended), slurm-ext history "
          f"--node {args.node} --since 1h, and slurm-ext dev heal {args.node}")
    return 0


def _dev_heal(args: argparse.Namespace) -> int:
    from . import cluster, drills
    healed = drills.heal(cluster.with_present_nodes(_dev_settings(args)), args.node)
    if not healed.undone:
        print(f"no drill injected on {args.node}: nothing to undo")
        return 0
    print(f"undone on {args.node}:")
    for line in healed.undone:
        print(f"  {line}")
    print(f"the node is not resumed here: its monitor lifts its own drain once each finding has stayed away for its "
          f"quiet window; a recommended repair brings it back once approved (slurm-ext repair approve {args.node}); "
          "a finding that stays (a critical Xid until a reboot): slurm-ext health clear")
    return 0


def _gpu_index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a GPU index (0, 1, ...)")
    return int(text)


def _print_status(state) -> None:
    print(f"dev cluster in {state.state_dir}")
    for daemon in state.daemons:
        print(f"  {daemon.name:<21} {'running, pid ' + str(daemon.pid) if daemon.pid else 'stopped'}")
    for node in state.nodes:
        flags = "+".join(sorted(node.flags))
        reason = f" reason {node.reason!r}" if node.reason else ""
        print(f"  node {node.name}: {node.state}{'+' + flags if flags else ''} gres {node.gres or '-'}{reason}")
    if not state.node:
        print(f"  node: unknown ({state.problem})")


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `dev` and its actions to the core CLI's subcommands."""
    dev = commands.add_parser(
        "dev", help="a local Slurm cluster on this host (root), for trying slurm-ext and for its tests",
        description="Real munge, MariaDB, slurmdbd, slurmctld and slurmd on 127.0.0.1 with fake GPUs, "
                    "all under one state directory ([dev] state_dir).")
    dev_commands = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("install-deps", _dev_install_deps, "apt-get install the Debian packages the cluster needs"),
        ("up", _dev_up, "start what is not running and wait for the node (idempotent)"),
        ("down", _dev_down, "cancel jobs, undo drills, stop every daemon of every node by its pidfile, remove job "
                            "cgroups"),
        ("status", _dev_status, "say what runs and each node's state (exit 3 when slurmctld does not know the "
                                "first node)"),
        ("demo", _dev_demo, "submit a GPU job and show it completed in sacct"),
        ("inject", _dev_inject, "a drill: make FAULT on a dev node through the path a real one takes (fake NVML, "
                                "the node's own network namespace and tmpfs, its slurmd's pidfile), recorded and "
                                "journaled as a drill; says what the node's checks will make of it"),
        ("heal", _dev_heal, "undo every drill injected on the node and say what was undone; the node is resumed by "
                            "its monitor or an approved repair, not here"),
        ("reboot-node", _dev_reboot_node, "what the cluster's RebootProgram runs on `scontrol reboot`: restart the "
                                          "node's agent and slurmd with a new boot id, as after a reboot"),
        ("fleet", _dev_fleet, "play the agents of the nodes slurm.conf defines that do not run ([dev] "
                              "defined_nodes): each a journal written at a rate, with an optional burst, and GET "
                              "/journal on the node's own port, for trying the collector, `history` and the page at "
                              "a large cluster's size"),
    ):
        sub = dev_commands.add_parser(name, help=text, description=text)
        if name != "install-deps":
            sub.add_argument("--state-dir", metavar="DIR", help="override [dev] state_dir")
        if name == "up":  # down and status cover every node an earlier up made
            sub.add_argument("--nodes", type=_node_count, metavar="N",
                             help="nodes that run, each with its own slurmd and worker agent on 127.0.0.1 (override "
                                  "[dev] nodes; default 1)")
        if name in ("reboot-node", "inject", "heal"):
            sub.add_argument("node", help="the node's name")
        if name == "inject":
            from .faults import KINDS  # not .drills: every process builds this parser
            sub.add_argument("fault", metavar="FAULT", help="one of: " + "; ".join(
                f"{kind}: {k.doc}" for kind, k in KINDS.items()))
            sub.add_argument("--gpu", type=_gpu_index, metavar="N",
                             help="the GPU of a GPU fault (its index in the node's fake GPUs; default 0)")
        if name == "up":
            sub.add_argument("--proctrack", choices=("cgroup", "linuxproc"),
                             help="Slurm's ProctrackType (override [dev] proctrack; default cgroup); linuxproc "
                                  "shows the Epilog's cleanup where Slurm cannot track jobs by cgroup, as in pods")
        if name == "fleet":
            for flag, default, text in (
                    ("--rate", 0.03, "events a second of each node (default 0.03)"),
                    ("--burst-rate", 0.0, "events a second of the whole fleet during the burst (default 0: none)"),
                    ("--burst-after", 60.0, "seconds from the start to the burst (default 60)"),
                    ("--burst-for", 300.0, "the burst's length in seconds (default 300)"),
                    ("--seconds", 0.0, "seconds to run (default 0: until interrupted)")):
                sub.add_argument(flag, type=_non_negative, default=default, metavar="X", help=text)
            sub.add_argument("--processes", type=_node_count, default=1, metavar="N",
                             help="processes that share the nodes (default 1)")
        sub.set_defaults(func=func)

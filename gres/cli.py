"""`slurm-ext gres ...`: gres.conf from NVML, registered with the core CLI.

`add_commands(commands)` is what `slurm_ext.cli` calls while it builds the
parser; NVML and Slurm are asked only when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from slurm_ext import config

__all__ = ["add_commands"]


def _gres_generate(args: argparse.Namespace) -> int:
    from slurm_ext import events
    from . import generate
    loaded = config.load(args.config)
    if args.output:
        loaded = replace(loaded, gres=replace(loaded.gres, output=args.output))
    dry = args.dry_run or args.diff
    try:
        # a dry run's events go to standard error only (the log line), never into the node journal
        emit = events.emitter(None if dry else loaded.node.state_dir, "gres")
        generation = generate(loaded, loaded.node.slurm_name, emit=emit, dry_run=dry, accept=args.accept)
    except OSError as err:
        from . import output_path
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
    from . import read_inventory
    from .inventory import to_json
    loaded = config.load(args.config)
    inventory = read_inventory(dev_dir=Path(loaded.gres.dev_dir), types=loaded.gres.types)
    if args.json:
        print(to_json(inventory))
        return 0
    if args.slurmd_conf:
        from .render import dynamic_node_conf
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
    from . import read_inventory
    from .check import compare_counts, nvml_counts, parse_gres, slurmd_counts
    from .render import gres_conf
    from slurm_ext.slurm import SlurmClient
    loaded = config.load(args.config)
    node = loaded.node.slurm_name
    inventory = read_inventory(dev_dir=Path(loaded.gres.dev_dir), types=loaded.gres.types)
    expected = nvml_counts(inventory)
    problems = compare_counts(expected, slurmd_counts(loaded.slurm.conf_path(), gres_conf(inventory, node), node),
                              "slurmd -G")
    running = SlurmClient(loaded.slurm).node(node)
    problems += compare_counts(expected, parse_gres(running.gres), f"node {node} in slurmctld")
    summary = ", ".join(f"gpu:{kind}:{n}" for kind, n in sorted(expected.items())) or "no GPUs"
    for line in problems:
        print(line)
    print(f"NVML: {summary}; node {node}: Gres={running.gres or '(none)'}: "
          + ("differs" if problems else "agrees"))
    return 1 if problems else 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add this component's commands to the core CLI's subcommands."""
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

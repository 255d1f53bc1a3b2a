"""`slurm-ext accounting ...`: durable accounting's commands, registered with the core CLI.

`add_commands(commands)` is what `slurm_ext.cli` calls while it builds the
parser; the work is imported only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slurm_ext import config

__all__ = ["add_commands"]


def _config(args: argparse.Namespace) -> int:
    from . import database
    loaded = config.load(args.config)
    written = database.write_config(loaded, slurmdbd=not args.no_slurmdbd)
    for path in (written.slurmdbd_conf, written.my_cnf, written.init_sql):
        if path:
            print(f"wrote {path}")
    return 0


def _check_storage(args: argparse.Namespace) -> int:
    from . import database, storage
    loaded = config.load(args.config)
    try:
        verdict = database.prepare_storage(loaded, args.role, allow_ephemeral=args.allow_ephemeral)
    except storage.StorageRefused as err:
        _emitter(loaded)("storage-refused", str(err), role=args.role)
        raise
    for note in verdict.notes:
        print(note)
    return 0


def _emitter(loaded):
    from slurm_ext import events
    return events.emitter(loaded.node.state_dir, "accounting")


def _backup(args: argparse.Namespace) -> int:
    from . import backups
    loaded = config.load(args.config)
    result = backups.backup(loaded, Path(args.to) if args.to else None, args.keep, emit=_emitter(loaded))
    for taken in (result, result.own):
        if taken is None:
            continue
        tables = taken.manifest.tables
        print(f"backup of {taken.manifest.database}: {taken.path} ({taken.manifest.size} bytes, {len(tables)} "
              f"tables, {sum(tables.values())} rows) in {taken.seconds:.1f}s; manifest {taken.manifest_path}")
        for old in taken.removed:
            print(f"removed old backup {old}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from . import backups
    loaded = config.load(args.config)
    result = backups.restore(loaded, Path(args.source), emit=_emitter(loaded))
    print(f"restored {args.source} into database {result.database}: {len(result.tables)} tables, "
          f"{sum(result.tables.values())} rows, in {result.seconds:.1f}s")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from . import backups
    loaded = config.load(args.config)
    result = backups.verify(Path(args.file), loaded.accounting.backup_key, emit=_emitter(loaded))
    for problem in result.problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    rows = sum(found for _, found in result.counts.values())
    print(f"{args.file}: {'OK' if result.ok else 'FAILED'}: {len(result.counts)} tables, {rows} rows restored into a "
          f"scratch MariaDB in {result.seconds:.1f}s")
    return 0 if result.ok else 1


def _reconcile(args: argparse.Namespace) -> int:
    from slurm_ext.journal import parse_since
    from . import reconcile
    loaded = config.load(args.config)
    since = parse_since(args.since) if args.since else None
    found = reconcile.reconcile(loaded, since=since, witness=Path(args.witness) if args.witness else None,
                                emit=_emitter(loaded))
    if args.json:
        print(json.dumps(found.as_dict(), indent=1))
    else:
        print(found.summary())
        for job in found.missing:
            print(f"missing  job {job.job_id} {job.state} ended {job.end} user {job.user} (witness line "
                  f"{job.line})")
        for line in found.runaway:
            print(f"runaway  {line}")
    return 1 if found.missing or found.runaway else 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `accounting` and its actions to the core CLI's subcommands."""
    acct = commands.add_parser(
        "accounting", help="slurmdbd and MariaDB: config, storage guard, backup, restore, reconcile",
        description="Durable Slurm accounting: the database on a guarded persistent volume, consistent backups "
                    "with a manifest, and a reconciliation of every job end against sacct. Settings: [accounting].")
    actions = acct.add_subparsers(dest="action", metavar="ACTION", required=True)

    sub = actions.add_parser("config", help="write slurmdbd.conf (0600, SlurmUser's) and, with run_database, "
                             "MariaDB's my.cnf and start-up SQL",
                             description="The password comes from accounting.password_file or "
                                         "$SLURM_EXT_DB_PASSWORD, never from the command line.")
    sub.add_argument("--no-slurmdbd", action="store_true", help="only MariaDB's files: slurmdbd runs elsewhere")
    sub.set_defaults(func=_config)

    sub = actions.add_parser("check-storage", help="the durability guard: refuse tmpfs, a container's layer, a "
                             "read-only or full volume, a broken fsync, or a replaced volume (exit 3)",
                             description="Run by the accounting and controller agents before mariadbd and "
                                         "slurmctld. On first initialisation it writes an identity marker into "
                                         "the database volume and StateSaveLocation.")
    sub.add_argument("--role", choices=("accounting", "controller"), default="accounting",
                     help="guard what this role keeps (default: accounting)")
    sub.add_argument("--allow-ephemeral", action="store_true",
                     help="accept tmpfs or a container's own layer, for a demo (every line says so)")
    sub.set_defaults(func=_check_storage)

    sub = actions.add_parser("backup", help="a consistent, compressed dump with a manifest (checksums, row counts, "
                             "cluster identity) authenticated by accounting.backup_key; keeps accounting.backup_keep "
                             "of them")
    sub.add_argument("--to", metavar="DIR", help="where the backup goes (default: accounting.backup_dir)")
    sub.add_argument("--keep", type=int, metavar="N", help="backups kept in DIR (default: accounting.backup_keep)")
    sub.set_defaults(func=_backup)

    sub = actions.add_parser("restore", help="load a backup into a new or stopped database (refused without an "
                             "authenticated manifest, while slurmdbd is connected, onto a database that holds data, "
                             "or through an account that may write other databases)")
    sub.add_argument("--from", dest="source", required=True, metavar="FILE", help="the backup (.sql.gz)")
    sub.set_defaults(func=_restore)

    sub = actions.add_parser("verify", help="restore a backup into a scratch MariaDB and compare its row counts "
                             "with the manifest, authenticated by accounting.backup_key (exit 1 on any difference)")
    sub.add_argument("file", metavar="FILE", help="the backup (.sql.gz)")
    sub.set_defaults(func=_verify)

    sub = actions.add_parser("reconcile", help="list every job the witness saw end that sacct lacks, and runaway "
                             "jobs (exit 1 when there is any)",
                             description="The witness is Slurm's jobcomp/filetxt log (JobCompLoc), which slurmctld "
                                         "writes at each job end without going through slurmdbd.")
    sub.add_argument("--since", metavar="T", help="only jobs that ended from T on: a duration back from now (2h, 1d) "
                     "or an ISO time")
    sub.add_argument("--witness", metavar="FILE", help="the jobcomp/filetxt log (default: accounting.witness, "
                     "else slurm.conf's JobCompLoc)")
    sub.add_argument("--json", action="store_true", help="print the findings as JSON")
    sub.set_defaults(func=_reconcile)

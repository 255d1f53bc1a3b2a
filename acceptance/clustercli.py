"""`slurm-ext accept cluster`: its options and its output. Light: every slurm-ext process builds the parser; the
run itself (acceptance.cluster) is imported when the command runs."""

from __future__ import annotations

import argparse
import json
import signal
import sys

__all__ = ["add_command"]

#: exit codes: 0 every node passed, 1 a node failed, 3 a node could not be tested or a test could not run, 2 refused
_EXIT = {"pass": 0, "fail": 1, "error": 3}


def _duration(text: str) -> float:
    from slurm_ext.config import parse_duration
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err} (a number and s, m or h: 90s, 30m, 1h)") from None


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10000:
        raise argparse.ArgumentTypeError(f"not a number of jobs from 1 to 10000: {text!r}")
    return int(text)


def _main(args: argparse.Namespace) -> int:
    import threading

    from slurm_ext import config
    from slurm_ext.errors import SlurmExtError

    from .cluster import accept_cluster
    loaded = config.load(args.config)
    stop = threading.Event()

    def stopping(signum, frame):  # only a flag: the run's loop cancels its jobs and removes the reservation
        stop.set()
    before = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    say = (lambda text: print(text, file=sys.stderr)) if not args.json else (lambda text: None)
    try:
        run = accept_cluster(loaded, args.level, nodes=args.nodes or "", batch=args.batch, wait_jobs=args.wait_jobs,
                             output_dir=args.output_dir, say=say, stop=stop,
                             on_node=(lambda outcome: None) if args.json else (lambda outcome: print(outcome.line(),
                                                                                                     flush=True)))
    except SlurmExtError as err:
        print(f"slurm-ext accept cluster: {err}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if args.json:
        print(json.dumps(run.to_json(), indent=1))
    else:
        print(run.summary())
        if not run.reservation_end.startswith(("removed", "none")):
            print(f"slurm-ext accept cluster: reservation {run.reservation} {run.reservation_end}", file=sys.stderr)
    return _EXIT[run.verdict]


def add_command(actions: argparse._SubParsersAction) -> None:
    """Add `accept cluster` to `slurm-ext accept`'s actions."""
    from .records import LEVELS
    cluster = actions.add_parser(
        "cluster", help="every node's acceptance on demand, in a Slurm maintenance reservation (run on the "
        "controller); exit 0 all passed, 1 a node failed, 3 a node could not be tested or a test could not run, "
        "2 refused",
        description="Makes a MAINT reservation (Flags=MAINT,IGNORE_JOBS) over the nodes, runs one exclusive job "
                    "per node, at most --batch at once, each the node's own `slurm-ext accept run --apply` "
                    "([acceptance] job_command): a failing node is drained by its own agent with the test and the "
                    "GPU in its reason, and a repair is recommended from it. A node still running a job is tested "
                    "when that job ends, up to --wait-jobs (never killed); drained and down nodes are not tested. "
                    "The reservation is removed at the end, on Ctrl-C and SIGTERM too. Needs a Slurm operator or "
                    "admin (root, SlurmUser, or adminlevel=operator).")
    cluster.add_argument("--nodes", metavar="LIST", help="a Slurm host list (gpu[01-16],gpu20); default: every node "
                         "slurmctld knows")
    cluster.add_argument("--level", choices=LEVELS, default="quick", help="quick (seconds a node, the default), "
                         "standard (about two minutes), extended (up to an hour)")
    cluster.add_argument("--batch", type=_count, default=64, metavar="N", help="at most N nodes tested at once "
                         "(default 64): the rest of the cluster keeps its own capacity meanwhile")
    cluster.add_argument("--wait-jobs", type=_duration, default=3600.0, metavar="DURATION", help="how long a "
                         "node's test may wait for the jobs running there to end (default 1h); past it the node is "
                         "reported not tested: busy")
    cluster.add_argument("--output-dir", default="/tmp", metavar="DIR", help="where each node's job writes its "
                         "output, on the node (default /tmp): slurm-ext-accept-NODE-JOBID.out")
    cluster.add_argument("--json", action="store_true", help="machine-readable: every node's outcome and run")
    cluster.set_defaults(func=_main)

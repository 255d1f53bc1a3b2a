"""Repair benchmarks on a dev cluster of 1,000 nodes in slurm.conf, four of them running (root, Debian's Slurm):

- `status` and `history` for the whole cluster: wall time and the Slurm commands they issue, against `sinfo -N`
  for the same cluster in the same run (targets: under 1 s, one query per Slurm table);
- approve -> the node drained with the repair's reason, and the reboot's end (the node registered again after
  RebootProgram) -> the node resumed, over a few real repairs.

    python tests/benchmarks/bench_repair.py [--nodes 1000] [--repairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.wait import wait_for  # noqa: E402  what the tests wait with
from slurm_ext import command, config, devcluster as dev  # noqa: E402
from slurm_ext.devcluster.layout import Layout  # noqa: E402
from slurm_ext.repair.history import gather  # noqa: E402
from slurm_ext.repair.status import node_statuses  # noqa: E402
from slurm_ext.repair.store import open_store  # noqa: E402
from slurm_ext.slurm import SlurmClient  # noqa: E402

BENCH_CLUSTER = dict(cluster_name="slurmextbenchrepair", node_name="bnode1", nodes=4, slurmctld_port=28817,
                     slurmd_port=28818, slurmdbd_port=28819, mariadb_port=23310, controller_probe_port=29831, web_port=29833,
                     worker_probe_port=29830, accounting_probe_port=29832, node_port_base=30000, health_interval=1.0,
                     repair_interval=1.0, slurmd_timeout=30, resume_timeout=60)


def counting(settings: dev.DevSection) -> tuple[SlurmClient, list]:
    """A Slurm client of the cluster that records every command it runs."""
    issued = []
    client = dev.client(settings)

    def runner(argv, timeout, **kwargs):
        issued.append(os.path.basename(argv[0]) + " " + " ".join(argv[1:3]))
        return command.run(argv, timeout, **kwargs)
    client.runner = runner
    return client, issued


def timed(what, rounds: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = what()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes defined in slurm.conf (4 run)")
    parser.add_argument("--repairs", type=int, default=3, help="real repairs timed")
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-repair-")
    os.chmod(state_dir, 0o755)
    settings = dev.DevSection(state_dir=state_dir, defined_nodes=args.nodes, **BENCH_CLUSTER)
    layout = Layout(settings)
    try:
        started = time.perf_counter()
        dev.up(settings)
        print(f"cluster: {args.nodes} nodes in slurm.conf, 4 running; up in {time.perf_counter() - started:.1f}s")
        loaded = config.load(layout.slurm_ext_conf)
        store = open_store(loaded)
        env = layout.daemon_environ()

        sinfo, _ = timed(lambda: subprocess.run(["sinfo", "-N", "-h"], env=env, capture_output=True, check=True))
        client, issued = counting(settings)
        issued.clear()
        status_time, statuses = timed(lambda: node_statuses(client.nodes(), store.records(open_only=True),
                                                            store.events(since=time.time() - 86400, limit=5000)))
        status_commands = len(issued) // 5
        issued.clear()

        history_time, timeline = timed(lambda: gather(store, client, time.time() - 3600), rounds=3)
        history_commands = sorted(set(issued))
        history_count = len(issued) // 3
        cli = [sys.executable, "-m", "slurm_ext.cli", "--config", str(layout.slurm_ext_conf)]
        status_cli, _ = timed(lambda: subprocess.run([*cli, "status", "--json"], capture_output=True, check=True), 3)
        history_cli, _ = timed(lambda: subprocess.run([*cli, "history", "--json"], capture_output=True, check=True), 3)
        print(f"status, {len(statuses)} nodes: {status_time * 1000:.0f} ms in process, {status_cli * 1000:.0f} ms "
              f"as `slurm-ext status --json`; {status_commands} Slurm command per call; `sinfo -N` "
              f"{sinfo * 1000:.0f} ms (ratio {status_time / sinfo:.2f} in process, {status_cli / sinfo:.2f} CLI)")
        print(f"history, {len(timeline.entries)} entries, {len(timeline.unreachable)} agents not answering: "
              f"{history_time * 1000:.0f} ms in process, {history_cli * 1000:.0f} ms as `slurm-ext history "
              f"--json`; {history_count} Slurm commands per call ({', '.join(history_commands)})")

        drained, resumed = [], []
        for index in range(args.repairs):
            node = layout.nodes[1 + index % 3]
            spec = json.loads(node.gpu_spec.read_text())
            with open(node.kernel_log, "a") as log:
                log.write(f"NVRM: Xid (PCI:{spec['gpus'][1]['pci_bus_id'][4:-2]}): 79, pid='<unknown>', "
                          "name=<unknown>, GPU has fallen off the bus.\n")
            wait_for("a recommendation", lambda: any(r.node == node.name and r.state == "recommended"
                                                     for r in store.records(open_only=True)), 30)
            slurm = dev.client(settings)
            before = slurm.node(node.name).boot_time
            done = subprocess.run([*cli, "repair", "approve", node.name], capture_output=True, text=True)
            approved = time.perf_counter()
            assert done.returncode == 0, done.stderr
            wait_for("the repair drain", lambda: slurm.node(node.name).reason.startswith("slurm-ext: repair"), 30)
            drained.append(time.perf_counter() - approved)
            booted = wait_for("the reboot's end",
                              lambda: (n := slurm.node(node.name)).boot_time and n.boot_time > before
                              and not n.flags & {"REBOOT_ISSUED", "REBOOT_REQUESTED"} and time.perf_counter(), 120)
            wait_for("resumed", lambda: not slurm.node(node.name).drained, 120)
            resumed.append(time.perf_counter() - booted)
            wait_for("the repair closed",
                     lambda: not [r for r in store.records(open_only=True) if r.node == node.name], 60)
        print(f"approve -> drained: median {statistics.median(drained) * 1000:.0f} ms, max {max(drained) * 1000:.0f} "
              f"ms over {len(drained)} repairs (repair.interval 1s)")
        print(f"reboot's end -> resumed: median {statistics.median(resumed):.2f} s, max {max(resumed):.2f} s "
              "(health.interval 1s: the checks' first pass after the boot, then the resume)")
        print("targets: status and history under 1 s with one query per Slurm table (nodes; nodes and events)")
        store.close()
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Admin resume -> our drain: how long a node with a critical want held behind an admin's drain stays schedulable
once the admin resumes it (root, Debian's Slurm, a dev cluster of its own).

Each try: the admin drains the node, a want of ours arrives (held behind it), the admin resumes, and `scontrol
show node` is sampled every 20 ms until our reason shows. Printed: the median and the most of resume -> our drain
over the tries (target: at most 1 s), against the same run's floor, one `scontrol show node` and one `scontrol
update` back to back (what any reaction costs at least).

    python tests/benchmarks/bench_nodestate.py [--tries 20]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from slurm_ext import command, devcluster as dev, nodestate
from slurm_ext.devcluster.layout import Layout
from slurm_ext.nodestate import channel

BENCH_CLUSTER = dict(cluster_name="slurmextbenchstate", node_name="snode1", slurmctld_port=31817, slurmd_port=31818,
                     slurmdbd_port=31819, mariadb_port=23320, controller_probe_port=31831, web_port=0,
                     worker_probe_port=31830, accounting_probe_port=31832, node_port_base=31900)
GPU = "gpu missing: GPU-00000000-0000-0000-0000-000000000003"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=20)
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-nodestate-")
    os.chmod(state_dir, 0o755)
    settings = dev.DevSection(state_dir=state_dir, **BENCH_CLUSTER)
    layout = Layout(settings)
    try:
        dev.up(settings)
        slurm = dev.client(settings)
        node = settings.node_name
        socket = nodestate.socket_path(layout.hook_socket.parent)

        def scontrol(*words: str) -> None:
            command.run(["scontrol", "update", f"nodename={node}", *words], 10, env=layout.daemon_environ())

        floor = []
        for _ in range(5):
            started = time.perf_counter()
            slurm.node(node)
            scontrol("state=drain", "reason=bench: floor")
            floor.append(time.perf_counter() - started)
        scontrol("state=resume")
        reactions, schedulable = [], []
        for _ in range(args.tries):
            scontrol("state=drain", "reason=admin: bench")
            answer = channel.request(socket, {"owner": "gres", "want": GPU}, 30)
            assert answer.get("ok") and "held" in answer.get("outcome", ""), answer
            time.sleep(random.uniform(0.3, 0.8))  # the resume at any phase of the agent's look-twice-a-second
            scontrol("state=resume")
            resumed = time.perf_counter()
            open_since, open_for = None, 0.0
            while True:
                shown = slurm.node(node)
                now = time.perf_counter()
                if not shown.drained:
                    open_since = open_since or now
                elif open_since is not None:
                    open_for += now - open_since
                    open_since = None
                if shown.drained and shown.reason.startswith("slurm-ext:"):
                    break
                if now - resumed > 30:
                    raise SystemExit(f"our drain did not come within 30 s: {shown}")
                time.sleep(0.02)
            reactions.append(now - resumed)
            schedulable.append(open_for)
            channel.request(socket, {"owner": "gres", "clear": True}, 30)
            deadline = time.monotonic() + 30
            while slurm.node(node).drained and time.monotonic() < deadline:
                time.sleep(0.05)
        base = statistics.median(floor)
        print(f"floor (scontrol show node + scontrol update): median {base * 1000:.0f} ms")
        print(f"admin resume -> our drain over {args.tries} tries: median {statistics.median(reactions) * 1000:.0f} ms, "
              f"max {max(reactions) * 1000:.0f} ms (target <= 1000 ms); ratio to the floor "
              f"{statistics.median(reactions) / base:.1f}")
        print(f"schedulable (not drained) as sampled: median {statistics.median(schedulable) * 1000:.0f} ms, "
              f"max {max(schedulable) * 1000:.0f} ms")
        return 0 if max(reactions) <= 1.0 else 1
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""The collected history on the dev cluster (issue 33): the controller agent's own `collector` worker takes the node
agent's journal into the repair database on the cluster's MariaDB; SIGKILLed in the middle (the agent starts it
again) and with the node rebooted in the middle (its agent stopped and started again), every event the node wrote
is in `slurm-ext history` once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

from helpers.cli import cli
from helpers.wait import wait_for
from slurm_ext import devcluster, events


def _collector_pid(cluster) -> int | None:
    """The controller agent's collector worker (`slurm-ext repair collect`, a child of the agent)."""
    agent = int(cluster.layout.pidfile("supervise-controller").read_text().split()[0])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if parent == agent and b"repair" in argv and b"collect" in argv:
            return int(entry.name)
    return None


def test_every_event_of_the_node_once_across_a_killed_collector_and_a_reboot(running_cluster):
    cluster = running_cluster
    state = str(cluster.layout.first.node_state)
    run = uuid.uuid4().hex[:12]
    first = wait_for("the controller's collector worker", lambda: _collector_pid(cluster), 60)
    written = []

    def write(start: int, count: int) -> None:
        for seq in range(start, start + count):
            events.emit(state, "prolog_epilog", "script-ok", f"history probe {run} #{seq}", probe=run, seq=seq)
            written.append(seq)
            time.sleep(0.01)

    writer = threading.Thread(target=write, args=(0, 300))
    writer.start()
    time.sleep(1.0)
    os.kill(first, signal.SIGKILL)  # the controller's collector dies mid-run: the agent starts it again
    writer.join()
    again = wait_for("the collector started again", lambda: (pid := _collector_pid(cluster)) != first and pid, 60)
    assert again != first
    writer = threading.Thread(target=write, args=(300, 200))
    writer.start()
    devcluster.reboot_node(cluster.settings, cluster.node)  # the node's agent stops and starts while it writes
    writer.join()

    def probes():
        done = cli("--config", str(cluster.layout.slurm_ext_conf), "history", "--node", cluster.node, "--since", "30m",
                   "--limit", "100000", "--json", timeout=60)
        assert done.returncode == 0, done.stderr
        found = [e for e in json.loads(done.stdout)["entries"] if run in e["message"]]
        return found if len(found) >= len(written) else None
    found = wait_for("every probe event in the history", probes, 120, interval=2.0)
    seqs = sorted(int(e["message"].rsplit("#", 1)[1]) for e in found)
    assert seqs == list(range(500)), f"{len(seqs)} rows, {len(set(seqs))} distinct of 500"
    assert all(e["source"] == "agent" and e["event"] == "prolog_epilog/script-ok" for e in found)

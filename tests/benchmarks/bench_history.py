"""The collected history at 10,000 nodes (issue 33), on a dev cluster whose slurm.conf defines them (one runs, `dev
fleet` plays the agents of the rest), with the controller agent's own collector worker and the cluster's MariaDB:

- 0.03 events per node per second, and a burst of 5,000 events a second for 5 minutes; the collector SIGKILLed and
  the whole fleet SIGKILLed and started again in the middle of the burst;
- every event in the store once (each node's numbers 0 .. n-1, counted against the fleet's own journals);
- the backlog, the collector's CPU (of one core) and memory, the fleet's memory, sampled every 2 s;
- how long after the burst's end the store holds everything written up to it (target: 2 minutes);
- `history --since 1d` and `status` (the agents' /health as the collector took it) against `sinfo -N` in the same
  run (target: under 1 s);
- the page's watcher over the same cluster: its refresh (target: under 1 s) and what a browser is sent, the whole
  view and an update after one refresh interval (target: under 200 KiB).

    python tests/benchmarks/bench_history.py [--nodes 10000] [--burst-rate 5000] [--burst-for 300]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.wait import wait_for  # noqa: E402
from slurm_ext import config, devcluster as dev  # noqa: E402
from slurm_ext.devcluster import fleet as simulator  # noqa: E402
from slurm_ext.devcluster.layout import Layout  # noqa: E402
from slurm_ext.repair.store import open_store  # noqa: E402

#: the simulated nodes' ports are 12001 .. 32001 (below the ephemeral range): the cluster's own are below them
BENCH_CLUSTER = dict(cluster_name="slurmextbenchhistory", node_name="hnode1", nodes=1, slurmctld_port=10717,
                     slurmd_port=10718, slurmdbd_port=10719, mariadb_port=10312, controller_probe_port=10871,
                     worker_probe_port=10870, accounting_probe_port=10872, web_port=0, node_port_base=12000,
                     history_interval=15.0, repair_interval=10.0, slurmd_timeout=300)
CPU_TICKS = os.sysconf("SC_CLK_TCK")


def collector_pid(layout: Layout) -> int | None:
    agent = int(layout.pidfile("supervise-controller").read_text().split()[0])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == agent and b"repair" in argv and b"collect" in argv:
                return int(entry.name)
    return None


def cpu_and_rss(pid: int) -> tuple[float, float]:
    """(CPU seconds, resident MiB) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return (int(fields[11]) + int(fields[12])) / CPU_TICKS, rss


def group_rss(leader: int) -> float:
    """Resident MiB of a process group (the fleet and its children)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == leader:
                    total += cpu_and_rss(int(entry.name))[1]
            except (OSError, IndexError, ValueError):
                continue
    return total


def fleet(layout: Layout, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(layout.dev_conf), "dev", "fleet",
                             "--processes", "2", *args], start_new_session=True, stdout=subprocess.DEVNULL)


def stop(process: subprocess.Popen, how: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, how)
        process.wait(60)


def page(loaded, simulated: int) -> None:
    """The page's watcher over this cluster: Slurm's tables of 10,000 nodes and the /health answers the collector
    took (no agent asked); its refresh's time and CPU, and what a browser is sent: the whole view, and the update
    after one refresh interval (the collector took about a third of the nodes again meanwhile)."""
    from slurm_ext.web.watch import Watcher
    watcher = Watcher(loaded)
    asked = []
    real_health = watcher.agent_client.health

    def health(node, *args, **kwargs):
        asked.append(node)
        return real_health(node, *args, **kwargs)
    watcher.agent_client.health = health
    walls, cpus = [], []
    for round_ in range(4):
        if round_:
            time.sleep(loaded.web.refresh)
        began, cpu = time.perf_counter(), time.process_time()
        view = watcher.refresh()
        walls.append(time.perf_counter() - began)
        cpus.append(time.process_time() - cpu)
        if round_ == 0:
            first = watcher.changes.version
            full = len(watcher.changes.body(None))
        if round_ == 1:
            update, zipped = len(watcher.changes.body(first)), len(watcher.changes.body(first, zipped=True))
    whole = len(view.body)
    repair = watcher.sources["repair"]
    if not repair.ok or len(watcher._taken) < simulated:  # what the page could not read, said
        print(f"page: the repair database's source {'ok' if repair.ok else 'failing: ' + repair.error}; answers held "
              f"{len(watcher._taken)}; the collector's interval as read {watcher._collecting:g}")
    data = json.loads(watcher.changes.body(None))
    taken = sum(1 for row in data["nodes"] if row["agent"]["error"] == "")
    print(f"page at {len(view.data['nodes'])} nodes ({simulated} simulated, their /health as the collector took "
          f"it; agents asked by the page: {len(asked)}; rows with an answer: {taken}): refresh "
          f"{walls[0] * 1000:.0f} ms the first (every answer read), then {statistics.median(walls[1:]) * 1000:.0f} ms "
          f"(median of 3; the page's own CPU {statistics.median(cpus[1:]) * 1000:.0f} ms, the rest Slurm's commands); "
          f"target under 1 s")
    print(f"page sent: the whole view {whole / 2**20:.1f} MiB (a script's), the page's first answer "
          f"{full / 2**20:.1f} MiB, an update after one refresh ({loaded.web.refresh:g}s) {update / 1024:.0f} KiB, "
          f"{zipped / 1024:.0f} KiB as a browser gets it (gzip); target under 200 KiB")
    watcher.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000, help="nodes defined in slurm.conf (one runs)")
    parser.add_argument("--rate", type=float, default=0.03, help="events a second of each node")
    parser.add_argument("--burst-rate", type=float, default=5000.0, help="events a second of the burst")
    parser.add_argument("--burst-for", type=float, default=300.0, help="the burst's seconds")
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-history-")
    os.chmod(state_dir, 0o755)
    settings = dev.DevSection(state_dir=state_dir, defined_nodes=args.nodes, **BENCH_CLUSTER)
    layout = Layout(settings)
    conf = layout.slurm_ext_conf
    burst_at = 60.0
    players = quiet = None
    try:
        started = time.perf_counter()
        dev.up(settings)
        print(f"cluster: {args.nodes} nodes in slurm.conf, one running; up in {time.perf_counter() - started:.1f}s")
        loaded = config.load(conf)
        store = open_store(loaded)
        print(f"store: {store.where}; collector every {loaded.history.interval:g}s, {loaded.history.parallel} "
              f"agents at once, batches of {loaded.history.batch}, backlog {loaded.history.backlog}")

        def stored() -> int:
            """The simulated nodes' events the collector took (the running node's own are not counted)."""
            return int(store._execute("SELECT COALESCE(SUM(taken), 0) FROM journal_cursors WHERE node <> ?",
                                      (layout.nodes[0].name,))[0][0])

        players = fleet(layout, "--rate", str(args.rate), "--burst-rate", str(args.burst_rate), "--burst-after",
                        str(burst_at), "--burst-for", str(args.burst_for))
        began = time.monotonic()
        samples, killed_collector, killed_fleet, burst_end_count, caught_up = [], False, False, None, None
        last_cpu = None
        while True:
            time.sleep(2.0)
            now = time.monotonic() - began
            pid = collector_pid(layout)
            figures = json.loads((Path(loaded.node.state_dir) / "collector-metrics.json").read_text()) \
                if (Path(loaded.node.state_dir) / "collector-metrics.json").exists() else {}
            if pid:
                cpu, rss = cpu_and_rss(pid)
                share = (cpu - last_cpu[1]) / (now - last_cpu[2]) if last_cpu and last_cpu[0] == pid else None
                last_cpu = (pid, cpu, now)
                samples.append((now, share, rss, figures.get("backlog", 0), group_rss(players.pid)))
            if not killed_collector and now >= burst_at + args.burst_for / 2 and pid:
                os.kill(pid, signal.SIGKILL)
                killed_collector = True
                print(f"t={now:.0f}s: collector SIGKILLed (the controller agent starts it again)")
            if not killed_fleet and now >= burst_at + args.burst_for * 2 / 3:
                stop(players, signal.SIGKILL)
                left = burst_at + args.burst_for - (time.monotonic() - began)
                players = fleet(layout, "--rate", str(args.rate), "--burst-rate", str(args.burst_rate),
                                "--burst-after", "0", "--burst-for", f"{max(left, 0):.0f}")
                killed_fleet = True
                print(f"t={now:.0f}s: every simulated agent SIGKILLed and started again on its journal")
            if burst_end_count is None and now >= burst_at + args.burst_for:
                burst_end_count = sum(simulator.written(layout).values())
                burst_end = now
                print(f"t={now:.0f}s: the burst ended; {burst_end_count} events written so far")
            if burst_end_count is not None and caught_up is None and stored() >= burst_end_count:
                caught_up = now - burst_end
                print(f"t={now:.0f}s: the store holds everything written up to the burst's end, "
                      f"{caught_up:.0f}s after it")
            if burst_end_count is not None and (caught_up is not None or now > burst_end + 300):
                if now > burst_end + max(caught_up or 0, 30):
                    break
        stop(players)
        quiet = fleet(layout, "--rate", "0")
        total = sum(simulator.written(layout).values())
        wait_for("the rest collected", lambda: stored() >= total, 300, interval=2.0)
        counts = simulator.written(layout)
        rows = store._execute(
            "SELECT node, COUNT(*), COUNT(DISTINCT JSON_VALUE(fields, '$.fleet_seq')), "
            "MAX(CAST(JSON_VALUE(fields, '$.fleet_seq') AS SIGNED)) FROM node_events WHERE component <> 'repair' "
            "AND node <> ? GROUP BY node", (layout.nodes[0].name,))
        found = {node: (int(n), int(d), int(m)) for node, n, d, m in rows}
        wrong = {node: (count, found.get(node)) for node, count in counts.items()
                 if found.get(node, (0, 0, -1)) != (count, count, count - 1)}
        silent = [node for node, count in counts.items() if not count]  # a fleet part that never ran
        if silent:
            print(f"{len(silent)} simulated nodes wrote nothing (a part of the fleet did not start?): {silent[:5]}")
        print(f"events: {total} written by {len(counts)} simulated agents, {sum(v[0] for v in found.values())} "
              f"stored; nodes whose events are not each there once: {len(wrong)} {dict(list(wrong.items())[:5])}")
        burst = [s for s in samples if burst_at <= s[0] <= burst_at + args.burst_for and s[1] is not None]
        base = [s for s in samples if s[0] < burst_at and s[1] is not None and s[0] > 20]
        print(f"collector CPU (one core): {statistics.mean(s[1] for s in base):.2f} at the base rate, "
              f"{statistics.mean(s[1] for s in burst):.2f} in the burst (max {max(s[1] for s in burst):.2f}); "
              f"RSS max {max(s[2] for s in samples):.0f} MiB; backlog max {max(s[3] for s in samples)}; "
              f"fleet RSS max {max(s[4] for s in samples):.0f} MiB")
        print(f"burst: {args.burst_rate:g} events/s for {args.burst_for:g}s; caught up "
              f"{caught_up if caught_up is None else round(caught_up)}s after its end (target 120 s)")
        env = layout.daemon_environ()
        cli = [sys.executable, "-m", "slurm_ext.cli", "--config", str(conf)]

        def timed(argv: list, rounds: int = 3) -> float:
            times = []
            for _ in range(rounds):
                began = time.perf_counter()
                done = subprocess.run(argv, env=env, capture_output=True, text=True)
                if done.returncode:  # slurmctld busy pinging 10,000 nodes that never answer may time a client out
                    print(f"{' '.join(argv[-4:])}: exit {done.returncode}: {done.stderr.strip()[-300:]} (not timed)")
                    continue
                times.append(time.perf_counter() - began)
            return statistics.median(times) if times else float("nan")
        sinfo = timed(["sinfo", "-N", "-h"])
        table = timed(["scontrol", "show", "node", "--oneliner"])
        print(f"Slurm's node table as `status` and the page read it on this Slurm (`scontrol show node --oneliner`): "
              f"{table * 1000:.0f} ms; `sinfo -N` {sinfo * 1000:.0f} ms")
        history = timed([*cli, "history", "--since", "1d", "--json"])
        print(f"`history --since 1d --json` (the newest 1000 of {total} events): {history * 1000:.0f} ms; "
              f"`sinfo -N` {sinfo * 1000:.0f} ms (ratio {history / sinfo:.2f}); target under 1 s")
        fresh = time.time() - 3 * loaded.history.interval
        wait_for("every simulated node's /health taken lately", lambda: int(store._execute(
            "SELECT COUNT(*) FROM node_health WHERE taken >= ?", (fresh,))[0][0]) >= len(counts), 120, interval=2.0)
        said = json.loads(subprocess.run([*cli, "status", "--json"], env=env, capture_output=True, check=True).stdout)
        status = timed([*cli, "status", "--json"])
        print(f"`status --json` ({len(said['nodes'])} nodes, {sum(said['counts'].values())} counted; the agents' "
              f"/health as the collector took it, {len(said['warnings'])} warnings): {status * 1000:.0f} ms; "
              f"`sinfo -N` {sinfo * 1000:.0f} ms (ratio {status / sinfo:.2f}); target under 1 s")
        page(loaded, len(counts))
        stop(quiet)
        store.close()
        return 1 if wrong or silent else 0
    finally:
        for process in (players, quiet):
            if process is not None:
                stop(process)
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

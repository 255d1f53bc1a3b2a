"""The cluster page on a dev cluster of 1,000 nodes in slurm.conf, four of them running (root, Debian's Slurm,
Debian's Chromium):

- the server's time per refresh and the Slurm commands one refresh issues, against `sinfo -N` for the same cluster
  in the same run;
- ten browsers polling /api/cluster at once for a while: Slurm queries per table per refresh (target: one, whatever
  the number of browsers);
- in headless Chromium, navigation to the Nodes grid of 1,000 nodes drawn, against the same browser drawing 1,000
  plain boxes of a static page (target: under 1 s);
- a history of 1,000 nodes x 2,000 journal events in the repair database, as the collector stores them (Slurm and
  the agents stood in by literal answers: four running nodes make no such history): one refresh alone, and while
  eight clients loop over /api/timeline?node=X&limit=5000 (target: the refresh takes every agent's answer in, about
  as fast as alone);
- "is it being used?" at 1,000 nodes of 8 GPUs with 2,000 running jobs (and 500 pending): Slurm's answers are
  literal text in the shapes Slurm 22.05 gave on the dev cluster (scontrol show node, squeue --json with gres_detail),
  parsed by the real SlurmClient, the agents stood in with 8 GPU readings and every check's state each. The
  refresh time and the queries per table per refresh (each Slurm command and each repair-store query counted),
  against the same refresh without the job table (the view as it was before, in the same run), and the Nodes
  grid and list of that view drawn in headless Chromium (target: under 1 s);
- the same view where the collector runs (every node's /health from its table, a third taken again before each
  refresh, no agent asked): the page's refresh against the same refresh making every row again with Python's cycle
  collector running throughout, in the same run (target: under 1 s at 10,000 nodes); with --usage-refreshes N, the
  process's RSS and the objects set aside from the cycle collector over N more refreshes of it (bounded: no growth
  from one whole pass of the collector to the next).

    python tests/benchmarks/bench_web.py [--nodes 1000] [--clients 10] [--seconds 20] [--cache-nodes 1000]
        [--usage-nodes 1000] [--usage-jobs 2000] [--only-usage] [--usage-refreshes 0]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: its helpers

from bench_history import cpu_and_rss  # noqa: E402  (benchmarks beside this one)
from bench_repair import counting, timed  # noqa: E402
from helpers.page import StandInAgents, journal_lines, stored_journal  # noqa: E402  (the page's tests' stand-ins)

from slurm_ext import config, devcluster as dev  # noqa: E402
from slurm_ext.slurm import Node  # noqa: E402
from slurm_ext.devcluster.layout import Layout  # noqa: E402
from slurm_ext.web.app import create_app  # noqa: E402
from slurm_ext.web.watch import Watcher  # noqa: E402

BENCH_CLUSTER = dict(cluster_name="slurmextbenchweb", node_name="bweb1", nodes=4, slurmctld_port=31817,
                     slurmd_port=31818, slurmdbd_port=31819, mariadb_port=23311, controller_probe_port=31831,
                     worker_probe_port=31830, accounting_probe_port=31832, web_port=0, node_port_base=32000,
                     health_interval=1.0, repair_interval=5.0, slurmd_timeout=30)
PAGE_PORT = 31833
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1500,1000")
#: resolves with performance.now() (ms since the navigation began) once `selector` matches `count` elements, or,
#: for a canvas grid, once it holds `count` nodes and has drawn its cells (its data-nodes and data-drawn)
_DRAWN = """
const [selector, count, done] = arguments;
(function look() {
  const found = document.querySelectorAll(selector);
  const canvas = found.length === 1 && found[0].tagName === "CANVAS";
  if (canvas ? Number(found[0].dataset.nodes) >= count && Number(found[0].dataset.drawn) > 0 : found.length >= count) {
    done(performance.now());
  } else requestAnimationFrame(look);
})();
"""
#: the Nodes grid (a canvas: no DOM element per node) and the most rows the Nodes list draws at once
_GRID = "#node-grid canvas"
_LIST_PAGE = 100


def table(issued: list[str]) -> dict[str, int]:
    """Slurm commands by table: the node table, the job queue, the event table, the configuration."""
    kinds = {"nodes": 0, "jobs": 0, "events": 0, "config": 0}
    for line in issued:
        if line.startswith(("squeue", "scontrol show job")):
            kinds["jobs"] += 1
        elif line.startswith("sacctmgr"):
            kinds["events"] += 1
        elif "show config" in line:
            kinds["config"] += 1
        elif line.startswith(("scontrol show", "scontrol --json")):
            kinds["nodes"] += 1
    return kinds


def drawn_times(url: str, nodes: int, rounds: int = 3) -> dict[str, float]:
    """Median ms from navigation to the Nodes tab drawn with `nodes` nodes, as a grid and as a list."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="bench-web-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_script_timeout(60)
    try:
        found = {}
        for view, selector, count in (("grid", _GRID, nodes), ("list", "#node-table tbody tr", min(nodes, _LIST_PAGE))):
            driver.get(url + "#nodes")
            driver.execute_script(f"sessionStorage.setItem('slurm-ext-node-view', '{view}')")
            times = []
            for _ in range(rounds):
                driver.get("about:blank")
                driver.get(url + "#nodes")
                times.append(driver.execute_async_script(_DRAWN, selector, count))
            found[view] = statistics.median(times)
        return found
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def browser_times(url: str, nodes: int, rounds: int = 3) -> tuple[float, float]:
    """(median ms to the Nodes grid of `nodes` cells, median ms to `nodes` boxes of a static page)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="bench-web-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_script_timeout(60)
    try:
        driver.get(url + "#nodes")
        driver.execute_script("sessionStorage.setItem('slurm-ext-node-view', 'grid')")
        page, boxes = [], []
        static = "data:text/html," + "".join(f"<div class=c>n{i}</div>" for i in range(nodes))
        for _ in range(rounds):
            driver.get("about:blank")
            driver.get(url + "#nodes")
            page.append(driver.execute_async_script(_DRAWN, _GRID, nodes))
            driver.get(static)
            boxes.append(driver.execute_async_script(_DRAWN, ".c", nodes))
        return statistics.median(page), statistics.median(boxes)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class _CacheSlurm:
    """Slurm as a literal answer: `count` idle nodes, no job, no event, no configuration."""

    def __init__(self, count: int):
        self.listed = [Node(f"c{i}", "IDLE", addr="127.0.0.1") for i in range(count)]

    def nodes(self):
        return self.listed

    def node_events(self, node, since):
        return []

    def queue(self):
        return []

    def show_config(self):
        return {}


def journal_cache(nodes: int, events: int, clients: int, state_dir: str) -> None:
    """The refresh over a history of `nodes` x `events` journal events, alone and while `clients` loop over one
    node's timeline: its time and the agents' answers it took in."""
    from waitress.server import create_server
    path = os.path.join(state_dir, "cache.toml")
    with open(path, "w") as file:
        file.write(f'[node]\nstate_dir = "{state_dir}/cache-state"\n[web]\nrefresh = "3600s"\ntoken_file = ""\n'
                   f'[repair]\nsqlite_file = "{state_dir}/cache-repair.db"\n')
    loaded = config.load(path)
    from slurm_ext.repair.store import open_sqlite
    store, collector = open_sqlite(f"{state_dir}/cache-repair.db"), open_sqlite(f"{state_dir}/cache-repair.db")
    first = time.time() - events - 60
    for i in range(nodes):
        stored_journal(collector, f"c{i}", journal_lines(0, events, first))
    agents = StandInAgents([f"c{i}" for i in range(nodes)])
    watcher = Watcher(loaded, _CacheSlurm(nodes), store, lambda url, timeout: (None, "refused"), agents)
    watcher.refresh()

    def one_refresh(start: int) -> tuple[float, int]:
        stored_journal(collector, "c0", journal_lines(start, 1, first + start))
        begun = time.perf_counter()
        view = watcher.refresh()
        took = time.perf_counter() - begun
        return took, sum(n["agent"]["answered"] == view.data["refreshed"] for n in view.data["nodes"])
    alone, taken_alone = one_refresh(events)
    server = create_server(create_app(loaded, watcher), host="127.0.0.1", port=0, threads=8)
    threading.Thread(target=server.run, daemon=True).start()
    stop, served = threading.Event(), []

    def loop():
        while not stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=600)
            begun = time.perf_counter()
            connection.request("GET", "/api/timeline?node=c7&limit=5000")
            connection.getresponse().read()
            served.append(time.perf_counter() - begun)
            connection.close()
    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    while len(served) < clients:
        time.sleep(0.05)
    loaded_refresh, taken = one_refresh(events + 1)
    stop.set()
    for thread in threads:
        thread.join()
    server.close()
    store.close()
    print(f"history of {nodes} nodes x {events} events: a refresh alone {alone * 1000:.0f} ms ({taken_alone} "
          f"agents taken in); while {clients} clients loop over /api/timeline?node=c7&limit=5000: "
          f"{loaded_refresh * 1000:.0f} ms ({taken} of {nodes} agents taken in; the timeline answered in "
          f"{statistics.median(served) * 1000:.0f} ms, median of {len(served)})")


class _Counted:
    """The repair store, each query it is asked counted (records, events, paused's read)."""

    def __init__(self, store, asked: list):
        self._store, self._asked = store, asked

    def __getattr__(self, name):
        found = getattr(self._store, name)
        if not callable(found) or name in ("close", "locked"):
            return found

        def counted(*args, **kwargs):
            self._asked.append(name)
            return found(*args, **kwargs)
        return counted


def usage_answers(nodes: int, jobs: int, pending: int) -> dict[str, str]:
    """Slurm's answers for `nodes` nodes of 8 GPUs and `jobs` running jobs spread over them (each holding 8 //
    (jobs // nodes) GPUs) and `pending` pending: each command (its first word, and scontrol's object) -> its standard
    output."""
    per_node = max(1, jobs // nodes)
    gpus = 8 // per_node
    # `scontrol show node --oneliner` as 22.05 printed it on the dev cluster (the client reads the node table so
    # before 23.02)
    listed = [f"NodeName=u{i} Arch=x86_64 CoresPerSocket=32  CPUAlloc={per_node} CPUEfctv=64 CPUTot=64 "
              f"CPULoad=1.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h200:8 NodeAddr=127.0.0.1 "
              f"NodeHostName=u{i} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 "
              f"(2024-02-01)  RealMemory=1000000 AllocMem=0 FreeMem=900000 Sockets=2 Boards=1 State=MIXED "
              f"ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  "
              f"BootTime=2026-12-01T09:00:00 SlurmdStartTime=2026-12-01T09:01:00 LastBusyTime=2026-12-06T09:00:00 "
              f"CfgTRES=cpu=64,mem=1000000M,billing=64,gres/gpu=8 AllocTRES=cpu={per_node},gres/gpu={gpus * per_node}"
              f" CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
              for i in range(nodes)]
    queue = []
    for number in range(jobs):
        node, slot = divmod(number, per_node)
        node %= nodes
        first = slot * gpus
        queue.append({"job_id": number + 1, "name": f"train-{number}", "user_name": f"user{number % 37}",
                      "job_state": "RUNNING", "partition": "gpu", "nodes": f"u{node}",
                      "gres_detail": [f"gpu:h200:{gpus}(IDX:{first}-{first + gpus - 1})"],
                      "job_resources": {"nodes": f"u{node}", "allocated_nodes": [{"nodename": f"u{node}"}]},
                      "start_time": 1_700_000_000})
    queue += [{"job_id": jobs + number + 1, "name": "wait", "user_name": f"user{number % 37}", "job_state": "PENDING",
               "partition": "gpu,debug", "nodes": "", "gres_detail": [], "job_resources": {}}
              for number in range(pending)]
    import json
    return {"scontrol node": "\n".join(listed) + "\n", "squeue": json.dumps({"jobs": queue}), "sacctmgr": "",
            "scontrol config": "ClusterName = usage\nSLURM_VERSION = 22.05.8\n"}


def usage_runner(answers: dict[str, str], issued: list | None = None):
    """A Slurm 22.05 answering `answers` (usage_answers), each command it is given noted in `issued`."""
    from slurm_ext import command

    def runner(argv, timeout, **kwargs):
        if issued is not None:
            issued.append(" ".join(argv[:3]))
        if argv[1:2] == ["--version"]:
            return command.CommandResult(argv, 0, "slurm 22.05.8\n", "")
        said = answers[f"scontrol {argv[2]}" if argv[0] == "scontrol" else argv[0]]
        return command.CommandResult(argv, 0, said, "")
    return runner


def usage_tables(nodes: int, jobs: int, state_dir: str) -> None:
    """The refresh with the job table at `nodes` nodes and `jobs` running jobs, against the same refresh without it,
    each Slurm command and store query counted; then the Nodes grid and list of that view in Chromium."""
    from slurm_ext.config import SlurmSection
    from slurm_ext.health.settings import CHECKS
    from slurm_ext.repair.store import open_sqlite
    from slurm_ext.slurm import SlurmClient
    from waitress.server import create_server
    path = os.path.join(state_dir, "usage.toml")
    with open(path, "w") as file:
        file.write(f'[node]\nstate_dir = "{state_dir}/usage-state"\n[web]\nrefresh = "3600s"\ntoken_file = ""\n'
                   f'[repair]\nsqlite_file = "{state_dir}/usage-repair.db"\n')
    loaded = config.load(path)
    issued, asked = [], []
    slurm = SlurmClient(SlurmSection(), runner=usage_runner(usage_answers(nodes, jobs, jobs // 4), issued))
    store = _Counted(open_sqlite(f"{state_dir}/usage-repair.db"), asked)
    per_node = max(1, jobs // nodes)
    gpus = [{"gpu": {"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}"}, "utilization": 3 if i < 2 else 70,
             "fb_used_mib": 9000.0, "fb_free_mib": 130000.0, "fb_reserved_mib": 500.0, "temperature": 40,
             "jobs": [1 + i // (8 // per_node)]} for i in range(8)]
    answer = {"boot": "b", "time": 1.0, "monitor": {"readings_time": 1.0, "findings": [], "driver": "580.0",
                                                    "checks": {c: "ok" for c in CHECKS}, "gpus": gpus}}
    agents = StandInAgents([f"u{i}" for i in range(nodes)], answer)

    class WithoutJobs(SlurmClient):
        """Slurm as the page read it before: no job table, so no holders and no allocation."""

        def queue(self):
            return []

    figures = {}
    without = WithoutJobs(SlurmSection(), runner=slurm.runner)
    for name, client in (("without the job table", without), ("with it", slurm)):
        watcher = Watcher(loaded, client, store, lambda url, timeout: (None, "refused"), agents)
        watcher.refresh()
        issued.clear()
        asked.clear()
        took, _ = timed(watcher.refresh)
        figures[name] = took
        print(f"usage view, {nodes} nodes x 8 GPUs, {jobs} running jobs, {jobs // 4} pending, {name}: one refresh "
              f"{took * 1000:.0f} ms (median of 5; view {len(watcher.view.body) / 1024:.0f} KiB); per refresh: "
              f"Slurm {({k: v / 5 for k, v in table(issued).items()})}, repair store "
              f"{({q: asked.count(q) / 5 for q in sorted(set(asked))})}")
    print(f"usage view: the job table costs a refresh x{figures['with it'] / figures['without the job table']:.2f}")
    server = create_server(create_app(loaded, watcher), host="127.0.0.1", port=0, threads=4)
    threading.Thread(target=server.run, daemon=True).start()
    try:
        drawn = drawn_times(f"http://127.0.0.1:{server.effective_port}/", nodes)
    finally:
        server.close()
    print(f"Chromium, navigation to the Nodes tab of that view drawn: grid {drawn['grid']:.0f} ms, list "
          f"{drawn['list']:.0f} ms (median of 3; target under 1 s)")


def collected_refresh(nodes: int, jobs: int, state_dir: str, refreshes: int = 0) -> None:
    """The usage view's refresh where the collector runs, as at 10,000 nodes: every node's /health taken from the
    collector's table (the fleet simulator's answers: eight H200s each), a third of them taken again before each
    refresh (history.interval 15 s, web.refresh 5 s), no agent asked; against the same refresh that makes every row
    again with Python's cycle collector running throughout (the page before issue 33's third step), in the same run."""
    from slurm_ext.config import SlurmSection
    from slurm_ext.devcluster.fleet import _health
    from slurm_ext.repair.collector import CONTROL
    from slurm_ext.repair.store import open_sqlite
    from slurm_ext.slurm import SlurmClient
    path = os.path.join(state_dir, "collected.toml")
    with open(path, "w") as file:
        file.write(f'[node]\nstate_dir = "{state_dir}/collected-state"\n[web]\nrefresh = "3600s"\ntoken_file = ""\n'
                   f'[repair]\nsqlite_file = "{state_dir}/collected-repair.db"\n')
    loaded = config.load(path)
    runner = usage_runner(usage_answers(nodes, jobs, jobs // 4))
    store = open_sqlite(f"{state_dir}/collected-repair.db")
    clock = [time.time()]
    names = [f"u{i}" for i in range(nodes)]

    def taken(part: list) -> None:
        store._many("REPLACE INTO node_health (node, taken, findings, body) VALUES (?, ?, ?, ?)",
                    [(name, clock[0], "[]", json.dumps(_health(name, clock[0]))) for name in part])
        store.set_control(CONTROL, json.dumps({"interval": 15.0, "nodes": nodes}), "collector", clock[0])

    def next_round(round_: int) -> None:
        """5 s later, a third of the nodes' answers taken again."""
        clock[0] += 5.0
        taken(names[round_ % 3::3])

    class EveryRow(Watcher):
        """Every row made again (and, below, the cycle collector running throughout)."""

        def refresh(self):
            self._rows = {}
            return super().refresh()

    class NoAgent:
        def health(self, node, addr="", timeout=None):
            raise AssertionError(f"node {node}'s agent asked: the collector's answers were not taken")

        def acceptance(self, node, addr="", trigger="", timeout=None):
            from slurm_ext.agentapi import AcceptanceAnswer
            return AcceptanceAnswer(node, "b", False, False, None)
    figures = {}
    from slurm_ext.web import watch
    held_off = watch._cycles_collected_after
    for label, kind, collector in (("every row made again", EveryRow, contextlib.nullcontext),
                                   ("as the page does", Watcher, held_off)):
        watch._cycles_collected_after = collector
        taken(names)
        watcher = kind(loaded, SlurmClient(SlurmSection(), runner=runner), store,
                       lambda url, timeout: (None, "refused"), NoAgent(), clock=lambda: clock[0])
        watcher.refresh()
        times = []
        for round_ in range(6):
            next_round(round_)
            began = time.perf_counter()
            watcher.refresh()
            times.append(time.perf_counter() - began)
        figures[label] = statistics.median(times)
        if kind is Watcher and refreshes:
            held_memory(watcher, refreshes, next_round)
        watcher.stop()
        watch._cycles_collected_after = held_off
        print(f"usage view fed by the collector, {nodes} nodes x 8 GPUs, {jobs} running jobs, a third of the answers "
              f"new each refresh, {label}: one refresh {figures[label] * 1000:.0f} ms (median of 6)")
    print(f"usage view fed by the collector: ratio {figures['as the page does'] / figures['every row made again']:.2f}"
          f" (target: the page's refresh under 1 s at 10,000 nodes)")
    store.close()


def held_memory(watcher: Watcher, refreshes: int, before_each: Callable[[int], object]) -> None:
    """The page's memory over `refreshes` refreshes (each after `before_each(round)`), through whole passes of the
    cycle collector (every _COLLECT_ALL_EVERY refreshes, what is set aside given back): whether what the page holds
    stays bounded while it is set aside."""
    from slurm_ext.web import watch
    every = watch._COLLECT_ALL_EVERY
    rss, frozen = [], []
    for round_ in range(refreshes):
        before_each(round_)
        watcher.refresh()
        if round_ % (every // 2) == every // 2 - 1 or round_ == refreshes - 1:
            rss.append(round(cpu_and_rss(os.getpid())[1]))
            frozen.append(gc.get_freeze_count())
    print(f"the page's memory over {refreshes} refreshes (a whole pass every {every}): RSS {rss} MiB, objects set "
          f"aside {frozen} (every {every // 2} refreshes); RSS grew {rss[-1] - rss[min(1, len(rss) - 1)]} MiB from "
          f"refresh {min(every, refreshes)} to the last")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes defined in slurm.conf (4 run)")
    parser.add_argument("--clients", type=int, default=10, help="browsers polling at once")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long they poll")
    parser.add_argument("--cache-nodes", type=int, default=1000, help="nodes of the journal cache (0: not measured)")
    parser.add_argument("--cache-events", type=int, default=2000, help="journal events of each")
    parser.add_argument("--usage-nodes", type=int, default=1000, help="nodes of the usage view (0: not measured)")
    parser.add_argument("--usage-jobs", type=int, default=2000, help="running jobs of the usage view")
    parser.add_argument("--only-usage", action="store_true", help="only the usage view (no dev cluster)")
    parser.add_argument("--usage-refreshes", type=int, default=0,
                        help="refreshes of the collector-fed view whose memory is followed (0: not measured)")
    args = parser.parse_args()
    if args.only_usage:
        state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-web-")
        try:
            usage_tables(args.usage_nodes, args.usage_jobs, state_dir)
            collected_refresh(args.usage_nodes, args.usage_jobs, state_dir, args.usage_refreshes)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
        return 0
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-web-")
    os.chmod(state_dir, 0o755)
    settings = dev.DevSection(state_dir=state_dir, defined_nodes=args.nodes, **BENCH_CLUSTER)
    layout = Layout(settings)
    server = None
    try:
        started = time.perf_counter()
        dev.up(settings)
        print(f"cluster: {args.nodes} nodes in slurm.conf, 4 running; up in {time.perf_counter() - started:.1f}s")
        loaded = config.load(layout.slurm_ext_conf)
        loaded = dataclasses.replace(loaded, web=dataclasses.replace(loaded.web, refresh=2.0,
                                                                     listen=f"127.0.0.1:{PAGE_PORT}"))
        env = layout.daemon_environ()
        sinfo, _ = timed(lambda: subprocess.run(["sinfo", "-N", "-h"], env=env, capture_output=True, check=True))
        client, issued = counting(settings)
        watcher = Watcher(loaded, slurm=client)
        watcher.refresh()  # the first: Slurm's configuration, the journals since a week
        issued.clear()
        refresh, _ = timed(watcher.refresh)
        per_refresh = {kind: count / 5 for kind, count in table(issued).items()}
        size = len(watcher.view.body)
        print(f"one refresh, {args.nodes} nodes: {refresh * 1000:.0f} ms (median of 5; view {size / 1024:.0f} KiB); "
              f"Slurm commands per refresh: {per_refresh}; `sinfo -N` {sinfo * 1000:.0f} ms (ratio "
              f"{refresh / sinfo:.2f})")

        from waitress.server import create_server
        server = create_server(create_app(loaded, watcher), host="127.0.0.1", port=PAGE_PORT, threads=8)
        threading.Thread(target=server.run, daemon=True).start()
        url = f"http://127.0.0.1:{PAGE_PORT}/"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        watcher.start()
        issued.clear()
        refreshes_before, served, stop = watcher.refreshes, [], threading.Event()

        def browse():
            while not stop.is_set():
                begun = time.perf_counter()
                with opener.open(url + "api/cluster", timeout=30) as answer:
                    answer.read()
                served.append(time.perf_counter() - begun)
                stop.wait(0.25)
        clients = [threading.Thread(target=browse) for _ in range(args.clients)]
        for thread in clients:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in clients:
            thread.join()
        refreshes = watcher.refreshes - refreshes_before
        kinds = table(issued)
        print(f"{args.clients} browsers polling every 0.25 s for {args.seconds:g} s: {len(served)} answers (median "
              f"{statistics.median(served) * 1000:.1f} ms, max {max(served) * 1000:.0f} ms); {refreshes} refreshes "
              f"(web.refresh 2 s); Slurm queries per refresh: node table {kinds['nodes'] / max(refreshes, 1):.2f}, "
              f"job queue {kinds['jobs'] / max(refreshes, 1):.2f}, "
              f"event table {kinds['events'] / max(refreshes, 1):.2f}")
        grid, boxes = browser_times(url, args.nodes)
        print(f"Chromium, navigation to the Nodes grid of {args.nodes} nodes drawn: {grid:.0f} ms (median of 3); "
              f"a static page of {args.nodes} boxes: {boxes:.0f} ms (ratio {grid / boxes:.2f})")
        watcher.stop()
        if args.cache_nodes:
            journal_cache(args.cache_nodes, args.cache_events, 8, state_dir)
        if args.usage_nodes:
            usage_tables(args.usage_nodes, args.usage_jobs, state_dir)
            collected_refresh(args.usage_nodes, args.usage_jobs, state_dir, args.usage_refreshes)
        print("targets: a refresh and the grid under 1 s; one Slurm query per table per refresh whatever the number "
              "of browsers; a refresh over the journal cache takes every agent in while clients read it")
    finally:
        if server is not None:
            server.close()
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

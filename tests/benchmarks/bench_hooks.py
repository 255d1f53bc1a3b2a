#!/usr/bin/env python3
"""Benchmark: what slurm-ext's Prolog and Epilog cost a job, against empty bash hooks.

A cluster of its own (`slurm-ext dev up`, PrologFlags=Contain, i.e. Alloc and
the extern step) runs arrays of trivial jobs (`--wrap true`, as nobody) with
three hooks in turn, in the same run, rounds interleaved:

- bash: Prolog= and Epilog= point at `#!/bin/bash` + `exit 0` (the baseline);
- naive: a Python hook that imports psutil and exits (what a hand-written
  Python Prolog costs before it does anything: the fallback's baseline);
- service: slurm-ext-hook, the C client, handing each job to the hook service;
- fallback: the same client with the service's socket hidden, so each hook
  starts the Python hook and does the work itself.

Jobs per second = jobs / (first submission to the node idle again). Targets:
service at least as fast as bash (ratio >= 1.0, within the run's noise), fallback
at least as fast as naive.

Run as root, with no other dev cluster up: python tests/benchmarks/bench_hooks.py [--jobs 100] [--rounds 2]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.cluster import TEST_CLUSTER  # noqa: E402  the test cluster's ports and names

from slurm_ext import devcluster as dev  # noqa: E402
from slurm_ext.devcluster.settings import DevSection  # noqa: E402
from slurm_ext.devcluster.layout import Layout  # noqa: E402


def run_array(layout: Layout, jobs: int, timeout: float = 600.0) -> float:
    """Jobs per second for an array of `jobs` trivial jobs, until the node is idle again."""
    env = layout.daemon_environ()
    started = time.perf_counter()
    array = subprocess.run(["sbatch", "--parsable", f"--array=1-{jobs}", "--uid=nobody", "--gid=nogroup",
                            "-o", "/dev/null", "-D", "/tmp", "--wrap", "true"], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    deadline = started + timeout
    while time.perf_counter() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", array], env=env, capture_output=True, text=True).stdout
        state = subprocess.run(["sinfo", "-h", "-n", layout.settings.node_name, "-o", "%T"], env=env,
                               capture_output=True, text=True).stdout.strip()
        if not queue.strip() and state == "idle":
            return jobs / (time.perf_counter() - started)
        if "drain" in state:
            raise SystemExit(f"node drained during the array: {state}; see {layout.log}")
        time.sleep(0.05)
    raise SystemExit(f"array {array} not done within {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-")
    os.chmod(state_dir, 0o755)
    settings = DevSection(state_dir=state_dir, **{**TEST_CLUSTER, "node_name": "benchnode"})
    layout = Layout(settings)
    try:
        dev.up(settings)
        hook = layout.bin / "slurm-ext-hook"
        client = hook.with_name("slurm-ext-hook.client")
        shutil.copy2(hook, client)
        bash = hook.with_name("empty-hook.sh")
        bash.write_text("#!/bin/bash\nexit 0\n")
        bash.chmod(0o755)
        naive = hook.with_name("naive-hook.py")
        naive.write_text(f"#!{sys.executable}\nimport psutil\n")
        naive.chmod(0o755)
        socket_path, hidden = layout.hook_socket, layout.hook_socket.with_name("hooks.sock.hidden")

        def use(program: Path, service: bool) -> None:
            tmp = hook.with_name(".slurm-ext-hook.swap")
            shutil.copy2(program, tmp)
            os.replace(tmp, hook)
            if service and hidden.exists():
                os.rename(hidden, socket_path)
            elif not service and socket_path.exists():
                os.rename(socket_path, hidden)

        variants = {"bash": (bash, True), "naive": (naive, True), "service": (client, True),
                    "fallback": (client, False)}
        rates: dict[str, list[float]] = {name: [] for name in variants}
        use(bash, True)
        run_array(layout, 10)  # warm-up: the scheduler, the page cache
        for _ in range(args.rounds):
            for name, (program, service) in variants.items():
                use(program, service)
                rates[name].append(run_array(layout, args.jobs))
                print(f"  {name}: {rates[name][-1]:.2f} jobs/s", flush=True)
        use(client, True)
        median = {name: statistics.median(values) for name, values in rates.items()}
        print(f"{args.jobs} trivial jobs per array, {args.rounds} rounds, medians:")
        for name in variants:
            print(f"  {name:<9} {median[name]:6.2f} jobs/s  ({', '.join(f'{r:.2f}' for r in rates[name])})")
        print(f"ratio service / bash:   {median['service'] / median['bash']:.2f}  (target >= 1.0)")
        print(f"ratio fallback / naive: {median['fallback'] / median['naive']:.2f}  (target >= 1.0)")
        print(f"ratio fallback / bash:  {median['fallback'] / median['bash']:.2f}")
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

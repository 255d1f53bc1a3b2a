#!/usr/bin/env python3
"""Benchmark: the GPU acceptance tests through libcuda on 8 fake GPUs, and the memory test against the prototype's way.

Over the fake libcuda.so.1 and libnvidia-ml.so.1 (devcluster/fakenvml; 8 H200s of 256 MiB device memory
each, the real H200's bandwidths), each test run as the runner runs it, in its own
`python -I -m slurm_ext.acceptance.child`:

- wall time of gpu-memory, gpu-bandwidth and gpu-p2p at quick and standard (gpu-burn is left out: it runs
  for a set time, min(60 s, 0.4 x deadline) at standard);
- memory-test throughput (GiB of patterns checked a second, bytes tested x patterns / time, as the
  prototype counted): ours checks each pattern ON THE GPU (the check kernel); the baseline, run in the same
  run on the same fake, is the prototype's method: the same kernel fills, the buffer is copied to the host
  and compared there, in Python without numpy (array equality against the expected words). The prototype
  did 1 GiB x 4 patterns in 4.1 s on the real H200 (~1 GiB/s, host compare with numpy).

On the fake the "GPU" is this host's CPU, so the ratio measures the method on one substrate; on a real
H200 the check runs at HBM speed (terabytes a second), which `tests/device/gpu_check.py` reports.

Run: python tests/benchmarks/bench_acceptance_gpu.py [--baseline-mib 32]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_ext.devcluster import fakenvml

GPUS = 8

#: the prototype's memory test on the same fake: fill with the kernel, copy to the host, compare in Python
BASELINE = r"""
import array, ctypes, json, sys, time
from slurm_ext.acceptance import cudadriver, ptx
size = int(sys.argv[1]) * 2**20
d = cudadriver.open_driver()
dev = d.devices()[0]
d.retain(dev)
fill = d.function(d.load_module(ptx.MODULE), ptx.FILL)
buf, words = d.alloc(size), size // 4
host = array.array("I", bytes(size))
address, _ = host.buffer_info()
patterns = [0x00000000, 0xFFFFFFFF, 0xA5A5A5A5, 0x5A5A5A5A]
bad, start = 0, time.perf_counter()
for pattern in patterns:
    d.launch(fill, 4096, 256, [ctypes.c_uint64(buf), ctypes.c_uint64(words), ctypes.c_uint32(0),
                               ctypes.c_uint32(pattern)])
    d.dtoh(address, buf, size)
    d.sync()
    expected = array.array("I", (pattern ^ i for i in range(words)))
    if host != expected:
        bad += sum(1 for a, b in zip(host, expected) if a != b)
seconds = time.perf_counter() - start
print(json.dumps({"gibps": size * len(patterns) / 2**30 / seconds, "seconds": seconds, "bad": bad}))
"""


def child(env: dict, root: Path, test: str, level: str) -> tuple[float, dict]:
    request = {"test": test, "level": level, "config": str(root / "slurm-ext.toml"), "deadline": 300.0,
               "profile": "auto"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", "-m", "slurm_ext.acceptance.child"], input=json.dumps(request),
                          env=env, capture_output=True, text=True, check=True, cwd=root)
    answer = json.loads(proc.stdout)
    if "results" not in answer or any(r["outcome"] != "pass" for r in answer["results"]):
        raise SystemExit(f"{test} at {level} did not pass: {proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - start, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-mib", type=int, default=32, help="the host-compare baseline's buffer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurm-ext-bench-") as tmp:
        root = Path(tmp)
        lib = fakenvml.build(root / "lib")
        spec = fakenvml.default_gpus(GPUS)
        for gpu in spec["gpus"]:
            gpu["cuda"] = {"memory_mib": 256, "p2p_gbps": 400}
        fakenvml.write_spec(root / "gpus.json", spec)
        (root / "slurm-ext.toml").write_text(f'[node]\nstate_dir = "{root / "state"}"\n')
        env = {"PATH": os.environ.get("PATH", ""), **fakenvml.environ(lib.parent, root / "gpus.json")}

        print(f"{GPUS} fake H200s, 256 MiB device memory each; wall time of each test's child process:")
        memory = {}
        for level in ("quick", "standard"):
            total = 0.0
            for test in ("gpu-memory", "gpu-bandwidth", "gpu-p2p"):
                if test == "gpu-p2p" and level == "quick":
                    continue
                seconds, answer = child(env, root, test, level)
                total += seconds
                print(f"  {level:8} {test:14} {seconds:6.2f} s  ({len(answer['results'])} results)")
                if test == "gpu-memory":
                    memory[level] = answer
            print(f"  {level:8} {'all':14} {total:6.2f} s")

        print("whole levels, `slurm-ext accept run --only gpu` as an operator or the agent's start step runs it "
              "(targets: quick < 15 s, standard < 3 min for 8 GPUs):")
        (root / "slurm-ext.toml").write_text(f'[node]\nstate_dir = "{root / "state"}"\nruntime_dir = "{root / "run"}"'
                                             '\n[acceptance]\nenabled = true\n')
        for level in ("quick", "standard"):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(root / "slurm-ext.toml"),
                                   "accept", "run", "--level", level, "--only", "gpu", "--json"], env=env,
                                  capture_output=True, text=True, cwd=root)
            seconds = time.perf_counter() - start
            run = json.loads(done.stdout)
            slowest = sorted(run["results"], key=lambda r: -r["seconds"])[0]
            print(f"  {level:8} {seconds:6.1f} s  verdict {run['verdict']}, {len(run['results'])} results, "
                  f"not applicable: {', '.join(run['not_applicable']) or 'none'}; slowest {slowest['test']} "
                  f"{slowest['target']} {slowest['seconds']:.1f} s")

        figures = [f["value"] for r in memory["standard"]["results"] for f in r["figures"]
                   if f["name"] == "memory_gibps"]
        ours = sum(figures) / len(figures)
        proc = subprocess.run([sys.executable, "-I", "-c", BASELINE, str(args.baseline_mib)], env=env,
                              capture_output=True, text=True, check=True)
        base = json.loads(proc.stdout)
    print("memory test throughput (GiB of patterns checked a second, per GPU):")
    print(f"  ours, checked by the kernel (standard, 8 patterns, mean of {len(figures)} GPUs): {ours:8.2f} GiB/s")
    print(f"  baseline, copied to the host and compared in Python ({args.baseline_mib} MiB x 4 patterns): "
          f"{base['gibps']:8.2f} GiB/s ({base['seconds']:.2f} s)")
    print(f"ratio ours / baseline on the fake: {ours / base['gibps']:.1f}x; the prototype on the real H200: "
          f"1 GiB x 4 patterns in 4.1 s = {4 / 4.1:.2f} GiB/s")


if __name__ == "__main__":
    main()

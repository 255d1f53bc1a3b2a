#!/usr/bin/env python3
"""Benchmark: gres.conf generation for 8 GPUs (without `slurmd -G`), against raw NVML reads.

Runs in a child process over the fake libnvidia-ml (8 H200s, minors out of PCI
order, a full NVLink mesh), as the worker agent would before a slurmd start:

- generate: `slurm_ext.gres.generate` (NVML init, inventory, topology, drift,
  render, compare with the file on disk), median of N runs in one process;
- baseline: the same NVML calls made bare in a loop (init, per GPU name, UUID,
  PCI info, minor, affinity, NVLink states, shutdown): what any generator
  must pay.

Target: generation under 100 ms. Run: python tests/benchmarks/bench_gres.py [--runs 20]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_gres_cluster import eight_gpus  # noqa: E402  the acceptance test's 8-GPU layout

from slurm_ext.devcluster import fakenvml  # noqa: E402

CHILD = r"""
import json, os, statistics, sys, time
from pathlib import Path
import pynvml
from slurm_ext.config import from_dict
from slurm_ext.gres import generate

root, runs = Path(sys.argv[1]), int(sys.argv[2])
config = from_dict({"node": {"state_dir": str(root / "state"), "name": "benchnode"},
                    "gres": {"output": str(root / "gres.conf"), "dev_dir": str(root / "dev"),
                             "types": {"NVIDIA H200": "h200"}}})

def raw():
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetName(h); pynvml.nvmlDeviceGetUUID(h); pynvml.nvmlDeviceGetPciInfo(h)
        pynvml.nvmlDeviceGetMinorNumber(h); pynvml.nvmlDeviceGetCpuAffinity(h, 64)
        for link in range(7):
            pynvml.nvmlDeviceGetNvLinkState(h, link); pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
    pynvml.nvmlShutdown()

def timed(fn):
    out = []
    for _ in range(runs):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return out

first = time.perf_counter()
generation = generate(config, "benchnode", emit=lambda *a, **k: None)
first = time.perf_counter() - first
assert generation.gres == "gpu:h200:8", generation.gres
ours = timed(lambda: generate(config, "benchnode", emit=lambda *a, **k: None))
base = timed(raw)
print(json.dumps({"first": first, "ours": ours, "base": base}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurm-ext-bench-") as tmp:
        root = Path(tmp)
        lib = fakenvml.build(root / "lib")
        spec = root / "gpus.json"
        fakenvml.write_spec(spec, eight_gpus(os.cpu_count() or 1))
        (root / "dev").mkdir()
        for gpu in json.loads(spec.read_text())["gpus"]:
            fakenvml.make_device(root / "dev" / f"nvidia{gpu['minor']}", gpu["minor"])
        env = {**os.environ, **fakenvml.environ(lib.parent, spec)}
        out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(args.runs)], env=env, check=True,
                             capture_output=True, text=True).stdout
    result = json.loads(out)
    median = {k: sorted(result[k])[len(result[k]) // 2] for k in ("ours", "base")}
    print(f"8 GPUs, {args.runs} runs in one process (pynvml loaded, NVML initialised per run):")
    print(f"  generate (inventory, drift, render, compare): median {median['ours'] * 1000:.1f} ms, "
          f"max {max(result['ours']) * 1000:.1f} ms; first run in the process {result['first'] * 1000:.1f} ms")
    print(f"  baseline, the bare NVML calls:               median {median['base'] * 1000:.1f} ms")
    print(f"ratio generate / bare NVML: {median['ours'] / median['base']:.2f}; target: generate < 100 ms")


if __name__ == "__main__":
    main()

"""Ask Slurm itself whether it sees the GPUs NVML reports.

Two questions: does slurmd parse the generated gres.conf into the count and
type NVML reported (`slurmd -G`, run on a copy of slurm.conf beside the new
file, so a bad file is caught before slurmd uses it), and does the running
node's GRES in slurmctld (scontrol) match NVML now (`slurm-ext gres check`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from slurm_ext import command
from slurm_ext.errors import CommandError

from .inventory import Inventory
from .render import gres_types

__all__ = ["nvml_counts", "slurmd_counts", "parse_gres", "compare_counts"]

_SLURMD_LINE = re.compile(r"Gres Name=gpu Type=(\S+) Count=(\d+)")
_AUTH_LINE = re.compile(r"\s*(AuthType|CredType)\s*=", re.IGNORECASE)
_TIMEOUT = 60.0


def nvml_counts(inventory: Inventory) -> Counter:
    """GPUs (or MIG devices) by Slurm type, as gres.conf lists them."""
    return Counter(kind for gpu in inventory.gpus for kind in gres_types(gpu))


def slurmd_counts(slurm_conf: Path | None, gres_text: str, node: str, environ: dict[str, str] | None = None,
                  gres: str = "", inventory: Inventory | None = None) -> Counter:
    """What `slurmd -G` parses from `gres_text`, placed beside a copy of `slurm_conf`.

    `slurm_conf` None (a configless node: slurmctld sends slurm.conf when slurmd starts): a stand-in
    slurm.conf declaring `node` with `gres` (its Gres=, as the agent passes it in slurmd's --conf) and
    the sockets and cores of `inventory` (Cores= is checked against them).

    Raises:
        CommandError: slurmd cannot run or refuses the files (its message is kept).
    """
    with tempfile.TemporaryDirectory(prefix="slurm-ext-gres-") as directory:
        copy = Path(directory) / "slurm.conf"
        if slurm_conf is None:
            layout = f"CPUs={os.cpu_count() or 1}"
            if inventory is not None and inventory.socket_count and inventory.core_count % inventory.socket_count == 0:
                layout = (f"Sockets={inventory.socket_count} "
                          f"CoresPerSocket={inventory.core_count // inventory.socket_count}")
            text = (f"ClusterName=gres-check\nSlurmctldHost=localhost\nGresTypes=gpu\n"
                    f"NodeName={node} {layout}" + (f" Gres={gres}\n" if gres else "\n"))
        else:
            text = "".join(line for line in Path(slurm_conf).read_text().splitlines(keepends=True)
                           if not _AUTH_LINE.match(line))
        # parsing only, nothing is sent: no auth or credential plugin. With the cluster's (auth/slurm,
        # Slurm 24.11) slurmd -G re-initialises the running slurmd's credential state, and the jobs
        # running on the node never complete.
        copy.write_text(text.rstrip("\n") + "\nAuthType=auth/none\nCredType=cred/none\n")
        (Path(directory) / "gres.conf").write_text(gres_text)
        env = {**(environ or {}), "SLURM_CONF": str(copy)}
        env.setdefault("PATH", command.CLEAN_PATH)
        result = command.run(["slurmd", "-G", "-N", node], _TIMEOUT, env=env, check=False)
    counts: Counter = Counter()
    for kind, count in _SLURMD_LINE.findall(result.stdout + result.stderr):
        counts[kind] += int(count)
    if result.returncode != 0 and not counts:
        raise CommandError(["slurmd", "-G", "-N", node], result.returncode, result.stderr or result.stdout)
    return counts


def parse_gres(text: str) -> Counter:
    """GPU counts by type from a node's Gres= string ("gpu:h200:8(S:0-1),gpu:a100:2")."""
    counts: Counter = Counter()
    for item in filter(None, re.sub(r"\([^)]*\)", "", text or "").split(",")):
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind = parts[1] if len(parts) == 3 else "(no type)"
        counts[kind] += int(parts[-1]) if parts[-1].isdigit() else 1
    return counts


def compare_counts(expected: Counter, seen: Counter, who: str) -> list[str]:
    """One line per type whose count differs: `<who>: gpu:<type> <seen> (NVML: <expected>)`."""
    return [f"{who}: gpu:{kind} {seen.get(kind, 0)} (NVML: {expected.get(kind, 0)})"
            for kind in sorted(set(expected) | set(seen)) if expected.get(kind, 0) != seen.get(kind, 0)]


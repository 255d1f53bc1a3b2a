"""Files the tests make: scripts with an owner and mode, directories other users can enter, a fake /sys."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fake_sysfs(root: Path, cpus: dict[int, tuple], online: str | None = None) -> Path:
    """A fake /sys CPU topology under `root`: cpus maps OS cpu id -> (package, core_id) or
    (package, die, core_id); `online` defaults to every cpu given."""
    from slurm_ext.gres.topology import ranges
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text((online if online is not None else ranges(cpus)) + "\n")
    for cpu, place in cpus.items():
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{place[0]}\n")
        (topology / "core_id").write_text(f"{place[-1]}\n")
        if len(place) == 3:
            (topology / "die_id").write_text(f"{place[1]}\n")
    return root


def temp_dir(owner: int = 0, mode: int = 0o755) -> Path:
    """mkdtemp under /tmp (not pytest's tmp_path, which other uids cannot enter; /tmp is root-owned and
    sticky, an ancestor script validation accepts), chowned and chmodded."""
    path = Path(tempfile.mkdtemp(prefix="slurm-ext-test-"))
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def script(directory: Path, name: str, text: str, mode: int = 0o755, owner: int = 0) -> Path:
    """A lifecycle script or user hook: written, chowned and chmodded (its directory made as needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path

"""Tests for slurm_ext.gres.render: gres.conf text, Gres= strings, and the file writer.

Everything here works on literal Inventory records; reading NVML is
tests/test_gres_inventory.py's business.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_ext.gres import render
from slurm_ext.gres.inventory import Inventory, InventoryGpu, MigDevice
from slurm_ext.gres.render import dynamic_node_conf, gres_conf, gres_string, write_if_changed

NOW = 1_700_000_000  # 2023-11-14T22:13:20Z


def gpu(i: int, *, kind: str = "h200", name: str = "NVIDIA H200", cores=(0, 1, 2, 3), links=(), mig=(),
        mig_mode: bool = False) -> InventoryGpu:
    return InventoryGpu(nvml_index=i, minor=2 * i, name=name, type=kind, uuid=f"GPU-{i}",
               pci_bus_id=f"00000000:{16 + i:02X}:00.0", device=f"/dev/nvidia{2 * i}", cpus=tuple(range(8)),
               cores=tuple(cores), links=tuple(links),
               mig=tuple(mig), mig_mode=mig_mode)


def test_gres_conf_exact_text_with_cores_and_links():
    inv = Inventory("550.54.15", (
        gpu(0, cores=(0, 1, 2, 3), links=(-1, 4)),
        gpu(1, cores=(4, 5, 6, 7, 12), links=(4, -1)),
    ), core_count=16)
    assert gres_conf(inv, "gpu-node-1", now=NOW) == (
        "# gres.conf for gpu-node-1, written by slurm-ext gres generate; edits are overwritten\n"
        "# generated at: 2023-11-14T22:13:20Z\n"
        "# NVIDIA driver 550.54.15\n"
        "# gpu 0: GPU-0, 00000000:10:00.0, minor 0, NVIDIA H200\n"
        "# gpu 1: GPU-1, 00000000:11:00.0, minor 2, NVIDIA H200\n"
        "NodeName=gpu-node-1 Name=gpu Type=h200 File=/dev/nvidia0 Cores=0-3 Links=-1,4\n"
        "NodeName=gpu-node-1 Name=gpu Type=h200 File=/dev/nvidia2 Cores=4-7,12 Links=4,-1\n"
    )


def test_cores_are_one_whole_socket_or_none_when_the_sockets_are_known():
    """Slurm >= 24.11 refuses a Cores= that is not one whole socket (node INVALID_REG, "doesn't match socket
    boundaries"), and schedules GPUs by socket anyway: NUMA-sized affinity is widened to its socket."""
    inv = Inventory("550.54.15", (
        gpu(0, cores=(4, 5, 6, 7)),          # a quarter of socket 0 (AMD NPS4): the whole socket
        gpu(1, cores=tuple(range(16, 32))),  # socket 1, as NVML gave it
        gpu(2, cores=(12, 13, 14, 15, 16)),  # across both sockets: no Cores= (any core)
        gpu(3, cores=tuple(range(32))),      # every core: no Cores=
    ), core_count=32, socket_count=2)
    lines = [line.split(" File=")[1] for line in gres_conf(inv, "n", now=NOW).splitlines() if " File=" in line]
    assert lines == ["/dev/nvidia0 Cores=0-15", "/dev/nvidia2 Cores=16-31", "/dev/nvidia4", "/dev/nvidia6"]
    one_socket = Inventory("1", (gpu(0, cores=(0,)),), core_count=2, socket_count=1)
    assert "Cores" not in gres_conf(one_socket, "n", now=NOW)


def test_header_names_nvml_index_when_it_differs_and_lists_lost_and_problems():
    inv = Inventory("550.54.15", (gpu(3, links=(-1,)),), lost=("NVML GPU 0: GPU is lost",),
                    problems=("/dev/nvidia6 is missing",))
    text = gres_conf(inv, "n1", generator="test", now=NOW)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header == [
        "# gres.conf for n1, written by test; edits are overwritten",
        "# generated at: 2023-11-14T22:13:20Z",
        "# NVIDIA driver 550.54.15",
        "# gpu 0: GPU-3, 00000000:13:00.0, minor 6, NVIDIA H200 (NVML index 3)",
        "# lost: NVML GPU 0: GPU is lost",
        "# problem: /dev/nvidia6 is missing",
    ]


def test_cores_left_out_when_unknown_or_every_core():
    inv = Inventory("1", (gpu(0, cores=()), gpu(1, cores=range(8)), gpu(2, cores=range(4))), core_count=8)
    body = [line for line in gres_conf(inv, "n", now=NOW).splitlines() if not line.startswith("#")]
    assert body == [
        "NodeName=n Name=gpu Type=h200 File=/dev/nvidia0",
        "NodeName=n Name=gpu Type=h200 File=/dev/nvidia2",
        "NodeName=n Name=gpu Type=h200 File=/dev/nvidia4 Cores=0-3",
    ]


def test_links_left_out_without_any_nvlink():
    inv = Inventory("1", (gpu(0, links=(-1, 0)), gpu(1, links=(0, -1))))
    assert "Links=" not in gres_conf(inv, "n", now=NOW)


def test_mig_gpu_gives_one_line_per_mig_device_and_no_links():
    migs = (
        MigDevice(1, 0, "MIG-a", "1g.18gb", ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap12",
                                             "/dev/nvidia-caps/nvidia-cap13")),
        MigDevice(2, 0, "MIG-b", "3g.71gb", ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap21",
                                             "/dev/nvidia-caps/nvidia-cap22")),
    )
    inv = Inventory("1", (gpu(0, links=(-1, 2)), gpu(1, cores=(4, 5), links=(2, -1), mig=migs, mig_mode=True)),
                    core_count=8)
    text = gres_conf(inv, "n", now=NOW)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "NodeName=n Name=gpu Type=h200 File=/dev/nvidia0 Cores=0-3",
        "NodeName=n Name=gpu Type=h200_1g.18gb "
        "MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13 Cores=4-5",
        "NodeName=n Name=gpu Type=h200_3g.71gb "
        "MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 Cores=4-5",
    ]
    assert "#   mig gi 1 ci 0: MIG-a, 1g.18gb" in text.splitlines()
    assert gres_string(inv) == "gpu:h200:1,gpu:h200_1g.18gb:1,gpu:h200_3g.71gb:1"


def test_mig_mode_without_mig_devices_gives_no_line():
    inv = Inventory("1", (gpu(0), gpu(1, mig_mode=True)))
    body = [line for line in gres_conf(inv, "n", now=NOW).splitlines() if not line.startswith("#")]
    assert body == ["NodeName=n Name=gpu Type=h200 File=/dev/nvidia0 Cores=0-3"]
    assert gres_string(inv) == "gpu:h200:1"


def test_gres_string_one_type_mixed_types_and_none():
    assert gres_string(Inventory("1", tuple(gpu(i) for i in range(8)))) == "gpu:h200:8"
    mixed = tuple(gpu(i, kind="h200" if i % 4 else "a100") for i in range(8))
    assert gres_string(Inventory("1", mixed)) == "gpu:a100:2,gpu:h200:6"
    assert gres_string(Inventory("1", ())) == ""


def test_dynamic_node_conf():
    eight = Inventory("1", tuple(gpu(i) for i in range(8)))
    assert dynamic_node_conf(eight) == "Gres=gpu:h200:8"
    assert dynamic_node_conf(eight, "Feature=hopper") == "Gres=gpu:h200:8 Feature=hopper"
    assert dynamic_node_conf(Inventory("1", ()), "Feature=cpu") == "Feature=cpu"
    assert dynamic_node_conf(Inventory("1", ())) == ""


# ---------------------------------------------------------------------------
# write_if_changed
# ---------------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_if_changed_writes_new_file_with_mode(tmp_path):
    path = tmp_path / "gres.conf"
    assert write_if_changed(path, "a\n") is True
    assert path.read_text() == "a\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert write_if_changed(tmp_path / "baseline.json", "{}\n", mode=0o600) is True
    assert stat.S_IMODE((tmp_path / "baseline.json").stat().st_mode) == 0o600
    assert leftovers(tmp_path) == []


def test_regenerating_an_unchanged_inventory_does_not_rewrite(tmp_path):
    path = tmp_path / "gres.conf"
    inv = Inventory("550.54.15", (gpu(0, links=(-1, 2)), gpu(1, links=(2, -1))), core_count=8)
    first = gres_conf(inv, "n", now=NOW)
    assert write_if_changed(path, first) is True
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # an old mtime, so a rewrite could not hide
    inode = path.stat().st_ino

    later = gres_conf(inv, "n", now=NOW + 86_400)
    assert later != first  # only the time line differs
    assert render.differs(path, later) is False
    assert write_if_changed(path, later) is False
    assert path.stat().st_mtime_ns == 1_000_000_000 and path.stat().st_ino == inode
    assert path.read_text() == first  # the time line still says when the content last changed


def test_changed_content_is_replaced_atomically(tmp_path):
    path = tmp_path / "gres.conf"
    write_if_changed(path, gres_conf(Inventory("1", (gpu(0),)), "n", now=NOW))
    inode = path.stat().st_ino
    text = gres_conf(Inventory("1", (gpu(0), gpu(1))), "n", now=NOW)
    assert render.differs(path, text) is True
    assert write_if_changed(path, text) is True
    assert path.read_text() == text
    assert path.stat().st_ino != inode  # renamed into place, not rewritten in place
    assert leftovers(tmp_path) == []


def test_only_the_time_line_is_ignored(tmp_path):
    path = tmp_path / "f"
    write_if_changed(path, "# generated at: x\nA=1\n")
    assert render.differs(path, "# generated at: y\nA=1\n") is False
    assert render.differs(path, "# generated at: x\nA=2\n") is True
    assert render.differs(path, "# generated at: x\nA=1") is True  # the final newline counts
    assert render.differs(tmp_path / "missing", "") is True


def test_a_directory_in_the_way_raises_oserror_and_leaves_nothing(tmp_path):
    path = tmp_path / "gres.conf"
    path.mkdir()
    with pytest.raises(OSError):
        write_if_changed(path, "a\n")
    assert path.is_dir() and leftovers(tmp_path) == []


def test_a_missing_directory_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        write_if_changed(tmp_path / "no" / "gres.conf", "a\n")


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "gres.conf"
    write_if_changed(path, "old\n")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)  # the rename fileio.atomic_write does
    with pytest.raises(OSError, match="No space left"):
        write_if_changed(path, "new\n")
    assert path.read_text() == "old\n" and leftovers(tmp_path) == []

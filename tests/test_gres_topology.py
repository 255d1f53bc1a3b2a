"""Tests for slurm_ext.gres.topology: OS CPU ids to Slurm's abstract core indexes.

Each layout is a fake /sys tree in tmp_path, written as the kernel would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.files import fake_sysfs
from slurm_ext.errors import SlurmExtError
from slurm_ext.gres.topology import (
    CpuTopology,
    TopologyError,
    core_indexes,
    cpus_from_masks,
    ranges,
    read_topology,
)


def two_socket_split(root: Path) -> Path:
    """2 sockets x 8 cores x 2 threads: 0-7 / 8-15 first threads, 16-23 / 24-31 second threads."""
    cpus = {}
    for thread in range(2):
        for socket in range(2):
            for core in range(8):
                cpus[thread * 16 + socket * 8 + core] = (socket, core)
    return fake_sysfs(root, cpus)


# --- read_topology: layouts ------------------------------------------------------------------------------


def test_single_socket_no_ht(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {c: (0, c) for c in range(4)}))
    assert dict(topo.core_of) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert (topo.sockets, topo.cores, topo.threads_per_core) == (1, 4, 1)


def test_two_sockets_split_threads_layout(tmp_path):
    topo = read_topology(two_socket_split(tmp_path))
    assert (topo.sockets, topo.cores, topo.threads_per_core) == (2, 16, 2)
    # cpu 0 and cpu 16 are the two threads of socket 0's first core
    assert topo.core_of[0] == topo.core_of[16] == 0
    assert topo.core_of[8] == topo.core_of[24] == 8
    assert topo.core_of[31] == 15


def test_numa_node_affinity_maps_to_its_sockets_cores(tmp_path):
    topo = read_topology(two_socket_split(tmp_path))
    node0 = [*range(0, 8), *range(16, 24)]
    node1 = [*range(8, 16), *range(24, 32)]
    assert core_indexes(node0, topo) == list(range(0, 8))
    assert core_indexes(node1, topo) == list(range(8, 16))
    assert ranges(core_indexes(node0, topo)) == "0-7"
    assert ranges(core_indexes(node1, topo)) == "8-15"


def test_adjacent_siblings_layout(tmp_path):
    # 2 sockets x 4 cores; cpus 2k and 2k+1 share core k
    cpus = {cpu: (cpu // 8, (cpu // 2) % 4) for cpu in range(16)}
    topo = read_topology(fake_sysfs(tmp_path, cpus))
    assert (topo.sockets, topo.cores, topo.threads_per_core) == (2, 8, 2)
    assert all(topo.core_of[2 * k] == topo.core_of[2 * k + 1] == k for k in range(8))
    assert core_indexes(range(8, 16), topo) == [4, 5, 6, 7]


def test_non_contiguous_core_ids_still_number_from_zero(tmp_path):
    core_ids = [0, 1, 2, 3, 8, 9, 10, 11]
    topo = read_topology(fake_sysfs(tmp_path, {cpu: (0, core_id) for cpu, core_id in enumerate(core_ids)}))
    assert [topo.core_of[cpu] for cpu in range(8)] == list(range(8))
    assert topo.cores == 8


def test_same_core_id_on_two_sockets_is_two_cores(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: (0, 0), 1: (1, 0)}))
    assert dict(topo.core_of) == {0: 0, 1: 1}
    assert (topo.sockets, topo.cores) == (2, 2)


def test_offline_cpu_is_ignored(tmp_path):
    # cpu 2 has a topology directory but is not online (as after `echo 0 > cpu2/online`)
    root = fake_sysfs(tmp_path, {c: (0, c) for c in range(4)}, online="0-1,3")
    topo = read_topology(root)
    assert dict(topo.core_of) == {0: 0, 1: 1, 3: 2}
    assert topo.cores == 3
    assert core_indexes([0, 2, 3], topo) == [0, 2]


def test_offline_cpu_needs_no_topology_files(tmp_path):
    root = fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1)}, online="0")
    (root / "devices/system/cpu/cpu1/topology/core_id").unlink()
    assert dict(read_topology(root).core_of) == {0: 0}


def test_offline_second_thread_leaves_threads_per_core_at_the_max(tmp_path):
    cpus = {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)}
    topo = read_topology(fake_sysfs(tmp_path, cpus, online="0-2"))
    assert (topo.cores, topo.threads_per_core) == (2, 2)


def test_dies_are_numbered_die_by_die(tmp_path):
    # one package, two dies whose CPUs interleave; core_id restarts on each die
    cpus = {cpu: (0, cpu % 2, cpu // 2) for cpu in range(8)}
    topo = read_topology(fake_sysfs(tmp_path, cpus))
    assert (topo.sockets, topo.cores, topo.threads_per_core) == (1, 8, 1)
    assert core_indexes([0, 2, 4, 6], topo) == [0, 1, 2, 3]  # die 0
    assert core_indexes([1, 3, 5, 7], topo) == [4, 5, 6, 7]  # die 1
    assert topo.core_of[3] == 5


def test_missing_die_id_counts_as_die_zero(tmp_path):
    root = fake_sysfs(tmp_path, {0: (0, 0, 0), 1: (0, 0, 1)})
    (root / "devices/system/cpu/cpu1/topology/die_id").unlink()
    assert dict(read_topology(root).core_of) == {0: 0, 1: 1}


def test_cores_follow_hwloc_cpu_order_not_core_id_value(tmp_path):
    # hwloc (hence Slurm) orders cores by the lowest CPU they hold, not by core_id
    topo = read_topology(fake_sysfs(tmp_path, {0: (0, 5), 1: (0, 2), 2: (0, 5), 3: (0, 2)}))
    assert dict(topo.core_of) == {0: 0, 1: 1, 2: 0, 3: 1}


def test_core_of_is_read_only(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: (0, 0)}))
    with pytest.raises(TypeError):
        topo.core_of[5] = 1


def test_real_sys():
    topo = read_topology()  # a host without it fails here, naming the file
    assert topo.core_of, "no online CPUs read"
    assert all(0 <= index < topo.cores for index in topo.core_of.values())
    assert set(topo.core_of.values()) == set(range(topo.cores))
    assert 1 <= topo.sockets <= topo.cores
    assert topo.threads_per_core >= 1
    assert len(topo.core_of) <= topo.cores * topo.threads_per_core


# --- read_topology: errors -------------------------------------------------------------------------------


def test_missing_online_file_names_it(tmp_path):
    with pytest.raises(TopologyError) as info:
        read_topology(tmp_path)
    assert info.value.path == tmp_path / "devices/system/cpu/online"
    assert str(tmp_path / "devices/system/cpu/online") in str(info.value)
    assert "cannot read" in str(info.value)
    assert isinstance(info.value, SlurmExtError)


@pytest.mark.parametrize("text", ["zero", "0-", "3-1", "0-3,x", "-1", ""])
def test_malformed_online_file_names_it(tmp_path, text):
    root = fake_sysfs(tmp_path, {0: (0, 0)}, online=text)
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert info.value.path == root / "devices/system/cpu/online"
    assert str(info.value.path) in str(info.value)


def test_missing_core_id_names_it(tmp_path):
    root = fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1)})
    path = root / "devices/system/cpu/cpu1/topology/core_id"
    path.unlink()
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert info.value.path == path
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["physical_package_id", "core_id", "die_id"])
def test_malformed_id_file_names_it(tmp_path, name):
    root = fake_sysfs(tmp_path, {0: (0, 0, 0)})
    path = root / "devices/system/cpu/cpu0/topology" / name
    path.write_text("garbage\n")
    with pytest.raises(TopologyError) as info:
        read_topology(root)
    assert info.value.path == path
    assert str(path) in str(info.value) and "'garbage'" in str(info.value)


# --- core_indexes ----------------------------------------------------------------------------------------


def test_core_indexes_sorted_distinct_and_unknown_ignored():
    topo = CpuTopology(core_of={0: 0, 1: 1, 2: 0, 3: 1}, sockets=1, cores=2, threads_per_core=2)
    assert core_indexes([3, 2, 1, 0, 99], topo) == [0, 1]
    assert core_indexes([], topo) == []
    assert core_indexes(iter([99]), topo) == []


# --- cpus_from_masks -------------------------------------------------------------------------------------


def test_cpus_from_two_64_bit_words():
    assert cpus_from_masks([(1 << 0) | (1 << 1) | (1 << 63), 1]) == [0, 1, 63, 64]


def test_cpus_from_masks_edges():
    assert cpus_from_masks([]) == []
    assert cpus_from_masks([0, 0]) == []
    assert cpus_from_masks([0xFFFFFFFF, 0x1], word_bits=32) == [*range(32), 32]
    assert cpus_from_masks([0, 0b101]) == [64, 66]


def test_cpus_from_masks_rejects_words_that_do_not_fit():
    with pytest.raises(ValueError, match="word 1"):
        cpus_from_masks([0, 1 << 64])
    with pytest.raises(ValueError):
        cpus_from_masks([-1])
    with pytest.raises(ValueError):
        cpus_from_masks([1], word_bits=0)


def test_masks_to_gres_cores(tmp_path):
    topo = read_topology(two_socket_split(tmp_path))
    # NUMA node 1 of the split layout: cpus 8-15 and 24-31 in one 64-bit word
    word = sum(1 << c for c in [*range(8, 16), *range(24, 32)])
    assert ranges(core_indexes(cpus_from_masks([word]), topo)) == "8-15"


# --- ranges ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("numbers, expected", [
    ([], ""),
    ([5], "5"),
    ([0, 1, 2, 3, 8, 9], "0-3,8-9"),
    ([1, 3, 5], "1,3,5"),
    ([9, 8, 3, 2, 1, 0, 3], "0-3,8-9"),
    ([0, 1], "0-1"),
    ([0, 2, 3, 4, 7], "0,2-4,7"),
    (range(64), "0-63"),
])
def test_ranges(numbers, expected):
    assert ranges(numbers) == expected

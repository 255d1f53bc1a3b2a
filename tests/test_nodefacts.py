"""The node's facts as its agent serves them: read from fixture trees of /sys/class/net and os-release."""

from __future__ import annotations

from pathlib import Path

from slurm_ext.nodefacts import Interface, os_name, read_facts


def _link(net: Path, name: str, state: str, speed: str, rx: int, tx: int, physical: bool) -> None:
    base = net / name
    (base / "statistics").mkdir(parents=True)
    (base / "operstate").write_text(state + "\n")
    (base / "speed").write_text(speed + "\n")
    (base / "statistics" / "rx_bytes").write_text(f"{rx}\n")
    (base / "statistics" / "tx_bytes").write_text(f"{tx}\n")
    if physical:
        (base / "device").mkdir()


def test_physical_and_watched_interfaces_with_their_counters_and_the_os_image(tmp_path):
    net = tmp_path / "net"
    _link(net, "ib0", "up", "400000", 10, 20, physical=True)
    _link(net, "eth0", "down", "-1", 1, 2, physical=True)  # a link that is down reports speed -1 (or EINVAL)
    _link(net, "veth1234", "up", "10000", 5, 6, physical=False)  # a pod's: left out
    _link(net, "bond0", "up", "not a number", 7, 8, physical=False)  # virtual, but watched by health.interfaces
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\n')
    facts = read_facts(("bond0",), net, release)
    assert facts.os == "Debian GNU/Linux 13 (trixie)" and facts.kernel
    assert facts.interfaces == [Interface("bond0", "up", None, 7, 8), Interface("eth0", "down", None, 1, 2),
                                Interface("ib0", "up", 400000, 10, 20)]


def test_no_sysfs_and_no_os_release_are_empty_facts(tmp_path):
    facts = read_facts((), tmp_path / "missing", tmp_path / "missing-os-release")
    assert facts.interfaces == [] and facts.os == ""
    assert os_name(tmp_path / "missing") == ""

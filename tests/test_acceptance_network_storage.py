"""network-links, network-rdma and storage through the real child process (`python -I -m
slurm_ext.acceptance.child`): interfaces in a network namespace made here (`ip netns exec` remounts /sys for
it), a fake `ib_write_bw` printing perftest's real report, and real files on a temporary path and on small
tmpfs mounts made full or read-only here. Needs root (namespaces, mounts) and Debian's fio.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from slurm_ext.acceptance import network

from helpers.acceptance import CHILD, ask_child, by_target



def _child(tmp_path: Path, test: str, acceptance: str, level: str = "standard", path: str = "/usr/bin:/bin",
           netns: str | None = None, deadline: float = 60.0, extra_env: dict | None = None) -> dict:
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n\n[acceptance]\nprofile = "h200-sxm"\n'
                      f'{acceptance}\n')
    env = {**os.environ, "PATH": path, **(extra_env or {})}
    command = CHILD if netns is None else ("ip", "netns", "exec", netns, *CHILD)
    return ask_child(config, test, level, deadline, env, command=command, timeout=300)


# -- network-links ---------------------------------------------------------------------------------------------


@pytest.fixture
def netns():
    """A network namespace with veth pairs `data0` (MTU 9000) and `eth0` (veth reports 10000 Mb/s) up, `ib1` down,
    and `lo` up (a virtual interface: operstate "unknown" while up); removed after."""
    name = f"slurm-ext-accept-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for args in (["link", "add", "data0", "type", "veth", "peer", "name", "data0p"],
                     ["link", "set", "data0", "mtu", "9000"], ["link", "set", "data0p", "mtu", "9000"],
                     ["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"],
                     ["link", "add", "ib1", "type", "veth", "peer", "name", "ib1p"],
                     *(["link", "set", link, "up"] for link in ("data0", "data0p", "eth0", "eth0p", "lo"))):
            subprocess.run(["ip", "-n", name, *args], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def test_interfaces_up_at_their_mtu_and_speed_pass(tmp_path: Path, netns: str) -> None:
    answer = _child(tmp_path, "network-links", "[acceptance.interfaces.data0]\nmtu = 9000\n"
                    "[acceptance.interfaces.eth0]\nspeed_mbps = 10000\nmtu = 1500\n"
                    "[acceptance.interfaces.lo]\n", netns=netns)
    results = by_target(answer)
    assert {r["outcome"] for r in results.values()} == {"pass"}, results
    assert results["data0"]["message"] == "data0: up, 10000 Mb/s, MTU 9000"
    assert results["eth0"]["message"] == "eth0: up, 10000 Mb/s (expected >= 10000), MTU 1500"
    assert results["lo"]["message"] == "lo: up, MTU 65536"


def test_a_wrong_mtu_a_slow_link_a_down_one_and_a_missing_one_fail(tmp_path: Path, netns: str) -> None:
    answer = _child(tmp_path, "network-links", "[acceptance.interfaces.data0]\nmtu = 4200\n"
                    "[acceptance.interfaces.eth0]\nspeed_mbps = 400000\n"
                    "[acceptance.interfaces.ib1]\n[acceptance.interfaces.ib7]\n", netns=netns)
    results = by_target(answer)
    assert {t: (r["outcome"], r["action"]) for t, r in results.items()} == {
        "data0": ("fail", "none"), "eth0": ("fail", "reboot"), "ib1": ("fail", "reboot"), "ib7": ("fail", "reboot")}
    assert results["data0"]["message"] == ("data0: MTU 9000 (expected 4200: set it, ip link set data0 mtu 4200, or "
                                           "fix the node's network configuration)")
    assert results["eth0"]["message"] == "eth0: 10000 Mb/s (expected 400000 Mb/s)"
    assert results["ib1"]["message"].startswith("ib1: down (expected up)")
    assert results["ib7"]["message"] == "ib7: no such interface (expected up)"


def test_no_interface_configured_does_not_apply(tmp_path: Path) -> None:
    assert _child(tmp_path, "network-links", "")["not_applicable"] == "no [acceptance.interfaces.<name>] configured"


# -- network-rdma ----------------------------------------------------------------------------------------------

#: ib_write_bw's report (perftest 4.5, --report_gbits -F -D), as its README and field captures print it: the
#: settings block, the queue pairs' addresses, then "#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec]
#: MsgRate[Mpps]" and one line per message size; a CPU-frequency warning may come between them
_REPORT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : {hca}
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : ON
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 4096[B]
 Link type       : IB
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0x01 QPN 0x0c8b PSN 0x83a0e9 RKey 0x1fff00 VAddr 0x007f1b6d600000
 remote address: LID 0x01 QPN 0x0c8c PSN 0x9d3a21 RKey 0x1ffe00 VAddr 0x007f4a1c800000
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 1500.000000 != 3300.016000. CPU Frequency is not max.
 8388608    27914            0.00               {gbps}   \t\t   0.005838
---------------------------------------------------------------------------------------
"""


@pytest.fixture
def fake_perftest(tmp_path: Path) -> Path:
    """An `ib_write_bw` that, as the real one, serves on -p's TCP port until a client has come (the server) or
    connects to it and prints the report (the client, given the server's address last); the bandwidth of HCA X
    is $FAKE_GBPS_X (else 391.79)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ib_write_bw"
    script.write_text(f"""#!{sys.executable}
import os, socket, sys
args = sys.argv[1:]
hca, port = args[args.index("-d") + 1], int(args[args.index("-p") + 1])
if args[-1] != "127.0.0.1":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(1)
    print("************************************\\n* Waiting for client to connect... *\\n"
          "************************************", flush=True)
    server.accept()[0].recv(16)
    sys.exit(0)
if os.environ.get("FAKE_FAIL_" + hca):
    print("Unable to open file descriptor for socket connection Unable to init the socket connection", file=sys.stderr)
    sys.exit(1)
with socket.create_connection(("127.0.0.1", port)) as client:
    client.sendall(b"qp")
print({_REPORT!r}.format(hca=hca, gbps=os.environ.get("FAKE_GBPS_" + hca, "391.79")))
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_rdma_loopback_per_hca_against_the_profiles_limit(tmp_path: Path, fake_perftest: Path) -> None:
    answer = _child(tmp_path, "network-rdma", 'hcas = ["mlx5_0", "mlx5_1", "mlx5_2"]',
                    path=f"{fake_perftest}:/usr/bin:/bin",
                    extra_env={"FAKE_GBPS_mlx5_1": "212.40", "FAKE_FAIL_mlx5_2": "1"})
    results = by_target(answer)
    assert results["mlx5_0"]["outcome"] == "pass"
    assert results["mlx5_0"]["message"] == "mlx5_0: loopback rdma_gbps 391.8 Gb/s (>= 360)"
    assert (results["mlx5_1"]["outcome"], results["mlx5_1"]["action"]) == ("fail", "reboot")
    assert results["mlx5_1"]["message"].startswith("mlx5_1: loopback rdma_gbps 212.4 Gb/s (>= 360): below the limit")
    assert results["mlx5_2"]["outcome"] == "error"
    assert results["mlx5_2"]["message"] == ("mlx5_2: ib_write_bw exited with status 1: Unable to open file "
                                            "descriptor for socket connection Unable to init the socket connection")


def test_without_perftest_rdma_is_an_error_saying_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    answer = _child(tmp_path, "network-rdma", 'hcas = ["mlx5_0"]', path=str(empty))
    assert answer["error"] == "ib_write_bw is not installed: install perftest (apt-get install perftest)"


def test_no_hca_configured_does_not_apply(tmp_path: Path) -> None:
    assert _child(tmp_path, "network-rdma", "")["not_applicable"] == "no HCA configured (acceptance.hcas)"


def test_the_report_parser_refuses_another_unit_and_no_table() -> None:
    assert network.parse_ib_write_bw(_REPORT.format(hca="mlx5_0", gbps="97.29")) == 97.29
    with pytest.raises(ValueError, match="another unit than Gb/sec"):
        network.parse_ib_write_bw(" #bytes  #iterations  BW peak[MB/sec]  BW average[MB/sec]  MsgRate[Mpps]\n"
                                  " 65536  5000  11000.0  10990.1  0.17\n")
    with pytest.raises(ValueError, match="no 'BW average"):
        network.parse_ib_write_bw("Couldn't connect to 127.0.0.1:18515\n")


# -- storage ---------------------------------------------------------------------------------------------------


@pytest.fixture
def fio_path() -> str:
    assert shutil.which("fio", path="/usr/bin:/bin"), "fio is needed (Debian's fio: .ci/run installs it)"
    return "/usr/bin:/bin"


@pytest.mark.parametrize("tool", ["fio", "python"])
def test_storage_on_a_path_measures_fsync_and_throughput_and_leaves_nothing(tmp_path: Path, fio_path: str,
                                                                            tool: str) -> None:
    target = tmp_path / "scratch"
    target.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    answer = _child(tmp_path, "storage", f'paths = ["{target}"]\n[acceptance.tests.storage]\n'
                    "limits = { fsync_ms = 1000, write_mbps = 1, read_mbps = 1 }\n", level="quick",
                    path=fio_path if tool == "fio" else str(empty))
    (result,) = answer["results"]
    assert result["outcome"] == "pass", result
    assert result["message"].endswith(f"({tool}, 64 MiB)")
    figures = {f["name"]: f for f in result["figures"]}
    assert set(figures) == {"fsync_ms", "fsync_p99_ms", "write_mbps", "read_mbps"}
    assert figures["fsync_ms"]["limit"] == 1000 and figures["fsync_ms"]["at_least"] is False
    assert all(f["value"] > 0 for f in figures.values())
    assert list(target.iterdir()) == [], "the scratch directory was left"


def test_storage_slower_than_its_limit_fails_naming_the_figure(tmp_path: Path, fio_path: str) -> None:
    answer = _child(tmp_path, "storage", f'paths = ["{tmp_path}"]\n[acceptance.tests.storage]\n'
                    "limits = { write_mbps = 1e9 }\n", level="quick", path=fio_path)
    (result,) = answer["results"]
    assert (result["outcome"], result["action"]) == ("fail", "none")
    assert result["message"].startswith(f"{tmp_path}: too slow: write_mbps ")
    assert result["message"].endswith("MB/s (>= 1e+09)")


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 2 MiB tmpfs mounted here, unmounted after."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("tool", ["fio", "python"])
def test_a_full_file_system_fails_naming_the_path(tmp_path: Path, small_tmpfs: Path, fio_path: str,
                                                  tool: str) -> None:
    with open(small_tmpfs / "filler", "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError:
            pass
    empty = tmp_path / "empty"
    empty.mkdir()
    answer = _child(tmp_path, "storage", f'paths = ["{small_tmpfs}"]', level="quick",
                    path=fio_path if tool == "fio" else str(empty))
    (result,) = answer["results"]
    assert (result["outcome"], result["action"]) == ("fail", "none")
    assert result["message"].startswith(f"{small_tmpfs}: full")


def test_a_read_only_file_system_and_a_missing_path_fail(tmp_path: Path, small_tmpfs: Path, fio_path: str) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    answer = _child(tmp_path, "storage", f'paths = ["{small_tmpfs}", "{tmp_path / "gone"}"]', level="quick",
                    path=fio_path)
    results = by_target(answer)
    assert results[str(small_tmpfs)]["message"] == f"{small_tmpfs}: read-only (Read-only file system)"
    assert results[str(tmp_path / "gone")]["message"] == f"{tmp_path / 'gone'}: missing (No such file or directory)"
    assert {r["outcome"] for r in results.values()} == {"fail"}


def test_no_path_configured_does_not_apply(tmp_path: Path) -> None:
    assert _child(tmp_path, "storage", "")["not_applicable"] == "no path configured (acceptance.paths)"

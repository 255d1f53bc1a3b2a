"""Network tests: `links` (each configured interface up, at its speed and MTU) and `rdma` (loopback bandwidth
per HCA with perftest's ib_write_bw).

Interfaces are read from sysfs (/sys/class/net/<name>/: operstate, flags, carrier, speed, mtu), which
`ip netns exec` remounts for its namespace, so the test sees what the node's own namespace has. A
missing or down interface, or one slower than expected, fails with action reboot, as health's
link-down check acts; a wrong MTU is the node's configuration, a fail with no repair.

ib_write_bw's text report is parsed, not its --out_json: perftest's JSON "produces invalid JSON"
(imbue-ai/cluster-health host_validation/p2p_ib_test.py, which parses the text for that reason).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .catalog import Given
from .records import ERROR, FAIL, PASS, Figure, NotApplicable, Result, TestError

__all__ = ["links", "rdma", "parse_ib_write_bw", "SYS_NET"]

SYS_NET = Path("/sys/class/net")
_IFF_UP = 0x1
#: ib_write_bw's first TCP port for the loopback's exchange of queue-pair numbers (perftest's default is 18515);
#: each HCA takes the next, as AzNHC runs its 8 HCAs on 18510-18517
_FIRST_PORT = 18515
#: how long each loopback runs (ib_write_bw -D), by level: long enough for a steady figure, well inside the
#: level's deadline (standard 300 s, extended 3600 s, for every HCA in turn)
_SECONDS = {"quick": 2, "standard": 5, "extended": 20}
#: a large message, as AzNHC's check_ib_bw_gdr (-s 8388608): the line rate, not the message rate
_MESSAGE = 8388608


# -- links -------------------------------------------------------------------------------------------------------


def links(given: Given, root: Path = SYS_NET) -> list[Result]:
    """One result per [acceptance.interfaces.<name>]: up, speed at least speed_mbps, MTU equal to mtu (0: any).

    Raises:
        NotApplicable: no interface is configured.
    """
    interfaces = dict(getattr(given.settings, "interfaces", {}) or {})
    if not interfaces:
        raise NotApplicable("no [acceptance.interfaces.<name>] configured")
    return [_link(root, name, section) for name, section in sorted(interfaces.items())]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # EINVAL: a down link's speed or carrier; ENOENT: not there
        return None


def _link(root: Path, name: str, section) -> Result:
    started = time.monotonic()
    where = root / name
    if not where.exists():
        return Result("network-links", "network", name, FAIL, f"{name}: no such interface (expected up)", (),
                      time.monotonic() - started, "reboot")
    operstate = _read(where / "operstate") or "unknown"
    flags = int(_read(where / "flags") or "0", 16)
    carrier = _read(where / "carrier")
    # A virtual or tunnel interface (dummy, lo) reports operstate "unknown" while up: its flags and carrier say.
    up = operstate == "up" or (operstate == "unknown" and bool(flags & _IFF_UP) and carrier == "1")
    figures = []
    faults: list[tuple[str, str]] = []
    if not up:
        faults.append((f"{operstate} (expected up)", "reboot"))
    expected_speed = int(getattr(section, "speed_mbps", 0) or 0)
    speed_text = _read(where / "speed")
    speed = int(speed_text) if speed_text and speed_text.lstrip("-").isdigit() else -1
    if speed >= 0 or expected_speed:
        figures.append(Figure("speed_mbps", float(max(speed, 0)), "Mb/s", float(expected_speed) if expected_speed else None))
        if expected_speed and speed < expected_speed:
            shown = f"{speed} Mb/s" if speed >= 0 else "speed unknown"
            faults.append((f"{shown} (expected {expected_speed} Mb/s)", "reboot"))
    mtu = int(_read(where / "mtu") or "0")
    expected_mtu = int(getattr(section, "mtu", 0) or 0)
    figures.append(Figure("mtu", float(mtu), "", None))
    if expected_mtu and mtu != expected_mtu:
        faults.append((f"MTU {mtu} (expected {expected_mtu}: set it, ip link set {name} mtu {expected_mtu}, or fix "
                       f"the node's network configuration)", "none"))
    seconds = time.monotonic() - started
    if faults:
        action = "reboot" if any(a == "reboot" for _, a in faults) else "none"
        return Result("network-links", "network", name, FAIL, f"{name}: " + "; ".join(w for w, _ in faults),
                      tuple(figures), seconds, action)
    shown = [f"{speed} Mb/s" + (f" (expected >= {expected_speed})" if expected_speed else "")] if speed >= 0 else []
    return Result("network-links", "network", name, PASS, f"{name}: " + ", ".join(["up", *shown, f"MTU {mtu}"]),
                  tuple(figures), seconds)


# -- RDMA --------------------------------------------------------------------------------------------------------


def rdma(given: Given) -> list[Result]:
    """A loopback ib_write_bw per HCA of acceptance.hcas (server and client on this node), against rdma_gbps.

    Raises:
        NotApplicable: no HCA is configured.
        TestError: perftest is not installed.
    """
    hcas = tuple(getattr(given.settings, "hcas", ()) or ())
    if not hcas:
        raise NotApplicable("no HCA configured (acceptance.hcas)")
    program = shutil.which("ib_write_bw")
    if program is None:
        raise TestError("ib_write_bw is not installed: install perftest (apt-get install perftest)")
    seconds = _SECONDS.get(given.level, 5)
    budget = max(10.0, given.deadline - 5.0) / len(hcas)
    return [_loopback(program, hca, _FIRST_PORT + k, seconds, budget, given.limits.get("rdma_gbps"))
            for k, hca in enumerate(hcas)]


def _near_hca(hca: str) -> list[str]:
    """`taskset -c CPUS`, the CPUs near the HCA (its PCI device's local_cpulist), as numactl --cpunodebind would:
    on a two-socket node a loopback across sockets reads below a healthy HCA's floor. [] (anywhere) when sysfs or
    taskset (util-linux) is not there. A prefix, not preexec_fn, which is not safe in a process with threads."""
    taskset = shutil.which("taskset")
    try:
        near = Path(f"/sys/class/infiniband/{hca}/device/local_cpulist").read_text().strip()
    except OSError:
        return []
    return [taskset, "-c", near] if taskset and near else []


def _loopback(program: str, hca: str, port: int, seconds: int, budget: float, limit: float | None) -> Result:
    started = time.monotonic()
    args = ["-d", hca, "-p", str(port), "-F", "--report_gbits", "-s", str(_MESSAGE), "-D", str(seconds)]
    near = _near_hca(hca)
    server = subprocess.Popen([*near, program, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        if not _listening(port, server, min(10.0, budget / 2)):
            out = _finish(server)
            return _error(hca, started, f"its ib_write_bw server did not start: {_last(out)}")
        try:
            client = subprocess.run([*near, program, *args, "127.0.0.1"], stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True,
                                    timeout=max(5.0, budget - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            return _error(hca, started, f"ib_write_bw did not finish within {budget:.0f}s")
        if client.returncode != 0:
            return _error(hca, started, f"ib_write_bw exited with status {client.returncode}: "
                                        f"{_last(client.stdout + client.stderr)}")
        try:
            gbps = parse_ib_write_bw(client.stdout)
        except ValueError as err:
            return _error(hca, started, str(err))
    finally:
        _finish(server)
    figure = Figure("rdma_gbps", gbps, "Gb/s", limit)
    seconds_taken = time.monotonic() - started
    if figure.within:
        return Result("network-rdma", "network", hca, PASS, f"{hca}: loopback {figure.text()}", (figure,),
                      seconds_taken)
    return Result("network-rdma", "network", hca, FAIL, f"{hca}: loopback {figure.text()}: below the limit (a link "
                  f"trained down, a cable or the HCA's PCIe slot)", (figure,), seconds_taken, "reboot")


def _listening(port: int, server: subprocess.Popen, wait: float, proc_net: Path = Path("/proc/net")) -> bool:
    """Whether the server listens on `port` before `wait` seconds pass and while it runs. Read from
    /proc/net/tcp{,6} (state 0A, LISTEN): a probing connect would be taken for the client and end the server."""
    until = time.monotonic() + wait
    wanted = f":{port:04X}"
    while time.monotonic() < until and server.poll() is None:
        for table in ("tcp", "tcp6"):
            for row in (_read(proc_net / table) or "").splitlines()[1:]:
                fields = row.split()
                if len(fields) > 3 and fields[1].endswith(wanted) and fields[3] == "0A":
                    return True
        time.sleep(0.05)
    return False


def _finish(server: subprocess.Popen) -> str:
    if server.poll() is None:
        server.kill()  # in the test's own process group: the runner's kill at the deadline takes it too
    try:
        out, _ = server.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return ""
    return out or ""


def _last(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _error(hca: str, started: float, why: str) -> Result:
    return Result("network-rdma", "network", hca, ERROR, f"{hca}: {why}", (), time.monotonic() - started)


def parse_ib_write_bw(text: str) -> float:
    """BW average in Gb/s from ib_write_bw's text report (run with --report_gbits).

    The report's table: a header ` #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]`,
    then one line per message size; a warning line ("Conflicting CPU frequency values detected ...") may come
    between them. The average is the fourth column.

    Raises:
        ValueError: no such table, or a unit other than Gb/sec (a run without --report_gbits).
    """
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if "BW average[" not in line:
            continue
        if "BW average[Gb/sec]" not in line:
            raise ValueError(f"ib_write_bw reported in another unit than Gb/sec: {line.strip()}")
        for row in lines[k + 1:]:
            fields = row.split()
            if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
                try:
                    return float(fields[3])
                except ValueError:
                    break
        break
    raise ValueError("ib_write_bw's report has no 'BW average[Gb/sec]' table: " + _last(text))

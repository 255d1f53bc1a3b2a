"""Debian's Prometheus server as a child on 127.0.0.1, for the tests that need the real one (test_health_prometheus,
test_alerts_cluster): its own TSDB and log in the test's folder, scraping every second, stopped by its PID."""

from __future__ import annotations

import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers.wait import wait_for

PROMETHEUS = Path("/usr/bin/prometheus")
#: ports of their own: the session cluster, other tests and benchmarks use 13307, 16817-16819, 17817+, 19810-19812
PROMETHEUS_PORTS = range(29090, 29140)

#: never through a proxy from the environment: everything here is on 127.0.0.1
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is an answer too."""
    try:
        with _LOCAL.open(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def reachable(url: str) -> tuple[int, str] | None:
    """get's answer, or None while nothing listens there yet."""
    try:
        return get(url, timeout=2.0)
    except OSError:
        return None


def free_port(candidates: range) -> int:
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port on 127.0.0.1 in {candidates.start}-{candidates.stop - 1}")


def tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return f"({path} not written)"


@dataclass
class Server:
    """A running Prometheus: its base URL, process and log."""

    base: str
    proc: subprocess.Popen
    log_path: Path
    _log: object

    def stop(self) -> None:
        """SIGTERM to its PID, SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def start(workdir: Path, job: str, targets: list[str], rule_files: tuple[Path, ...] = (),
          binary: Path = PROMETHEUS) -> Server:
    """Prometheus scraping `targets` as `job` every second (rules evaluated every second), ready to answer."""
    port = free_port(PROMETHEUS_PORTS)
    config = workdir / "prometheus.yml"
    settings = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}]}
    if rule_files:
        settings["rule_files"] = [str(path) for path in rule_files]
    config.write_text(yaml.safe_dump(settings))
    log_path = workdir / "prometheus.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen([str(binary), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             "--storage.tsdb.retention.time=1h", f"--web.listen-address=127.0.0.1:{port}"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path, log)

    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}:\n{tail(log_path)}")
        answer = reachable(f"{server.base}/-/ready")
        return answer is not None and answer[0] == 200
    try:
        wait_for("prometheus ready", ready, timeout=30, interval=0.1)
    except AssertionError as err:
        server.stop()
        raise AssertionError(f"{err}\n{tail(log_path)}") from None
    return server

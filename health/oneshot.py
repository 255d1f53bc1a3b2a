"""`slurm-ext health check`: every check once, now, for an operator or a Slurm HealthCheckProgram.

The polled checks read the node now and judge that one reading; a hold
does not apply (the operator asked now). What needs time (throttling over
a window, error rates, kernel and NVML events) only the running monitor
can know, so its open findings are added. Exit 1 when anything is critical.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

from slurm_ext.procfs import boot_id
from slurm_ext.slurm import SlurmClient

from .check import View
from .checks import REGISTRY
from .findings import Finding, finding_of
from .monitor import load_state
from .records import Observation, Snapshot
from .checks.nvml_failing import failure_of

__all__ = ["Report", "check_now"]


@dataclass(frozen=True, slots=True)
class Report:
    #: checks run now, and checks left to the monitor (windows, events) or disabled
    ran: tuple[str, ...]
    findings: tuple[dict, ...]
    #: checks whose subject this node does not have (a fabric check on a GPU that reports no NVSwitch fabric)
    not_applicable: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not any(f["severity"] == "critical" for f in self.findings)


def check_now(config, nvml_module=None, slurm: SlurmClient | None = None) -> Report:
    from slurm_ext.gres import baseline

    from .nvmlread import read_gpus
    from .readers import LinkWatch, read_filesystems, read_node
    h = config.health
    enabled = [c for c in REGISTRY if h.params(c).enabled]
    sources = {REGISTRY[c].source for c in enabled}
    snapshot = Snapshot(time.monotonic())
    if "nvml" in sources:
        snapshot = _within(h.call_timeout, lambda: read_gpus((lambda: nvml_module) if nvml_module else None,
                                                             tuple(baseline(config.node.state_dir))))
    links = {}
    if "netlink" in sources and h.interfaces:
        try:
            watch = LinkWatch(h.interfaces, h.network_namespace)
            links = {c.ifname: c for c in watch.dump()}
            watch.close()
        except (OSError, ImportError) as err:
            links = {}
            print(f"slurm-ext: warning: cannot read the network links: {err}")
    node = read_node(slurm or SlurmClient(config.slurm), config.node.slurm_name) if "slurm" in sources else None
    view = View(time.time(), (snapshot,), links, (), h.interfaces,
                read_filesystems(h.paths) if "filesystem" in sources else (), node, (), h.xid, {})
    found: dict[tuple, dict] = {}
    ran, not_applicable = [], []
    for check_id in enabled:
        check = REGISTRY[check_id]
        if check.polled is None:
            continue
        if check.applies is not None and not check.applies(view):
            not_applicable.append(check_id)
            continue
        ran.append(check_id)
        for obs in check.polled(view, h.params(check_id)) or ():  # None: no verdict on one reading
            found[obs.key] = _row(obs)
    problem = failure_of(snapshot)
    if problem and "nvml" in enabled:
        params = h.params("nvml")
        # one failed reading is not a GPU fault (the monitor drains after health.checks.nvml.threshold in a row)
        found[("nvml", "node")] = _row(Observation("nvml", "node", "warning", params.action,
                                                   f"nvml failed now: {problem} (the monitor judges repeats)"))
    # the monitor's open findings, each fault once: one this run judged too on the same GPU is that fault (a GPU
    # lost now has no UUID to key it by, the monitor's finding has the one it read before)
    judged = {(row["check"], row["gpu"]) for row in found.values() if row.get("gpu") is not None}
    for item in load_state(config.node.state_dir, boot_id(config.node.boot_id_file)).get("findings") or ():
        if isinstance(item, dict) and item.get("opened") is not None:
            finding = Finding(**{k: v for k, v in item.items() if k in Finding.__dataclass_fields__})
            if (finding.check, finding.gpu) not in judged:
                found.setdefault(finding.key, {**asdict(finding), "from": "monitor"})
    return Report(tuple(ran), tuple(found.values()), tuple(not_applicable))


def _within(seconds: float, read) -> Snapshot:
    """`read()`, or an NVML failure when it runs past `seconds`: a driver call can hang for minutes, and a
    HealthCheckProgram or an operator's shell must get an answer. The stuck call is left on a daemon thread."""
    answer: list = []

    def run() -> None:
        try:
            answer.append(read())
        except BaseException as err:  # raised again below, in the caller's thread
            answer.append(err)
    reader = threading.Thread(target=run, name="health-check-nvml", daemon=True)
    reader.start()
    reader.join(seconds)
    if answer:
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]
    return Snapshot(time.monotonic(), error=-1, error_text=f"NVML did not answer within health.call_timeout "
                                                           f"({seconds:g}s)")


def _row(obs: Observation) -> dict:
    """A verdict of now, in the form of the monitor's findings (the same keys in `health check --json`)."""
    return {**asdict(finding_of(obs, time.time(), polled=True)), "from": "now"}

"""`slurm-ext health monitor`: the worker agent's `health` worker, every check on one node.

Sources that push run on threads of their own and hand records to one
queue: the kernel log, NVML's events, netlink. The polled readers (NVML,
the file systems, Slurm) run on threads too, so a read that hangs (a GPU
off the bus hangs the driver, a dead NFS server hangs statvfs) is seen
and reported instead of stopping the other checks. One thread, this one,
owns everything else: it judges, keeps the findings, writes the journal
and the metrics file, and tells the node-state owner what to drain.

Files: `<node.state_dir>/health/findings.json` keeps the findings across
restarts (with the boot they belong to: a new boot starts clean);
`<node.runtime_dir>/health.json` is the latest readings for the
agent's /metrics and `slurm-ext health show`; `<node.state_dir>/health/
clear.json` is an operator's `slurm-ext health clear`, taken up within a second.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_ext import config as config_mod, events, nodestate
from slurm_ext.errors import ConfigError
from slurm_ext.fileio import atomic_write
from slurm_ext.procfs import boot_id
from slurm_ext.slurm import SlurmClient

from .check import View
from .checks import REGISTRY
from .findings import FindingChange, Finding, Findings
from .kmsg import KernelLog, LineParser
from .records import LinkChange, Snapshot, Xid
from .settings import CHECKS, HealthSection

__all__ = ["Monitor", "OWNER", "owner_of", "state_path", "metrics_path", "clear_path", "load_state"]

log = logging.getLogger("health")

#: the owner of health drains in the node-state catalogue; each check drains as health/<check>
OWNER = "health"
#: a source that failed is tried again after this long
_RETRY = 30.0
#: the most event records and link changes kept for the windows (a storm of lines must not grow memory)
_MAX_RECENT = 2000
#: how often the operator is told about kernel-log lines that imitate the driver (see _kernel_log)
_REFUSED_EVERY = 3600.0
#: an Xid's echo from the other source comes within 2 s: records further back than this are not looked at
_ECHO_LOOK_BACK = 10.0
#: Xid count series kept (per GPU and Xid number, and one per node for Xids of no GPU it has)
_MAX_XID_SERIES = 512
#: how long a pushing source blocks in one wait (it wakes at once for a line or an event; this is only how often
#: an idle one comes up for air)
_SOURCE_WAIT = 5.0
#: how often the findings' last sightings are saved besides each change
_SAVE_EVERY = 30.0
#: how long a drain or clear may wait for the agent's answer
_POST_TIMEOUT = 30.0


def owner_of(check: str) -> str:
    return f"{OWNER}/{check}"


def state_path(state_dir: str) -> Path:
    return Path(state_dir) / "health" / "findings.json"


def clear_path(state_dir: str) -> Path:
    return Path(state_dir) / "health" / "clear.json"


def metrics_path(runtime_dir: str) -> Path:
    return Path(runtime_dir) / "health.json"


def load_state(state_dir: str, this_boot: str | None = None) -> dict:
    """The monitor's persisted state ({} when none or unreadable: the monitor starts clean); given `this_boot` (a
    boot id), {} also when it is of another boot (what `health show` and `health check` must not report)."""
    try:
        data = json.loads(state_path(state_dir).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or this_boot is not None and data.get("boot") not in (None, this_boot):
        return {}
    return data


class _NothingToWatch(Exception):
    """A source that does not apply to this node (NVML events where no GPU ever was): tried again, never reported."""


@dataclass
class _Poller:
    """A polled reader on a thread of its own: `read()` every `interval`; its result goes on the queue."""

    name: str
    read: object
    interval: float
    out: queue.Queue
    busy_since: float | None = None
    hung_reported: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    kick: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"health-{self.name}", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.busy_since = time.monotonic()
            try:
                result = self.read()
            except Exception as err:  # a reader's bug must not end the monitor: reported, tried again
                result = err
            self.busy_since = None
            self.out.put(("poll", self.name, result))
            self.kick.wait(self.interval)
            self.kick.clear()


class Monitor:
    def __init__(self, config, config_path: str | None = None, nvml_module=None):
        self.config = config
        self.config_path = config_path
        self.node = config.node.slurm_name
        self.state_dir = config.node.state_dir
        self.runtime_dir = config.node.runtime_dir
        self.emit = events.emitter(self.state_dir, "health")
        self.queue: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self._nvml = nvml_module
        self.snapshots: deque[Snapshot] = deque()
        self.recent: deque = deque(maxlen=_MAX_RECENT)
        self.link_changes: deque[LinkChange] = deque(maxlen=_MAX_RECENT)
        self.links: dict[str, LinkChange] = {}
        self.filesystems = ()
        self.node_sample = None
        #: the most active NVLinks each GPU has shown this boot (the nvlink check's expectation): kept across restarts
        self.nvlink_seen: dict[str, int] = {}
        #: each GPU index's identity as last read (a lost GPU answers nothing, its UUID included)
        self.identities: dict = {}
        #: each GPU's nvmlread.GpuFacts by UUID: read at its first poll, kept while the monitor runs
        self.gpu_facts: dict = {}
        #: "<uuid or bus>/<xid>" -> {gpu, uuid, pci_bus_id, xid, count}, and each GPU's last Xid: kept across restarts
        self.xid_counts: dict[str, dict] = {}
        self.last_xid: dict[str, int] = {}
        self.check_state: dict[str, str] = {}
        #: reader -> the error it last failed with (reported once, not every poll)
        self.reader_failed: dict[str, str] = {}
        #: checks whose drain a previous run of the monitor had asked for (lifted once they judge healthy)
        self.drained_before: set[str] = set()
        self.boot = boot_id(config.node.boot_id_file)
        self.findings = self._load()
        self._pollers: list[_Poller] = []
        self._drains = _DrainPoster(self)
        self._last_expire = self._last_save = self._last_metrics = 0.0

    # -- set-up ---------------------------------------------------------------------

    @property
    def health(self) -> HealthSection:
        return self.config.health

    def _load(self) -> Findings:
        state = load_state(self.state_dir)
        self.xid_counts = {str(k): dict(v) for k, v in dict(state.get("xid_counts") or {}).items()
                           if isinstance(v, dict)}
        self.last_xid = {str(k): int(v) for k, v in dict(state.get("last_xid") or {}).items()}
        self.drained_before = {str(c) for c in state.get("drains") or ()}
        self.nvlink_seen = {str(k): int(v) for k, v in dict(state.get("nvlink_seen") or {}).items()}
        if state.get("boot") and state.get("boot") != self.boot:
            self.xid_counts, self.last_xid, self.nvlink_seen = {}, {}, {}
            return Findings()  # the node rebooted: every finding of the last boot is over
        found = Findings.from_json(state.get("findings") or [])
        off = {c for c in CHECKS if not self.health.params(c).enabled}
        found.drop(lambda f: f.check not in off, "disabled")  # disabled while the monitor was down
        self.drained_before |= off & {str(c) for c in state.get("drains") or ()}
        return found

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stopping.set())
        signal.signal(signal.SIGHUP, lambda *_: self.queue.put(("reload", "", None)))
        signal.signal(signal.SIGUSR1, lambda *_: self.queue.put(("poll-now", "", None)))
        enabled = [c for c in CHECKS if self.health.params(c).enabled]
        self.emit("health-started", f"health monitor on node {self.node}: {len(enabled)} checks "
                  f"({', '.join(enabled)}), polled every {self.health.interval:g}s; kernel log "
                  f"{self.health.kernel_log or 'off'}; {len(self.findings.open())} open findings kept",
                  checks=enabled)
        self._start_sources()
        self._drains.start()
        self._drains.resync(self.findings.open())
        for check in self.drained_before - {f.check for f in self.findings.open()}:
            # no poll judges an event check or a disabled one: a drain of theirs from before is over now
            if check in REGISTRY and (REGISTRY[check].on_event is not None or not self.health.params(check).enabled):
                self._drains.sync(check, [])
        self._save()  # this boot's state from the start: `health show` never lists a finding of the boot before
        try:
            while not self.stopping.is_set():
                self._step(1.0)
        finally:
            for poller in self._pollers:
                poller.stop.set()
                poller.kick.set()
            self._save()
            self._drains.stop()
        return 0

    def _start_sources(self) -> None:
        h = self.health
        sources = {c.source for c in REGISTRY.values() if h.params(c.id).enabled}
        if "nvml" in sources:
            self._pollers.append(_Poller("nvml", self._read_nvml, h.interval, self.queue))
            if h.nvml_events:
                threading.Thread(target=self._nvml_events, name="health-nvml-events", daemon=True).start()
        if "filesystem" in sources:
            self._pollers.append(_Poller("filesystem", self._read_filesystems, h.params("filesystem").interval,
                                         self.queue))
        if "slurm" in sources:
            interval = min(h.params(c).interval for c in ("slurmd", "foreign-drain") if h.params(c).enabled)
            client = SlurmClient(self.config.slurm)
            from .readers import read_node
            self._pollers.append(_Poller("slurm", lambda: read_node(client, self.node), interval, self.queue))
        if "kernel" in sources and h.kernel_log:
            threading.Thread(target=self._kernel_log, name="health-kmsg", daemon=True).start()
        if "netlink" in sources and h.interfaces:
            threading.Thread(target=self._netlink, name="health-netlink", daemon=True).start()
        for poller in self._pollers:
            poller.start()

    # -- readers (their own threads) ----------------------------------------------------

    def _module(self):
        if self._nvml is None:
            from .nvmlread import nvml_module
            self._nvml = nvml_module()
        return self._nvml

    def _read_nvml(self) -> Snapshot:
        from slurm_ext.gres import baseline

        from .nvmlread import read_gpus
        return read_gpus(self._module, tuple(baseline(self.state_dir)), dict(self.identities), self.gpu_facts)

    def _read_filesystems(self):
        from .readers import read_filesystems
        return read_filesystems(self.health.paths)

    def _source_loop(self, name: str, open_source, read) -> None:
        """Keep a pushing source going: open it, read it, and when it fails say so and retry after _RETRY."""
        failing = ""
        while not self.stopping.is_set():
            try:
                source = open_source()
            except _NothingToWatch:
                self.stopping.wait(_RETRY)
                continue
            except Exception as err:
                if str(err) != failing:
                    failing = str(err)
                    self.queue.put(("source-failed", name, f"{err}; retried every {_RETRY:g}s"))
                self.stopping.wait(_RETRY)
                continue
            if failing:
                self.queue.put(("source-ok", name, "reading again"))
                failing = ""
            try:
                while not self.stopping.is_set():
                    for record in read(source):
                        self.queue.put(("record", name, record))
            except Exception as err:
                failing = str(err)
                self.queue.put(("source-failed", name, f"{err}; retried every {_RETRY:g}s"))
                self.stopping.wait(_RETRY)
            finally:
                close = getattr(source, "close", None)
                if close:
                    close()

    def _kernel_log(self) -> None:
        """Only the kernel's own lines are judged (kmsg.py says how they are told from a user's); lines that imitate
        the driver are counted and told to the operator in the log at most once every _REFUSED_EVERY."""
        parser = LineParser()
        told = {"count": 0, "at": -_REFUSED_EVERY}

        def open_log():
            source = KernelLog(self.health.kernel_log)
            source.open()
            return source

        def read(source):
            records = [r for r in map(parser.parse, source.lines(_SOURCE_WAIT)) if r is not None]
            if parser.refused > told["count"] and time.monotonic() - told["at"] >= _REFUSED_EVERY:
                log.warning("health: kernel log %s: %d lines that look like the NVIDIA driver's were not judged: not "
                            "the kernel's own (written from user space, or another message quoting the driver); the "
                            "last: %r", self.health.kernel_log, parser.refused - told["count"],
                            parser.last_refused[:300])
                told.update(count=parser.refused, at=time.monotonic())
            return records
        self._source_loop("kernel-log", open_log, read)

    def _nvml_events(self) -> None:
        from slurm_ext import nvml
        from slurm_ext.gres import baseline

        from .nvmlread import NvmlEvents, NvmlInitFailed

        def open_events():
            try:
                return NvmlEvents(self._module())
            except (NvmlInitFailed, nvml.NvmlUnavailable):
                if not baseline(self.state_dir):
                    raise _NothingToWatch() from None  # a node without GPUs: nothing to say
                raise
        self._source_loop("nvml-events", open_events, lambda watch: watch.wait(_SOURCE_WAIT))

    def _netlink(self) -> None:
        from .readers import LinkWatch

        def open_watch():
            watch = LinkWatch(self.health.interfaces, self.health.network_namespace)
            for change in watch.dump():
                self.queue.put(("record", "netlink", change))
            return watch
        self._source_loop("netlink", open_watch, lambda watch: watch.wait(1.0))

    # -- the one thread that judges ---------------------------------------------------

    def _step(self, timeout: float) -> None:
        try:
            kind, name, item = self.queue.get(timeout=timeout)
        except queue.Empty:
            kind = ""
        else:
            self._take(kind, name, item)
        now, tick = time.time(), time.monotonic()
        self._watch_hangs()
        if tick - self._last_expire >= 1.0:
            self._last_expire = tick
            expired = self.findings.expire(lambda check: self.health.params(check).quiet, now)
            self._apply(expired)
            for check in {c.finding.check for c in expired}:
                self._drains.sync(check, self.findings.open())
            self._operator_clear()
            if tick - self._last_save >= _SAVE_EVERY:  # last sightings, so that a crash loses at most this much
                self._save()
            if tick - self._last_metrics >= self.health.interval:  # fresh even while NVML hangs
                self._write_metrics()
            if self.links:  # a link's hold and a flap's window pass without a message: judged every second
                for check in ("link-down", "link-flap"):
                    self._judge_polled(check)

    def _take(self, kind: str, name: str, item) -> None:
        if kind == "poll":
            self._polled(name, item)
        elif kind == "record":
            self._record(item)
        elif kind == "source-failed":
            self.emit("health-source-failed", f"{name}: {item}", source=name)
        elif kind == "source-ok":
            self.emit("health-source-ok", f"{name}: {item}", source=name)
        elif kind == "reload":
            self._reload()
        elif kind == "poll-now":  # SIGUSR1 from the agent: an operator asked for the checks now
            for poller in self._pollers:
                poller.kick.set()

    def _polled(self, reader: str, result) -> None:
        if isinstance(result, Exception):
            if self.reader_failed.get(reader) != repr(result):
                self.emit("health-check-failed", f"reader {reader} failed: {result!r} (a bug of slurm-ext, or input "
                          "it cannot read: its checks wait, the others go on; tried again every poll)",
                          reader=reader, traceback=traceback.format_exception(result)[-3:])
            self.reader_failed[reader] = repr(result)
            return
        self.reader_failed.pop(reader, None)
        if reader == "nvml":
            self._add_snapshot(result)
        elif reader == "filesystem":
            self.filesystems = result
        elif reader == "slurm":
            self.node_sample = result
        for check in REGISTRY.values():
            if check.polled is not None and check.source == reader:
                self._judge_polled(check.id)
        if reader == "nvml":
            self._write_metrics()

    def _add_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)
        for sample in snapshot.gpus:
            if sample.gpu.uuid:
                self.identities[sample.gpu.index] = sample.gpu
            if sample.nvlink_active is not None:
                self.nvlink_seen[sample.gpu.uuid] = max(self.nvlink_seen.get(sample.gpu.uuid, 0), sample.nvlink_active)
        keep = max([self.health.params(c).window for c in CHECKS if REGISTRY[c].source == "nvml"]
                   + [self.health.interval * (self.health.params("nvml").threshold or 1)]) + 2 * self.health.interval
        while len(self.snapshots) > 2 and snapshot.time - self.snapshots[0].time > keep:
            self.snapshots.popleft()

    def _record(self, record) -> None:
        if isinstance(record, LinkChange):
            self.links[record.ifname] = record
            self.link_changes.append(record)
            for check in ("link-down", "link-flap"):
                self._judge_polled(check)
            return
        if isinstance(record, Xid):
            if self._echo(record):
                return
            self._count_xid(record)
        for check in REGISTRY.values():
            if check.on_event is not None and isinstance(record, check.events):
                self._judge_event(check.id, record)
        self.recent.append(record)

    def _echo(self, xid: Xid) -> bool:
        """The same Xid on the same GPU again within 2 s from the other source (NVML's event and the kernel line of
        one fault), or the driver's "fallen off the bus" line after its Xid 79 line: one Xid, not two."""
        gpu = self._gpu_of(xid)
        for old in reversed(self.recent):
            if old.time < xid.time - _ECHO_LOOK_BACK:  # newest first: nothing older can be an echo
                break
            if not isinstance(old, Xid) or xid.time - old.time > 2.0:
                continue
            if old.xid == xid.xid and self._gpu_of(old) == gpu and (old.source != xid.source or xid.no_xid_line):
                return True
        return False

    def _gpu_of(self, xid: Xid):
        return next((g for g in self.identities.values()
                     if (xid.uuid and g.uuid == xid.uuid) or (xid.pci_bus_id and g.pci_bus_id == xid.pci_bus_id)),
                    xid.uuid or xid.pci_bus_id)

    def _count_xid(self, xid: Xid) -> None:
        """Count it under its GPU (a kernel line names the bus, an NVML event the UUID: one GPU, one series); an Xid
        of no GPU the node has is counted under the node, whatever bus it names, and past _MAX_XID_SERIES series
        (Xid numbers no catalog has) the rest share one: the counts, kept in the state and the metrics, stay small."""
        gpu = self._gpu_of(xid)
        gpu = gpu if not isinstance(gpu, str) else None
        key = f"{gpu.uuid if gpu else 'node'}/{xid.xid}"
        number = xid.xid
        if key not in self.xid_counts and len(self.xid_counts) >= _MAX_XID_SERIES:
            key, number = f"{gpu.uuid if gpu else 'node'}/other", "other"
        entry = self.xid_counts.setdefault(key, {"gpu": gpu.index if gpu else "", "uuid": gpu.uuid if gpu else "",
                                                 "pci_bus_id": gpu.pci_bus_id if gpu else "", "xid": number,
                                                 "count": 0})
        entry["count"] += 1
        if gpu is not None:
            self.last_xid[gpu.uuid] = xid.xid

    def _view(self) -> View:
        return View(time.time(), tuple(self.snapshots), dict(self.links), tuple(self.link_changes),
                    self.health.interfaces, self.filesystems, self.node_sample, tuple(self.recent),
                    self.health.xid, dict(self.nvlink_seen))

    def _judge_polled(self, check_id: str) -> None:
        params = self.health.params(check_id)
        if not params.enabled:
            return
        now = time.time()
        try:
            observations = REGISTRY[check_id].polled(self._view(), params)
        except Exception as err:
            self._check_failed(check_id, err)
            return
        if observations is None:
            return  # no verdict: open findings keep their last sighting, none clears on missing data
        self._apply(self.findings.polled(params, observations, now, self._jobs))
        self._update_state(check_id)
        applies = REGISTRY[check_id].applies
        if applies is not None and self.check_state[check_id] == "ok" and not applies(self._view()):
            self.check_state[check_id] = "not-applicable"
        self._drains.sync(check_id, self.findings.open())

    def _judge_event(self, check_id: str, record) -> None:
        params = self.health.params(check_id)
        if not params.enabled:
            return
        try:
            observations = REGISTRY[check_id].on_event(record, self._view(), params)
        except Exception as err:
            self._check_failed(check_id, err)
            return
        now = time.time()
        for obs in observations:
            self._apply(self.findings.event(params, obs, now, self._jobs))
        self._update_state(check_id)
        # a new critical event is new evidence: it drains again even where an operator resumed our drain for the
        # same finding (a GPU that falls off the bus twice must not keep taking jobs)
        self._drains.sync(check_id, self.findings.open(), renew=any(o.severity == "critical" for o in observations))

    def _check_failed(self, check_id: str, err: Exception) -> None:
        if self.check_state.get(check_id) != "failed":
            self.emit("health-check-failed", f"check {check_id} failed: {err!r} (a bug of slurm-ext: the other "
                      "checks go on, this one runs again at its next turn)", check=check_id,
                      traceback=traceback.format_exception(err)[-3:])
        self.check_state[check_id] = "failed"

    def _unjudged(self, check_id: str) -> str:
        """A check's state before its first verdict. A polled check is "pending" until it has judged a reading: "ok"
        said healthy without having measured anything. An event check's verdict is the absence of events, so it is
        "ok" while something delivers them (the kernel log; NVML's event set for Xids). A check with nothing to
        read (no kernel log, no interface configured) is "not-applicable"."""
        check = REGISTRY[check_id]
        fed = {"kernel": bool(self.health.kernel_log) or (check_id == "xid" and self.health.nvml_events),
               "netlink": bool(self.health.interfaces)}.get(check.source, True)
        if not fed:  # no kernel log, no interface to watch: nothing this check could ever judge
            return "not-applicable"
        return "pending" if check.on_event is None else "ok"

    def _update_state(self, check_id: str) -> None:
        severities = [f.severity for f in self.findings.open() if f.check == check_id]
        self.check_state[check_id] = ("critical" if "critical" in severities else
                                      "warning" if "warning" in severities else "ok")

    def _jobs(self, obs) -> list[int]:
        from slurm_ext.prolog_epilog import gpu_jobs
        held = gpu_jobs(self.state_dir)
        return held.get(obs.gpu.index, []) if obs.gpu is not None else held.get(-1, [])

    def _watch_hangs(self) -> None:
        """A reader running past call_timeout: reported once; an NVML hang counts as a failed poll each interval."""
        now = time.monotonic()
        for poller in self._pollers:
            since = poller.busy_since
            if since is None:
                poller.hung_reported = False
                continue
            if now - since < self.health.call_timeout or poller.hung_reported and poller.name != "nvml":
                continue
            if not poller.hung_reported:
                poller.hung_reported = True
                self.emit("health-check-hung", f"reader {poller.name} has not answered for {now - since:.0f}s "
                          f"(call_timeout {self.health.call_timeout:g}s): its checks wait for it, the others go on",
                          reader=poller.name)
            if poller.name == "nvml" and (not self.snapshots or now - self.snapshots[-1].time >= self.health.interval):
                self._add_snapshot(Snapshot(now, error=-1, error_text=f"nvml call hung for {now - since:.0f}s"))
                self._judge_polled("nvml")

    # -- findings to the journal, the drains and the files ---------------------------------

    def _apply(self, changes: list[FindingChange]) -> None:
        for change in changes:
            self._report(change)
        if changes:
            self._save()

    def _report(self, change: FindingChange) -> None:
        f = change.finding
        where = {"gpu": f.gpu, "uuid": f.uuid, "pci_bus_id": f.pci_bus_id} if f.gpu is not None or f.pci_bus_id \
            else {}
        fields = {"check": f.check, "subject": f.subject, "evidence": f.evidence, "action": f.action,
                  "signature": f.signature, "finding_severity": f.severity, **where,
                  **({"jobs": f.jobs} if f.jobs else {}), **({"detail": f.detail} if f.detail else {}), **f.fields}
        severity = f.severity  # the journal's ladder has the findings' words (info, warning, critical)
        if change.kind == "opened":
            self.emit("health-finding", f"{f.severity}: {f.check} {f.evidence} action={f.action}"
                      + (f" jobs={','.join(map(str, f.jobs))}" if f.jobs else ""), severity, **fields)
        elif change.kind == "escalated":
            self.emit("health-escalated", f"{f.severity}: {f.check} {f.evidence} action={f.action} (was "
                      f"{change.why})", severity, **fields)
        else:
            by = f", by {change.by}" if change.by else ""
            self.emit("health-cleared", f"{f.check} {f.subject}: cleared ({_WHY[change.why]}{by}): {f.evidence}",
                      why=change.why, **fields, **({"by": change.by} if change.by else {}))
        self._update_state(f.check)

    def _save(self) -> None:
        self._last_save = time.monotonic()
        data = {"boot": self.boot, "findings": self.findings.to_json(), "xid_counts": self.xid_counts,
                "last_xid": self.last_xid, "nvlink_seen": self.nvlink_seen,
                "drains": sorted(self._drains.drained() | self.drained_before)}
        try:
            atomic_write(state_path(self.state_dir), json.dumps(data, indent=1) + "\n", mode=0o640, fsync="all")
        except OSError as err:
            log.error("health: cannot save the findings to %s: %s", state_path(self.state_dir), err.strerror)

    def _write_metrics(self) -> None:
        self._last_metrics = time.monotonic()
        snapshot = next((s for s in reversed(self.snapshots) if s.gpus or s.error is None), None)
        from slurm_ext.prolog_epilog import gpu_jobs
        held = gpu_jobs(self.state_dir)
        gpus = []
        for sample in snapshot.gpus if snapshot else ():
            row = asdict(sample)
            row["gpu"] = asdict(sample.gpu)
            row["jobs"] = held.get(sample.gpu.index, [])
            gpus.append(row)
        # the GPUs' readings carry their own time: during an NVML hang the file stays fresh, its readings do not
        readings = time.time() - (time.monotonic() - snapshot.time) if snapshot else 0.0
        data = {"time": time.time(), "readings_time": readings, "interval": self.health.interval, "node": self.node,
                "driver": snapshot.driver if snapshot else "", "gpus": gpus,
                "nvml_error": snapshot.error_text if snapshot else "", "xid_counts": list(self.xid_counts.values()),
                "last_xid": self.last_xid, "checks": {c: ("disabled" if not self.health.params(c).enabled else
                                                          self.check_state.get(c) or self._unjudged(c))
                                                      for c in CHECKS},
                "findings": [asdict(f) for f in self.findings.open()]}
        try:
            atomic_write(metrics_path(self.runtime_dir), json.dumps(data) + "\n", mode=0o644, fsync="none")
        except OSError as err:
            log.error("health: cannot write %s: %s", metrics_path(self.runtime_dir), err.strerror)

    def _operator_clear(self) -> None:
        path = clear_path(self.state_dir)
        try:
            request = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            request = {"bad": str(err)}
        path.unlink(missing_ok=True)
        if "bad" in request:
            self.emit("health-check-failed", f"{path}: not a clear request ({request['bad']}); ignored")
            return
        check, subject = str(request.get("check") or ""), str(request.get("subject") or "")
        action, by = str(request.get("action") or ""), str(request.get("by") or "")[:128]
        why = "reset" if request.get("why") == "reset" else "operator"
        changes = self.findings.drop(lambda f: not ((not check or f.check == check)
                                                    and (not action or f.action == action)
                                                    and (not subject or subject in (f.subject, f.uuid, f.pci_bus_id,
                                                                                    str(f.gpu)))), why, by)
        self._apply(changes)
        for changed in {c.finding.check for c in changes}:
            self._drains.sync(changed, self.findings.open())
        if check == "nvlink":  # named: a plain clear (a sticky Xid after a GPU reset) must not lower the count
            self._forget_nvlinks(subject)
        if not changes:
            log.info("health: clear request (check %r, subject %r) matched no open finding", check, subject)

    def _forget_nvlinks(self, subject: str) -> None:
        """An operator clearing the nvlink check accepts the links the GPUs have now (a link disabled on
        purpose, a GPU board swapped): without forgetting the most seen, the finding would open again."""
        named = {g.uuid for g in self.identities.values() if subject in (g.uuid, g.pci_bus_id, str(g.index))}
        forgotten = [uuid for uuid in self.nvlink_seen if not subject or uuid == subject or uuid in named]
        for uuid in forgotten:
            del self.nvlink_seen[uuid]
        if forgotten:
            log.info("health: nvlink expectation forgotten for %s: the links they show next are the expected count",
                     ", ".join(sorted(forgotten)))
            self._save()

    def _reload(self) -> None:
        try:
            new = config_mod.load(self.config_path)
        except ConfigError as err:
            self.emit("reload-failed", f"SIGHUP: config not reloaded, keeping the running one: {err}",
                      severity="error")
            return
        self.config = new
        gone = [c for c in CHECKS if not new.health.params(c).enabled]
        self._apply(self.findings.drop(lambda f: f.check not in gone, "disabled"))
        for check in gone:
            self._drains.sync(check, self.findings.open())
        self.emit("reload", f"SIGHUP: config reloaded from {new.source or 'defaults'}: thresholds, windows, "
                  "severities, "
                  "actions, paths and disabled checks apply now; a changed kernel_log, nvml_events, interfaces, "
                  "network_namespace, poll interval, or a check whose reader was not started, at the monitor's next "
                  "start")


_WHY = {"quiet": "its condition stayed away for its quiet window", "operator": "an operator's slurm-ext health clear",
        "disabled": "its check was disabled", "reboot": "the node rebooted",
        "reset": "its GPU was reset for an approved reset-gpu repair"}


class _DrainPoster:
    """Tells the node-state owner (the agent, over its socket) what each check wants, on a thread of its own:
    an answer can take Slurm's time, and judging must not wait for it."""

    def __init__(self, monitor: Monitor):
        self.monitor = monitor
        self.wanted: dict[str, str | None] = {}
        self.told: dict[str, str | None] = {}
        #: checks whose drain is asked again although told (a new critical event)
        self.renew: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._run, name="health-drains", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def resync(self, open_findings: list[Finding]) -> None:
        """At start: re-assert the drains of findings kept from before (the agent may have restarted too)."""
        for check in {f.check for f in open_findings}:
            self.sync(check, open_findings)

    def sync(self, check: str, open_findings: list[Finding], renew: bool = False) -> None:
        """Want `check`'s drain for its worst open critical finding, or its clear when it has none; `renew`: ask
        again even if asked already (the node-state owner drains anew where an operator had resumed it).

        A clear is sent only for a drain this monitor asked for, one a previous run asked for, or one Slurm
        shows now: twenty checks judging healthy at start must not cost the agent twenty Slurm reads."""
        critical = [f for f in open_findings if f.check == check and f.severity == "critical"]
        reason = max(critical, key=lambda f: (f.rank(), -f.opened)).reason if critical else None
        m = self.monitor
        with self._lock:
            shown = m.node_sample is not None and f"slurm-ext: {check} " in m.node_sample.reason
            if reason is None and check not in self.wanted and check not in m.drained_before and not shown:
                return
            self.wanted[check] = reason
            if renew and reason is not None:
                self.renew.add(check)
        self._wake.set()

    def drained(self) -> set[str]:
        """The checks whose drain was asked for, or whose clear Slurm has not confirmed yet (a restart must still
        lift it)."""
        with self._lock:
            return {c for c, r in self.wanted.items() if r is not None or self.told.get(c, "unset") is not None}

    def _run(self) -> None:
        m = self.monitor
        while not self._stop.is_set():
            self._wake.wait(5.0)
            self._wake.clear()
            with self._lock:
                todo = {c: r for c, r in self.wanted.items() if self.told.get(c, "unset") != r or c in self.renew}
                self.renew.clear()
            for check, reason in todo.items():
                try:
                    common = dict(node=m.node, slurm=lambda: SlurmClient(m.config.slurm),
                                  emit=events.emitter(m.state_dir, "nodestate"), timeout=_POST_TIMEOUT)
                    if reason is None:
                        nodestate.post_clear(m.runtime_dir, owner_of(check), **common)
                    else:
                        nodestate.post(m.runtime_dir, owner_of(check), f"slurm-ext: {reason}", **common)
                    self.told[check] = reason
                    if reason is None:
                        m.drained_before.discard(check)
                except Exception as err:  # Slurm, the agent's socket, a bug: never the end of this thread
                    log.warning("health: %s for %s not confirmed yet: %s; retrying", "clear" if reason is None
                                else "drain", check, err)
                    if reason is not None:
                        with self._lock:
                            self.renew.add(check)
                    self._wake.set()
                    self._stop.wait(5.0)


def serve(config_path: str | None = None) -> int:
    """The entry point of `slurm-ext health monitor`."""
    config = config_mod.load(config_path)
    if not config.health.enabled:
        log.info("health: health.enabled is false: nothing to monitor")
        return 0
    os.makedirs(Path(config.node.state_dir) / "health", exist_ok=True)
    return Monitor(config, config_path).run()

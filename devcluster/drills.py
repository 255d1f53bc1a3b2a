"""Drills: `slurm-ext dev inject NODE FAULT [--gpu N]` and `slurm-ext dev heal NODE`.

A drill makes a fault on a dev node through the path a real one takes to the node's health monitor, so that an
operator rehearses the whole loop (finding, drain, recommendation, approval, history) on the dev cluster:

- GPU faults change the node's fake-NVML spec (gpus.json), which the fake libnvidia-ml answers from; an Xid is an
  event appended to the spec's event list, delivered by nvmlEventSetWait as the driver delivers one, and taken out
  again once the monitor has it (a new event set would get it again: after the repair's reboot). Never a line
  written into a kernel log: the monitor trusts the kernel's own records only.
- link-down takes down `lo` of the node's own network namespace (nodenet.py), the interface its monitor watches;
  never an interface of the host.
- fs-full mounts a 16 MiB tmpfs on the node's drill-fs directory (one of its health.paths) and fills it; never a
  file system of the host's.
- slurmd-hang stops the node's slurmd (SIGSTOP, by its pidfile); Slurm's pings then time out.

What was injected is kept in <state_dir>/drills.json, so that `heal` undoes exactly that, and each inject and heal is
a `drill-injected` / `drill-healed` event in the node's journal: a drill is never mistaken for a real fault in the
history. `heal` never resumes a node: the monitor lifts its own drain once the finding clears, and a repair the
operator approves brings a node back through the node-state owner.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_ext import command, config, events
from slurm_ext.errors import DevClusterError, SlurmExtError
from slurm_ext.words import moment

from . import fakenvml, nodenet
from .faults import FS_SIZE, KINDS, Kind
from .layout import Layout, NodeLayout
from .settings import DevSection

__all__ = ["KINDS", "Kind", "Drill", "Injected", "Healed", "parse_fault", "inject", "heal", "heal_all",
           "recorded"]

#: the journal's component for drill events (the folder's name)
COMPONENT = "devcluster"
#: the file fs-full fills its tmpfs with
FILL = "drill-fill"
#: seconds `inject xid-NN` waits for the node's monitor to take the event before it leaves it in the spec
XID_WAIT = 15.0
#: clocks event reasons of a GPU held in hardware thermal slowdown: HwSlowdown 0x8 + HwThermalSlowdown 0x40
THERMAL_SLOWDOWN = 0x48


@dataclass(frozen=True, slots=True)
class Drill:
    """One injected fault, as drills.json keeps it."""

    #: a key of KINDS, `xid` for xid-NN
    kind: str
    node: str
    gpu: int | None = None
    xid: int | None = None
    #: slurmd-hang: the stopped slurmd's pid and its start time (clock ticks since boot), so heal continues that
    #: process and no other that took its pid
    pid: int | None = None
    started: int | None = None
    #: when it was injected, ISO 8601 with the zone
    time: str = ""

    @property
    def name(self) -> str:
        """The fault as `dev inject` takes it: xid-79, gpu-lost, ..."""
        return f"xid-{self.xid}" if self.kind == "xid" else self.kind

    @property
    def where(self) -> str:
        return f"{self.name} on {self.node}" + (f" gpu {self.gpu}" if self.gpu is not None else "")


@dataclass(frozen=True, slots=True)
class Injected:
    drill: Drill
    #: what was done, one line
    done: str
    #: what the node's checks will make of it, one line per check
    expect: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Healed:
    node: str
    #: one line per drill undone
    undone: tuple[str, ...]


def parse_fault(text: str) -> tuple[str, int | None]:
    """`text` as a kind of KINDS and, for xid-NN, the Xid number.

    Raises:
        DevClusterError: not a kind this knows (the message lists them).
    """
    found = re.fullmatch(r"xid-?(\d{1,3})", text.strip().lower())
    if found and 0 < int(found.group(1)):
        return "xid", int(found.group(1))
    if text in KINDS and text != "xid-NN":
        return text, None
    raise DevClusterError(f"dev inject: unknown fault {text!r}; faults: {', '.join(KINDS)} (NN: an Xid number "
                          "1-999, such as xid-79)")


def inject(settings: DevSection, node_name: str, fault: str, gpu: int | None = None) -> Injected:
    """Make `fault` on dev node `node_name` (and GPU `gpu` for a GPU fault, default 0), record it, journal it.

    Raises:
        DevClusterError: an unknown node or fault, --gpu out of range or given for a fault of the node, or the
            fault cannot be made (the message says why).
    """
    layout = Layout(settings)
    node = _node(layout, node_name, "inject")
    kind, xid = parse_fault(fault)
    needs_gpu = KINDS["xid-NN" if kind == "xid" else kind].gpu
    if not needs_gpu and gpu is not None:
        raise DevClusterError(f"dev inject: {kind} is a fault of the node, not of a GPU: --gpu does not apply")
    if needs_gpu:
        gpu = _gpu_in_range(node, 0 if gpu is None else gpu)
    drill = Drill(kind, node.name, gpu=gpu, xid=xid, time=moment())
    with _state(layout) as state:
        done, drill = _MAKE[kind](node, drill)
        state.setdefault(node.name, []).append(asdict(drill))
    expect = expectations(node, drill)
    events.emit(str(node.node_state), COMPONENT, "drill-injected",
                f"DRILL (not a real fault): {drill.where} injected by `slurm-ext dev inject`: {done}",
                drill=True, fault=drill.name, gpu=drill.gpu, user=_user())
    return Injected(drill, done, expect)


def heal(settings: DevSection, node_name: str) -> Healed:
    """Undo every drill injected on `node_name`, forget each once undone, journal it. The node is not resumed here.

    Raises:
        DevClusterError: an unknown node, or an undo failed (the message names what is still injected).
    """
    layout = Layout(settings)
    node = _node(layout, node_name, "heal")
    return _heal_node(layout, node)


def heal_all(settings: DevSection) -> list[Healed]:
    """Heal every node that has drills (`dev down`: a stopped slurmd must continue to stop, a tmpfs go).

    Raises:
        DevClusterError: an undo failed on some node, once every node was tried (naming what is still injected)."""
    layout = Layout(settings)
    healed, failed = [], []
    for name in list(_read(layout)):
        try:
            node = layout.node(name)
        except KeyError:
            # a node beyond --nodes now: its files are where they were
            node = NodeLayout(layout, name, 0 if name == settings.node_name else 1)
        try:
            healed.append(_heal_node(layout, node))
        except DevClusterError as err:
            failed.append(str(err))
    if failed:
        raise DevClusterError("; ".join(failed))
    return healed


def recorded(settings: DevSection) -> dict[str, list[Drill]]:
    """The drills injected and not healed, per node."""
    return {name: [Drill(**d) for d in drills] for name, drills in _read(Layout(settings)).items()}


def _heal_node(layout: Layout, node: NodeLayout) -> Healed:
    """Undo the node's drills, last first, each forgotten once undone: a failed undo leaves it and those before it
    in drills.json, and the error names them.

    Raises:
        DevClusterError: an undo failed (what is still injected, and why)."""
    done: list[Drill] = []
    undone: list[str] = []
    failed: DevClusterError | None = None
    with _state(layout) as state:
        kept = state.get(node.name, [])
        while kept:
            drill = Drill(**kept[-1])
            try:
                undone.append(_UNDO[drill.kind](node, drill))
            except (OSError, ValueError, KeyError, SlurmExtError) as err:
                still = ", ".join(Drill(**d).where for d in kept)
                failed = DevClusterError(f"dev heal: {drill.where} could not be undone ({err}); still injected on "
                                         f"{node.name}: {still} (recorded in {layout.drills}: fix the cause and "
                                         "run `slurm-ext dev heal` again)")
                break
            kept.pop()
            done.append(drill)
    if done:
        events.emit(str(node.node_state), COMPONENT, "drill-healed",
                    f"DRILL: {', '.join(d.where for d in reversed(done))} undone by `slurm-ext dev heal`", drill=True,
                    faults=[d.name for d in reversed(done)], user=_user())
    if failed is not None:
        raise failed
    return Healed(node.name, tuple(reversed(undone)))


# -- making and undoing each fault --------------------------------------------------------------------------------

def _spec(node: NodeLayout) -> dict:
    return json.loads(node.gpu_spec.read_text())


def _change_gpu(node: NodeLayout, drill: Drill, keys: dict) -> None:
    spec = _spec(node)
    spec["gpus"][drill.gpu] = {**spec["gpus"][drill.gpu], **keys}
    fakenvml.write_spec(node.gpu_spec, spec)


def _make_xid(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    """The event appended to the spec's events and, once the node's monitor has it, taken out again.

    The fake delivers to a new event set every event the file lists, as the driver does not: left there, the
    Xid would come again at the monitor's next start, after the very reboot that repairs it."""
    journal = events.journal_path(str(node.node_state))
    start = journal.stat().st_size if journal.exists() else 0
    event = {"gpu": drill.gpu, "xid": drill.xid}
    spec = _spec(node)
    spec.setdefault("events", []).append(event)  # appended: earlier ones keep their place
    fakenvml.write_spec(node.gpu_spec, spec)
    done = f"Xid {drill.xid} event on gpu {drill.gpu} appended to {node.gpu_spec}'s events"
    if not _agent_runs(node):
        return done + " (the node's agent does not run: it stays there until `dev heal`)", drill
    if _wait_finding(journal, start, drill, XID_WAIT):
        _remove_event(node, event)
        return done + ", taken by the node's monitor and removed (delivered once, as the driver does)", drill
    return done + f" (no finding of it in the node's journal within {XID_WAIT:g}s: it stays there until " \
                  "`dev heal`)", drill


def _make_gpu_lost(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    _change_gpu(node, drill, {"lost": True})
    return f"gpu {drill.gpu} lost (NVML answers GPU_IS_LOST) in {node.gpu_spec}", drill


def _make_ecc(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    _change_gpu(node, drill, {"ecc": {"volatile": {"uncorrected": 1}, "aggregate": {"uncorrected": 1}},
                              "remapped_rows": {"uncorrected": 1, "pending": 1}})
    return f"gpu {drill.gpu}: 1 uncorrectable ECC error, 1 row remap pending in {node.gpu_spec}", drill


def _make_throttle(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    _change_gpu(node, drill, {"clocks_event_reasons": THERMAL_SLOWDOWN})
    return f"gpu {drill.gpu} in hardware thermal slowdown (clocks event reasons {THERMAL_SLOWDOWN:#x}) in " \
           f"{node.gpu_spec}", drill


def _make_nvlink_down(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    gpu = _spec(node)["gpus"][drill.gpu]
    peers = gpu.get("nvlink_peers") or []
    if not peers:
        raise DevClusterError(f"dev inject: gpu {drill.gpu} of {node.name} has no active NVLink to take down "
                              f"({node.gpu_spec} lists no nvlink_peers)")
    # the link count stays what it was (a link per peer unless the spec gives more): the last link goes inactive,
    # it does not vanish
    _change_gpu(node, drill, {"nvlink_peers": peers[:-1], "nvlink_count": gpu.get("nvlink_count") or len(peers)})
    return f"gpu {drill.gpu}: NVLink {len(peers) - 1} inactive ({len(peers) - 1} of {len(peers)} active) in " \
           f"{node.gpu_spec}", drill


#: where the stuck-bit drill's bit is: 1 MiB into the GPU's memory (inside the quick level's slice), bit 3
STUCK_OFFSET, STUCK_BIT = 0x100000, 3


def _make_stuck_bit(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    _change_gpu(node, drill, {"cuda": {"stuck_bits": [{"offset": STUCK_OFFSET, "bit": STUCK_BIT, "value": 0}]}})
    return f"gpu {drill.gpu}: bit {STUCK_BIT} of the byte at {STUCK_OFFSET:#x} stuck at 0 in {node.gpu_spec}", drill


def _heal_gpu(node: NodeLayout, drill: Drill) -> str:
    s = node.cluster.settings
    healthy = fakenvml.default_gpus(s.gpu_count, s.gpu_name)["gpus"]
    spec = _spec(node)
    if drill.gpu < len(spec["gpus"]) and drill.gpu < len(healthy):
        spec["gpus"][drill.gpu] = healthy[drill.gpu]
        fakenvml.write_spec(node.gpu_spec, spec)
    return f"{drill.name}: gpu {drill.gpu} healthy again in {node.gpu_spec}"


def _agent_runs(node: NodeLayout) -> bool:
    from . import daemons
    from .cluster import cluster_daemons  # cluster runs heal_all at `dev down`: imported here, not at the top
    agent = next((d for d in cluster_daemons(node.cluster) if d.name == node.agent), None)
    return agent is not None and daemons.running_pid(agent) is not None


def _wait_finding(journal: Path, start: int, drill: Drill, timeout: float) -> bool:
    """Whether the node's journal, from byte `start`, gets the monitor's finding of the drill's Xid in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(journal, "rb") as log:
                log.seek(start)
                lines = log.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line still being written
            if record.get("event") == "health-finding" and record.get("xid") == drill.xid \
                    and record.get("gpu") == drill.gpu:
                return True
        time.sleep(0.1)
    return False


def _remove_event(node: NodeLayout, event: dict) -> bool:
    """Take the last listing of `event` out of the spec's events; whether it was there."""
    spec = _spec(node)
    listed = spec.get("events") or []
    for index in range(len(listed) - 1, -1, -1):
        if listed[index] == event:
            del listed[index]
            fakenvml.write_spec(node.gpu_spec, spec)
            return True
    return False


def _heal_xid(node: NodeLayout, drill: Drill) -> str:
    _remove_event(node, {"gpu": drill.gpu, "xid": drill.xid})
    return (f"xid-{drill.xid}: an event, nothing to undo on gpu {drill.gpu} (out of the spec's events); its finding "
            "clears after its quiet "
            "window, or, for a critical Xid, when the node reboots (approve its repair) or with "
            "`slurm-ext health clear --check xid`")


def _make_link_down(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    try:
        nodenet.set_lo(node.netns, False)
    except (OSError, ValueError) as err:
        raise DevClusterError(f"dev inject: cannot take down lo of network namespace {node.netns} (made by `dev "
                              f"up`): {err}") from err
    return f"lo of network namespace {node.netns} (the node's health.interfaces) down", drill


def _heal_link_down(node: NodeLayout, drill: Drill) -> str:
    try:
        nodenet.set_lo(node.netns, True)
    except (OSError, ValueError) as err:
        raise DevClusterError(f"lo of network namespace {node.netns} could not be brought up: {err}") from err
    return f"link-down: lo of network namespace {node.netns} up again"


def _make_fs_full(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    path = node.drill_fs
    path.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(path):
        command.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE},mode=0755", "slurm-ext-drill", str(path)], 30)
    written = 0
    with open(path / FILL, "ab") as fill:
        chunk = b"\0" * 2**20
        while True:
            try:
                written += os.write(fill.fileno(), chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise DevClusterError(f"dev inject: cannot fill {path / FILL}: {err.strerror}") from err
                break
    return f"a {FS_SIZE[:-1]} MiB tmpfs on {path} (one of the node's health.paths) filled", drill


def _heal_fs_full(node: NodeLayout, drill: Drill) -> str:
    path = node.drill_fs
    (path / FILL).unlink(missing_ok=True)
    if os.path.ismount(path):
        command.run(["umount", str(path)], 30)  # CommandError (a SlurmExtError): the heal stops and says so
    return f"fs-full: {path} emptied and its tmpfs unmounted"


def _make_slurmd_hang(node: NodeLayout, drill: Drill) -> tuple[str, Drill]:
    pidfile = node.cluster.pidfile(f"slurmd-{node.name}")
    try:
        pid = int(pidfile.read_text().split()[0])
        started = _start_time(pid)
    except (OSError, ValueError, IndexError):
        raise DevClusterError(f"dev inject: no running slurmd of {node.name} by its pidfile {pidfile}") from None
    why = _not_the_slurmd(node, pid, pidfile)
    if why:
        raise DevClusterError(f"dev inject: pid {pid} of {pidfile} is not the slurmd of {node.name}: {why}; "
                              "nothing was stopped (`slurm-ext dev up` starts the node's slurmd again)")
    os.kill(pid, signal.SIGSTOP)
    return f"slurmd of {node.name} (pid {pid}) stopped with SIGSTOP", Drill(**{**asdict(drill), "pid": pid,
                                                                               "started": started})


def _not_the_slurmd(node: NodeLayout, pid: int, pidfile: Path) -> str:
    """Why process `pid` is not this cluster's slurmd of `node`, "" when it is: a PID from a pidfile may have been
    taken by any process since, a slurmd among them (another node's, another cluster's on this host). This node's
    slurmd runs as slurmd, with `-N <node>` and SLURM_CONF the node's slurm.conf (daemon_environ), and wrote its
    pidfile once started."""
    proc = Path(f"/proc/{pid}")
    try:
        comm = (proc / "comm").read_text().strip()
        argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        started = _start_epoch(pid)
        written = pidfile.stat().st_mtime
    except (OSError, ValueError, IndexError) as err:
        return f"it cannot be read ({err})"
    if comm != "slurmd":
        return f"it is {comm!r}"
    if not any(argv[i] == "-N" and argv[i + 1] == node.name for i in range(len(argv) - 1)):
        return f"it runs without -N {node.name} ({' '.join(argv).strip()!r})"
    conf = next((item.split("=", 1)[1] for item in environ if item.startswith("SLURM_CONF=")), "(none)")
    if conf != str(node.slurm_conf):
        return f"its SLURM_CONF is {conf}, not this cluster's {node.slurm_conf}"
    if started > written + 1.0:
        return f"it started {started - written:.0f}s after the pidfile was written (it took a gone slurmd's pid)"
    return ""


def _heal_slurmd_hang(node: NodeLayout, drill: Drill) -> str:
    try:
        same = _start_time(drill.pid) == drill.started
    except (OSError, ValueError):
        same = False
    if not same:
        return f"slurmd-hang: slurmd pid {drill.pid} is gone (restarted since): nothing to continue"
    os.kill(drill.pid, signal.SIGCONT)
    return f"slurmd-hang: slurmd of {node.name} (pid {drill.pid}) continued with SIGCONT"


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def _start_epoch(pid: int) -> float:
    """When process `pid` started, in seconds since the epoch (the boot's btime and its start in clock ticks)."""
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return boot + _start_time(pid) / os.sysconf("SC_CLK_TCK")


_MAKE = {"xid": _make_xid, "gpu-lost": _make_gpu_lost, "ecc": _make_ecc, "throttle": _make_throttle,
         "nvlink-down": _make_nvlink_down, "link-down": _make_link_down, "fs-full": _make_fs_full,
         "slurmd-hang": _make_slurmd_hang, "stuck-bit": _make_stuck_bit}
_UNDO = {"xid": _heal_xid, "gpu-lost": _heal_gpu, "ecc": _heal_gpu, "throttle": _heal_gpu, "nvlink-down": _heal_gpu,
         "link-down": _heal_link_down, "fs-full": _heal_fs_full, "slurmd-hang": _heal_slurmd_hang,
         "stuck-bit": _heal_gpu}


# -- what the node's checks make of it ----------------------------------------------------------------------------

def expectations(node: NodeLayout, drill: Drill) -> tuple[str, ...]:
    """One line per check the drill reaches: its severity and action in this node's config, when it should come,
    and what follows (a drain, a recommendation)."""
    from slurm_ext.health import xids
    conf = config.load(str(node.slurm_ext_conf))
    lines = []
    if drill.kind == "stuck-bit":
        level = conf.acceptance.at_start if conf.acceptance.enabled and conf.acceptance.at_start != "off" else ""
        return (f"gpu-memory: a fail naming gpu {drill.gpu} and {STUCK_OFFSET:#x}, "
                + (f"at the node's next start ({level} level: `slurm-ext dev reboot-node {node.name}`), which drains "
                   "it 'slurm-ext: acceptance ...'" if level else
                   "in `slurm-ext accept run` on the node ([acceptance] is off: no start test drains it)"),)
    for check in KINDS["xid-NN" if drill.kind == "xid" else drill.kind].checks:
        params = conf.health.params(check)
        severity, action = params.severity, params.action
        if drill.kind == "xid":
            entry = xids.entry(drill.xid)
            override = conf.health.xid.get(str(drill.xid))
            severity = (override and override.severity) or entry.severity
            action = (override and override.action) or entry.action
        if check == "row-remap":
            action = "reset-gpu"  # pending; remove only once a remap failed
        line = f"{check}: a {severity} finding, action {action}, {_when(check, params, node)}"
        if severity == "critical":
            line += f"; the node drained 'slurm-ext: {check} ...'"
            repair = _recommended(drill, check, action, conf)
            line += f", then {repair} recommended (`slurm-ext repair list`)" if repair else \
                ", no repair recommended (clear it with `slurm-ext health clear` once dealt with)"
        else:
            line += "; no drain"
        lines.append(line)
    return tuple(lines)


def _when(check: str, params, node: NodeLayout) -> str:
    if check == "xid":
        return "at once"
    if check == "slurmd":
        timeout = node.cluster.settings.slurmd_timeout
        return (f"once slurmctld's ping times out (about {timeout // 3 + 10}s: SlurmdTimeout/3 + MessageTimeout) "
                f"and has lasted {params.hold:g}s")
    wait = max(params.interval, params.window) + params.hold
    return f"within about {wait:g}s (interval {params.interval:g}s, window {params.window:g}s, hold {params.hold:g}s)"


def _recommended(drill: Drill, check: str, action: str, conf) -> str | None:
    from slurm_ext.repair.recommend import Fault, action_for
    signature = f"xid/{drill.xid}" if drill.kind == "xid" else check
    return action_for(Fault(drill.node, signature, action, ""), conf.repair)


# -- nodes, GPUs and the state file -------------------------------------------------------------------------------

def _node(layout: Layout, name: str, verb: str) -> NodeLayout:
    try:
        return layout.node(name)
    except KeyError:
        raise DevClusterError(f"dev {verb}: {name!r} is not a node of the dev cluster in "
                              f"{layout.root} ({', '.join(n.name for n in layout.nodes)})") from None


def _gpu_in_range(node: NodeLayout, gpu: int) -> int:
    count = len(_spec(node).get("gpus") or [])
    if not 0 <= gpu < count:
        have = f"gpus 0-{count - 1}" if count else "no GPUs"
        raise DevClusterError(f"dev inject: --gpu {gpu} is out of range: {node.name} has {have} ({node.gpu_spec})")
    return gpu


def _read(layout: Layout) -> dict[str, list[dict]]:
    try:
        return json.loads(layout.drills.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise DevClusterError(f"{layout.drills}: not the drills' JSON ({err}): remove it after undoing its drills "
                              "by hand") from None


@contextmanager
def _state(layout: Layout) -> Iterator[dict]:
    """drills.json, read and written back under a lock (two drills at once keep both)."""
    layout.drills.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.drills.with_name(".drills.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _read(layout)
        try:
            yield state
        finally:
            state = {node: drills for node, drills in state.items() if drills}
            tmp = layout.drills.with_name(".drills.json.tmp")
            tmp.write_text(json.dumps(state, indent=1) + "\n")
            os.replace(tmp, layout.drills)


def _user() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or str(os.getuid())

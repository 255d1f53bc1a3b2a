"""Slurm client: typed records read through Slurm's own command-line tools.

slurm-ext talks to Slurm only through scontrol, sinfo, squeue, sacct and
sacctmgr (pyslurm needs headers matching the installed Slurm exactly, see the
design notes). `SlurmClient` reads `--json` where the installed Slurm has it
and parses plain text otherwise, so 22.05 to 26.05 all work; every call has a
timeout, and an unreachable controller or database is always the same
`SlurmUnreachable` error.

Node-state ownership lives here too: `drain` writes reasons that start with
``slurm-ext:`` and `resume` refuses any node whose reason does not, so an
admin's drain is never undone by us.

Main API: `SlurmClient.node`, `.nodes`, `.jobs`, `.queue` (jobs with the GPU
indexes each holds per node), `.job`, `.wait_accounted`, `.drain`, `.resume`,
`.node_events`; records `Node`, `Job`, `NodeEvent`; `slurmd_unready` (slurmd's
own /readyz, Slurm >= 25.11).
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from . import command
from .config import SlurmSection
from .errors import CommandError, CommandTimeout, NotOurDrain, SlurmError, SlurmTooOld, SlurmUnreachable

__all__ = ["REASON_PREFIX", "READYZ_SINCE", "POWER_ACTION_SINCE", "Node", "Job", "NodeEvent", "SlurmClient",
           "is_our_reason", "expand_hostlist", "gpu_indexes", "slurmd_unready", "version_tuple"]

#: every drain reason slurm-ext writes starts with this; it resumes no other
REASON_PREFIX = "slurm-ext:"

# What Slurm's tools print when the daemon on the other end does not answer.
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|Socket timed out|"
    r"Unable to connect to database|Problem talking to the database|Zero Bytes were transmitted|"
    r"Connection timed out|Communication connection failure",
    re.IGNORECASE,
)

# Job states after which nothing runs any more.
_FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                       "BOOT_FAIL", "DEADLINE"})

# Base node states; everything else after '+' is a flag.
_BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "COMPLETING"}


def is_our_reason(reason: str) -> bool:
    """Whether a node reason was written by slurm-ext."""
    return reason.startswith(REASON_PREFIX)


def version_tuple(version: str) -> tuple[int, int]:
    """'26.05.1' or 'slurm 25.11.0' -> (26, 5).

    Raises:
        ValueError: not a Slurm version."""
    found = re.search(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"{version!r} is not a Slurm version (such as 26.05.1)")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    #: base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    state: str
    #: state flags, upper case: DRAIN, NOT_RESPONDING, INVALID_REG, COMPLETING, ...
    flags: frozenset[str] = frozenset()
    #: the drain/down reason as set, without Slurm's "[user@time]" suffix
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    #: configured GRES, as Slurm prints it (gpu:h200:4)
    gres: str = ""
    cpus: int = 0
    #: MiB
    real_memory: int = 0
    partitions: tuple[str, ...] = ()
    #: when the slurmd that last registered started (it sends this in its registration)
    slurmd_start: datetime | None = None
    #: when the node last booted, as its slurmd reported (a reboot shows as a later one)
    boot_time: datetime | None = None
    #: GPUs allocated to jobs now (AllocTRES' gres/gpu)
    gpus_used: int = 0
    #: NodeAddr: where its daemons are reached
    addr: str = ""
    #: the port its slurmd listens on (0: not shown); on Slurm >= 25.11 slurmd answers /livez and /readyz there too
    port: int = 0
    #: its slurmd's Slurm version ("" until it registered)
    version: str = ""
    #: the OS its slurmd reported: kernel name, release and build (Linux 6.1.0-27-amd64 #1 SMP ...)
    os: str = ""

    @property
    def drained(self) -> bool:
        """DRAIN flag set (draining or drained)."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return self.state != "DOWN" and "NOT_RESPONDING" not in self.flags

    @property
    def idle(self) -> bool:
        """Idle and ready for a job: no drain, no down, answering."""
        return self.state == "IDLE" and self.responding and not (
            self.flags & {"DRAIN", "INVALID_REG", "COMPLETING", "MAINTENANCE", "REBOOT_REQUESTED"})

    @property
    def reason_is_ours(self) -> bool:
        return is_our_reason(self.reason)


#: the first Slurm whose slurmd answers GET /livez and /readyz on its own port
READYZ_SINCE = (25, 11)
#: the first Slurm with named PowerActions (`scontrol reboot action=NAME`)
POWER_ACTION_SINCE = (26, 5)


def slurmd_unready(node: Node, timeout: float = 2.0) -> str:
    """Why `node`'s slurmd says it cannot take RPCs yet, by its own /readyz (Slurm >= 25.11: "ready to accept
    incoming RPCs", slurmd.8), asked from the node itself. Two answers are a verdict: none within `timeout` from
    what took the connection (a hung slurmd, which slurmctld counts as responding until SlurmdTimeout), and an HTTP
    status that is not 2xx. Everything else is "": a Slurm without /readyz, no port shown, nothing taking the
    connection or dropping it, or an answer that is not HTTP (a dead slurmd is the agent's own knowledge; an address
    slurmd does not listen on here must not make a healthy node unready). Only the status is said, never what the
    other end wrote: whatever listens on the port writes it, and it goes to sd_notify."""
    try:
        if not node.port or version_tuple(node.version) < READYZ_SINCE:
            return ""
    except ValueError:
        return ""
    host = node.addr if _ip_literal(node.addr) else "127.0.0.1"  # no name lookup: this thread owns the node's state
    connection = http.client.HTTPConnection(host, node.port, timeout=timeout)
    try:
        connection.request("GET", "/readyz")
        status = connection.getresponse().status
    except TimeoutError:
        return f"slurmd's /readyz on port {node.port} did not answer within {timeout:g}s"
    except (OSError, http.client.HTTPException):  # refused, dropped, not HTTP: no verdict
        return ""
    finally:
        connection.close()
    return "" if 200 <= status < 300 else f"slurmd's /readyz on port {node.port} answered {status}"  # 26.05: 204


def _ip_literal(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    name: str
    user: str
    #: upper case: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    state: str
    #: node list expression as Slurm prints it
    nodes: str = ""
    partition: str = ""
    exit_code: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    #: the GPUs it holds, as Slurm allocated them: ((node, gpu type or "gpu", (index, ...)), ...); read by `queue`
    #: only (squeue --json's gres_detail, or `scontrol show job -d`'s GRES=gpu:h200:2(IDX:0-1) per node)
    gpus: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    @property
    def finished(self) -> bool:
        return self.state in _FINISHED


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One row of `sacctmgr show event`: a node state change kept by slurmdbd."""

    node: str
    start: datetime
    #: None while the state still holds
    end: datetime | None
    state: str
    reason: str
    user: str


Runner = Callable[..., command.CommandResult]


@dataclass
class SlurmClient:
    """Reads and changes Slurm state through its CLI tools.

    Build one from the [slurm] config section; every outside dependency (the
    command runner, the environment) is a field so tests can replace it.
    """

    settings: SlurmSection = field(default_factory=SlurmSection)
    runner: Runner = command.run
    environ: dict[str, str] | None = None
    _version: tuple[int, int] | None = field(default=None, init=False, repr=False)
    #: the last whole node table of text, each line with what it was read as: a line Slurm prints again the same
    #: (most, between two reads a few seconds apart) is not read again (Node is frozen)
    _lines: dict[str, Node] = field(default_factory=dict, init=False, repr=False)

    # -- reading -----------------------------------------------------------------

    def version(self) -> tuple[int, int]:
        """(major, minor) of the installed Slurm tools, e.g. (22, 5)."""
        if self._version is None:
            out = self._run(["sinfo", "--version"]).stdout
            try:
                self._version = version_tuple(out)
            except ValueError:
                raise SlurmError(f"cannot read the Slurm version from {out.strip()!r}",
                                 ["sinfo", "--version"]) from None
        return self._version

    def use_json(self, tool: str = "sinfo") -> bool:
        """Whether `tool` should be asked for --json (slurm.json: auto/always/never)."""
        mode = self.settings.json
        if mode != "auto":
            return mode == "always"
        # sinfo/squeue/sacct have --json since 21.08, scontrol since 23.02; but
        # 22.05's sacct --json reports return_code 0 for failed jobs (seen), so
        # sacct's JSON is trusted from 23.02 on too
        return self.version() >= ((23, 2) if tool in ("scontrol", "sacct") else (21, 8))

    def nodes(self) -> list[Node]:
        """Every node slurmctld knows."""
        return self._read_nodes(None)

    def node(self, name: str) -> Node:
        """One node by name.

        Raises:
            SlurmError: slurmctld does not know the node.
            SlurmUnreachable: slurmctld does not answer.
        """
        found = [n for n in self._read_nodes(name) if n.name == name]
        if not found:
            raise SlurmError(f"node {name}: not known to slurmctld", ["scontrol", "show", "node", name])
        return found[0]

    def _read_nodes(self, name: str | None) -> list[Node]:
        if self.use_json("scontrol"):
            cmd = ["scontrol", "--json", "show", "node"] + ([name] if name else [])
            return [_node_from_json(n) for n in self._json(cmd).get("nodes", [])]
        # before 23.02 scontrol has no JSON: its text, for one node as for all of them (22.05's sinfo --json, every
        # node whatever -n says, took 0.4-0.9 s at 10,000 nodes and 0.17 s more to read, `scontrol show node -o`
        # 0.1 s and 0.25 s: measured by tests/benchmarks/bench_history.py)
        cmd = ["scontrol", "show", "node", "--oneliner"] + ([name] if name else [])
        try:
            out = self._run(cmd).stdout
        except SlurmError as err:
            if name and re.search(r"Invalid node name|Node \S+ not found", str(err)):
                return []
            raise
        known = {} if name else self._lines
        lines = {line: known.get(line) or _node_from_text(line) for line in out.splitlines()
                 if line.startswith("NodeName=")}
        if not name:
            self._lines = lines
        return list(lines.values())

    def jobs(self) -> list[Job]:
        """Jobs slurmctld holds now (pending, running, completing), from squeue."""
        if self.use_json("squeue"):
            return self._squeue_json()
        out = self._run(["squeue", "--noheader", "--format=%i|%j|%u|%T|%N|%P|%S|%e"]).stdout
        return [_job_from_squeue_text(line) for line in out.splitlines() if line.strip()]

    def queue(self) -> list[Job]:
        """Jobs slurmctld holds now (pending, running, completing), each with the GPU indexes it holds on each node
        (`Job.gpus`): one squeue --json, or one `scontrol show job -d --oneliner` where the tools have no JSON
        (squeue's text formats do not print GPU indexes)."""
        if self.use_json("squeue"):
            return self._squeue_json()
        out = self._run(["scontrol", "show", "job", "-d", "--oneliner"]).stdout
        jobs = (_job_from_scontrol_text(line) for line in out.splitlines() if line.startswith("JobId="))
        return [job for job in jobs if not job.finished]

    def _squeue_json(self) -> list[Job]:
        """squeue --json's jobs, those that ended left out: 22.05's lists them too (within MinJobAge, recorded in
        tests/data/slurm/22.05.json), where its text form and later releases' JSON list only the jobs held."""
        jobs = (_job_from_squeue_json(j) for j in self._json(["squeue", "--json"]).get("jobs", []))
        return [job for job in jobs if not job.finished]

    def job(self, job_id: int) -> Job | None:
        """A job's accounting record from sacct (None until slurmdbd has it).

        sacct records arrive 1-3 s after a job ends: callers poll.
        """
        if self.use_json("sacct"):
            data = self._json(["sacct", "--json", "-j", str(job_id)])
            found = [_job_from_sacct_json(j) for j in data.get("jobs", [])]
        else:
            out = self._run(["sacct", "-n", "-P", "-X", "-j", str(job_id),
                             "--format=JobID,JobName,User,State,NodeList,Partition,ExitCode,Start,End"]).stdout
            found = [_job_from_sacct_text(line) for line in out.splitlines() if line.strip()]
        found = [j for j in found if j.job_id == job_id]
        return found[0] if found else None

    def wait_accounted(self, job_id: int, timeout: float = 60.0, interval: float = 0.5) -> Job:
        """Poll sacct until it holds the finished job's whole record.

        Records arrive 1-3 s after the job ends, and in pieces: slurmdbd may
        first build the row from a step message (name "allocation", no
        partition) and complete it when the job's start message lands (seen
        for the first job of a new cluster).

        Raises:
            SlurmError: no whole, finished record within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job and job.finished and job.partition:
                return job
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id}: no finished record in sacct after {timeout:g}s (last: {job})")
            time.sleep(interval)

    def show_config(self) -> dict[str, str]:
        """slurmctld's running configuration (`scontrol show config`): ClusterName, SLURM_VERSION, ...; keys as
        Slurm prints them."""
        found = {}
        for line in self._run(["scontrol", "show", "config"]).stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and " " not in key.strip():
                found[key.strip()] = value.strip()
        return found

    def node_events(self, node: str | None, since: datetime) -> list[NodeEvent]:
        """State changes of `node` (None: of every node, in the same one query) that started at or after `since`,
        oldest first."""
        start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        out = self._run(["sacctmgr", "--noheader", "--parsable2", "show", "event", "event=node",
                         *([f"nodes={node}"] if node else []), f"start={start}",
                         "format=NodeName,TimeStart,TimeEnd,State,User,Reason"]).stdout
        events = []
        for line in out.splitlines():
            parts = line.split("|", 5)  # the reason is last and may itself hold '|'
            if len(parts) < 6 or not parts[0] or node and parts[0] != node:
                continue
            events.append(NodeEvent(
                node=parts[0], start=_parse_time(parts[1]), end=_parse_time(parts[2]),
                state=parts[3], user=re.sub(r"\(\d+\)$", "", parts[4]), reason=parts[5]))
        return sorted(events, key=lambda e: e.start)

    def dbd_queue(self) -> int | None:
        """sdiag's "DBD Agent queue size": the accounting records slurmctld holds for slurmdbd (None when sdiag
        shows no such line: accounting does not go through slurmdbd)."""
        found = re.search(r"DBD Agent queue size:\s*(\d+)", self._run(["sdiag"]).stdout)
        return int(found.group(1)) if found else None

    def config_values(self) -> dict[str, str]:
        """`scontrol show config` as key -> value (keys as Slurm writes them: MaxDBDMsgs, JobCompLoc, ...)."""
        out = self._run(["scontrol", "show", "config"]).stdout
        return {key: value.strip() for key, value in re.findall(r"^(\w+)\s+= (.*)$", out, re.M)}

    def accounted_states(self, job_ids: list[int], chunk: int = 500) -> dict[int, str]:
        """Job id -> its state in sacct; ids sacct lacks are left out. An id with several records (requeued,
        or a row a database crash left behind): a finished one if it has one, else its last."""
        states: dict[int, str] = {}
        for start in range(0, len(job_ids), chunk):
            ids = ",".join(map(str, job_ids[start:start + chunk]))
            out = self._run(["sacct", "-n", "-P", "-X", "-a", "-D", "-j", ids, "--format=JobIDRaw,State"]).stdout
            for line in out.splitlines():
                raw, _, state = line.partition("|")
                state = state.split()[0] if state else ""
                if raw.isdigit() and states.get(int(raw)) not in _FINISHED:
                    states[int(raw)] = state
        return states

    def clusters(self) -> list[str]:
        """The clusters slurmdbd's database knows (`sacctmgr show cluster`)."""
        out = self._run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def jobs_named(self, name: str) -> dict[int, tuple[str, str]]:
        """Job id -> (state, reason) of the jobs named `name` that slurmctld still holds (pending, running, or ended
        within MinJobAge). By name, not --jobs: squeue refuses a list holding one id slurmctld no longer holds."""
        out = self._run(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i|%T|%r"]).stdout
        found = {}
        for line in out.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job_id.isdigit():
                found[int(job_id)] = (state.upper(), reason)
        return found

    def job_end(self, job_id: int) -> tuple[str, int | None] | None:
        """(state, exit status) of a job slurmctld still holds (`scontrol show job`), the status None where a signal
        ended it; None when slurmctld no longer holds the job (sacct has it: `job`)."""
        shown = self._run(["scontrol", "show", "job", str(job_id), "--oneliner"], check=False)
        state = re.search(r"\bJobState=(\S+)", shown.stdout)
        if not state:
            return None
        code = re.search(r"\bExitCode=(\d+):(\d+)", shown.stdout)
        return state.group(1), int(code.group(1)) if code and code.group(2) == "0" else None

    def runaway_jobs(self) -> list[str]:
        """`sacctmgr show runawayjobs` lines (id|name|partition|cluster|state|...), its offer to fix them
        answered "no": the fix is the operator's to make."""
        out = self._run(["sacctmgr", "-n", "-P", "show", "runawayjobs"], input="N\n", check=False).stdout
        return [line for line in out.splitlines() if re.match(r"^\d+\|", line)]

    # -- changing ----------------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        """Drain `node`; the reason gets the slurm-ext prefix if it lacks it."""
        if not is_our_reason(reason):
            reason = f"{REASON_PREFIX} {reason}"
        self._run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def reboot(self, node: str, action: str = "") -> None:
        """`scontrol reboot NODE` of a node already drained and idle: Slurm runs its RebootProgram at once and
        keeps the drain (and its reason, with ': reboot issued' added) after the reboot, so the node takes no job
        until it is resumed. Seen on 22.05: ASAP, or any nextstate, clears the drain when the reboot completes
        (RESUME at once; DOWN under ReturnToService=2 at the next ping), before any check could run. 26.05's FORCE
        is not used either: it requeues running jobs and resets the node's state, and the node rebooted here has
        none and must keep its drain. `action`: slurm.conf's PowerAction of that name instead of RebootProgram
        (`action=`, Slurm 26.05 and later; the drain is kept the same way).

        Raises:
            SlurmTooOld: an `action` on a Slurm before 26.05, which has no `action=`."""
        self.check_reboot_action(action)
        self._run(["scontrol", "reboot", *([f"action={action}"] if action else []), node])

    def check_reboot_action(self, action: str) -> None:
        """Whether this Slurm can reboot by PowerAction `action` (none asked: it can).

        Raises:
            SlurmTooOld: an `action` on a Slurm before 26.05, which has no `action=`."""
        if action and self.version() < POWER_ACTION_SINCE:
            raise SlurmTooOld(f"reboot action {action!r} (a PowerAction) needs Slurm 26.05 or later; this Slurm is "
                              f"{'.'.join(f'{part:02d}' for part in self.version())}: empty repair.reboot_action, or "
                              "upgrade", ["scontrol", "reboot", f"action={action}"])

    def submit(self, script: str, options: list[str]) -> int:
        """`sbatch --parsable OPTIONS` with `script` on its standard input; the job id.

        Raises:
            SlurmError: sbatch refused it (its words), or printed no job id."""
        out = self._run(["sbatch", "--parsable", *options], input=script).stdout
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise SlurmError(f"sbatch printed no job id: {out.strip()!r}") from None

    def cancel(self, job_ids: list[int]) -> None:
        """`scancel` the jobs; one already gone is no error."""
        if job_ids:
            self._run(["scancel", *map(str, job_ids)], check=False)

    def reserve(self, name: str, nodes: list[str], minutes: int, flags: str, users: str) -> None:
        """Make reservation `name` on `nodes`, starting now.

        Raises:
            SlurmError: slurmctld refused it (its words)."""
        self._run(["scontrol", "create", "reservation", f"ReservationName={name}", f"Nodes={','.join(nodes)}",
                   "StartTime=now", f"Duration={minutes}", f"Flags={flags}", f"Users={users}"])

    def unreserve(self, name: str) -> bool:
        """Delete reservation `name`; False when slurmctld has none of that name (gone already).

        Raises:
            SlurmError: slurmctld refused (a job of it still running)."""
        try:
            self._run(["scontrol", "delete", f"ReservationName={name}"])
        except SlurmError as err:
            # 22.05 to 26.05: "Requested reservation is invalid" (recorded in tests/data/slurm/)
            if isinstance(err, SlurmUnreachable) or not re.search(r"reservation is invalid|reservation \S* ?not found",
                                                                  str(err), re.I):
                raise
            return False
        return True

    def reconfigure(self) -> None:
        """`scontrol reconfigure`: slurmctld and every slurmd read their configuration (and slurmctld its JWKS)
        again."""
        self._run(["scontrol", "reconfigure"])

    def requeue(self, job_ids: list[int]) -> str:
        """`scontrol requeue` the jobs; Slurm refuses the ones that do not allow it (--no-requeue): its words for
        those are returned, the others are requeued."""
        if not job_ids:
            return ""
        result = self._run(["scontrol", "requeue", ",".join(map(str, job_ids))], check=False)
        return (result.stdout + result.stderr).strip()

    def resume(self, node: str) -> bool:
        """Resume `node` if, and only if, slurm-ext drained it.

        Returns False when the node is neither drained nor down (nothing to do).
        A reason changed by someone between our read and our resume is the one
        race left; Slurm has no compare-and-set for reasons.

        Raises:
            NotOurDrain: the node's reason was not written by slurm-ext.
        """
        current = self.node(node)
        if not current.drained and current.state != "DOWN":
            return False
        if not current.reason_is_ours:
            raise NotOurDrain(node, current.reason)
        self._run(["scontrol", "update", f"nodename={node}", "state=resume"])
        return True

    # -- plumbing ----------------------------------------------------------------

    def _run(self, cmd: list[str], input: str | None = None, check: bool = True) -> command.CommandResult:
        argv = [os.path.join(self.settings.bin_dir, cmd[0]) if self.settings.bin_dir else cmd[0], *cmd[1:]]
        env = dict(self.environ if self.environ is not None else os.environ)
        if self.settings.conf:
            env["SLURM_CONF"] = self.settings.conf
        try:
            if input is not None or not check:
                return self.runner(argv, self.settings.timeout, env=env, input=input, check=check)
            return self.runner(argv, self.settings.timeout, env=env)
        except CommandTimeout as err:
            raise SlurmUnreachable(
                f"{cmd[0]}: no answer within {self.settings.timeout:g}s (is slurmctld/slurmdbd running?)",
                argv) from err
        except CommandError as err:
            detail = err.stderr.strip().splitlines()[-1] if err.stderr.strip() else f"exit status {err.returncode}"
            if _UNREACHABLE.search(err.stderr):
                raise SlurmUnreachable(f"{cmd[0]}: Slurm unreachable: {detail}", argv) from err
            raise SlurmError(f"{' '.join(cmd[:3])}: {detail}", argv) from err

    def _json(self, cmd: list[str]) -> dict:
        out = self._run(cmd).stdout
        try:
            data = json.loads(out)
        except json.JSONDecodeError as err:
            raise SlurmError(f"{' '.join(cmd)}: output is not JSON ({err.msg} at char {err.pos})", cmd) from err
        # sacct reports an empty answer as the error "Nothing found with query"; 22.05 numbers an error "errno",
        # later releases "error_number"
        errors = [e for e in data.get("errors", []) if isinstance(e, dict) and (e.get("error_number") or e.get("errno"))
                  and "Nothing found" not in str(e.get("error") or e.get("description"))]
        if errors:
            text = "; ".join(str(e.get("error") or e.get("description")) for e in errors)
            if _UNREACHABLE.search(text):
                raise SlurmUnreachable(f"{cmd[0]}: Slurm unreachable: {text}", cmd)
            if text == "Unspecified error":  # 22.05's --json (seen of sinfo) when slurmctld does not answer: exit 0
                raise SlurmUnreachable(f"{cmd[0]}: Slurm unreachable: it answered only 'Unspecified error' (what "
                                       "Slurm 22.05's --json says when slurmctld does not answer)", cmd)
            raise SlurmError(f"{' '.join(cmd)}: {text}", cmd)
        return data


# -- parsing: JSON shapes of 22.05 (v0.0.38) up to 26.05 -----------------------------


def _number(value: Any) -> int | None:
    """An integer from either a plain number or the {set, infinite, number} form."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    return int(value)


def _epoch(value: Any) -> datetime | None:
    seconds = _number(value)
    return datetime.fromtimestamp(seconds, timezone.utc) if seconds else None


def _states(value: Any) -> list[str]:
    """Upper-case state words from 'idle', ['IDLE', 'DRAIN'] or 'IDLE+DRAIN'."""
    if isinstance(value, str):
        value = value.split("+")
    return [str(v).upper() for v in value or [] if v]


def _split_state(words: list[str]) -> tuple[str, frozenset[str]]:
    base = next((w for w in words if w in _BASE_STATES), words[0] if words else "UNKNOWN")
    return base, frozenset(w for w in words if w != base)


def _node_from_json(data: dict) -> Node:
    words = _states(data.get("state")) + _states(data.get("state_flags"))
    state, flags = _split_state(words)
    partitions = data.get("partitions") or []
    return Node(
        name=data["name"],
        state=state,
        flags=flags,
        reason=data.get("reason") or "",
        reason_user=data.get("reason_set_by_user") or "",
        reason_time=_epoch(data.get("reason_changed_at")),
        gres=data.get("gres") or "",
        cpus=_number(data.get("cpus")) or 0,
        real_memory=_number(data.get("real_memory")) or 0,
        partitions=tuple(partitions.split(",") if isinstance(partitions, str) else partitions),
        slurmd_start=_epoch(data.get("slurmd_start_time")),
        boot_time=_epoch(data.get("boot_time")),
        gpus_used=_gpus_in(data.get("alloc_tres") or data.get("tres_used") or ""),
        addr=data.get("address") or "",
        port=_number(data.get("port")) or 0,
        version=data.get("version") or data.get("slurmd_version") or "",  # slurmd_version: 22.05
        os=data.get("operating_system") or "",
    )


_TEXT_FIELD = re.compile(r"(?:^|\s)([A-Za-z_]+)=")


#: Slurm's own end of a node's reason, " [user@time]", where the reason ends: at the line's end or before the fields
#: it prints after it where they are set (Comment=, Extra=, ReservationName=)
_REASON_STAMP = re.compile(r" \[[^@\]\s]*@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\](?= [A-Za-z_]+=|$)")


def _fields_from_text(line: str) -> dict[str, str]:
    """key=value pairs of `scontrol -o` output; values may hold spaces. A node's Reason is free text: it is cut off
    before splitting, up to Slurm's [user@time] after it (the first one followed by a field or the end), and what
    Slurm prints after that is split as fields. Only an admin, or a tool with Slurm's operator rights, writes a
    reason."""
    reason = ""
    if " Reason=" in line:
        line, reason = line.split(" Reason=", 1)
        stamp = _REASON_STAMP.search(reason)
        if stamp:
            reason, line = reason[:stamp.end()], line + reason[stamp.end():]
    parts = _TEXT_FIELD.split(line)  # [before the first key, key, value, key, value, ...]: 10,000 lines in 0.1 s
    fields = dict(zip(parts[1::2], map(str.strip, parts[2::2])))
    if reason:
        fields["Reason"] = reason
    return fields


def _node_from_text(line: str) -> Node:
    fields = _fields_from_text(line)
    raw_state = fields.get("State", "UNKNOWN")
    words = _states(raw_state.rstrip("*~#!%$@^-"))
    if raw_state.endswith("*"):
        words.append("NOT_RESPONDING")
    state, flags = _split_state(words)
    reason, user, when = fields.get("Reason", ""), "", None
    suffix = re.search(r"\s*\[([^@\]]*)@([0-9T:-]+)\]$", reason)
    if suffix:
        reason, user, when = reason[: suffix.start()], suffix.group(1), _parse_time(suffix.group(2))
    partitions = fields.get("Partitions", "")
    return Node(
        name=fields["NodeName"],
        state=state,
        flags=flags,
        reason="" if reason == "(null)" else reason,
        reason_user=user,
        reason_time=when,
        gres="" if fields.get("Gres") in (None, "(null)") else fields["Gres"],
        cpus=int(fields.get("CPUTot", "0") or 0),
        real_memory=int(fields.get("RealMemory", "0") or 0),
        partitions=tuple(p for p in partitions.split(",") if p),
        slurmd_start=_parse_time(fields.get("SlurmdStartTime", "")),
        boot_time=_parse_time(fields.get("BootTime", "")),
        gpus_used=_gpus_in(fields.get("AllocTRES", "")),
        addr=fields.get("NodeAddr", ""),
        port=int(port) if (port := fields.get("Port", "")).isdigit() else 0,
        version="" if fields.get("Version") in (None, "(null)", "N/A") else fields["Version"],
        os="" if fields.get("OS") in (None, "(null)", "N/A") else fields["OS"],
    )


def _gpus_in(tres: str) -> int:
    """The GPU count of a TRES list (cpu=4,mem=8G,gres/gpu=2 or gres/gpu:h200=2: the first form counts all)."""
    found = re.search(r"(?:^|,)gres/gpu=(\d+)", tres) if isinstance(tres, str) else None
    return int(found.group(1)) if found else 0


def expand_hostlist(text: str) -> list[str]:
    """Node names of a Slurm host list: "gpu[01-03,07],login1" -> gpu01 gpu02 gpu03 gpu07 login1 (what `scontrol
    show hostnames` prints, without a command per list)."""
    if not text or ("[" not in text and "," not in text):  # one node, as most jobs' lists are
        return [text] if text else []
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        found = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not found:
            names.append(part)
            continue
        head, ranges, tail = found.groups()
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names += [f"{head}{number:0{width}d}{rest}" for rest in expand_hostlist(tail) or [""]]
    return names


#: one node's GPUs of a job: gpu:h200:2(IDX:0-1,3) or gpu:2(IDX:0-1) (`scontrol show job -d`, squeue's gres_detail)
_GPU_DETAIL = re.compile(r"(?:^|,)gpu(?::([^:(,]+))?:\d+\(IDX:([0-9,\-]*)\)")


def gpu_indexes(detail: str) -> tuple[str, tuple[int, ...]]:
    """(type or "gpu", indexes) of one node's GRES detail: "gpu:h200:2(IDX:0-1,3)" -> ("h200", (0, 1, 3)); ("", ())
    when it names no GPU."""
    found = _GPU_DETAIL.search(detail or "")
    if not found:
        return "", ()
    indexes: list[int] = []
    for piece in found.group(2).split(","):
        low, _, high = piece.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            indexes += range(int(low), int(high or low) + 1)
    return found.group(1) or "gpu", tuple(indexes)


@functools.lru_cache(maxsize=4096)
def _gpu_kinds(detail: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(type, indexes) of each GPU type of one node's GRES detail: Slurm joins the types with ","
    ("gpu:a100:1(IDX:0),gpu:h100:1(IDX:1)", src/stepmgr/gres_stepmgr.c), and a type holding no index is left out.

    Remembered: a queue of 20,000 jobs holds a few dozen different details (a third of reading it, uncached)."""
    found = []
    for match in _GPU_DETAIL.finditer(detail or ""):
        kind, indexes = gpu_indexes(match.group(0).lstrip(","))
        if indexes:
            found.append((kind, indexes))
    return tuple(found)


def _job_gpus(nodes: list[str], details: list) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """Each node's GPUs of a job, each type's apart, its GRES details in the order of its node list (as Slurm prints
    both)."""
    return tuple((node, kind, indexes) for node, detail in zip(nodes, details)
                 for kind, indexes in _gpu_kinds(str(detail)))


def _job_state(value: Any) -> str:
    """A job's state word; a job whose Epilog still runs is COMPLETING, as squeue's text says it, whatever base state
    the JSON lists first (["COMPLETED", "COMPLETING"]): it still holds its node."""
    words = _states(value) or ["UNKNOWN"]
    return "COMPLETING" if "COMPLETING" in words else words[0]


def _job_from_squeue_json(data: dict) -> Job:
    resources = data.get("job_resources") if isinstance(data.get("job_resources"), dict) else {}
    # 22.05: job_resources.allocated_nodes[].nodename; 24.05 on: job_resources.nodes.allocation[].name
    placed = resources.get("nodes") if isinstance(resources.get("nodes"), dict) else {}
    allocated = resources.get("allocated_nodes") or placed.get("allocation") or ()
    names = [n.get("nodename") or n.get("name") for n in allocated if isinstance(n, dict)] \
        or expand_hostlist(data.get("nodes") or "")
    return Job(
        job_id=_number(data.get("job_id")) or 0,
        name=data.get("name") or "",
        user=data.get("user_name") or "",
        state=_job_state(data.get("job_state")),
        nodes=data.get("nodes") or "",
        partition=data.get("partition") or "",
        exit_code=_exit_code(data.get("exit_code")),
        start=_epoch(data.get("start_time")),
        end=_epoch(data.get("end_time")),
        gpus=_job_gpus(names, data.get("gres_detail") or []),
    )


def _job_from_sacct_json(data: dict) -> Job:
    state = data.get("state") or {}
    times = data.get("time") or {}
    return Job(
        job_id=_number(data.get("job_id")) or 0,
        name=data.get("name") or "",
        user=data.get("user") or "",
        state=(_states(state.get("current") if isinstance(state, dict) else state) or ["UNKNOWN"])[0],
        nodes=data.get("nodes") or "",
        partition=data.get("partition") or "",
        exit_code=_exit_code(data.get("exit_code")),
        start=_epoch(times.get("start")),
        end=_epoch(times.get("end")),
    )


def _exit_code(value: Any) -> int | None:
    if isinstance(value, dict):
        return _number(value.get("return_code"))
    return _number(value)


def _job_from_squeue_text(line: str) -> Job:
    job_id, name, user, state, nodes, partition, start, end = line.split("|", 7)
    return Job(int(job_id), name, user, state.upper(), nodes, partition, None,
               _parse_time(start), _parse_time(end))


def _job_from_scontrol_text(line: str) -> Job:
    """A job of `scontrol show job -d --oneliner`: its fields, and each "Nodes=... GRES=gpu:h200:2(IDX:0-1)" detail
    (the detail's Nodes= may be a host list: every node of it holds those indexes)."""
    def field_of(key: str) -> str:  # one word each: a job's Reason= sits in the middle of its line
        found = re.search(rf"(?:^|\s){key}=(\S*)", line)
        return found.group(1) if found else ""
    held = []
    for nodes, detail in re.findall(r"\bNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", line):
        held += [(node, kind, indexes) for node in expand_hostlist(nodes) for kind, indexes in _gpu_kinds(detail)]
    job_id = field_of("JobId")
    return Job(int(job_id) if job_id.isdigit() else 0, field_of("JobName"), field_of("UserId").split("(")[0],
               (field_of("JobState") or "UNKNOWN").upper(), field_of("NodeList").replace("(null)", ""),
               field_of("Partition"), None, _parse_time(field_of("StartTime")), _parse_time(field_of("EndTime")),
               tuple(held))


def _job_from_sacct_text(line: str) -> Job:
    job_id, name, user, state, nodes, partition, exit_code, start, end = line.split("|", 8)
    code = exit_code.split(":")[0]
    return Job(int(job_id.split("_")[0].split("+")[0]), name, user,
               state.split()[0].upper() if state else "UNKNOWN", nodes, partition,
               int(code) if code.isdigit() else None, _parse_time(start), _parse_time(end))


_SLURM_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _parse_time(text: str) -> datetime | None:
    """Slurm's local-time timestamps (2026-12-06T09:36:43); 'Unknown', 'None', 'N/A' mean no time. Read by
    fromisoformat, not strptime: three a node, 30,000 in a table of 10,000 nodes, where strptime took 0.15 s."""
    text = text.strip()
    if not _SLURM_TIME.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:  # 2026-13-45T...
        return None

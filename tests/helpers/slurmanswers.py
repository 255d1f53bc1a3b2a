"""Slurm's answers recorded on real daemons, one file per version (tests/data/slurm/<version>.json), and the walk that
both records and replays them.

`walk` makes every call slurm_ext.slurm.SlurmClient makes, in one order, against a cluster prepared as `Facts`
says (two nodes with two GPUs each: one running a job that holds one GPU, one drained by another tool; a job that
completed and one that failed). tests/record_slurm_answers.py runs it on a live cluster through `Recorder`, which
keeps each command line and what it printed; tests/test_slurm_answers.py runs it again through `Replay`, which
answers each command line with what the daemons printed, and holds what the client made of it to the same facts
for every version. A command the client makes that the recording does not have fails the replay: a new call, or a
new form of one, needs a new recording.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_ext import command
from slurm_ext.errors import CommandError, CommandTimeout, NotOurDrain, SlurmError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
#: a job id no cluster of the recordings had
NO_SUCH_JOB = 999999
#: what the walk names: its reservation, its pending job's name
RESERVATION, PENDING_NAME = "slurm-ext-recorded", "slurm-ext-recorded-pending"
#: the PowerAction a 26.05 recording's slurm.conf defines (Program=/bin/true), which the walk's last reboot names
POWER_ACTION = "power-cycle"
#: the drain the walk makes (the client adds the prefix), and the one another tool made before it
OUR_DRAIN, FOREIGN_DRAIN = "recorded: xid 79 gpu 1", "NHC: check_fs_mount /scratch"


@dataclass(frozen=True)
class Facts:
    """The recorded cluster as the recorder prepared it: what the replay holds the client's readings to."""

    cluster: str
    #: its node running `running` (1 of its 2 GPUs), and its node drained by another tool (FOREIGN_DRAIN)
    busy: str
    drained: str
    running: int
    completed: int
    #: exit status 3
    failed: int
    #: `sacctmgr show event` from this moment on (the foreign drain is after it), as the client formats it
    since: str
    gpu_type: str = "h200"


@dataclass
class Recording:
    version: str
    facts: Facts
    #: where and how: the daemons, their configuration (cgroup or not, configless), the date
    recorded_on: str
    calls: list = field(default_factory=list)

    def save(self) -> Path:
        major, minor = self.version.split(".")[:2]
        path = DATA / f"{major}.{minor}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Recording:
        data = json.loads(path.read_text())
        return cls(data["version"], Facts(**data["facts"]), data["recorded_on"], data["calls"])


def _tool_line(argv: list[str]) -> list[str]:
    """The command line as the client wrote it (without [slurm] bin_dir)."""
    return [os.path.basename(argv[0]), *argv[1:]]


class Recorder:
    """A SlurmClient runner that runs each command through `runner` and keeps what it printed."""

    def __init__(self, runner=command.run) -> None:
        self.runner = runner
        self.calls: list[dict] = []

    def __call__(self, argv, timeout, env=None, input=None, check=True):
        call = {"argv": _tool_line(argv), "input": input}
        try:
            result = self.runner(argv, timeout, env=env, input=input, check=check)
        except CommandTimeout:
            self.calls.append({**call, "rc": None, "stdout": "", "stderr": ""})
            raise
        except CommandError as err:  # the runner keeps no standard output of a failed command
            self.calls.append({**call, "rc": err.returncode, "stdout": "", "stderr": err.stderr})
            raise
        self.calls.append({**call, "rc": result.returncode, "stdout": result.stdout, "stderr": result.stderr})
        return result


class Replay:
    """A SlurmClient runner that answers each command line with the recorded one's answer, in the recorded order."""

    def __init__(self, calls: list[dict]) -> None:
        self.calls = list(calls)
        self.at = 0

    def __call__(self, argv, timeout, env=None, input=None, check=True):
        line = _tool_line(argv)
        assert self.at < len(self.calls), f"the client ran {line}, past the recording's end"
        call = self.calls[self.at]
        assert call["argv"] == line and call["input"] == input, \
            f"call {self.at}: the client ran {line}, the recording has {call['argv']}: record again " \
            "(tests/record_slurm_answers.py)"
        self.at += 1
        if call["rc"] is None:
            raise CommandTimeout(line, timeout)
        if call["rc"] != 0 and check:
            raise CommandError(line, call["rc"], call["stderr"])
        return command.CommandResult(tuple(line), call["rc"], call["stdout"], call["stderr"])

    def done(self) -> bool:
        return self.at == len(self.calls)


def _error(call) -> str:
    """What the call raised, by class and words ("" when it returned)."""
    try:
        call()
    except (SlurmError, NotOurDrain) as err:
        return f"{type(err).__name__}: {err}"
    return ""


def walk(client, facts: Facts, script: str = "#!/bin/sh\nsleep 600\n") -> dict:
    """Every call the client makes, in one order; what each gave (the client's own records, and errors by words).

    Changes the cluster on the way back to how it was, but for the reboot asked of the drained node at the end
    and the running job requeued."""
    since = datetime.fromisoformat(facts.since)
    seen: dict = {"version": client.version()}
    seen["nodes"] = client.nodes()
    seen["busy"], seen["drained"] = client.node(facts.busy), client.node(facts.drained)
    seen["no_such_node"] = _error(lambda: client.node("nosuchnode"))
    seen["jobs"], seen["queue"] = client.jobs(), client.queue()
    seen["completed"], seen["failed"] = client.job(facts.completed), client.job(facts.failed)
    seen["no_such_job"] = client.job(NO_SUCH_JOB)
    seen["show_config"], seen["config_values"] = client.show_config(), client.config_values()
    seen["events_drained"] = client.node_events(facts.drained, since)
    seen["events_all"] = client.node_events(None, since)
    seen["dbd_queue"] = client.dbd_queue()
    seen["accounted"] = client.accounted_states([facts.completed, facts.failed, facts.running, NO_SUCH_JOB])
    seen["clusters"], seen["runaway"] = client.clusters(), client.runaway_jobs()
    seen["end_completed"], seen["end_running"] = client.job_end(facts.completed), client.job_end(facts.running)
    seen["end_no_such_job"] = client.job_end(NO_SUCH_JOB)
    # changing: our drain and its resume; another tool's drain, which resume leaves alone
    client.drain(facts.busy, OUR_DRAIN)
    seen["busy_drained"] = client.node(facts.busy)
    seen["resumed"] = client.resume(facts.busy)
    seen["busy_resumed"] = client.node(facts.busy)
    seen["resume_not_drained"] = client.resume(facts.busy)
    seen["resume_foreign"] = _error(lambda: client.resume(facts.drained))
    # a reservation (acceptance's), and deleting it twice
    client.reserve(RESERVATION, [facts.drained], 10, "MAINT,IGNORE_JOBS", "root")
    seen["unreserve"] = client.unreserve(RESERVATION)
    seen["unreserve_again"] = client.unreserve(RESERVATION)
    # a job that cannot start for an hour, named, then cancelled
    pending = client.submit(script, ["--begin=now+1hour", f"--job-name={PENDING_NAME}", "-o", "/dev/null"])
    seen["pending"] = pending
    seen["named"] = client.jobs_named(PENDING_NAME)
    client.cancel([pending])
    seen["end_cancelled"] = client.job_end(pending)
    seen["requeue"] = client.requeue([facts.running])
    client.reboot(facts.drained)
    seen["drained_rebooting"] = client.node(facts.drained)
    # by a PowerAction (26.05; refused before any call on an older Slurm), of the other node: the drained one has a
    # reboot pending already, which Slurm would keep
    seen["reboot_action"] = _error(lambda: client.reboot(facts.busy, POWER_ACTION))
    return seen

"""`slurm-ext accounting reconcile`: every job end a second witness saw, checked against sacct.

The witness is Slurm's jobcomp/filetxt log: slurmctld appends one line per
job at its end, straight to a file (JobCompLoc, on the controller's volume),
not through the DBD agent queue that a slurmctld killed during a database
outage loses. A job in the witness that sacct does not have, or has without
its end, is a lost accounting record; `sacctmgr show runawayjobs` lists the
other kind (jobs the database thinks still run). Either makes the command
exit 1, with an event (reconcile-missing) and the count for the agent's
metric.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator

from slurm_ext import fileio
from slurm_ext.config import Config
from slurm_ext.errors import ConfigError
from slurm_ext.slurm import SlurmClient

from . import slurmconf

__all__ = ["WitnessJob", "ReconcileFindings", "read_witness", "reconcile", "witness_path", "last_result", "RESULT_FILE"]

#: the last reconcile's counts, in node.state_dir: the controller agent exports them as metrics
RESULT_FILE = "accounting-reconcile.json"

#: jobcomp/filetxt's line, as slurmctld writes it: JobId, UserId and GroupId lead it, then Name (the user's text,
#: which may hold anything: "JobId=9", or a whole run of the fields that follow it), then Slurm's run of JobState to
#: ProcCnt, then WorkDir (the user's text again: a directory's name) and Slurm's fields to the end
_HEAD = re.compile(r"^JobId=(\d+) UserId=(\S*) GroupId=\S* Name=")
_RUN = re.compile(r" JobState=([A-Z_]+) Partition=\S* TimeLimit=\S+ StartTime=\S+ EndTime=(\S+) NodeList=\S* "
                  r"NodeCnt=\d+ ProcCnt=\d+ WorkDir=")
#: the longest record read (a job's name and work dir with their newlines): a log in a format of another Slurm,
#: whose lines never hold the run, is not read into memory whole
_LONGEST_RECORD = 16 * 2**20
#: sacct states of a job that has not ended
_UNFINISHED = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED"}


@dataclass(frozen=True, slots=True)
class WitnessJob:
    job_id: int
    state: str
    end: str
    user: str
    #: its line number in the witness
    line: int


@dataclass
class ReconcileFindings:
    witness: Path
    since: datetime | None
    #: jobs the witness saw end
    checked: int = 0
    #: seen ending by the witness, but sacct has no record or no end
    missing: list[WitnessJob] = field(default_factory=list)
    #: `sacctmgr show runawayjobs` lines
    runaway: list[str] = field(default_factory=list)

    def summary(self) -> str:
        span = f" since {self.since.isoformat(timespec='seconds')}" if self.since else ""
        if not self.missing and not self.runaway:
            return f"reconcile: all {self.checked} job ends in {self.witness}{span} are in sacct; no runaway jobs"
        return (f"reconcile: {len(self.missing)} of {self.checked} job ends in {self.witness}{span} are missing from "
                f"sacct; {len(self.runaway)} runaway jobs")

    def as_dict(self) -> dict:
        return {"witness": str(self.witness), "since": self.since.isoformat() if self.since else None,
                "checked": self.checked, "missing": [dataclasses.asdict(j) for j in self.missing], "runaway": self.runaway}


def _record(config: Config, findings: ReconcileFindings) -> None:
    """Keep the counts for the agent's /metrics; a node without its state dir only loses the metric."""
    counts = {"time": time.time(), "checked": findings.checked, "missing": len(findings.missing),
              "runaway": len(findings.runaway)}
    try:
        Path(config.node.state_dir).mkdir(parents=True, exist_ok=True)
        fileio.atomic_write(Path(config.node.state_dir) / RESULT_FILE, json.dumps(counts) + "\n", fsync="file")
    except OSError:
        pass


def last_result(state_dir: str) -> dict | None:
    """The counts of the last `reconcile` on this node (time, checked, missing, runaway), or None."""
    try:
        return json.loads((Path(state_dir) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def witness_path(config: Config) -> Path:
    """accounting.witness, else slurm.conf's JobCompLoc when JobCompType is jobcomp/filetxt.

    Raises:
        ConfigError: no witness is configured.
    """
    if config.accounting.witness:
        return Path(config.accounting.witness)
    conf = config.slurm.conf_path()
    values = slurmconf.read(conf) if conf.exists() else slurmconf.DEFAULTS
    if values["jobcomptype"].lower() == "jobcomp/filetxt" and values["jobcomploc"]:
        return Path(values["jobcomploc"])
    raise ConfigError(conf, "no job-end witness: set JobCompType=jobcomp/filetxt and JobCompLoc=FILE (on the "
                      "controller's persistent volume) in slurm.conf, or accounting.witness")


def read_witness(path: Path, since: datetime | None = None) -> list[WitnessJob]:
    """The jobs of a jobcomp/filetxt log that ended at or after `since` (a requeued job: its last end).

    The window starts at the first line that ended at or after `since`, and every line after it counts, whatever
    its EndTime says: slurmctld appends a line at each job's end, so a line's place in the file is when its job
    ended, and a job whose name forged an earlier EndTime (or a whole line, after a newline) is still checked. (A
    forged line can still pose as ending before `since` when it is the very first job to end after it.)

    Raises:
        OSError: the file cannot be read (the caller names it).
    """
    jobs: dict[int, WitnessJob] = {}
    # the log's times are local and have no offset: compared as text in the same form
    cutoff = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S") if since else ""
    in_window = not cutoff
    with open(path, errors="replace") as lines:
        for number, record in _records(lines):
            head, end = _HEAD.match(record), _end(record)
            if head is None or end is None:
                continue
            state, ended = end
            in_window = in_window or ended >= cutoff
            if not in_window:
                continue
            job_id = int(head.group(1))
            jobs[job_id] = WitnessJob(job_id, state, ended, re.sub(r"\(\d+\)$", "", head.group(2)), number)
    return sorted(jobs.values(), key=lambda j: j.job_id)


def _records(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each job's record: slurmctld writes a job's name and work dir as they are,
    newlines too, so a record whose JobId line has no run of Slurm's fields goes on over the lines after it until
    one has (a name's "\nJobId=9 UserId=..." stays the name's, not a line of job 9's). A line that has a head and a
    run on its own is also a record of its own: a forged head at the end of a work dir must not take the next job's
    line (that job unchecked); checking a forged job too is safe, leaving a real one out is not. Lines of no record
    are left out; so is a record that the file's end cuts (slurmctld still writing it), or one past _LONGEST_RECORD."""
    pending: list[str] = []  # the record's lines so far
    first = size = 0
    for number, line in enumerate(lines, 1):
        whole = bool(_HEAD.match(line)) and _RUN.search(line) is not None  # the run holds no newline
        if pending and size < _LONGEST_RECORD:
            pending.append(line)
            size += len(line)
        elif _HEAD.match(line):
            pending, first, size = [line], number, len(line)
        else:
            pending = []
            continue
        if _RUN.search(line):
            yield first, "".join(pending)
            if whole and first != number:
                yield number, line
            pending = []


def _end(record: str) -> tuple[str, str] | None:
    """(state, end time) of a witness record, from Slurm's run of fields between the job's name and its work dir.

    Both are the user's text, on either side of that run, and either can hold a run of its own: the text cannot say
    which one is Slurm's (a forged run ends at its own WorkDir=, before Slurm's starts, or starts after it). Of
    several, the latest end is taken (with its state): a forged run can only make its job's end later (it is then
    checked in later windows too, and sacct still decides whether it is missing), never earlier.
    """
    runs = [run.groups() for run in _RUN.finditer(record)]
    return max(runs, key=lambda run: run[1]) if runs else None


def reconcile(config: Config, since: datetime | None = None, witness: Path | None = None,
              slurm: SlurmClient | None = None, emit: Callable[..., dict] = lambda *a, **k: {}) -> ReconcileFindings:
    """Compare the witness with sacct (and list runaway jobs).

    Raises:
        ConfigError: no witness configured, or it cannot be read.
        SlurmError: sacct or sacctmgr failed (slurmdbd away: reconcile once it is back).
    """
    path = witness or witness_path(config)
    try:
        seen = read_witness(path, since)
    except OSError as err:
        raise ConfigError(path, f"cannot read the job-end witness: {err.strerror}") from None
    slurm = slurm or SlurmClient(config.slurm)
    recorded = slurm.accounted_states([job.job_id for job in seen])
    findings = ReconcileFindings(path, since, checked=len(seen))
    findings.missing = [job for job in seen if recorded.get(job.job_id, "PENDING") in _UNFINISHED]
    findings.runaway = slurm.runaway_jobs()
    _record(config, findings)
    if findings.missing or findings.runaway:
        shown = " ".join(str(job.job_id) for job in findings.missing[:20])
        emit("reconcile-missing", findings.summary() + (f": jobs {shown}" if shown else "")
             + (" ..." if len(findings.missing) > 20 else ""), missing=len(findings.missing),
             runaway=len(findings.runaway))
    else:
        emit("reconcile-clean", findings.summary(), checked=findings.checked)
    return findings

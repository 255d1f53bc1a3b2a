"""The Slurm client over answers recorded on real daemons of every Slurm release the project supports
(tests/data/slurm/<version>.json, written by tests/record_slurm_answers.py): every call it makes, replayed in the
order the recording made them, and what it made of them held to the facts the recorder set up, the same for every
release. A release whose answers the client reads differently fails here, naming the call."""

from __future__ import annotations

import pytest

from slurm_ext.config import SlurmSection
from slurm_ext.slurm import REASON_PREFIX, SlurmClient

from helpers.slurmanswers import DATA, FOREIGN_DRAIN, NO_SUCH_JOB, OUR_DRAIN, Recording, Replay, walk

RECORDINGS = sorted(DATA.glob("*.json"))
#: the releases the README names as supported, each with its recording (22.05: Debian 12, the host; 24.11: Debian
#: trixie's images; 25.11: Ubuntu 26.04's, which Debian skips; 26.05: Debian sid's)
SUPPORTED = {"22.05", "24.11", "25.11", "26.05"}


def test_every_supported_release_has_a_recording():
    assert {path.stem for path in RECORDINGS} == SUPPORTED


@pytest.fixture(params=RECORDINGS, ids=lambda path: path.stem)
def replayed(request):
    recording = Recording.load(request.param)
    replay = Replay(recording.calls)
    seen = walk(SlurmClient(SlurmSection(), runner=replay, environ={}), recording.facts)
    assert replay.done(), f"the walk left {len(replay.calls) - replay.at} recorded calls unmade: record again"
    return recording, seen


def test_the_version_is_read_once(replayed):
    recording, seen = replayed
    assert seen["version"] == tuple(int(part) for part in recording.version.split(".")[:2])
    assert sum(call["argv"][:2] == ["sinfo", "--version"] for call in recording.calls) == 1


def test_nodes_states_reasons_gres_and_gpus_in_use(replayed):
    recording, seen = replayed
    facts = recording.facts
    assert sorted(n.name for n in seen["nodes"]) == sorted([facts.busy, facts.drained])
    for busy in (seen["busy"], next(n for n in seen["nodes"] if n.name == facts.busy)):
        assert busy.state in ("MIXED", "ALLOCATED") and not busy.drained and busy.responding, busy
        assert busy.gres.startswith(f"gpu:{facts.gpu_type}:2") and busy.gpus_used == 1, busy
        assert busy.version.startswith(recording.version.rsplit(".", 1)[0]), busy.version
        # where its slurmd answers (/readyz on >= 25.11): 22.05's `scontrol show node` text does not say a running
        # node's port
        assert busy.addr and (busy.port > 1024 or recording.version.startswith("22.05") and busy.port == 0), busy
    for drained in (seen["drained"], next(n for n in seen["nodes"] if n.name == facts.drained)):
        assert drained.state == "IDLE" and drained.drained and drained.gpus_used == 0, drained
        assert drained.reason == FOREIGN_DRAIN and not drained.reason_is_ours and drained.reason_user == "root"
        assert drained.reason_time is not None and drained.partitions == ("debug",)
    assert seen["no_such_node"] == "SlurmError: node nosuchnode: not known to slurmctld"


def test_the_queue_holds_only_the_running_job_with_its_gpu(replayed):
    recording, seen = replayed
    facts = recording.facts
    for jobs in (seen["jobs"], seen["queue"]):
        # 22.05's squeue --json lists ended jobs too: the client leaves them out, as every other form does
        assert [j.job_id for j in jobs] == [facts.running], jobs
        assert jobs[0].state == "RUNNING" and jobs[0].nodes == facts.busy and jobs[0].user
    ((node, kind, indexes),) = seen["queue"][0].gpus
    assert node == facts.busy and kind == facts.gpu_type and len(indexes) == 1 and indexes[0] in (0, 1)


def test_accounting_records_and_states(replayed):
    recording, seen = replayed
    facts = recording.facts
    assert (seen["completed"].state, seen["completed"].exit_code) == ("COMPLETED", 0)
    assert (seen["failed"].state, seen["failed"].exit_code) == ("FAILED", 3)
    for job in (seen["completed"], seen["failed"]):
        assert job.nodes == facts.busy and job.partition == "debug" and job.start and job.end and job.finished
    assert seen["no_such_job"] is None
    accounted = seen["accounted"]
    # the running job's start may not have reached slurmdbd yet (22.05's recording: PENDING)
    assert accounted[facts.completed] == "COMPLETED" and accounted[facts.failed] == "FAILED"
    assert accounted[facts.running] in ("PENDING", "RUNNING") and NO_SUCH_JOB not in accounted
    assert seen["clusters"] == [facts.cluster] and seen["runaway"] == [] and seen["dbd_queue"] == 0


def test_the_configuration(replayed):
    recording, seen = replayed
    for config in (seen["show_config"], seen["config_values"]):
        assert config["ClusterName"] == recording.facts.cluster
        assert config["SLURM_VERSION"] == recording.version
        assert config["RebootProgram"] not in ("", "(null)")


def test_slurms_node_events_name_the_other_tools_drain(replayed):
    recording, seen = replayed
    for events in (seen["events_drained"], seen["events_all"]):
        drain = [e for e in events if e.node == recording.facts.drained and e.state == "DRAIN"]
        assert len(drain) == 1, events
        assert drain[0].reason == FOREIGN_DRAIN and drain[0].user == "root" and drain[0].end is None
        assert drain[0].start.isoformat() >= recording.facts.since


def test_scontrols_view_of_ended_and_running_jobs(replayed):
    _, seen = replayed
    assert seen["end_completed"] == ("COMPLETED", 0)
    assert seen["end_running"][0] == "RUNNING" and seen["end_no_such_job"] is None
    assert seen["end_cancelled"][0] == "CANCELLED"


def test_our_drain_is_resumed_and_another_tools_is_left(replayed):
    recording, seen = replayed
    drained = seen["busy_drained"]
    assert drained.drained and drained.reason == f"{REASON_PREFIX} {OUR_DRAIN}" and drained.reason_is_ours
    assert seen["resumed"] is True and not seen["busy_resumed"].drained
    # Slurm marks a node it resumes not responding until its next ping (every release recorded): what reads a node
    # right after a resume must not take that for a dead slurmd (the health check's hold, the repair flow's wait)
    assert "NOT_RESPONDING" in seen["busy_resumed"].flags
    assert seen["resume_not_drained"] is False
    assert seen["resume_foreign"].startswith(f"NotOurDrain: node {recording.facts.drained}: not resuming")


def test_a_reservation_deleted_twice_is_gone_the_second_time(replayed):
    _, seen = replayed
    assert seen["unreserve"] is True and seen["unreserve_again"] is False


def test_a_submitted_job_is_found_by_name_and_cancelled(replayed):
    recording, seen = replayed
    assert seen["pending"] > recording.facts.running
    ((job_id, (state, reason)),) = seen["named"].items()
    assert job_id == seen["pending"] and state == "PENDING" and reason, seen["named"]


def test_a_requeue_and_a_reboot_asked(replayed):
    recording, seen = replayed
    assert seen["requeue"] == ""
    node = seen["drained_rebooting"]
    # asked of an idle drained node: the reboot is asked at once, and the other tool's drain stays; once issued,
    # Slurm adds " : reboot issued" to the reason (24.11's recording read it then: state DOWN, REBOOT_ISSUED)
    assert node.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"} and node.drained, node
    assert node.reason in (FOREIGN_DRAIN, f"{FOREIGN_DRAIN} : reboot issued"), node.reason
    # a reboot by PowerAction (repair.reboot_action): asked of 26.05, refused by name before it, with no call made
    if tuple(int(part) for part in recording.version.split(".")[:2]) >= (26, 5):
        assert seen["reboot_action"] == "", seen["reboot_action"]
        assert any(call["argv"][:3] == ["scontrol", "reboot", "action=power-cycle"] for call in recording.calls)
    else:
        assert seen["reboot_action"].startswith("SlurmTooOld: reboot action 'power-cycle' (a PowerAction) needs "
                                                "Slurm 26.05 or later"), seen["reboot_action"]

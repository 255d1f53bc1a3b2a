"""Job records kept by the Prolog for the Epilog: bad environments and the round trip."""

import pytest

from slurm_ext.prolog_epilog import jobrecord

ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "100", "SLURM_JOB_USER": "alice",
       "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "1,3"}


def test_round_trip_and_cgroups_from_a_fake_tree(tmp_path):
    root = tmp_path / "cgroup"  # a hybrid host: two v1 hierarchies and a v2 one
    for hierarchy in ("freezer", "memory", "unified"):
        (root / hierarchy).mkdir(parents=True)
        (root / hierarchy / "cgroup.procs").write_text("")
    (root / "unified" / "cgroup.controllers").write_text("")
    record = jobrecord.from_environ(ENV, cgroup_root=root, now=1000.0)
    assert (record.job_id, record.uid, record.gid, record.user, record.gpus) == (42, 1000, 100, "alice", (1, 3))
    assert record.cgroups == tuple(str(root / p) for p in (
        "freezer/slurm_n1/uid_1000/job_42", "freezer/slurm/uid_1000/job_42",
        "memory/slurm_n1/uid_1000/job_42", "memory/slurm/uid_1000/job_42",
        "unified/system.slice/n1_slurmstepd.scope/job_42", "unified/system.slice/slurmstepd.scope/job_42"))
    path = jobrecord.write(record, str(tmp_path / "state"))
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert jobrecord.read(42, str(tmp_path / "state")) == record
    jobrecord.remove(42, str(tmp_path / "state"))
    assert jobrecord.read(42, str(tmp_path / "state")) is None


def test_gpus_fall_back_to_cuda_visible_devices(tmp_path):
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "0"}
    del env["SLURM_JOB_GPUS"]
    assert jobrecord.from_environ(env, cgroup_root=tmp_path).gpus == (0,)


@pytest.mark.parametrize("change, words", [
    ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID=None"),
    ({"SLURM_JOB_UID": "alice"}, "SLURM_JOB_UID='alice'"),
    ({"SLURM_JOB_GPUS": "0,x"}, "SLURM_JOB_GPUS='0,x'"),
])
def test_bad_environment_names_the_variable(tmp_path, change, words):
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    with pytest.raises(jobrecord.JobEnvironmentError, match=words.replace("(", r"\(")):
        jobrecord.from_environ(env, cgroup_root=tmp_path)


def test_a_garbled_record_reads_as_none(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "7.json").write_text("{not json")
    assert jobrecord.read(7, str(tmp_path)) is None


def test_the_places_to_look_on_this_host():
    """This machine's hybrid layout: v1 controllers and the cgroup2 mount at unified/."""
    paths = [str(p) for p in jobrecord.cgroup_paths(5, 0, "n1")]
    assert "/sys/fs/cgroup/freezer/slurm_n1/uid_0/job_5" in paths
    assert "/sys/fs/cgroup/unified/system.slice/slurmstepd.scope/job_5" in paths


def test_a_pure_v2_host_has_its_two_scope_names(tmp_path):
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "system.slice").mkdir()
    (tmp_path / "system.slice" / "cgroup.controllers").write_text("")
    assert jobrecord.cgroup_paths(9, 0, "n1", tmp_path) == [tmp_path / "system.slice/n1_slurmstepd.scope/job_9",
                                                            tmp_path / "system.slice/slurmstepd.scope/job_9"]


def _hybrid(root):
    """A fake hybrid cgroup root: freezer and memory (v1), unified (v2), and a file that is no hierarchy."""
    for hierarchy in ("freezer", "memory", "unified"):
        (root / hierarchy).mkdir(parents=True)
        (root / hierarchy / "cgroup.procs").write_text("")
    (root / "unified" / "cgroup.controllers").write_text("")
    (root / "README").write_text("")
    return root


def test_cgroup_places_are_cgroup_paths_as_strings(tmp_path):
    root = _hybrid(tmp_path / "cgroup")
    places = jobrecord.cgroup_places(42, 1000, "n1", root)
    assert places == [str(p) for p in jobrecord.cgroup_paths(42, 1000, "n1", root)]
    assert places == [str(root / p) for p in (
        "freezer/slurm_n1/uid_1000/job_42", "freezer/slurm/uid_1000/job_42",
        "memory/slurm_n1/uid_1000/job_42", "memory/slurm/uid_1000/job_42",
        "unified/system.slice/n1_slurmstepd.scope/job_42", "unified/system.slice/slurmstepd.scope/job_42")]
    assert jobrecord.cgroup_places(42, 1000, "n1", tmp_path / "missing") == []


def test_other_jobs_from_records_and_the_uids_v1_cgroups(tmp_path):
    """Records of the uid (young, or with a cgroup here) and v1 job cgroups of the uid without a record are
    live; an old record of a job that is gone is stale and removed; other uids' records and cgroups,
    temporary files and lock files count for nothing."""
    root, state = _hybrid(tmp_path / "cgroup"), str(tmp_path / "state")
    me = jobrecord.from_environ(ENV, cgroup_root=root, now=10_000.0)
    for job_id, uid, start in ((43, 1000, 9_990.0), (44, 1000, 1_000.0), (45, 1000, 1_000.0), (46, 2000, 9_990.0)):
        jobrecord.write(jobrecord.JobRecord(job_id, uid, uid, "u", "n1", (), start, ()), state)
    jobs = tmp_path / "state" / "jobs"
    (jobs / ".47.json.0123abcd.tmp").write_text("{}")  # an atomic write under way
    (jobs / ".uid-1000.lock").write_text("")
    (root / "memory" / "slurm_n1" / "uid_1000" / "job_44").mkdir(parents=True)  # 44 still runs
    (root / "freezer" / "slurm" / "uid_1000" / "job_48").mkdir(parents=True)  # a job whose record was lost
    (root / "freezer" / "slurm_n1" / "uid_2000" / "job_49").mkdir(parents=True)  # another user's

    assert jobrecord.recorded_jobs(state) == {43, 44, 45, 46}
    live, stale = jobrecord.other_jobs(me, state, now=10_000.0, cgroup_root=root)
    assert (live, stale) == ([43, 44, 48], [45])
    assert jobrecord.read(45, state) is None and jobrecord.read(46, state) is not None


def test_the_first_lock_or_record_makes_the_jobs_directory_root_only(tmp_path):
    locked, written = tmp_path / "locked", tmp_path / "written"
    with jobrecord.uid_lock(str(locked), 1000, timeout=1) as held:
        assert held
    jobrecord.write(jobrecord.from_environ(ENV, cgroup_root=tmp_path), str(written))
    for state in (locked, written):
        assert oct((state / "jobs").stat().st_mode & 0o777) == "0o700"
    assert jobrecord.read(42, str(written)) is not None

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

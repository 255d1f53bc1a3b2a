"""`slurm-ext dev ...`: the real local cluster from nothing, idempotent up, clean down."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from helpers.cli import cli, cli_as_nobody
from slurm_ext import devcluster as dev
from slurm_ext.devcluster import daemons, deps, drills, fakenvml, nodenet
from slurm_ext.devcluster.cluster import demo_script
from slurm_ext.devcluster.layout import Layout
from slurm_ext.errors import DevClusterError
from slurm_ext.procfs import pid_alive


def _tree_mtimes(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for sub in ("etc", "bin", "lib", "dev")
            for p in (root / sub).rglob("*") if p.is_file() or p.is_char_device()}


def _with_workers(pids) -> set[int]:
    """The given PIDs and their descendants (the agents' slurmctld and slurmd)."""
    found = set()
    for pid in pids:
        found.add(pid)
        found.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    return found


def _cgroup_pids(node: str) -> set[int]:
    pids = set()
    for top in dev.job_cgroups(node):
        for procs in top.rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def test_up_from_nothing_is_idempotent_and_down_leaves_nothing(cluster):
    settings = cluster.settings
    root = Path(settings.state_dir)
    dev.down(settings)
    for child in root.iterdir():  # from nothing: an empty state directory
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()

    first = dev.up(settings)
    assert first.node is not None and first.node.idle, first
    assert first.node.gres.startswith("gpu:h200:4"), first.node.gres  # (S:0): Cores= from the fake affinity
    pids = {d.name: d.pid for d in first.daemons if d.pid}
    assert {"supervise-accounting", "supervise-controller", "supervise-worker"} <= set(pids), first.daemons
    everything = _with_workers(pids.values())
    assert len(everything) >= len(pids) + 4, "the agents run mariadbd, slurmdbd, slurmctld and slurmd"
    files = _tree_mtimes(root)
    assert len(files) >= 10

    node = Layout(settings).first
    assert nodenet.lo_up(node.netns), "the node's network namespace, its watched lo up"
    second = dev.up(settings)
    assert {d.name: d.pid for d in second.daemons if d.pid} == pids, "a second up restarted a daemon"
    assert _tree_mtimes(root) == files, "a second up rewrote files"
    assert second.node.idle

    # a job running at `down` must not survive it either
    job_id = cluster.sbatch("--wrap=sleep 300")
    deadline = time.monotonic() + 30
    while not _cgroup_pids(cluster.node) and time.monotonic() < deadline:
        time.sleep(0.2)
    job_pids = _cgroup_pids(cluster.node)
    assert job_pids, f"job {job_id} never showed up in the node's cgroups"

    # drills left in place: down undoes them (a stopped slurmd must go on to stop, the tmpfs must go)
    drills.inject(settings, cluster.node, "fs-full")
    drills.inject(settings, cluster.node, "slurmd-hang")
    stopped = dev.down(settings)
    assert not os.path.ismount(node.drill_fs) and drills.recorded(settings) == {}
    assert not os.path.exists(f"/run/netns/{node.netns}"), "down removes the node's network namespace"
    assert set(pids.values()) <= set(stopped)
    alive = [p for p in sorted(everything | job_pids) if pid_alive(p)]
    assert not alive, f"still alive after down: {alive}"
    assert dev.job_cgroups(cluster.node) == [], "down left the node's job cgroups behind"
    after = dev.status(settings)
    assert not any(d.pid for d in after.daemons if d.name != "munged" or pids.get("munged"))
    assert after.node is None and "not running" in after.problem


def test_sbatch_job_completes_and_reaches_sacct(running_cluster):
    job_id = running_cluster.sbatch("--gres=gpu:1", "--wrap=echo gpus=$CUDA_VISIBLE_DEVICES")
    job = running_cluster.wait_accounted(job_id)
    assert job.state == "COMPLETED" and job.exit_code == 0
    assert job.nodes == running_cluster.node
    output = (running_cluster.layout.out / f"{job_id}.out").read_text()
    assert output.strip() == "gpus=0"


def test_the_prolog_records_the_job_and_the_epilog_forgets_it(running_cluster):
    """The Prolog records the job (GPUs, cgroups) for the Epilog, which removes the record."""
    started = running_cluster.layout.out / "record-job-started"
    started.unlink(missing_ok=True)
    job_id = running_cluster.sbatch("--gres=gpu:2", f"--wrap=touch {started}; sleep 3")
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    record_file = running_cluster.layout.node_state / "jobs" / f"{job_id}.json"
    record = json.loads(record_file.read_text())
    assert (record["job_id"], record["uid"], record["user"]) == (job_id, 0, "root")
    assert record["gpus"] == [0, 1] and record["node"] == running_cluster.node
    assert any(f"slurm_{running_cluster.node}/uid_0/job_{job_id}" in c for c in record["cgroups"]), record
    assert oct(record_file.stat().st_mode & 0o777) == "0o600"
    running_cluster.wait_accounted(job_id)
    deadline = time.monotonic() + 10
    while record_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not record_file.exists(), "the Epilog left the job record behind"
    # the hook service did it: the Python hooks log that they ran without it
    log = (running_cluster.layout.log / "slurm-ext.log").read_text()
    assert f"job {job_id}: prolog done in" not in log and f"job {job_id}: epilog done in" not in log


def test_daemons_and_hooks_see_the_fake_gpus(running_cluster):
    """The same fake NVML is in every daemon's environment (read from /proc)."""
    state = dev.status(running_cluster.settings)
    lib = str(running_cluster.layout.lib)
    processes = [psutil.Process(pid) for pid in _with_workers(d.pid for d in state.daemons if d.pid)]
    seen = set()
    for process in processes:
        if process.name() in ("slurmd", "slurmctld", "slurmdbd"):
            assert process.environ().get("LD_LIBRARY_PATH") == lib, process
            seen.add(process.name())
    assert seen == {"slurmd", "slurmctld", "slurmdbd"}
    wrapper = (running_cluster.layout.bin / "slurm-ext-prolog").read_text()
    assert f"LD_LIBRARY_PATH='{lib}'" in wrapper and "SLURM_EXT_FAKE_NVML=" in wrapper


def test_every_daemon_listens_on_loopback_only(running_cluster):
    pids = _with_workers(d.pid for d in dev.status(running_cluster.settings).daemons if d.pid)
    listening = [(psutil.Process(c.pid).name(), c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                 if c.pid in pids and c.status == psutil.CONN_LISTEN]
    names = {name for name, _, _ in listening}
    assert names >= {"mariadbd", "slurmdbd", "slurmctld", "slurmd", "slurm-ext"}, listening
    assert all(ip == "127.0.0.1" for _, ip, _ in listening), listening


def test_cli_status_and_demo(running_cluster):
    config = str(running_cluster.config_file)
    status = cli("--config", config, "dev", "status")
    assert status.returncode == 0, status.stderr
    assert "supervise-controller  running, pid" in status.stdout
    assert f"node {running_cluster.node}: IDLE gres gpu:h200:4" in status.stdout

    demo = cli("--config", config, "dev", "demo")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "COMPLETED exit code 0" in demo.stdout
    assert "CUDA_VISIBLE_DEVICES=0" in demo.stdout
    assert "NVML in the job sees 1 of the 4 GPUs of the node" in demo.stdout
    assert "NVML gpu 0: NVIDIA H200 GPU-" in demo.stdout  # the job read its GPU through pynvml
    assert "NVML gpu 1" not in demo.stdout, demo.stdout  # and only its GPU: the devices cgroup hides the rest


def test_a_job_sees_in_nvml_only_the_gpus_slurm_gave_it(running_cluster):
    """ConstrainDevices=yes: the job's devices cgroup lets it open only its GPUs' device files,
    and the fake NVML, like the driver, then enumerates only those (dense indexes 0, 1)."""
    out = running_cluster.layout.out / f"nvml-count-{os.getpid()}.out"
    code = ("import pynvml; pynvml.nvmlInit(); "
            "hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]; "
            "print(pynvml.nvmlDeviceGetCount(), *(pynvml.nvmlDeviceGetMinorNumber(h) for h in hs))")
    job_id = running_cluster.sbatch("--gres=gpu:2", f"--output={out}", f"--wrap={sys.executable} -c '{code}'")
    job = running_cluster.wait_accounted(job_id)
    text = out.read_text()
    out.unlink()
    assert job.state == "COMPLETED" and job.exit_code == 0, (job, text)
    count, *minors = text.split()
    assert count == "2", text
    assert sorted(map(int, minors)) == [0, 1], text  # the GPUs Slurm gave it (CUDA_VISIBLE_DEVICES=0,1)


def test_the_demo_job_script_prints_the_gpus_nvml_shows_it(tmp_path):
    """demo_script under bash, against the fake with a dev dir that holds only the node of
    the GPU with minor 2 (as a job's devices cgroup leaves it only its GPU)."""
    if os.geteuid() != 0:
        pytest.skip("mknod of the GPU device files needs root")
    lib = fakenvml.build(tmp_path / "lib")
    spec = fakenvml.default_gpus(4)
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    (tmp_path / "dev").mkdir()
    fakenvml.make_device(tmp_path / "dev" / "nvidia2", 2)
    env = {**os.environ, **fakenvml.environ(lib.parent, tmp_path / "gpus.json", dev_dir=tmp_path / "dev"),
           "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": "0"}
    run = subprocess.run(["bash", "-c", demo_script(4)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "job 7 on n1: CUDA_VISIBLE_DEVICES=0",
        "NVML in the job sees 1 of the 4 GPUs of the node (its devices cgroup hides the others):",
        f"NVML gpu 0: NVIDIA H200 {spec['gpus'][2]['uuid']} nvidia2",
    ]


def _free_ports(count: int) -> list[int]:
    """`count` ports of 127.0.0.1 that nothing listens on now (the kernel's choice, all held until all are had)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def test_a_taken_port_is_a_clear_error_before_anything_starts(cluster, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        state_dir = tmp_path / "other"
        state_dir.mkdir()
        state_dir.chmod(0o755)
        tmp_path.chmod(0o755)
        # the accounting agent's ports (checked first) free now: fixed ones met the container cluster's MariaDB
        # (23307) and slurmdbd (26819), started by the suite's other half at the same time
        dbd, mariadb, probe = _free_ports(3)
        other = replace(cluster.settings, state_dir=str(state_dir), node_name="portnode",
                        slurmctld_port=port, slurmd_port=port + 1 if port < 65535 else port - 1,
                        slurmdbd_port=dbd, mariadb_port=mariadb, accounting_probe_port=probe)
        with pytest.raises(DevClusterError, match=f"supervise-controller: port {port} on 127.0.0.1 is taken"):
            dev.up(other)
        assert not any(d.pid for d in dev.status(other).daemons if d.name != "munged")


def test_a_missing_package_names_the_install_command(cluster, monkeypatch):
    monkeypatch.setattr(deps, "PACKAGES", deps.PACKAGES + ("slurm-ext-no-such-package",))
    with pytest.raises(DevClusterError) as caught:
        dev.up(cluster.settings)
    message = str(caught.value)
    assert "missing Debian packages: slurm-ext-no-such-package" in message
    assert "apt-get install -y slurm-ext-no-such-package" in message


def test_not_root_is_a_clear_error(cluster):
    code, stderr = cli_as_nobody("--config", str(cluster.config_file), "dev", "up")
    assert code == 1, stderr
    assert "dev up must run as root" in stderr and "Traceback" not in stderr


def test_stale_pidfile_with_a_reused_pid_is_not_signalled(cluster, tmp_path):
    """A pidfile naming a live process that is not the daemon is ignored, never killed."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        fake = daemons.Daemon("slurmd", ("slurmd",), tmp_path / "slurmd.pid", frozenset({"slurmd"}),
                              tmp_path / "slurmd.out")
        fake.pidfile.write_text(f"{bystander.pid}\n")
        assert daemons.running_pid(fake) is None
        assert daemons.stop(fake) is None
        assert bystander.poll() is None, "a process that is not slurmd was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_several_nodes_get_their_own_names_ports_files_and_one_hook_dispatcher(tmp_path):
    from slurm_ext.devcluster import render
    from slurm_ext.devcluster.layout import Layout, node_names
    from slurm_ext.devcluster.settings import DevSection
    settings = DevSection(state_dir=str(tmp_path), node_name="gpu01", nodes=3, defined_nodes=5, node_port_base=20000)
    layout = Layout(settings)
    assert node_names(settings) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert [n.name for n in layout.nodes] == ["gpu01", "gpu02", "gpu03"]
    second = layout.node("gpu02")
    assert (second.slurmd_port, second.probe_port, second.agent) == (20002, 20003, "supervise-worker-gpu02")
    assert second.slurm_conf == tmp_path / "nodes" / "gpu02" / "etc" / "slurm.conf"
    assert layout.first.gpu_spec == tmp_path / "gpus.json" and second.gpu_spec != layout.first.gpu_spec
    topology = render.Topology(cpus=2, boards=1, sockets_per_board=1, cores_per_socket=2, threads_per_core=1,
                               real_memory=4000)
    conf = render.slurm_conf(layout, topology, str(layout.node_hook))
    lines = [line for line in conf.splitlines() if line.startswith("NodeName=gpu")]
    # the nodes that never run in one ranged line, as a real cluster's slurm.conf names them (Slurm parses it for
    # every command), on one port where no slurmd listens
    assert [line.split()[0] for line in lines] == ["NodeName=gpu01", "NodeName=gpu02", "NodeName=gpu03",
                                                   "NodeName=gpu[04-05]"]
    assert lines[0].endswith("Port=6818") and lines[1].endswith("Port=20002") and lines[3].endswith("Port=20006")
    assert render.host_ranges(["gpu8", "gpu9", "gpu10", "gpu11", "gpu13", "login"]) == \
        ["gpu[8-9]", "gpu[10-11]", "gpu13", "login"]
    assert "SlurmdSpoolDir=" in conf and "/state/d/%n" in conf and f"RebootProgram={layout.reboot_program}" in conf
    toml = render.slurm_ext_toml(layout, second)
    assert 'name = "gpu02"' in toml and f"worker = {second.probe_port}" in toml
    assert f'gpu02 = "127.0.0.1:{second.probe_port}"' in toml  # the controller's repair service finds its agent
    hook = render.node_hook(layout, {"gpu01": "/a/hook", "gpu02": "/b/hook"})
    assert "gpu02) exec '/b/hook'" in hook and "is not one of the dev cluster's" in hook
    reboot = render.reboot_program(layout, "/usr/bin/slurm-ext")
    assert f"'{second.slurm_ext_conf}') node=gpu02" in reboot and "setsid -f" in reboot


def test_a_second_cluster_on_the_host_leaves_the_first_ones_daemons_alone(running_cluster):
    """Every daemon of one cluster keeps its own pidfile: a slurmdbd stops whatever PID its PidFile names at its
    start, and Slurm's default one is shared by every slurmdbd on the host."""
    def workers(settings):
        state = dev.status(settings)
        return {p.name(): p.pid for p in map(psutil.Process, _with_workers(d.pid for d in state.daemons if d.pid))
                if p.name() in ("mariadbd", "slurmdbd", "slurmctld", "slurmd")}
    before = workers(running_cluster.settings)
    assert set(before) == {"mariadbd", "slurmdbd", "slurmctld", "slurmd"}, before
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-second-")
    os.chmod(state_dir, 0o755)
    second = replace(running_cluster.settings, state_dir=state_dir, cluster_name="slurmextsecond",
                     node_name="secondnode1", slurmctld_port=27917, slurmd_port=27918, slurmdbd_port=27919,
                     mariadb_port=23407, controller_probe_port=27911, worker_probe_port=27910,
                     accounting_probe_port=27912, web_port=27913, gpu_count=0, kernel_log="")
    try:
        dev.up(second)
        theirs = workers(second)
        assert set(theirs) == set(before) and not set(theirs.values()) & set(before.values()), theirs
        time.sleep(3)  # a slurmdbd told to stop is gone by now
        assert workers(running_cluster.settings) == before
        for settings in (running_cluster.settings, second):  # both databases answer
            dev.client(settings).node_events(settings.node_name, datetime.now(timezone.utc) - timedelta(hours=1))
    finally:
        dev.down(second)
        shutil.rmtree(state_dir, ignore_errors=True)
    assert workers(running_cluster.settings) == before

"""slurm-ext's images as a Slurm cluster in a real Docker engine: Slurm 26.05 (Debian sid) inside, the agent
as PID 1 of every container, workers that join as Slinky's NodeSet pods do (containers/cluster.py, what
`python3 containers/cluster.py up` runs for users).

Everything runs twice, once per way users run workers: Slurm's cgroup/v1 plugins, and
CgroupPlugin=disabled with proctrack/linuxproc (cgroup/v2 cannot run on this host).
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from helpers.wait import wait_for
from slurm_ext.slurm import READYZ_SINCE, version_tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))
from cluster import MODES, ContainerCluster, Worker  # noqa: E402 (containers/cluster.py, not a package)

pytestmark = pytest.mark.containers

_JOB = """#!/bin/sh
echo "gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES node=$SLURMD_NODENAME"
LD_LIBRARY_PATH=/usr/local/lib/slurm-ext-fakenvml SLURM_EXT_FAKE_NVML=/etc/slurm-ext/gpus.json \\
SLURM_EXT_FAKE_NVML_DEV_DIR=/dev /opt/slurm-ext/bin/python -c \\
    'import pynvml; pynvml.nvmlInit(); print("nvml", pynvml.nvmlDeviceGetCount())'
# a daemon that escapes the job: its own session, its parent gone (re-parented to the agent, PID 1)
setsid sh -c 'sleep 1000 & echo $! > /tmp/daemon-'$SLURM_JOB_ID
"""


#: the workers' agents look at their node's readiness every 5 s once ready (30 s by default): a slurmd that stops
#: answering is seen within seconds
WORKER_CONF = '[supervisor]\nready_interval = "5s"\n'


@pytest.fixture(scope="module", params=MODES)
def ccluster(engine, images, request):
    cluster = ContainerCluster(engine.client, images, request.param, worker_conf=WORKER_CONF)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _slurmd_pid(cluster: ContainerCluster, worker: Worker) -> int | None:
    """The live slurmd whose parent is PID 1, the agent (after a reconfigure the process is named slurmd-wlm,
    but its arguments stay)."""
    _, text = cluster.exec(f"n{worker.index}", "ps", "-eo", "pid=,ppid=,stat=,args=")
    for line in text.splitlines():
        pid, ppid, state, args = line.split(None, 3)
        if ppid == "1" and args.startswith("slurmd ") and not state.startswith("Z"):
            return int(pid)
    return None


def _worker_name(worker: Worker) -> str:
    return f"n{worker.index}"


def test_workers_register_as_dynamic_nodes_with_their_gpus_from_nvml(ccluster):
    """How fast a container's node registers is bench_containers' figure (start -> idle); here, that it did, with
    its GPUs, and without slurmd's barrier wait."""
    for worker in ccluster.workers.values():
        node = ccluster.node(worker.node)
        assert "DYNAMIC_NORM" in node["state"], node["state"]
        assert node["gres"] == f"gpu:h200:{worker.gpus}", node["gres"]
        # the GPUs' File= and Links= from NVML reach slurmd: what it parses from the config it fetched (the
        # controller's gres.conf, `Include /etc/slurm-local/gres.conf`, resolved on the node), read as
        # slurm-ext's own check reads it: a copy with the node declared and no auth or credential plugin
        # (with the cluster's, slurmd -G disturbs the running slurmd: jobs never complete on 24.11)
        _, layout = ccluster.exec(_worker_name(worker), "sh", "-c", "rm -rf /tmp/g && mkdir /tmp/g && "
                                  "cp /run/slurm/conf/* /tmp/g/ && grep -v -E '^(AuthType|CredType)' "
                                  "/run/slurm/conf/slurm.conf > /tmp/g/slurm.conf && printf 'AuthType=auth/none\\n"
                                  f"CredType=cred/none\\nNodeName={worker.node} Gres={node['gres']}\\n' >> "
                                  f"/tmp/g/slurm.conf && slurmd -G -N {worker.node} -f /tmp/g/slurm.conf 2>&1",
                                  check=False)
        files = [line.split("File=")[1].split()[0] for line in layout.splitlines() if "Gres Name=gpu" in line]
        assert files == [f"/dev/nvidia{m}" for m in range(worker.gpus)], layout
        if worker.gpus > 1:
            assert "Links=-1,1" in layout, layout
        log = ccluster.logs(_worker_name(worker))
        assert "--systemd" in log and "notify slurmd: READY=1" in log
        # no barrier wait: the agent closed the descriptor slurmd passed with BARRIER=1
        assert "poll timed out" not in log, log[-3000:]
        registered = worker.registered - worker.started
        print(f"{ccluster.mode}: {worker.node} registered {registered:.2f}s after its container started")


def test_jobs_see_only_their_gpus_and_the_epilog_kills_an_escaped_daemon(ccluster):
    ccluster.put("controller", "/tmp/job.sh", _JOB)
    jobs = {w.node: ccluster.sbatch("-w", w.node, "--gres=gpu:1", "-o", "/tmp/out-%j.txt", "/tmp/job.sh")
            for w in ccluster.workers.values()}
    for node, job_id in jobs.items():
        worker = ccluster.workers[node]
        ccluster.wait_job(job_id)
        _, out = ccluster.exec(_worker_name(worker), "cat", f"/tmp/out-{job_id}.txt")
        fields = dict(word.split("=", 1) for word in out.split("\n")[0].split())
        assert fields["gpus"].isdigit() and fields["cuda"].isdigit() and fields["node"] == node, out
        seen = int(out.split("nvml ")[1].split()[0])
        if ccluster.mode == "cgroup-v1":  # ConstrainDevices: NVML in the job opens only the job's GPU
            assert seen == 1, out
        else:  # no cgroups, no device isolation: CUDA_VISIBLE_DEVICES is all that keeps a job to its GPU
            assert seen == worker.gpus, out
        _, pid = ccluster.exec(_worker_name(worker), "cat", f"/tmp/daemon-{job_id}")

        def daemon_alive() -> bool:
            code, stat = ccluster.exec(_worker_name(worker), "cat", f"/proc/{pid.strip()}/stat", check=False)
            return code == 0 and stat.rsplit(") ", 1)[1].split()[0] != "Z"
        wait_for(f"{node}: job {job_id}'s escaped daemon gone", lambda: not daemon_alive(), timeout=30,
                 interval=0.1)
        if ccluster.mode == "linuxproc":  # Slurm cannot see it: only slurm-ext's Epilog could have killed it
            cleaned = [e for e in ccluster.events(_worker_name(worker), "leftovers-cleaned")
                       if str(e.get("job")) == str(job_id)]
            assert cleaned, ccluster.events(_worker_name(worker))[-10:]
    # the accounting pair (slurmdbd, MariaDB on its volume) has every job, once slurmctld has sent the
    # records (after the job ends, not with it)
    def accounted() -> bool:
        _, listed = ccluster.exec("controller", "sacct", "-X", "-n", "-a", "-P", "-o", "jobid,state")
        states = dict(line.split("|") for line in listed.split())
        return all(states.get(str(job_id)) == "COMPLETED" for job_id in jobs.values())
    wait_for("every job COMPLETED in sacct", accounted, timeout=30, interval=0.5)


_ASK_AS_NOBODY = """import json, sys, urllib.error, urllib.request
found = []
for method, url in json.loads(sys.argv[1]):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"" if method == "POST" else None,
                                                           method=method), timeout=5) as answer:
            found.append(answer.status)
    except urllib.error.HTTPError as err:
        found.append(err.code)
print(json.dumps(found))
"""


def test_the_agents_answer_only_the_cluster_credential_and_history_reads_them_with_it(ccluster):
    """Issue 27 in the images: a job's user (nobody, in the worker's container) gets 401 from its agent's journal,
    health and check; the controller's `slurm-ext history` (Slurm 26.05) and the page's client read every worker's
    agent with the credential; a forged answer is not believed."""
    import json
    from slurm_ext.agentapi import AgentAnswerError, AgentClient
    worker = next(iter(ccluster.workers.values()))
    base = f"http://127.0.0.1:{worker.agent_port}"
    asked = [["GET", f"{base}/events?since=0"], ["GET", f"{base}/health"], ["POST", f"{base}/health/check"],
             ["GET", f"{base}/livez"]]
    _, said = ccluster.exec(_worker_name(worker), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "/opt/slurm-ext/bin/python", "-c", _ASK_AS_NOBODY, json.dumps(asked))
    assert json.loads(said.strip().splitlines()[-1]) == [401, 401, 401, 200], said

    def collected():  # the controller's collector takes every worker's journal within its interval
        _, text = ccluster.exec("controller", "slurm-ext", "history", "--json", "--since", "1h")
        timeline = json.loads(text)
        seen = {e["node"] for e in timeline["entries"] if e["source"] == "agent"}
        return timeline if seen >= set(ccluster.workers) else None
    timeline = wait_for("every worker's journal in the controller's history", collected, 60, interval=1.0)
    assert timeline["unreachable"] == {}, timeline["unreachable"]
    client = AgentClient(str(ccluster.root / "agent-credential"), 0,
                         {w.node: f"127.0.0.1:{w.agent_port}" for w in ccluster.workers.values()}, 10.0)
    for node in ccluster.workers:
        assert client.health(node).node == node
    # a request for another node is refused by the agent it reached (the proof names the node meant)
    with pytest.raises(AgentAnswerError, match="request refused: GET /health: it was meant for node 'cxn9'"):
        AgentClient(client.credential.path, 0, {"cxn9": client.address(worker.node)}).health("cxn9")


def test_the_accounting_pair_recreated_on_its_volume_keeps_the_history(ccluster):
    """MariaDB's and slurmdbd's containers removed and made anew on the same Docker volume: every job is
    still in sacct, and the storage guard found the volume it had marked (no first initialisation)."""
    job_id = ccluster.sbatch("-o", "/dev/null", "--wrap", "true")

    def listed() -> dict[str, str]:
        code, text = ccluster.exec("controller", "sacct", "-X", "-n", "-a", "-P", "-o", "jobid,state", check=False)
        return dict(line.split("|") for line in text.split()) if code == 0 else {}
    wait_for(f"job {job_id} COMPLETED in sacct", lambda: listed().get(str(job_id)) == "COMPLETED", timeout=60,
             interval=0.5)
    before = listed()
    for name in ("accounting", "mariadb"):
        ccluster.remove(name)
    ccluster.start_accounting()
    wait_for("sacct answering again with the same history", lambda: listed() == before, timeout=90, interval=1.0)
    checked = [e["message"] for e in ccluster.events("mariadb", "storage-checked")]
    assert any(": OK (" in note for note in checked), checked
    assert not any("first initialisation" in note for note in checked), checked


def test_slurmd_killed_in_a_worker_comes_back_in_the_same_container_and_its_job_completes(ccluster):
    worker = ccluster.workers[min(ccluster.workers)]
    job_id = ccluster.sbatch("-w", worker.node, "-o", "/dev/null", "--wrap", "sleep 6")
    ccluster.wait_job(job_id, ("RUNNING",))
    before = _slurmd_pid(ccluster, worker)
    restarts = ccluster.metric(worker, "slurm_ext_supervisor_restarts_total", worker="slurmd")
    started_at = worker.container.attrs["State"]["StartedAt"]
    killed = time.monotonic()
    ccluster.exec(_worker_name(worker), "kill", "-9", str(before))
    after = wait_for("a new slurmd", lambda: (pid := _slurmd_pid(ccluster, worker)) not in (None, before) and pid,
                     timeout=10, interval=0.05)
    wait_for(f"{worker.node} answering again", lambda: "NOT_RESPONDING" not in ccluster.state(worker.node)
             and ccluster.state(worker.node) & {"ALLOCATED", "MIXED", "IDLE"}, timeout=30, interval=0.1)
    print(f"{ccluster.mode}: slurmd kill -9 -> pid {after} answering in {time.monotonic() - killed:.2f}s")
    worker.container.reload()
    assert worker.container.status == "running" and worker.container.attrs["RestartCount"] == 0
    assert worker.container.attrs["State"]["StartedAt"] == started_at  # the same container, not a new one
    assert ccluster.metric(worker, "slurm_ext_supervisor_restarts_total", worker="slurmd") == restarts + 1
    ccluster.wait_job(job_id)
    ccluster.wait_idle(worker.node)


def test_a_stopped_slurmd_makes_its_agent_unready_by_slurmds_own_readyz_before_slurmctld_notices(ccluster):
    """Slurm >= 25.11: slurmd answers GET /readyz on its port, and the agent's readiness asks it. A slurmd stopped
    (SIGSTOP) is still responding to slurmctld until SlurmdTimeout; the agent is unready at its next look
    (supervisor.ready_interval: WORKER_CONF's 5 s), naming slurmd's /readyz, and ready again once slurmd runs. Before 25.11 (trixie's
    24.11) there is no /readyz to ask: the agent is unready only because Slurm's commands, whose credentials a
    configless node's slurmd gives (auth/slurm's sack socket), stop answering."""
    worker = ccluster.workers[min(ccluster.workers)]
    slurmd = _slurmd_pid(ccluster, worker)
    readyz = version_tuple(ccluster.node(worker.node)["version"]) >= READYZ_SINCE
    assert _readyz(worker) == (200, "ready")
    ccluster.exec(_worker_name(worker), "kill", "-STOP", str(slurmd))
    try:
        status, why = wait_for("the agent unready", lambda: (got := _readyz(worker))[0] == 503 and got, timeout=30,
                               interval=0.2)
        if readyz:
            assert f"slurmd's /readyz on port {ccluster.ports.slurmd + worker.index} did not answer" in why, why
        else:
            assert "/readyz" not in why and "no answer within" in why, why
        assert "NOT_RESPONDING" not in ccluster.state(worker.node)  # slurmctld has not noticed yet
    finally:
        ccluster.exec(_worker_name(worker), "kill", "-CONT", str(slurmd))
    wait_for("the agent ready again", lambda: _readyz(worker) == (200, "ready"), timeout=15, interval=0.2)


def _readyz(worker: Worker) -> tuple[int, str]:
    """The worker's agent's /readyz: (status, its text)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.agent_port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


def test_reconfigure_every_slurmd_re_execs_and_the_agents_follow(ccluster):
    workers = list(ccluster.workers.values())
    before = {w.node: _slurmd_pid(ccluster, w) for w in workers}
    restarts = {w.node: ccluster.metric(w, "slurm_ext_supervisor_restarts_total", worker="slurmd") for w in workers}
    ccluster.exec("controller", "scontrol", "reconfigure")
    for worker in workers:
        new = wait_for(f"{worker.node}: slurmd re-exec'd", lambda: (p := _slurmd_pid(ccluster, worker))
                       not in (None, before[worker.node]) and p, timeout=15, interval=0.05)
        followed = [e for e in ccluster.events(_worker_name(worker), "mainpid") if e.get("pid") == new]
        assert followed, ccluster.logs(_worker_name(worker))[-2000:]
    time.sleep(1.0)
    for worker in workers:
        worker.container.reload()
        assert worker.container.status == "running"
        assert ccluster.metric(worker, "slurm_ext_supervisor_restarts_total", worker="slurmd") == restarts[worker.node]
        ccluster.wait_idle(worker.node)


def test_a_worker_recreated_with_a_gpu_fewer_is_drained_naming_it_and_cleared_with_it_back(ccluster):
    worker = ccluster.workers[min(ccluster.workers)]
    assert worker.gpus == 2
    ccluster.remove(_worker_name(worker))
    fewer = ccluster.start_worker(worker.index, 1)
    missing = "GPU-fa4e0001-0000-4000-8000-000000000001"

    def drained() -> str | None:
        node = ccluster.node(fewer.node)
        return node.get("reason") if "DRAIN" in node.get("state", ()) and missing in node.get("reason", "") \
            else None
    reason = wait_for(f"{fewer.node} drained for the missing GPU", drained, timeout=45, interval=0.2)
    assert reason.startswith("slurm-ext: gpu missing: "), reason
    ccluster.remove(_worker_name(fewer))
    back = ccluster.start_worker(worker.index, 2)
    ccluster.wait_idle(back.node, timeout=45)
    assert ccluster.node(back.node)["gres"] == "gpu:h200:2"


def test_docker_stop_drains_the_node_before_slurmd_stops_and_a_new_container_clears_it(ccluster):
    worker = ccluster.workers[max(ccluster.workers)]
    job_id = ccluster.sbatch("-w", worker.node, "-o", "/dev/null", "--wrap", "sleep 300")
    ccluster.wait_job(job_id, ("RUNNING",))
    stopped: dict = {}

    def stop():
        started = time.monotonic()
        worker.container.stop(timeout=60)
        stopped["took"] = time.monotonic() - started
    stopper = threading.Thread(target=stop)
    asked = time.monotonic()
    stopper.start()
    reason = wait_for("the stop drain", lambda: (r := ccluster.node(worker.node).get("reason", ""))
                      .startswith("slurm-ext: node agent stopping") and r, timeout=10, interval=0.05)
    drained_in = time.monotonic() - asked
    stopper.join(90)
    print(f"{ccluster.mode}: docker stop -> drained in {drained_in:.2f}s, container stopped in {stopped['took']:.2f}s")
    assert reason == "slurm-ext: node agent stopping: SIGTERM"
    # the agent stops slurmd once Slurm shows its stop drain, or says it gave up waiting (5 s): it did not give up
    log = ccluster.logs(_worker_name(worker))
    assert "supervisor: stop: " in log and ": stop-drain-late: " not in log, log[-3000:]
    worker.container.reload()
    assert worker.container.attrs["State"]["ExitCode"] == 0, ccluster.logs(_worker_name(worker))[-2000:]
    assert stopped["took"] < 30  # slurmd's and the hook service's stop grace, well inside docker's
    ccluster.exec("controller", "scancel", str(job_id))
    ccluster.remove(_worker_name(worker))
    new = ccluster.start_worker(worker.index, worker.gpus)
    ccluster.wait_idle(worker.node, timeout=45)
    # by the new container's agent (the journal is on the node's volume, kept across containers)
    resumed = [e for e in ccluster.events(_worker_name(worker), "resume") if e.get("why") == "stale"
               and datetime.strptime(e["time"], "%Y-%m-%dT%H:%M:%S%z").timestamp() >= int(new.started)]
    assert resumed, ccluster.events(_worker_name(worker))[-10:]


# -- bad input: a clear word of what is missing and what provides it, an event, the agent alive and retrying --

def _alive_and_retrying(cluster: ContainerCluster, worker: Worker) -> None:
    time.sleep(2.0)
    worker.container.reload()
    assert worker.container.status == "running", cluster.logs(_worker_name(worker))[-2000:]
    assert worker.container.attrs["RestartCount"] == 0
    assert cluster.live(worker)


def _event(cluster: ContainerCluster, worker: Worker, event: str, text: str) -> dict:
    return wait_for(f"{worker.node}: a {event} event saying {text!r}", lambda: next(
        (e for e in cluster.events(_worker_name(worker), event) if text in e["message"]), None), timeout=30,
        interval=0.2)


def test_a_worker_without_the_slurm_key_says_which_mount_provides_it(ccluster):
    worker = ccluster.start_worker(3, 1, key=False)
    found = _event(ccluster, worker, "preflight-problem", "/etc/slurm/slurm.key is missing")
    assert "slurmKeyRef" in found["message"] and "-v KEY:/etc/slurm/slurm.key:ro" in found["message"]
    assert "slurmKeyRef" in ccluster.logs(_worker_name(worker))  # on stderr too, beside slurmd's own fatal
    _alive_and_retrying(ccluster, worker)
    ccluster.remove(_worker_name(worker))


def test_arguments_slurmd_rejects_are_a_crash_loop_with_slurmds_word_and_the_agent_lives(ccluster):
    worker = ccluster.start_worker(4, 1, extra_args=("--no-such-option",))
    _event(ccluster, worker, "crash-loop", "worker slurmd is crash-looping")
    assert "--no-such-option" in ccluster.logs(_worker_name(worker))  # slurmd's own usage message
    _alive_and_retrying(ccluster, worker)
    ccluster.remove(_worker_name(worker))


def test_a_worker_without_its_gpu_devices_or_sys_admin_names_the_flags(ccluster):
    # NVML lists the GPU (the driver does, whatever the container's /dev holds) but its device file is absent
    worker = ccluster.start_worker(5, 1, devices=False, environment={"SLURM_EXT_FAKE_NVML_DEV_DIR": None},
                                   cap_add=[])
    _event(ccluster, worker, "inventory-problem", "--device /dev/nvidia0")
    _event(ccluster, worker, "cgroup-failed", "--cap-add SYS_ADMIN")
    _alive_and_retrying(ccluster, worker)
    ccluster.remove(_worker_name(worker))


def test_a_worker_started_before_its_controller_answers_joins_once_it_does(ccluster):
    controller = ccluster.containers["controller"]
    controller.stop(timeout=30)
    try:
        worker = ccluster.start_worker(6, 1)
        _alive_and_retrying(ccluster, worker)
    finally:
        controller.start()
    ccluster.wait_idle(worker.node, timeout=60)
    ccluster.remove(_worker_name(worker))


"""The Slurm client against the real cluster (JSON and text paths), plus parsing of other versions' shapes."""

import time
from datetime import datetime, timedelta, timezone

import pytest

from slurm_ext import command, devcluster as dev
from slurm_ext.config import SlurmSection
from slurm_ext.devcluster import cluster as dev_cluster, daemons
from slurm_ext.devcluster.layout import Layout
from slurm_ext.errors import NotOurDrain, SlurmError, SlurmUnreachable
from slurm_ext.slurm import REASON_PREFIX, Node, SlurmClient, _job_from_sacct_json, _node_from_json, _node_from_text

MODES = ["auto", "never"]  # auto reads --json on this Slurm; never parses plain text


def _daemon(cluster, name):
    return next(d for d in dev_cluster.cluster_daemons(Layout(cluster.settings)) if d.name == name)


@pytest.mark.parametrize("json", MODES)
def test_node_record(running_cluster, json):
    node = running_cluster.client(json=json).node(running_cluster.node)
    assert node.name == running_cluster.node
    assert node.state == "IDLE" and node.flags == frozenset() and node.idle and node.responding
    assert node.gres.startswith("gpu:h200:4"), node.gres  # then "(S:0)": the sockets of the GPUs' Cores=
    assert node.cpus >= 1 and node.real_memory > 0
    assert node.partitions == ("debug",)
    assert [n.name for n in running_cluster.client(json=json).nodes()] == [running_cluster.node]


def test_unknown_node_is_a_slurm_error(running_cluster):
    for json in MODES:
        with pytest.raises(SlurmError, match="nosuchnode: not known"):
            running_cluster.client(json=json).node("nosuchnode")


@pytest.mark.parametrize("json", MODES)
def test_drain_carries_the_prefix_and_resume_clears_our_own(running_cluster, json):
    slurm = running_cluster.client(json=json)
    node = running_cluster.node
    slurm.drain(node, f"test drain {json}")
    drained = slurm.node(node)
    assert drained.drained and drained.reason == f"{REASON_PREFIX} test drain {json}"
    assert drained.reason_is_ours and drained.reason_user == "root"
    assert slurm.resume(node) is True
    assert not slurm.node(node).drained
    assert slurm.resume(node) is False  # nothing to do on a node that is not drained


@pytest.mark.parametrize("json", MODES)
def test_resume_refuses_an_admin_drain(running_cluster, json):
    slurm = running_cluster.client(json=json)
    node = running_cluster.node
    running_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maintenance")
    try:
        with pytest.raises(NotOurDrain) as caught:
            slurm.resume(node)
        assert caught.value.reason == "maintenance" and "not set by slurm-ext" in str(caught.value)
        still = slurm.node(node)
        assert still.drained and still.reason == "maintenance"
    finally:
        running_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")


def test_node_events_come_from_sacctmgr(running_cluster):
    slurm = running_cluster.client()
    node = running_cluster.node
    since = datetime.now(timezone.utc) - timedelta(seconds=2)
    # slurmdbd keys node events by their start in whole seconds: a drain in the same second as the one
    # before it (an earlier test's) is merged into that event, its reason kept. So: a second of its own.
    time.sleep(1.0 - time.time() % 1.0)
    reason = f"event check {time.time():.0f}"
    slurm.drain(node, reason)
    drained = slurm.node(node)  # Slurm records the event once the node is DRAINED (no job on it), not DRAINING
    slurm.resume(node)
    # slurmctld hands node events to slurmdbd through its DBD agent queue, which waits 10 s after a failed send:
    # with the other half of the suite loading both cores, the event can take more than one such wait
    deadline = time.monotonic() + 60
    events = []
    while time.monotonic() < deadline:
        events = [e for e in slurm.node_events(node, since) if e.reason == f"{REASON_PREFIX} {reason}"]
        if events and events[0].end is not None:
            break
        time.sleep(0.5)
    assert events, (f"DBD agent queue {slurm.dbd_queue()}", drained, slurm.node_events(node, since))
    event = events[0]
    assert event.node == node and "DRAIN" in event.state and event.user == "root"
    assert event.start >= since - timedelta(seconds=1)
    assert event.end is not None and event.end >= event.start


@pytest.mark.parametrize("json", MODES)
def test_jobs_and_accounting(running_cluster, json):
    slurm = running_cluster.client(json=json)
    job_id = running_cluster.sbatch("--job-name=client-check", "--wrap=sleep 2; exit 3")
    queued = [j for j in slurm.jobs() if j.job_id == job_id]
    assert queued and queued[0].name == "client-check" and queued[0].user == "root"
    assert queued[0].state in ("PENDING", "RUNNING", "CONFIGURING")
    job = running_cluster.wait_accounted(job_id)
    accounted = slurm.job(job_id)
    assert accounted.state == "FAILED" and accounted.exit_code == 3
    raw = running_cluster.run("sacct", "-P", "-j", str(job_id), "--format=JobID,Partition,State,Cluster,Submit").stdout
    assert accounted.nodes == running_cluster.node and accounted.partition == "debug", (accounted, raw)
    assert accounted.start and accounted.end and accounted.end >= accounted.start
    assert job == running_cluster.client().job(job_id)
    assert slurm.job(99999999) is None


@pytest.mark.parametrize("json", MODES)
def test_unreachable_controller_raises_within_the_timeout(running_cluster, json):
    stopped = daemons.stop(_daemon(running_cluster, "supervise-controller"), grace=30.0)
    assert stopped
    try:
        slurm = running_cluster.client(timeout=1.5, json=json)
        for call in (lambda: slurm.node(running_cluster.node), slurm.nodes, slurm.jobs,
                     lambda: slurm.drain(running_cluster.node, "x")):
            started = time.monotonic()
            with pytest.raises(SlurmUnreachable):
                call()
            assert time.monotonic() - started < 1.5 + 1.5
    finally:
        dev.up(running_cluster.settings)


def test_unreachable_database_raises_within_the_timeout(running_cluster):
    stopped = daemons.stop(_daemon(running_cluster, "supervise-accounting"), grace=120.0)  # MariaDB and slurmdbd
    assert stopped
    try:
        slurm = running_cluster.client(timeout=3.0)
        started = time.monotonic()
        with pytest.raises(SlurmUnreachable):
            slurm.node_events(running_cluster.node, datetime.now(timezone.utc))
        assert time.monotonic() - started < 3.0 + 1.5
    finally:
        dev.up(running_cluster.settings)


# -- parsing of shapes this host's Slurm 22.05 does not print ------------------------


def test_text_record_of_a_drained_node():
    line = ("NodeName=vm Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.11 "
            "AvailableFeatures=(null) Gres=gpu:h200:4 NodeAddr=127.0.0.1 OS=Linux 6.1 #1 SMP "
            "RealMemory=23605 State=IDLE+DRAIN Partitions=debug,gpu CfgTRES=cpu=2,mem=23605M "
            "Reason=slurm-ext: gpu 3 lost x=y|z [root@2026-11-29T16:56:27]")
    node = _node_from_text(line)
    assert node == Node(name="vm", state="IDLE", flags=frozenset({"DRAIN"}), reason="slurm-ext: gpu 3 lost x=y|z",
                        reason_user="root", reason_time=node.reason_time, gres="gpu:h200:4", cpus=2,
                        real_memory=23605, partitions=("debug", "gpu"), addr="127.0.0.1", os="Linux 6.1 #1 SMP")
    assert node.reason_time == datetime(2026, 11, 29, 16, 56, 27).astimezone()
    assert node.reason_is_ours and not node.idle


def test_text_record_not_responding():
    node = _node_from_text("NodeName=n1 CPUTot=4 Gres=(null) RealMemory=1 State=DOWN* Partitions=p")
    assert node.state == "DOWN" and "NOT_RESPONDING" in node.flags and not node.responding and node.gres == ""


def test_22_05s_json_answer_of_a_controller_that_does_not_answer_is_unreachable_not_an_empty_cluster():
    """Seen: 22.05's `sinfo --json` with slurmctld stopped exits 0 after its retries with no nodes and this error;
    taken for an empty cluster, it closed every repair recommendation ("no longer in Slurm"). Any --json answer of
    that form is unreachable (22.05's node table is read as text now; its squeue --json stays)."""
    answer = ('{"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [{"error": "Unspecified error", "errno": -1}], '
              '"nodes": []}')
    slurm = SlurmClient(SlurmSection(json="always"),
                        runner=lambda argv, timeout, **kw: command.CommandResult(argv, 0, answer, ""))
    with pytest.raises(SlurmUnreachable, match="Unspecified error"):
        slurm.nodes()
    other = answer.replace("Unspecified error", "Invalid node name specified").replace("-1", "2017")
    slurm.runner = lambda argv, timeout, **kw: command.CommandResult(argv, 0, other, "")
    with pytest.raises(SlurmError, match="Invalid node name specified"):
        slurm.nodes()


def test_json_record_of_slurm_24():
    data = {"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "maintenance",
            "reason_set_by_user": "alice", "reason_changed_at": {"set": True, "infinite": False, "number": 1800000000},
            "gres": "gpu:h100:8", "cpus": 128, "real_memory": 2000000, "partitions": ["gpu"]}
    node = _node_from_json(data)
    assert node.state == "IDLE" and node.flags == {"DRAIN"} and node.reason_user == "alice"
    assert node.reason_time == datetime.fromtimestamp(1800000000, timezone.utc)
    assert not node.reason_is_ours and node.partitions == ("gpu",)


def test_sacct_json_of_slurm_24():
    data = {"job_id": 7, "name": "train", "user": "bob", "state": {"current": ["COMPLETED"], "reason": "None"},
            "nodes": "n[1-2]", "partition": "gpu",
            "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0}},
            "time": {"start": 1800000000, "end": 1800000060}}
    job = _job_from_sacct_json(data)
    assert (job.job_id, job.state, job.exit_code, job.nodes) == (7, "COMPLETED", 0, "n[1-2]")
    assert (job.end - job.start).total_seconds() == 60


def test_a_completing_job_in_squeues_json_is_completing_and_kept():
    """The review of issue 32: a job whose Epilog still runs lists its base state first (["COMPLETED", "COMPLETING"]);
    it still holds its node, as squeue's text says (CG), and the client's queue keeps it."""
    from slurm_ext.slurm import _job_from_squeue_json
    job = _job_from_squeue_json({"job_id": 7, "job_state": ["COMPLETED", "COMPLETING"], "nodes": "n1"})
    assert job.state == "COMPLETING" and not job.finished
    assert _job_from_squeue_json({"job_id": 8, "job_state": ["COMPLETED"], "nodes": "n1"}).finished


def _readyz_server(status: int, body: bytes):
    """An HTTP server on 127.0.0.1 that answers every GET with `status` and `body`, as slurmd's /readyz would."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _one_reply(reply: bytes) -> int:
    """A port on 127.0.0.1 whose one connection gets `reply` (raw bytes, not HTTP) and is closed; the port."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer():
        peer, _ = server.accept()
        peer.recv(4096)
        peer.sendall(reply)
        peer.close()
        server.close()
    threading.Thread(target=answer, daemon=True).start()
    return server.getsockname()[1]


def test_slurmd_readyz_is_asked_only_of_a_slurm_that_has_it():
    """25.11 and later: a 503 is the reason (its status only: the body is whatever listens there), a 204 none, a
    slurmd that takes the connection and does not answer (hung) the reason too; before 25.11, with no port shown,
    with nothing taking the connection, or a connection dropped or answered in something not HTTP, nothing is said (the port answers 503 to anyone who asks: a 22.05 node would
    be unready if it were asked). A NodeAddr that is a name is asked on 127.0.0.1, with no lookup. The images' test
    asks a real 26.05 slurmd (tests/test_container_cluster.py)."""
    import socket
    from slurm_ext.slurm import slurmd_unready
    unready = _readyz_server(503, b"not ready\nREADY=1\n")
    ready = _readyz_server(204, b"")  # as 26.05's slurmd answers
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(1)  # the kernel takes the connection; nobody answers
    try:
        port = unready.server_address[1]
        node = Node("n1", "IDLE", addr="127.0.0.1", port=port, version="26.05.5")
        assert slurmd_unready(node) == f"slurmd's /readyz on port {port} answered 503"
        for answering in (Node("n1", "IDLE", addr="127.0.0.1", port=ready.server_address[1], version="25.11.2"),
                          Node("n1", "IDLE", addr="n1.invalid", port=ready.server_address[1], version="26.05.5")):
            assert slurmd_unready(answering) == "", answering
        for older in ("22.05.8", "24.11.6", "", "(null)"):
            assert slurmd_unready(Node("n1", "IDLE", addr="127.0.0.1", port=port, version=older)) == "", older
        assert slurmd_unready(Node("n1", "IDLE", addr="127.0.0.1", port=0, version="26.05.5")) == ""
        stuck = Node("n1", "IDLE", addr="127.0.0.1", port=hung.getsockname()[1], version="26.05.5")
        assert slurmd_unready(stuck, timeout=0.5) == f"slurmd's /readyz on port {stuck.port} did not answer within 0.5s"
        for reply in (b"", b"SLURM-RPC garbage READY=1\nSTOPPING=1\n"):  # dropped without a word; not HTTP
            other = _one_reply(reply)
            assert slurmd_unready(Node("n1", "IDLE", addr="127.0.0.1", port=other, version="26.05.5")) == "", reply
    finally:
        for server in (unready, ready):
            server.shutdown()
            server.server_close()
        hung.close()
    gone = Node("n1", "IDLE", addr="127.0.0.1", port=port, version="26.05.5")  # nobody listens there now
    assert slurmd_unready(gone) == ""


@pytest.mark.parametrize("version,refused", [("22.05.8", True), ("25.11.2", True), ("26.05.5", False)])
def test_a_reboot_by_power_action_is_asked_only_of_slurm_26_05(version, refused):
    """Before 26.05 `scontrol reboot action=` does not exist: refused here, naming the key and the version, never
    run as a plain reboot. The images' repair test reboots by a real PowerAction (tests/test_repair_cluster.py)."""
    calls = []

    def run(argv, timeout, env=None, input=None, check=True):
        calls.append(argv)
        return command.CommandResult(tuple(argv), 0, f"slurm {version}\n" if argv[0] == "sinfo" else "", "")

    client = SlurmClient(SlurmSection(), runner=run)
    if refused:
        with pytest.raises(SlurmError, match=rf"power-cycle.*needs Slurm 26.05 or later; this Slurm is "
                                             rf"{version[:5]}: empty repair.reboot_action"):
            client.reboot("n1", "power-cycle")
        assert [c for c in calls if c[0] == "scontrol"] == []
    else:
        client.reboot("n1", "power-cycle")
        assert calls[-1] == ["scontrol", "reboot", "action=power-cycle", "n1"]
    client.reboot("n2")
    assert calls[-1] == ["scontrol", "reboot", "n2"]


def test_slurms_times_in_its_text_are_read_and_anything_else_is_no_time():
    from datetime import datetime
    from slurm_ext.slurm import _parse_time
    assert _parse_time(" 2026-12-06T09:36:43 ") == datetime(2026, 12, 6, 9, 36, 43).astimezone()
    for text in ("Unknown", "None", "N/A", "", "2026-13-45T00:00:00", "2026-12-06 09:36:43", "2026-12-06",
                 "2026-12-06T09:36:43+05:00", "2026-12-06T09:36:43.5"):
        assert _parse_time(text) is None, text


def test_a_node_table_of_text_reads_every_field_whatever_the_spaces_and_its_reason_whatever_it_holds():
    line = ("NodeName=g1 Arch=x86_64 CoresPerSocket=2  CPUTot=2 Gres=gpu:h200:2 NodeAddr=10.0.0.1 Port=6818 "
            "Version=22.05.8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC  RealMemory=23605 State=IDLE+DRAIN "
            "Partitions=debug,gpu  BootTime=2026-12-05T21:19:11 SlurmdStartTime=None AllocTRES=cpu=1,gres/gpu=1 "
            "Reason=NHC: fs State=IDLE Partitions=x [root@2026-12-06T09:53:45] [alice@2026-12-06T09:53:46]")
    node = _node_from_text(line)
    assert (node.name, node.state, node.flags, node.gres, node.cpus, node.addr, node.port) == \
        ("g1", "IDLE", frozenset({"DRAIN"}), "gpu:h200:2", 2, "10.0.0.1", 6818)
    assert node.os == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC" and node.partitions == ("debug", "gpu")
    assert node.gpus_used == 1 and node.boot_time is not None and node.slurmd_start is None
    # the reason is free text, last: what it holds is not read as fields, and only Slurm's own last [user@time] is
    assert node.reason == "NHC: fs State=IDLE Partitions=x [root@2026-12-06T09:53:45]" and node.reason_user == "alice"


def test_a_node_table_of_text_read_again_reads_only_the_lines_that_changed():
    """At 10,000 nodes reading the table cost 0.25 s a read; between two reads a few seconds apart Slurm prints most
    lines again the same, and they are not read again: their nodes are the last read's (frozen)."""
    table = ["NodeName=g1 CPUTot=2 Gres=gpu:h200:2 State=IDLE Partitions=p",
             "NodeName=g2 CPUTot=2 Gres=gpu:h200:2 State=MIXED Partitions=p AllocTRES=cpu=1,gres/gpu=1"]
    slurm = SlurmClient(SlurmSection(json="never"), runner=lambda argv, timeout, **kw: command.CommandResult(
        argv, 0, "\n".join(table) + "\n", ""))
    first = slurm.nodes()
    table[1] = table[1].replace("State=MIXED", "State=IDLE+DRAIN") + " Reason=admin [root@2026-12-06T09:53:45]"
    second = slurm.nodes()
    assert second[0] is first[0] and second[1] is not first[1]
    assert (second[1].state, second[1].flags, second[1].reason) == ("IDLE", frozenset({"DRAIN"}), "admin")
    assert slurm.node("g2") == second[1]  # one node: read, and the whole table's lines kept as they are
    assert slurm.nodes()[0] is first[0]


def test_a_reason_ends_at_slurms_own_stamp_and_the_fields_after_it_are_fields():
    """Slurm prints a node's Comment= and Extra= after its Reason's [user@time] where they are set: the reason is
    not them, and its user and time are read (a reason that drains a node is compared whole with ours)."""
    line = ("NodeName=g1 CPUTot=2 State=IDLE+DRAIN Partitions=p Reason=slurm-ext: health xid/79 [root@2026-12-06T09:53:45]"
            " Comment=rack 12 [bob@2026-01-01T00:00:00] Extra=foo")
    node = _node_from_text(line)
    assert (node.reason, node.reason_user, node.drained) == ("slurm-ext: health xid/79", "root", True)
    assert node.reason_time is not None and node.reason_time.day == 6
    # no stamp (not seen from Slurm): the rest of the line is the reason, as before
    assert _node_from_text("NodeName=g1 State=IDLE Reason=cables Xid=79").reason == "cables Xid=79"

"""The repair component's logic: recommendations from literal nodes, decisions on a real SQLite store, the
executors for real (a command; the Kubernetes client against a recording HTTP(S) server), the status classes, and
`history` from the real CLI on the session cluster."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers.cli import cli
from helpers.files import script
from helpers.wait import wait_for
from slurm_ext import config
from slurm_ext.agentapi import HealthAnswer, Readings
from slurm_ext.repair import decide, executors, recommend
from slurm_ext.repair.settings import RepairSection
from slurm_ext.repair.status import classify, counts, node_statuses
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.slurm import Node, expand_hostlist

XID79 = "slurm-ext: xid 79 gpu 1 GPU has fallen off the bus action=reboot"


def _node(name: str, state: str = "IDLE", flags=(), reason: str = "", user: str = "root") -> Node:
    return Node(name, state, frozenset(flags), reason, user if reason else "", gres="gpu:h200:4")


def _drained(name: str, reason: str = XID79) -> Node:
    return _node(name, flags={"DRAIN"}, reason=reason)


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "state" / "repair.db"))
    yield opened
    opened.close()


def _plan(records, nodes, settings=RepairSection(), jobs=None, reboots=None, now=1000.0):
    return recommend.plan(records, nodes, jobs or {}, settings, reboots or {}, now)


# -- recommendations ----------------------------------------------------------------------------------------

def test_a_health_drain_becomes_one_recommendation_with_its_action_evidence_and_jobs():
    changes = _plan([], [_drained("n1"), _node("n2"), _node("n3", flags={"DRAIN"}, reason="admin: fan")],
                    jobs={"n1": [12, 7]})
    assert [(c.kind, c.record.node, c.record.signature, c.record.action, c.record.jobs) for c in changes] == [
        ("new", "n1", "xid/79", "reboot", [7, 12])]
    assert changes[0].record.evidence == "79 gpu 1 GPU has fallen off the bus"


def test_the_config_table_chooses_the_action_by_signature_then_by_check():
    settings = RepairSection(actions={"xid/79": "failover", "temperature": "remove"})
    hot = _drained("n2", "slurm-ext: temperature 95C (limit 87C) action=reboot")
    changes = _plan([], [_drained("n1"), hot], settings)
    assert {c.record.node: c.record.action for c in changes} == {"n1": "failover", "n2": "remove"}


def test_a_finding_that_needs_no_repair_of_the_node_recommends_nothing():
    assert _plan([], [_drained("n1", "slurm-ext: xid 13 gpu 0 graphics engine exception action=restart-job")]) == []


def test_a_cleared_fault_takes_its_recommendation_away_and_a_rejected_one_is_closed():
    open_one = Record("n1", "xid/79", "reboot", "e", state="recommended", opened=1.0, updated=1.0, id=1)
    rejected = Record("n2", "xid/79", "reboot", "e", state="rejected", opened=1.0, updated=1.0, id=2)
    changes = _plan([open_one, rejected], [_node("n1"), _node("n2")])
    assert [(c.kind, c.record.state, c.record.closed) for c in changes] == [("gone", "gone", 1000.0),
                                                                          ("closed", "rejected", 1000.0)]


def test_a_worse_fault_escalates_in_place_and_repeats_after_reboots_recommend_remove():
    record = Record("n1", "xid/79", "reboot", "e", state="recommended", opened=1.0, updated=1.0, id=1)
    worse = _drained("n1", "slurm-ext: xid 79 gpu 1 GPU has fallen off the bus action=remove")
    (change,) = _plan([record], [worse])
    assert (change.kind, change.record.action, change.record.id) == ("escalated", "remove", 1)
    (again,) = _plan([], [_drained("n1")], reboots={("n1", "xid/79"): 2})
    assert again.record.action == "remove" and "after 2 reboots" in again.record.evidence
    (below,) = _plan([], [_drained("n1")], reboots={("n1", "xid/79"): 1})
    assert below.record.action == "reboot"


def test_a_node_under_repair_is_left_to_the_flow():
    running = Record("n1", "xid/79", "reboot", "e", state="running", step="wait-boot", opened=1.0, updated=1.0, id=1)
    assert _plan([running], [_node("n1", flags={"DRAIN"}, reason="slurm-ext: repair reboot: x (approved by a)")]) == []


# -- decisions on a real SQLite store ------------------------------------------------------------------------

def _recommend(store, node: str, now: float = 1000.0) -> Record:
    with store.locked():
        return store.add(Record(node, "xid/79", "reboot", "79 gpu 1", opened=now, updated=now))


def test_approve_records_the_user_and_a_second_approval_is_refused_with_who(store):
    _recommend(store, "n1")
    record, said = decide.approve(store, "n1", "alice", RepairSection(), 10)
    assert (record.state, record.decided_by) == ("approved", "alice") and "approved reboot" in said
    with pytest.raises(decide.DecisionRefused, match="already approved by alice"):
        decide.approve(store, "n1", "bob", RepairSection(), 10)
    events = store.events(node="n1")
    assert [(e.event, e.user) for e in events] == [("repair-approved", "alice")]


def test_two_operators_approving_at_once_one_wins(tmp_path):
    path = str(tmp_path / "r.db")
    first, second = open_sqlite(path), open_sqlite(path)
    _recommend(first, "n1")
    results = []

    def approve(store, user):
        try:
            decide.approve(store, "n1", user, RepairSection(), 10)
            results.append(("ok", user))
        except decide.DecisionRefused as err:
            results.append(("refused", str(err)))

    threads = [threading.Thread(target=approve, args=(s, u)) for s, u in ((first, "alice"), (second, "bob"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r[0] for r in results) == ["ok", "refused"], results
    assert len(first.events(node="n1")) == 1


def test_no_recommendation_an_unknown_action_and_an_empty_rejection_are_refused(store):
    with pytest.raises(decide.DecisionRefused, match="no recommendation"):
        decide.approve(store, "n9", "alice", RepairSection(), 10)
    _recommend(store, "n1")
    with pytest.raises(decide.DecisionRefused, match="unknown action 'explode'"):
        decide.approve(store, "n1", "alice", RepairSection(), 10, action="explode")
    with pytest.raises(decide.DecisionRefused, match="needs its reason"):
        decide.reject(store, "n1", "alice", "  ")
    rejected = decide.reject(store, "n1", "alice", "vendor on site tomorrow")
    assert (rejected.state, rejected.note) == ("rejected", "vendor on site tomorrow")
    with pytest.raises(decide.DecisionRefused, match="rejected by alice.*vendor on site tomorrow"):
        decide.approve(store, "n1", "bob", RepairSection(), 10)


def test_the_guard_refuses_beyond_max_of_nodes_and_percent_and_says_why(store):
    settings = RepairSection(guard_nodes=1, guard_percent=50)
    for name in ("n1", "n2", "n3"):
        _recommend(store, name)
    decide.approve(store, "n1", "a", settings, 4)
    decide.approve(store, "n2", "a", settings, 4)
    guard = r"refused by the guard: 2 node\(s\) under repair now \(n1, n2\), and at most 2 may be at once"
    with pytest.raises(decide.DecisionRefused, match=guard):
        decide.approve(store, "n3", "a", settings, 4)
    assert decide.guard_limit(RepairSection(guard_nodes=3, guard_percent=10), 10) == 3
    assert decide.guard_limit(RepairSection(guard_nodes=1, guard_percent=10), 1000) == 100


def test_pause_cooldown_dry_run_and_auto_approve_rules(store):
    settings = RepairSection(cooldown=600)
    _recommend(store, "n1")
    decide.pause(store, "carol")
    with pytest.raises(decide.DecisionRefused, match="paused \\(by carol"):
        decide.approve(store, "n1", "a", settings, 10)
    decide.unpause(store, "carol")
    _, said = decide.approve(store, "n1", "a", settings, 10, dry_run=True)
    assert "would approve" in said and store.records(node="n1")[0].state == "recommended"
    with pytest.raises(decide.DecisionRefused, match="auto-approve takes only reset-gpu, reboot, not remove"):
        decide.approve(store, "n1", "auto", settings, 10, action="remove", auto=True)
    done = store.records(node="n1")[0]
    done.state, done.closed = "done", time.time() - 60
    with store.locked():
        store.save(done)
    _recommend(store, "n1")
    with pytest.raises(decide.DecisionRefused, match="in its cooldown"):
        decide.approve(store, "n1", "a", settings, 10)
    decide.approve(store, "n1", "a", replace(settings, cooldown=30), 10)


# -- executors, for real ------------------------------------------------------------------------------------

def test_the_command_executor_runs_the_template_and_reports_failure_and_timeout(tmp_path):
    out = tmp_path / "rma.log"
    # each a program that takes the node as its argument, as the docs say (never `sh -c` with {node} in its text)
    rma = script(tmp_path, "rma", f'#!/bin/sh\necho "RMA $1" >> {out}\necho ticket 42\n')
    reimage = script(tmp_path, "reimage", "#!/bin/sh\necho no image >&2\nexit 3\n")
    settings = RepairSection(commands={"remove": [str(rma), "{node}"], "reprovision": [str(reimage), "{node}"],
                                       "failover": ["/bin/sleep", "5"]}, command_timeout=1.0)
    outcome = executors.run_action(settings, "remove", "gpu-7")
    assert out.read_text() == "RMA gpu-7\n" and "ticket 42" in outcome.output
    with pytest.raises(executors.ExecutorFailed, match="reimage gpu-7 exited with status 3: no image"):
        executors.run_action(settings, "reprovision", "gpu-7")
    started = time.monotonic()
    with pytest.raises(executors.ExecutorFailed, match="did not finish within 1s and was killed"):
        executors.run_action(settings, "failover", "gpu-7")
    assert time.monotonic() - started < 4
    with pytest.raises(executors.ExecutorFailed, match="no command for remove"):
        executors.run_action(RepairSection(), "remove", "gpu-7")


def test_a_node_name_that_the_sites_tool_would_take_for_an_option_is_refused_and_nothing_runs(tmp_path):
    """Issue 28.15: a node named `-oProxyCommand=...` in an ssh template is an option of ssh, which runs the command
    in it (seen: the marker made, as root). Every name outside [A-Za-z0-9][A-Za-z0-9._-]* is refused before
    anything runs."""
    marker = tmp_path / "proxy-command-ran"
    ssh = RepairSection(commands={"remove": ["/usr/bin/ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "{node}",
                                             "true"]})
    with pytest.raises(executors.ExecutorFailed, match=r"node name '-oProxyCommand=touch .*' refused.*nothing was run"):
        executors.run_action(ssh, "remove", f"-oProxyCommand=touch {marker}")
    assert not marker.exists()
    ran = tmp_path / "ran"
    record = RepairSection(commands={"remove": [str(script(tmp_path, "record", f'#!/bin/sh\necho "$1" >> {ran}\n')),
                                                "{node}"]})
    for node in ("-rf", "--help", "gpu 1", "gpu1\n", "gpu;id", "$(id)", "../gpu1", ".hidden", "_gpu1", "", "gpü1",
                 "gpu1\x1b[2J"):
        with pytest.raises(executors.ExecutorFailed, match="refused"):
            executors.run_action(record, "remove", node)
    assert not ran.exists()
    executors.run_action(record, "remove", "gpu-07.rack_2")
    assert ran.read_text() == "gpu-07.rack_2\n"


def test_what_the_command_prints_is_kept_to_its_tail_with_control_characters_escaped(tmp_path):
    """Issue 28.15: an executor's output goes into the repair's history and onto the page (its outcome, or the
    failure's message): the last executors.OUTPUT_LIMIT characters, escape sequences escaped."""
    noisy = "#!/bin/sh\n{ head -c 100000 /dev/zero | tr '\\0' x; printf '\\033]0;pwned\\007\\033[2J done\\n'; } >&2\n"
    settings = RepairSection(commands={"remove": [str(script(tmp_path, "ok", noisy)), "{node}"],
                                       "reprovision": [str(script(tmp_path, "fails", noisy + "exit 4\n")), "{node}"]})
    outcome = executors.run_action(settings, "remove", "gpu-7")
    with pytest.raises(executors.ExecutorFailed) as failed:
        executors.run_action(settings, "reprovision", "gpu-7")
    said = str(failed.value)
    assert "\x1b" not in said + outcome.output and outcome.output.endswith("x\\x1b]0;pwned\\x07\\x1b[2J done")
    assert "exited with status 4: x" in said and said.endswith("x\\x1b]0;pwned\\x07\\x1b[2J done")
    assert len(outcome.output) <= executors.OUTPUT_LIMIT and len(said) < executors.OUTPUT_LIMIT + 200


class _Recorder(BaseHTTPRequestHandler):
    """A recording HTTP server in the Kubernetes API's shape: it keeps every request and answers what the client
    expects (no API server can run on these machines)."""

    requests: list = []

    def _answer(self, body: dict, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append({"method": self.command, "path": self.path, "body": body,
                              "auth": self.headers.get("Authorization"),
                              "type": self.headers.get("Content-Type")})
        return body

    def do_GET(self):
        self._record()
        name = self.path.rsplit("/", 1)[-1]
        if name == "missing":
            return self._answer({"kind": "Status", "code": 404, "message": "pods \"missing\" not found"}, 404)
        self._answer({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "slurm"},
                      "spec": {"nodeName": "k8s-worker-7", "containers": [{"name": "slurmd"}]}})

    def do_PATCH(self):
        self._record()
        self._answer({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "k8s-worker-7"}})

    def do_DELETE(self):  # the API answers a pod's deletion with the pod
        self._record()
        name = self.path.rsplit("/", 1)[-1]
        self._answer({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "slurm"},
                      "spec": {"nodeName": "k8s-worker-7", "containers": [{"name": "slurmd"}]}})

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder(tmp_path):
    _Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings = RepairSection(executor="kubernetes", kubernetes_api=f"http://127.0.0.1:{server.server_port}",
                             kubernetes_token_file=str(token), kubernetes_ca_file="", kubernetes_insecure=True,
                             kubernetes_namespace="slurm", kubernetes_pod="gpu-{node}")
    yield settings, _Recorder.requests
    server.shutdown()
    server.server_close()


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by the openssl command line."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


class _CountingServer(ThreadingHTTPServer):
    """Counts every connection it is offered, before the TLS handshake: a client that sends nothing is seen too."""

    offered = 0

    def get_request(self):
        self.offered += 1
        return super().get_request()


@pytest.fixture
def https_recorder(tmp_path):
    """The recording server behind TLS on 127.0.0.1, its certificate self-signed: (settings that verify it with that
    certificate as the CA, the server, the requests it records)."""
    cert, key = _self_signed(tmp_path, "api")
    _Recorder.requests = []
    server = _CountingServer(("127.0.0.1", 0), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings = RepairSection(executor="kubernetes", kubernetes_api=f"https://127.0.0.1:{server.server_port}",
                             kubernetes_token_file=str(token), kubernetes_ca_file=str(cert),
                             kubernetes_namespace="slurm", kubernetes_pod="gpu-{node}")
    yield settings, server, _Recorder.requests
    server.shutdown()
    server.server_close()


def test_the_kubernetes_executor_sends_its_token_only_to_an_api_server_it_verified(https_recorder, tmp_path):
    """Issue 28.14: without a CA file the executor turned TLS verification off and sent its bearer token to whoever
    answered. Now it refuses before connecting, naming repair.kubernetes_ca_file, unless repair.kubernetes_insecure
    says so; with the CA it verifies (a server with another certificate gets no request)."""
    settings, server, requests = https_recorder
    unverified = replace(settings, kubernetes_ca_file="")
    with pytest.raises(executors.ExecutorFailed, match="repair.kubernetes_ca_file is empty.*nothing was sent"):
        executors.run_action(unverified, "reprovision", "n1")
    plain = replace(unverified, kubernetes_api=settings.kubernetes_api.replace("https:", "http:"))
    with pytest.raises(executors.ExecutorFailed, match="plain http.*repair.kubernetes_insecure = true"):
        executors.run_action(plain, "reprovision", "n1")
    assert server.offered == 0 and requests == []

    other, _ = _self_signed(tmp_path, "other")
    with pytest.raises(executors.ExecutorFailed, match="no answer from the Kubernetes API for reprovision.*CERTIFICATE"):
        executors.run_action(replace(settings, kubernetes_ca_file=str(other)), "reprovision", "n1")
    assert requests == []  # its handshake failed: nothing sent

    executors.run_action(settings, "reprovision", "n1")
    assert [(r["method"], r["auth"]) for r in requests] == [("GET", "Bearer s3cret"), ("DELETE", "Bearer s3cret")]
    requests.clear()
    executors.run_action(replace(unverified, kubernetes_insecure=True), "reprovision", "n2")  # the site said so
    assert [(r["method"], r["path"]) for r in requests] == [("GET", "/api/v1/namespaces/slurm/pods/gpu-n2"),
                                                           ("DELETE", "/api/v1/namespaces/slurm/pods/gpu-n2")]


def test_the_kubernetes_executor_sends_the_expected_requests(recorder):
    settings, requests = recorder
    executors.run_action(settings, "reprovision", "n1")
    assert [(r["method"], r["path"]) for r in requests] == [("GET", "/api/v1/namespaces/slurm/pods/gpu-n1"),
                                                           ("DELETE", "/api/v1/namespaces/slurm/pods/gpu-n1")]
    assert all(r["auth"] == "Bearer s3cret" for r in requests)
    requests.clear()
    outcome = executors.run_action(settings, "remove", "n2")
    assert [(r["method"], r["path"]) for r in requests] == [("GET", "/api/v1/namespaces/slurm/pods/gpu-n2"),
                                                           ("PATCH", "/api/v1/nodes/k8s-worker-7"),
                                                           ("DELETE", "/api/v1/namespaces/slurm/pods/gpu-n2")]
    assert requests[1]["body"] == {"spec": {"unschedulable": True},
                                   "metadata": {"labels": {"slurm-ext.io/rma": "true"}}}
    assert "cordoned Kubernetes node k8s-worker-7 and labelled it for RMA" in outcome.summary
    requests.clear()
    executors.run_action(settings, "failover", "n3")
    assert requests[1]["body"] == {"spec": {"unschedulable": True}}
    with pytest.raises(executors.ExecutorFailed, match="Kubernetes refused reprovision of pod slurm/missing: 404"):
        executors.run_action(replace(settings, kubernetes_pod="missing"), "reprovision", "n4")


def test_the_kubernetes_executor_names_an_api_that_does_not_answer(tmp_path):
    settings = RepairSection(executor="kubernetes", kubernetes_api="http://127.0.0.1:9", kubernetes_token_file="",
                             kubernetes_ca_file="", kubernetes_insecure=True)
    with pytest.raises(executors.ExecutorFailed, match="no answer from the Kubernetes API for remove"):
        executors.run_action(settings, "remove", "n1")


# -- status and the rest -------------------------------------------------------------------------------------

def test_each_node_gets_one_of_the_five_states():
    nodes = [_node("ok"), _node("boot", flags={"REBOOT_REQUESTED"}), _drained("sick"),
             _node("admin", flags={"DRAIN"}, reason="NHC: disk full"), _drained("wait"),
             _node("gone", "DOWN", {"NOT_RESPONDING"})]
    records = [Record("wait", "xid/79", "reboot", "e", state="recommended", opened=1.0, updated=1.0)]
    statuses = node_statuses(nodes, records, [])
    assert [s.state for s in statuses] == ["healthy", "booting", "unhealthy", "paused", "pending", "unhealthy"]
    assert counts(statuses) == {"healthy": 1, "booting": 1, "unhealthy": 2, "pending": 1, "paused": 1}
    assert statuses[3].reason_owner == "root" and statuses[2].findings == [
        "xid/79: 79 gpu 1 GPU has fallen off the bus"]
    waiting = Record("boot2", "xid/79", "reboot", "e", state="running", step="verify", opened=1.0, updated=1.0)
    assert classify(_node("boot2", flags={"DRAIN"}, reason="slurm-ext: repair reboot: x (approved by a)"),
                    waiting) == "booting"


def test_host_lists_expand_like_scontrol_show_hostnames():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("n[8-11]") == ["n8", "n9", "n10", "n11"]
    assert expand_hostlist("") == []
    assert expand_hostlist("gpu07") == ["gpu07"] and expand_hostlist("a,b") == ["a", "b"]
    one = expand_hostlist("gpu07")
    one.append("x")  # a caller's list is its own
    assert expand_hostlist("gpu07") == ["gpu07"]


def test_the_repair_section_is_refused_with_the_key_named(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[repair]\nactions = { "xid/79" = "explode" }\n')
    with pytest.raises(Exception, match="repair.actions"):
        config.load(Path(path))


# -- the flow, step by step, on literal nodes (its real run: tests/test_repair_cluster.py) ---------------------

class _Slurm:
    """Records what the flow asks of Slurm (the flow's own logic is under test here, not Slurm's)."""

    def __init__(self):
        self.calls = []

    def drain(self, node, reason):
        self.calls.append(("drain", node, reason))

    def reboot(self, node, action=""):
        self.calls.append(("reboot", node) + ((action,) if action else ()))

    def check_reboot_action(self, action):
        """As a 26.05 Slurm: every action can be asked."""

    def resume(self, node):
        self.calls.append(("resume", node))
        return True

    def requeue(self, ids):
        self.calls.append(("requeue", tuple(ids)))
        return ""


def _health(readings_time: float, findings=(), boot: str = "boot-1") -> HealthAnswer:
    """A node agent's /health as the boundary hands it to the flow."""
    return HealthAnswer("n1", boot, readings_time, Readings(readings_time, tuple(findings), {}, "", ()), {})


def test_a_node_that_boots_again_during_verify_starts_its_comparison_over(store):
    """A reading newer than the first one counts only within the same boot: a node that rebooted again in between
    (its clock may have jumped) is compared from its new boot's first reading."""
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    record.state, record.step = "running", "verify"
    record.detail = {"reason": "slurm-ext: repair reboot: x (approved by alice)", "back_at": 1.0}
    readings = iter([_health(50.0), _health(60.0, boot="boot-2"), _health(61.0, boot="boot-2")])
    seen = _seen(store, [_drained("n1", record.detail["reason"])], health=lambda node: next(readings), now=2.0)
    advance(record, seen)
    assert record.step == "verify" and record.detail["verify_boot"] == "boot-1"
    advance(record, seen)
    assert record.step == "verify" and record.detail["verify_boot"] == "boot-2" and \
        record.detail["first_reading"] == 60.0
    advance(record, seen)
    assert record.step == "resume"


def test_a_first_verify_pass_without_an_answer_costs_no_extra_pass(store):
    """An agent silent at the step's first pass is no boot to start over from: its first answer with a newer
    reading than none passes the verify at once, as before boots were compared."""
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    record.state, record.step = "running", "verify"
    record.detail = {"reason": "slurm-ext: repair reboot: x (approved by alice)", "back_at": 1.0}
    readings = iter([None, _health(60.0)])
    seen = _seen(store, [_drained("n1", record.detail["reason"])], health=lambda node: next(readings), now=2.0)
    advance(record, seen)
    assert record.step == "verify" and record.detail["verify_boot"] == ""
    advance(record, seen)
    assert record.step == "resume"


def _seen(store, nodes, settings=RepairSection(), jobs=None, health=None, actions=None, started=None, now=2000.0):
    from slurm_ext.repair.flow import Seen
    emitted = []

    def start_action(action, node):
        started.append((action, node))
        from concurrent.futures import Future
        future = Future()
        future.set_result(executors.Outcome("ran"))
        return future
    return Seen(_Slurm(), store, settings, {n.name: n for n in nodes}, jobs or {}, health or (lambda node: None),
                start_action, actions if actions is not None else {}, lambda *a, **k: emitted.append(a),
                now if callable(now) else (lambda: now))


def _approved(store, node="n1", action="reboot") -> Record:
    with store.locked():
        return store.add(Record(node, "xid/79", action, "79 gpu 1", state="approved", decided_by="alice",
                                opened=1.0, updated=1.0))


def test_a_reboot_repair_drains_reboots_waits_verifies_and_resumes(store):
    from datetime import datetime, timezone
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    old = datetime(2026, 1, 1, tzinfo=timezone.utc)
    seen = _seen(store, [replace(_drained("n1"), boot_time=old)])
    advance(record, seen)
    assert [c[0] for c in seen.slurm.calls] == ["drain", "reboot"]  # the pass saw its own drain: no second one
    assert seen.slurm.calls[0][2] == "slurm-ext: repair reboot: xid/79 79 gpu 1 (approved by alice)"
    assert (record.state, record.step) == ("running", "wait-boot")
    booted = replace(_node("n1", flags={"DRAIN"}, reason=seen.slurm.calls[0][2] + " : reboot issued"),
                     boot_time=datetime(2026, 6, 1, tzinfo=timezone.utc))
    readings = iter([_health(50.0), _health(51.0)])
    seen = _seen(store, [booted], health=lambda node: next(readings), now=2010.0)
    advance(record, seen)
    assert record.step == "verify" and seen.slurm.calls == []  # the first reading seen is the baseline
    advance(record, seen)
    assert record.state == "done" and seen.slurm.calls == [("resume", "n1")]
    assert [e.event for e in store.events(record=record.id)][-1] == "repair-done"


def test_a_reboot_by_power_action_says_so_and_a_slurm_without_it_fails_the_repair_before_its_drain(store):
    """repair.reboot_action: `scontrol reboot action=NAME` (the images' 26.05 repair test runs a real one); on a Slurm
    without it (SlurmClient.check_reboot_action before 26.05) the repair fails before it drains the node."""
    from slurm_ext.errors import SlurmTooOld
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    seen = _seen(store, [_drained("n1")], RepairSection(reboot_action="power-cycle"))
    advance(record, seen)
    assert seen.slurm.calls[-1] == ("reboot", "n1", "power-cycle") and record.step == "wait-boot"
    said = [e.message for e in store.events(record=record.id) if e.event == "repair-step"][-1]
    assert said.startswith("scontrol reboot action=power-cycle n1: Slurm runs PowerAction power-cycle"), said

    class OldSlurm(_Slurm):
        def check_reboot_action(self, action):
            raise SlurmTooOld(f"reboot action {action!r} (a PowerAction) needs Slurm 26.05 or later; this Slurm is "
                              "22.05: empty repair.reboot_action, or upgrade")
    refused = _approved(store, "n2")
    seen = _seen(store, [_node("n2")], RepairSection(reboot_action="power-cycle"))
    seen.slurm = OldSlurm()
    advance(refused, seen)
    assert refused.state == "failed" and "needs Slurm 26.05 or later" in refused.note, refused
    assert seen.slurm.calls == []  # before its drain: the node was not drained for a reboot it cannot have
    said = [e.message for e in store.events(record=refused.id) if e.event == "repair-failed"][-1]
    assert "failed before it began" in said and "nothing was done to the node" in said and "stays drained" not in said
    # no cooldown: once repair.reboot_action is fixed, the node's next recommendation is approved at once
    from slurm_ext.repair.decide import _check_cooldown
    _check_cooldown(store, "n2", RepairSection(cooldown=3600.0), 2001.0)


def test_jobs_past_the_deadline_fail_the_repair_and_its_reason_says_so(store):
    from slurm_ext.repair.flow import advance
    from slurm_ext.slurm import Job
    record = _approved(store)
    job = Job(7, "train", "u", "RUNNING", "n1")
    seen = _seen(store, [_drained("n1")], jobs={"n1": [job]})
    advance(record, seen)
    assert record.step == "wait-jobs" and [c[0] for c in seen.slurm.calls] == ["drain"]
    held = replace(_drained("n1"), reason=record.detail["reason"])
    late = _seen(store, [held], RepairSection(drain_deadline=60), jobs={"n1": [job]}, now=2000.0 + 61)
    advance(record, late)
    assert record.state == "failed" and "jobs [7] still run" in record.note
    assert late.slurm.calls[0][2].startswith("slurm-ext: repair reboot failed: jobs [7]")
    requeue = _approved(store, "n2")
    seen = _seen(store, [_drained("n2")], RepairSection(requeue=True), jobs={"n2": [replace(job, nodes="n2")]})
    advance(requeue, seen)
    assert ("requeue", (7,)) in seen.slurm.calls


def test_an_admins_reason_stops_the_repair_and_is_left_alone(store):
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    seen = _seen(store, [_node("n1", flags={"DRAIN"}, reason="admin: do not touch")])
    advance(record, seen)
    assert record.state == "failed" and "not draining it for its repair: it holds 'admin: do not touch'" in record.note
    assert seen.slurm.calls == []


def test_an_executor_runs_once_and_never_again_after_a_restart(store):
    from slurm_ext.repair.flow import advance
    record = _approved(store, action="remove")
    started = []
    seen = _seen(store, [_drained("n1")], started=started)
    advance(record, seen)  # drain, jobs none, the executor started on a thread
    assert started == [("remove", "n1")] and record.step == "act"
    advance(record, seen)  # its outcome, saved: removed, left drained
    assert record.state == "done" and seen.actions == {} and not any(c[0] == "resume" for c in seen.slurm.calls)
    again = _approved(store, "n2", action="reprovision")
    again.state, again.step, again.detail = "running", "act", {"acted_at": 1.0, "reason": "slurm-ext: repair x"}
    restarted = []
    seen = _seen(store, [_drained("n2", "slurm-ext: repair x")], started=restarted)
    advance(again, seen)  # a new service, no future for it: the outcome is unknown
    assert restarted == [] and again.state == "failed" and "not run twice" in again.note


def test_a_dry_run_records_every_step_and_touches_nothing(store):
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    seen = _seen(store, [_drained("n1")], RepairSection(dry_run=True))
    advance(record, seen)
    assert record.state == "done" and record.detail["dry_run"] and seen.slurm.calls == []
    assert [e.message.split(":")[0] for e in store.events(record=record.id)] == [
        "reboot started (approved by alice) as a dry run", "dry run", "dry run", "dry run"]


def test_checks_that_still_fail_after_the_reboot_fail_the_repair(store):
    from slurm_ext.repair.flow import advance
    record = _approved(store)
    record.state, record.step = "running", "verify"
    record.detail = {"reason": "slurm-ext: repair reboot: x (approved by alice)", "back_at": 1.0, "first_reading": 5.0}
    record.detail["verify_boot"] = "boot-1"
    bad = _health(6.0, [{"check": "xid", "evidence": "79 gpu 1", "severity": "critical"},
                        {"check": "temperature", "evidence": "90C (expected 85C)", "severity": "warning"}])
    seen = _seen(store, [_drained("n1", record.detail["reason"])], health=lambda node: bad)
    advance(record, seen)
    assert record.state == "failed" and "health checks fail after the repair: xid 79 gpu 1" in record.note


def test_a_node_that_never_comes_back_fails_at_the_boot_timeout_or_at_slurms_own_word(store):
    from datetime import datetime, timezone
    from slurm_ext.repair.flow import advance
    boot = datetime(2026, 1, 1, tzinfo=timezone.utc)
    reason = "slurm-ext: repair reboot: xid/79 79 gpu 1 (approved by alice)"
    for node_reason, waits, why in ((reason + " : reboot issued", True, "repair.boot_timeout"),
                                    (reason + " : reboot issued : reboot timed out", False, "ResumeTimeout")):
        record = _approved(store)
        record.state, record.step = "running", "wait-boot"
        record.detail = {"reason": reason, "acted_at": 2000.0, "boot_before": boot.timestamp()}
        node = replace(_node("n1", "DOWN", {"DRAIN", "REBOOT_ISSUED"}, node_reason), boot_time=boot)
        advance(record, _seen(store, [node], now=2010.0))
        assert record.state == ("running" if waits else "failed")  # within its time, unless Slurm gave up
        advance(record, _seen(store, [node], now=2000.0 + 901))
        assert record.state == "failed" and why in record.note, record.note


def test_an_approval_made_while_a_pass_reads_the_cluster_comes_before_its_first_step(store, tmp_path):
    """The service's pass read the cluster, an operator approved meanwhile, the pass then took the repair up: the
    history must show the approval before the drain it led to (a CI failure: the steps carried the pass's start)."""
    from slurm_ext.repair.service import Service
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n')
    with store.locked():
        record = store.add(Record("n1", "xid/79", "reboot", "79 gpu 1 GPU has fallen off the bus",
                                  opened=1.0, updated=1.0))

    class Slurm(_Slurm):
        def nodes(self):
            return [_drained("n1")]

        def jobs(self):  # the operator's approval lands while the pass reads Slurm
            time.sleep(0.01)
            decide.approve(store, "n1", "alice", RepairSection(), 1)
            return []
    service = Service(config.load(path), str(path), store=store)
    service.slurm = Slurm()
    service.run_pass()
    events = store.events(record=record.id)
    assert [e.event for e in events][:2] == ["repair-approved", "repair-step"], events
    assert [e.time for e in events] == sorted(e.time for e in events), events


# -- the history in the order things happened ----------------------------------------------------------------------

class _Ticking:
    """A clock that moves on by `step` every time it is read, as time does between the flow's steps."""

    def __init__(self, start: float, step: float = 0.05):
        self.now, self.step = start, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_each_step_is_stamped_when_it_happens_and_an_action_before_it_runs(store):
    """One pass of a reboot repair: its steps stamped one after the other, each action stamped before it ran and
    saying what it did (a CI failure: every step of a pass carried one time, taken before the slowest of them)."""
    from datetime import datetime, timezone
    from slurm_ext.repair.flow import advance
    clock = _Ticking(877.0)

    class Slurm(_Slurm):  # each call says when it ran
        def drain(self, node, reason):
            self.calls.append(("drain", clock()))

        def reboot(self, node, action=""):
            self.calls.append(("reboot", clock()))

        def resume(self, node):
            self.calls.append(("resume", clock()))
            return True
    record = _approved(store)
    seen = _seen(store, [replace(_drained("n1"), boot_time=datetime(2026, 1, 1, tzinfo=timezone.utc))], now=clock)
    seen.slurm = Slurm()
    advance(record, seen)
    booted = replace(_drained("n1", record.detail["reason"]), boot_time=datetime(2026, 6, 1, tzinfo=timezone.utc))
    readings = iter([_health(50.0), _health(51.0)])
    later = _seen(store, [booted], health=lambda node: next(readings), now=clock)
    later.slurm = seen.slurm
    advance(record, later)
    advance(record, later)
    events = store.events(record=record.id)
    assert [(e.message.split(":")[0].split(" (")[0], e.acts) for e in events] == [
        ("reboot started", ""), ("drained n1", "drain"), ("the node's jobs have ended", ""),
        ("scontrol reboot n1", "reboot"), ("n1 is back", ""), ("n1's health checks pass after the reboot", ""),
        ("resumed n1", "resume")]
    times = [e.time for e in events]
    assert times == sorted(set(times)), events  # one moment each, in the order they happened
    ran = dict(seen.slurm.calls)
    stamped = {e.acts: e.time for e in events if e.acts}
    assert all(stamped[act] < ran[act] for act in ("drain", "reboot", "resume")), (stamped, ran)
    assert record.detail["acted_at"] == stamped["reboot"] and record.closed == stamped["resume"]


def _entry(time_, source, event, message="", acts="", node="n1"):
    from slurm_ext.repair.history import Entry
    return Entry(time_, node, source, event, message, acts=acts)


def _said(entries) -> list[str]:
    return [f"{e.source} {e.event}" + (f" {e.message}" if e.message else "") for e in entries]


def test_what_a_step_caused_in_its_second_comes_after_it_and_what_it_saw_before_it():
    """Slurm and the journals keep whole seconds: the DRAIN Slurm recorded when the last job ended (877.1) is seen by
    "jobs have ended" (877.2); Slurm's reboot and the agent's stop and start (877.3 to 877.9) follow `scontrol reboot`
    (877.25), though all of them read 877 (the issue's failure: they were listed before the step that caused them)."""
    from slurm_ext.repair.history import in_causal_order
    entries = [_entry(877.0, "slurm", "drain", "DRAIN"), _entry(877.0, "slurm", "end", "DRAIN over"),
               _entry(877.0, "slurm", "boot^", "BOOT^"), _entry(879.0, "slurm", "end", "BOOT^ over"),
               _entry(877.2, "repair", "repair-step", "jobs ended"),
               _entry(877.25, "repair", "repair-step", "scontrol reboot", "reboot"),
               _entry(878.6, "repair", "repair-step", "is back"),
               _entry(879.4, "repair", "repair-done", "resumed", "resume"),
               _entry(877.0, "agent", "supervisor/stop"), _entry(877.0, "agent", "supervisor/started"),
               _entry(878.0, "agent", "health/health-started"), _entry(879.0, "agent", "health/health-check-run"),
               _entry(877.0, "slurm", "boot^", "BOOT^ of another node", node="n2")]
    ordered = in_causal_order(entries)
    assert _said(ordered) == [
        "slurm drain DRAIN", "slurm boot^ BOOT^ of another node", "repair repair-step jobs ended",
        "repair repair-step scontrol reboot", "slurm end DRAIN over", "slurm boot^ BOOT^", "agent supervisor/stop",
        "agent supervisor/started", "agent health/health-started", "repair repair-step is back",
        "agent health/health-check-run", "repair repair-done resumed", "slurm end BOOT^ over"]
    assert [e.time for e in ordered] == sorted(e.time for e in ordered)
    moved = {e.message or e.event: e.time for e in ordered if e.source != "repair" and not e.time.is_integer()}
    assert moved == {"DRAIN over": pytest.approx(877.25), "BOOT^": pytest.approx(877.25),
                     "supervisor/stop": pytest.approx(877.25), "supervisor/started": pytest.approx(877.25),
                     "BOOT^ over": pytest.approx(879.4)}  # each just after its cause, inside its own second
    assert all(877.25 < t < 877.26 for m, t in moved.items() if m != "BOOT^ over")


def test_a_drain_of_an_idle_node_comes_before_slurms_drain_and_old_rows_move_nothing():
    from slurm_ext.repair.history import in_causal_order
    drained = [_entry(866.0, "agent", "nodestate/drain", "health drain"),
               _entry(866.5, "repair", "repair-recommended"), _entry(867.7, "repair", "repair-step", "drained", "drain"),
               _entry(867.0, "slurm", "end", "health DRAIN over"), _entry(867.0, "slurm", "drain", "repair DRAIN"),
               _entry(867.0, "agent", "nodestate/drain-overridden"), _entry(867.0, "agent", "health/health-finding")]
    assert _said(in_causal_order(drained)) == [
        "agent nodestate/drain health drain", "repair repair-recommended", "agent health/health-finding",
        "repair repair-step drained", "slurm end health DRAIN over", "slurm drain repair DRAIN",
        "agent nodestate/drain-overridden"]
    old = [_entry(877.2, "repair", "repair-step", "scontrol reboot"), _entry(877.0, "slurm", "boot^", "BOOT^")]
    assert _said(in_causal_order(old)) == ["slurm boot^ BOOT^", "repair repair-step scontrol reboot"]


def _collected(store, tmp_path: Path, node: str, journal: str) -> None:
    """`journal` as node `node`'s journal, taken into `store` the way the controller does it: the agents' own HTTP
    server (supervisor.http, its credential guard and GET /journal) on 127.0.0.1, asked by the collector's single
    pass (`slurm-ext repair collect --once`)."""
    from types import SimpleNamespace
    from slurm_ext.agentapi import AgentClient, create_credential
    from slurm_ext.config import section_class
    from slurm_ext.repair.collector import Collector
    from slurm_ext.supervisor.http import Guard, ProbeServer, journal_answer
    from slurm_ext.supervisor.later import AnswerWorker
    credential, boot, state = tmp_path / "agent-credential", tmp_path / "boot_id", tmp_path / f"state-{node}"
    create_credential(credential)
    boot.write_text("boot-1\n")
    state.mkdir()
    (state / "journal.jsonl").write_text(journal)
    agent = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(
        agent_credential=str(credential), slurm_name=node, boot_id_file=str(boot))))
    guard, reader = Guard(agent), AnswerWorker("http-journal")
    server = ProbeServer("127.0.0.1", 0, lambda target, headers: guard.guarded(
        "GET", target, headers, lambda: journal_answer(str(state), target.partition("?")[2], reader))).start()

    class Nodes:
        def nodes(self):
            return [_node(node)]
    try:
        config = SimpleNamespace(history=section_class("history")(), node=SimpleNamespace(state_dir=str(tmp_path)))
        figures = Collector(config, store, AgentClient(str(credential), 9810, {node: f"127.0.0.1:{server.address[1]}"},
                                                       5.0), Nodes(), lambda *args, **kwargs: None).once()
    finally:
        server.close()
    assert (figures.failures, figures.events) == (0, journal.count("\n"))


def test_history_merges_slurm_the_journal_and_the_steps_of_one_pass_in_causal_order(store, tmp_path):
    """The issue's case end to end on literal sources: the flow's pass on a real store, Slurm's event table as
    sacctmgr gives it, the node's journal over HTTP, merged by `history`."""
    from datetime import datetime, timezone
    from slurm_ext.repair.flow import advance
    from slurm_ext.repair.history import gather
    from slurm_ext.slurm import NodeEvent
    record = _approved(store)
    reason = "slurm-ext: repair reboot: xid/79 79 gpu 1 (approved by alice)"
    record.state, record.step, record.detail = "running", "wait-jobs", {"reason": reason, "drained_at": 860.0}
    start = datetime.fromtimestamp(877.0, timezone.utc).astimezone()  # the job ended at 877.1, the pass ran at 877.2
    advance(record, _seen(store, [_drained("n1", reason)], now=_Ticking(877.15)))
    journal = "".join(json.dumps({"time": start.strftime("%Y-%m-%dT%H:%M:%S%z"), "component": "supervisor",
                                  "event": event, "message": event}) + "\n" for event in ("stop", "started"))


    class Slurm:
        def node_events(self, node, since):
            return [NodeEvent("n1", start, start, "DRAIN", reason, "root"),
                    NodeEvent("n1", start, None, "BOOT^", reason + " : reboot issued", "root")]

    _collected(store, tmp_path, "n1", journal)
    timeline = gather(store, Slurm(), 800.0, node="n1")
    assert timeline.unreachable == {}
    assert [(e.source, e.event, e.message.split(":")[0]) for e in timeline.entries] == [
        ("slurm", "drain", "DRAIN"), ("repair", "repair-step", "the node's jobs have ended"),
        ("repair", "repair-step", "scontrol reboot n1"), ("slurm", "end", "DRAIN over"), ("slurm", "boot^", "BOOT^"),
        ("agent", "supervisor/stop", "stop"), ("agent", "supervisor/started", "started")]
    assert [e.time for e in timeline.entries] == sorted(e.time for e in timeline.entries)
    assert timeline.entries[2].acts == "reboot"


def test_history_shows_the_escape_sequences_a_script_printed_escaped(running_cluster):
    """Issue 28.9: a job-end script's last line of output is in its script-failed event, in the node's journal;
    `slurm-ext history` printed it raw, so its escape sequences retitled and cleared the operator's terminal. The
    real CLI now escapes them as `slurm-ext events` does."""
    cluster = running_cluster
    hook = script(cluster.layout.etc / "worker" / "job-end.d", "50-escapes",
                  "#!/bin/sh\nprintf 'scratch check \\033]0;pwned\\007\\033[2J failed\\n'\nexit 1\n")
    try:
        job = cluster.sbatch("--wrap", "true")

        def history():
            done = cli("--config", str(cluster.layout.slurm_ext_conf), "history", "--node", cluster.node, "--since",
                       "10m")
            assert done.returncode == 0, done.stderr
            return done.stdout if f"job-end script {hook}" in done.stdout else None
        shown = wait_for(f"job {job}'s job-end script in the history", history, 120, interval=1.0)
    finally:
        hook.unlink()
    line = next(line for line in shown.splitlines() if f"job-end script {hook}" in line)
    assert "scratch check \\x1b]0;pwned\\x07\\x1b[2J failed" in line, line
    assert not set(shown) & {"\x1b", "\x07"}, shown


def test_a_history_written_before_steps_said_what_they_did_opens_and_reads(tmp_path):
    import sqlite3
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE repair_events (id INTEGER PRIMARY KEY AUTOINCREMENT, time DOUBLE NOT NULL, node "
                    "VARCHAR(255) NOT NULL, event VARCHAR(64) NOT NULL, message TEXT NOT NULL, user VARCHAR(255) "
                    "NOT NULL, record BIGINT)")
        old.execute("INSERT INTO repair_events (time, node, event, message, user, record) VALUES "
                    "(5.0, 'n1', 'repair-step', 'scontrol reboot n1', 'alice', 1)")
    opened, again = open_sqlite(str(path)), open_sqlite(str(path))
    try:
        with opened.locked():
            opened.event("n1", "repair-done", "resumed n1", "alice", now=6.0, acts="resume")
        assert [(e.message, e.acts) for e in again.events(node="n1")] == [("scontrol reboot n1", ""),
                                                                          ("resumed n1", "resume")]
    finally:
        opened.close()
        again.close()


def test_held_findings_are_the_critical_ones_as_our_drain_would_state_them():
    from slurm_ext.repair.status import held
    findings = [{"check": "xid", "evidence": "48 gpu 3 double-bit ECC error", "action": "reset-gpu",
                 "severity": "critical"},
                {"check": "temperature", "evidence": "gpu 1 at 86C (expected under 85C)", "action": "failover",
                 "severity": "warning"}, "junk"]
    assert held(findings) == ["xid 48 gpu 3 double-bit ECC error action=reset-gpu"]
    assert held(None) == []


def test_history_entries_carry_the_signature_check_gpu_and_severity_of_their_finding(store, tmp_path):
    """Issue 29 item 7: `history --json` had no severity, check, GPU or signature: a script could not tell which
    fault a repair was for without parsing its message. A repair's rows carry its record's (the finding that opened
    it: a health drain, which only a critical finding makes), a node's health events their finding's."""
    from datetime import datetime, timezone
    from slurm_ext.repair.history import gather
    with store.locked():
        record = store.add(Record("n1", "xid/79", "reboot", "79 gpu 1 GPU has fallen off the bus", opened=900.0,
                                  updated=900.0, detail={"gpu": 1}))
        store.event("n1", "repair-recommended", "reboot recommended for xid/79", record=record, now=900.5)
        store.event("n1", "health-check-run", "health checks asked from the page by carol", "carol", now=901.5)
    finding = {"time": datetime.fromtimestamp(899.0, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
               "component": "health", "event": "health-finding", "severity": "critical", "message": "critical: xid",
               "check": "xid", "evidence": "79 gpu 1 GPU has fallen off the bus", "gpu": 1, "finding_severity": "critical",
               "xid": 79}
    journal = json.dumps(finding) + "\n"

    class Slurm:
        def node_events(self, node, since):
            return []

    _collected(store, tmp_path, "n1", journal)
    timeline = gather(store, Slurm(), 800.0, node="n1")
    rows = {e.event: e for e in timeline.entries}
    recommended = rows["repair-recommended"]
    assert (recommended.record, recommended.signature, recommended.check, recommended.gpu, recommended.severity) == (
        record.id, "xid/79", "xid", 1, "critical")
    seen = rows["health/health-finding"]
    assert (seen.signature, seen.check, seen.gpu, seen.severity) == ("xid/79", "xid", 1, "critical")
    paused = rows["health-check-run"]
    assert (paused.record, paused.signature, paused.check, paused.gpu, paused.severity) == (None, "", "", None, "")


def _as_nobody(call) -> str:
    """What `call()` raised, run by user nobody in a forked child ("" when it returned)."""
    import os
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        said = b""
        try:
            os.setgid(65534)
            os.setuid(65534)
            call()
        except BaseException as err:
            said = f"{type(err).__name__}: {err}".encode()
        finally:
            os.write(write_end, said)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.mark.parametrize("folder", [0o755, 0o700])
def test_the_page_refused_by_roots_sqlite_history_is_told_what_to_do(folder):
    """Seen on the images' cluster: the page (web.user) cannot open the repair service's SQLite file (root's, 600);
    in a folder it may enter or not, its error names the file, the user and the two ways out, never a crash or only
    "unable to open"."""
    import os
    import shutil
    import tempfile
    from slurm_ext.config import Config
    from slurm_ext.repair.store import open_store
    if os.geteuid() != 0:
        pytest.fail("run as root (the README's test command does): the test opens root's file as nobody")
    top = Path(tempfile.mkdtemp(prefix="slurm-ext-page-store-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "repair").mkdir(mode=folder)
        (top / "repair").chmod(folder)
        path = top / "repair" / "repair.db"
        settings = Config(repair=RepairSection(database="sqlite", sqlite_file=str(path)))
        open_store(settings, role="repair").close()  # the service makes it, as root: 600
        said = _as_nobody(lambda: open_store(settings, create=False, role="page"))
    finally:
        shutil.rmtree(top)
    assert said.startswith(f"StoreError: repair database {path}: cannot open it: "), said
    assert "the page runs as web.user" in said and 'repair.database = "mariadb"' in said, said

"""The repair notifier against a real webhook: an http.server on 127.0.0.1 in this process, real files, a real SQLite
repair store, raw sockets for what is not HTTP. Each notice is posted once in either format, a 500 is tried again, a
webhook that is down, never answers, answers something not HTTP or redirects costs retries and a counted drop (never
the caller's time nor the thread), a full queue drops its oldest waiting (never the one being posted), a restarted
or replaced notifier posts nothing twice, a drained node's journal is read on from where the last read ended, and
a URL file others can read, or holding a control character, is refused with the file named and the URL never
said."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from slurm_ext.repair import notify, webhook
from slurm_ext.repair.metrics import families, write_figures
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.repair.webhook import Notice, NotifyUrlError

from helpers.wait import wait_for


class Webhook:
    """A webhook on 127.0.0.1: records every body; `answers` is the list of statuses to give, the last repeated;
    status 0 never answers (holds the connection until the test ends), -200 holds it until `release`, then 200."""

    def __init__(self, answers=(200,)):
        self.bodies: list = []
        self.answers = list(answers)
        self.tries = 0
        self.release = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.tries += 1
                status = hook.answers.pop(0) if len(hook.answers) > 1 else hook.answers[0]
                if status <= 0:
                    hook.release.wait(30)
                    if status == 0:
                        return
                    status = -status
                if status < 300:
                    hook.bodies.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    made = []

    def make(answers=(200,)):
        made.append(Webhook(answers))
        return made[-1]
    yield make
    for hook in made:
        hook.close()


def url_file(tmp_path: Path, url: str, mode: int = 0o600) -> str:
    path = tmp_path / "webhook-url"
    path.write_text(url + "\n")
    path.chmod(mode)
    return str(path)


class Events:
    def __init__(self):
        self.said: list[tuple] = []

    def __call__(self, event, message, severity=None, **fields):
        self.said.append((event, message, severity, fields))

    def named(self, name):
        return [s for s in self.said if s[0] == name]


def notifier(tmp_path, url, form="slack", queue=100, retries=3, backoff=0.05, timeout=1.0, emit=None):
    sent = notify.Sent(tmp_path / notify.SENT_FILE)
    return notify.Notifier(url_file(tmp_path, url), form, queue, retries, backoff, timeout, sent, emit or Events())


def notice(number: int, event="repair-recommended", node="node1") -> Notice:
    return Notice(f"repair:{number}", event, node, f"reboot recommended for xid/79: {number}",
                  notify.NOTIFIED_EVENTS.get(event, "critical"), 1767225600.0 + number, {"user": "alice"})


def test_each_notice_is_posted_once_as_slacks_text(tmp_path, hooks):
    hook = hooks()
    sender = notifier(tmp_path, hook.url)
    sender.put([notice(1), notice(2, "repair-approved"), notice(2, "repair-approved")])  # the repeat: once
    wait_for("two posts", lambda: len(hook.bodies) == 2, timeout=10)
    sender.stop()
    assert hook.bodies == [
        {"text": "slurm-ext warning: node node1: repair-recommended: reboot recommended for xid/79: 1"},
        {"text": "slurm-ext info: node node1: repair-approved: reboot recommended for xid/79: 2"}]
    assert sender.figures() == {"posted": 2, "retried": 0, "dropped": 0, "failed": 0, "queue": 0}


def test_alertmanager_gets_a_list_of_alerts_each_with_labels_of_its_own(tmp_path, hooks):
    hook = hooks()
    sender = notifier(tmp_path, hook.url, form="alertmanager")
    sender.put([notice(7, "repair-failed", node="gpu-a1")])
    wait_for("one post", lambda: hook.bodies, timeout=10)
    sender.stop()
    [[alert]] = hook.bodies
    assert alert["labels"] == {"alertname": "SlurmExtRepairFailed", "severity": "critical", "node": "gpu-a1",
                               "event": "repair-failed", "slurm_ext_key": "repair:7", "user": "alice"}
    assert alert["annotations"] == {"summary": "node gpu-a1: repair-failed",
                                    "description": "reboot recommended for xid/79: 7"}
    assert alert["startsAt"] == "2026-01-01T00:00:07Z"


def test_a_500_is_tried_again_and_the_retry_is_counted(tmp_path, hooks):
    hook = hooks(answers=(500, 200))
    sender = notifier(tmp_path, hook.url)
    sender.put([notice(1)])
    wait_for("the retry's post", lambda: hook.bodies, timeout=10)
    sender.stop()
    assert hook.tries == 2 and len(hook.bodies) == 1
    assert sender.figures()["retried"] == 1 and sender.figures()["failed"] == 0


def _refusing_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again: connections are refused


@pytest.mark.parametrize("down", ["refused", "never-answers"])
def test_a_webhook_that_is_down_costs_retries_and_a_counted_drop_never_the_callers_time(tmp_path, hooks, down):
    if down == "refused":
        url = f"http://127.0.0.1:{_refusing_port()}/hook"
    else:
        url = hooks(answers=(0,)).url
    said = Events()
    sender = notifier(tmp_path, url, retries=2, backoff=0.05, timeout=0.5, emit=said)
    started = time.monotonic()
    sender.put([notice(1), notice(2)])
    assert time.monotonic() - started < 0.1  # put never waits for the webhook
    wait_for("both given up", lambda: sender.figures()["failed"] == 2, timeout=20)
    sender.stop()
    assert sender.figures() == {"posted": 0, "retried": 4, "dropped": 0, "failed": 2, "queue": 0}
    [first, second] = said.named("repair-notify-failed")
    assert "3 tries" in first[1] and first[2] == "error" and first[3]["node"] == "node1"
    assert "127.0.0.1" not in first[1]  # the URL is a secret: never in the journal


def test_a_full_queue_drops_its_oldest_queued_never_the_one_being_posted_and_says_it_once(tmp_path, hooks):
    hook = hooks(answers=(-200,))  # holds the first post: the queue fills behind it
    said = Events()
    sender = notifier(tmp_path, hook.url, queue=2, retries=0, timeout=5.0, emit=said)
    sender.put([notice(1)])
    wait_for("the first post under way", lambda: hook.tries == 1, timeout=10)
    sender.put([notice(2), notice(3), notice(4)])  # 1 posting; 2, 3 queued; 4 drops 2, the oldest queued
    assert sender.figures()["dropped"] == 1 and sender.waiting == 2
    assert len(said.named("repair-notify-dropped")) == 1
    assert "repair.notify_queue 2" in said.named("repair-notify-dropped")[0][1]
    hook.release.set()
    wait_for("1, 3 and 4 posted", lambda: len(hook.bodies) == 3, timeout=10)
    sender.stop()
    assert [b["text"].rsplit(": ", 1)[1] for b in hook.bodies] == ["1", "3", "4"]
    assert sender.figures() == {"posted": 3, "retried": 0, "dropped": 1, "failed": 0, "queue": 0}


def test_a_restarted_notifier_posts_nothing_twice(tmp_path, hooks):
    hook = hooks()
    sender = notifier(tmp_path, hook.url)
    sender.put([notice(1), notice(2)])
    wait_for("two posts", lambda: len(hook.bodies) == 2, timeout=10)
    sender.stop()
    store = open_sqlite(str(tmp_path / "repair.db"))
    for number in range(1, 5):
        store.event("node1", "repair-recommended", f"recommended {number}")
    store.event("node1", "repair-step", "not posted")
    again = notify.Sent(tmp_path / notify.SENT_FILE)
    assert again.repair_id == 2
    notices = notify.repair_notices(store, again.repair_id)
    assert [n.key for n in notices] == ["repair:3", "repair:4"]  # 1 and 2 were posted before the restart


def test_a_url_file_others_can_read_is_refused_naming_the_file_and_the_fix(tmp_path):
    path = url_file(tmp_path, "http://127.0.0.1:9/hook", mode=0o644)
    with pytest.raises(NotifyUrlError) as refused:
        webhook.read_url(path)
    assert str(refused.value) == (f"{path} (repair.notify_url_file): mode 0644 lets others read or change it "
                                  f"(expected 0600 or 0400: chmod 600 {path}): whoever reads the URL can post to the "
                                  "channel")
    link = tmp_path / "link"
    os.chmod(path, 0o600)
    link.symlink_to(path)
    with pytest.raises(NotifyUrlError, match="cannot read it"):
        webhook.read_url(str(link))
    Path(path).write_text("not a url\n")
    with pytest.raises(NotifyUrlError, match="does not hold one http"):
        webhook.read_url(path)


def test_the_figures_become_metrics_with_the_age_of_each_recommendation(tmp_path):
    waiting = Record("node3", "xid/79", "reboot", "GPU has fallen off the bus", opened=1000.0)
    write_figures(str(tmp_path), 1500.0, [waiting], {"posted": 3, "retried": 1, "dropped": 2, "failed": 1,
                                                     "queue": 0})
    found = {f.name: f for f in families(str(tmp_path), now=2900.0)}
    [age] = found["slurm_ext_repair_awaiting_approval_seconds"].samples
    assert age.labels == {"hostname": "node3", "signature": "xid/79", "action": "reboot"} and age.value == 1900.0
    assert {s.labels["why"]: s.value for s in found["slurm_ext_repair_notify_dropped"].samples
            if s.name.endswith("_total")} == {"queue-full": 2, "failed": 1}
    assert found["slurm_ext_repair_pass_timestamp_seconds"].samples[0].value == 1500.0


def _journal(state_dir: Path) -> list[dict]:
    from slurm_ext import events
    path = events.journal_path(str(state_dir))
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_service_refuses_a_url_file_others_can_read_says_so_once_and_starts_once_it_is_fixed(tmp_path, hooks):
    """The repair service itself: a URL file of mode 0644 is an error event naming the file and the fix, said once
    over passes, the service going on without a notifier; once the file is 0600 the next pass starts it, and it
    posts the store's new repair events (none from before its first start)."""
    from slurm_ext import config
    from slurm_ext.repair.service import Service
    hook = hooks()
    state = tmp_path / "state"
    state.mkdir()
    path = url_file(tmp_path, hook.url, mode=0o644)
    conf = tmp_path / "slurm-ext.toml"
    conf.write_text(f'[node]\nstate_dir = "{state}"\n[repair]\nnotify_url_file = "{path}"\n'
                    'notify_backoff = "50ms"\n')
    store = open_sqlite(str(tmp_path / "repair.db"))
    store.event("n1", "repair-recommended", "from before the notifier: never posted")
    service = Service(config.load(str(conf)), str(conf), store=store)
    service._start_notifier()
    service._notify()
    service._notify()
    refused = [e for e in _journal(state) if e["event"] == "repair-notify-failed"]
    assert len(refused) == 1 and service.notifier is None
    assert f"{path} (repair.notify_url_file): mode 0644 lets others read or change it" in refused[0]["message"]
    assert f"chmod 600 {path}" in refused[0]["message"] and refused[0]["severity"] == "error"

    os.chmod(path, 0o600)
    service._notify()  # the next pass: the notifier starts
    assert service.notifier is not None
    with store.locked():
        store.event("n1", "repair-approved", "reboot approved by alice")
        store.event("n1", "repair-step", "drained n1")  # not a notice
        store.event("n1", "repair-failed", "reboot of n1 failed at wait-boot")
    service._notify()
    wait_for("two posts", lambda: len(hook.bodies) == 2, timeout=10)
    service._stop_notifier()
    assert [b["text"] for b in hook.bodies] == [
        "slurm-ext info: node n1: repair-approved: reboot approved by alice",
        "slurm-ext critical: node n1: repair-failed: reboot of n1 failed at wait-boot"]
    store.close()


# -- the review's findings (issue 29 item 5) ---------------------------------------------------------------------

SECRET = "/hooks/T0KEN-SECRET"


class RawAnswer:
    """A "webhook" on 127.0.0.1 that answers every connection with `answer` bytes and closes it: a wrong port, an
    SSH server, a load balancer speaking something else."""

    def __init__(self, answer: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.hits = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}{SECRET}"
        threading.Thread(target=self._serve, args=(answer,), daemon=True).start()

    def _serve(self, answer):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.hits += 1
                conn.sendall(answer)

    def close(self):
        self.sock.close()


def test_a_webhook_answering_something_not_http_costs_retries_and_the_thread_lives_on(tmp_path):
    raw = RawAnswer(b"SSH-2.0-OpenSSH_9.2\r\n")
    said = Events()
    sender = notifier(tmp_path, raw.url, retries=1, backoff=0.01, emit=said)
    sender.put([notice(1), notice(2)])
    wait_for("both given up", lambda: sender.figures()["failed"] == 2, timeout=20)
    assert sender._thread.is_alive()
    sender.put([notice(3)])
    wait_for("the third given up too", lambda: sender.figures()["failed"] == 3, timeout=20)
    sender.stop()
    raw.close()
    assert raw.hits == 6 and sender.figures()["posted"] == 0
    [first, *_] = said.named("repair-notify-failed")
    assert "BadStatusLine" in first[1] and SECRET not in first[1]


def test_an_unexpected_error_in_either_thread_is_counted_said_once_and_the_thread_lives_on(tmp_path, caplog):
    said = Events()
    posted = []

    def post(url, body, timeout):
        if len(posted) < 2:
            posted.append(None)
            raise KeyError("a bug in a post")
        posted.append(body)
        return 200
    sent = notify.Sent(tmp_path / notify.SENT_FILE)
    sender = notify.Notifier(url_file(tmp_path, "http://127.0.0.1:9/h"), "slack", 10, 0, 0.01, 1.0, sent, said,
                             post=post)
    sender.put([notice(1), notice(2), notice(3)])
    wait_for("the third posted", lambda: len(posted) == 3, timeout=10)
    assert sender._thread.is_alive() and sender.figures()["failed"] == 2 and sender.figures()["posted"] == 1
    crashed = [s for s in said.named("repair-notify-failed") if "KeyError" in s[1]]
    assert len(crashed) == 1, said.said

    class Agents:
        calls = 0

        def events(self, node, addr="", since=0.0, limit=None, timeout=None):
            Agents.calls += 1
            raise ZeroDivisionError("a bug in a read")
    feed = notify.HealthFeed(sender, Agents(), sent, time.time())
    for _ in range(3):
        feed.watch({"n1": ""})
        calls = Agents.calls
        wait_for("a read", lambda: Agents.calls > calls, timeout=10)
    assert feed._thread.is_alive() and feed.failed >= 2
    assert len([s for s in said.said if "ZeroDivisionError" in s[1]]) == 1
    feed.stop()
    sender.stop()


@pytest.mark.parametrize("bad", ["\x7f", "\x01", "\t", "\x00"])
def test_a_url_with_a_control_character_is_refused_without_the_url_in_the_message(tmp_path, bad):
    path = tmp_path / "webhook-url"
    path.write_bytes(f"http://127.0.0.1:9{SECRET}{bad}x\n".encode())
    path.chmod(0o600)
    with pytest.raises(NotifyUrlError) as refused:
        webhook.read_url(str(path))
    assert SECRET not in str(refused.value) and "T0KEN" not in str(refused.value)


def test_a_url_without_a_host_is_refused(tmp_path):
    for text in ("http:///hooks/x", "https://:443/x", "ftp://127.0.0.1/x"):
        with pytest.raises(NotifyUrlError, match="does not hold one http"):
            webhook.read_url(url_file(tmp_path, text))


def test_no_failure_kind_puts_the_secret_url_in_an_event_or_the_log(tmp_path, hooks, caplog):
    import logging
    caplog.set_level(logging.DEBUG)
    said = Events()
    kinds = {"refused": f"http://127.0.0.1:{_refusing_port()}{SECRET}",
             "not-http": RawAnswer(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n").url,
             "garbage": RawAnswer(b"\x00\x01garbage\r\n\r\n").url,
             "500": hooks(answers=(500,)).url.replace("/hook", SECRET),
             "redirect": _Redirecting().url}
    for kind, url in kinds.items():
        (tmp_path / kind).mkdir()
        sender = notifier(tmp_path / kind, url, retries=1, backoff=0.01, timeout=2.0, emit=said)
        sender.put([notice(1)])
        wait_for(f"{kind}: given up", lambda: sender.figures()["failed"] == 1, timeout=20)
        sender.stop()
    assert len(said.named("repair-notify-failed")) == len(kinds)
    for event in said.said:
        assert SECRET not in json.dumps(event) and "T0KEN" not in json.dumps(event), event
    assert "T0KEN" not in caplog.text


class _Redirecting:
    """A webhook that answers every POST with a 301 to /moved and counts the GETs a client following it sends."""

    def __init__(self, code=301):
        self.gets = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(code)
                self.send_header("Location", "/moved")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                hook.gets.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("code", [301, 302, 303, 307])
def test_a_redirecting_webhook_is_a_failure_naming_the_redirect_never_a_post_counted_as_done(tmp_path, code):
    hook = _Redirecting(code)
    said = Events()
    sender = notifier(tmp_path, hook.url, retries=0, emit=said)
    sender.put([notice(1, "repair-failed")])
    wait_for("given up", lambda: sender.figures()["failed"] == 1, timeout=10)
    sender.stop()
    hook.server.shutdown()
    assert hook.gets == [] and sender.figures()["posted"] == 0
    [failed] = said.named("repair-notify-failed")
    assert f"the webhook answered HTTP {code}: a redirect, not followed (fix the URL)" in failed[1]


def test_slacks_text_escapes_what_slack_reads_as_markup():
    body = json.loads(webhook.body_of(Notice("health:n1:1.0:d", "health-finding", "n1",
                                             "<!channel> xid & <@U123> <http://x|y>", "critical", 1.0), "slack"))
    assert body["text"] == ("slurm-ext critical: node n1: health-finding: "
                            "&lt;!channel&gt; xid &amp; &lt;@U123&gt; &lt;http://x|y&gt;")


def test_the_keys_kept_are_only_those_queued_or_in_flight(tmp_path, hooks):
    hook = hooks()
    sender = notifier(tmp_path, hook.url)
    sender.put([notice(n) for n in range(1, 51)])
    wait_for("fifty posts", lambda: len(hook.bodies) == 50, timeout=20)
    sender.stop()
    assert sender._keys == set()


def test_a_stopped_notifier_whose_post_outlived_the_join_never_saves_over_the_new_ones(tmp_path, hooks):
    """A SIGHUP: the old notifier's post outlives stop()'s join; the new one started from the file and posted
    more. The old thread's late save would put its stale progress back (the new posts posted again)."""
    hook = hooks(answers=(-200,))  # holds the post until released, then 200
    old = notifier(tmp_path, hook.url, timeout=10.0)
    old.put([notice(1)])
    wait_for("the post under way", lambda: hook.tries == 1, timeout=10)
    old.stop(timeout=0.1)
    assert old._thread.is_alive()
    new = notify.Sent(tmp_path / notify.SENT_FILE)
    new.repair_id = 5
    new.save()
    hook.release.set()
    old._thread.join(10)
    assert notify.Sent(tmp_path / notify.SENT_FILE).repair_id == 5


class _Journal:
    """Agents whose one node's journal is `lines` (critical findings or not): records each `since` asked."""

    def __init__(self):
        self.lines: list[str] = []
        self.asked: list[float] = []

    def add(self, when: float, event="health-check", severity="info", message="ok"):
        from datetime import datetime, timezone
        self.lines.append(json.dumps({"time": datetime.fromtimestamp(when, timezone.utc).isoformat(),
                                      "event": event, "component": "health", "message": message,
                                      "severity": severity, "finding_severity": severity, "check": "xid"}))

    def events(self, node, addr="", since=0.0, limit=None, timeout=None):
        from slurm_ext.agentapi import EventsPage
        self.asked.append(since)
        whole_since = float(f"{since:.0f}")  # as the agent is asked: whole seconds
        from datetime import datetime
        body = "\n".join(line for line in self.lines
                         if datetime.fromisoformat(json.loads(line)["time"]).timestamp() >= whole_since)
        return EventsPage.of(node, "b", body)


def test_each_pass_reads_a_drained_nodes_journal_from_where_the_last_read_ended(tmp_path, hooks):
    hook = hooks()
    month_ago = time.time() - 30 * 86400
    journal = _Journal()
    journal.add(month_ago + 10, "health-finding", "critical", "xid 79 gpu 1 GPU has fallen off the bus")
    for n in range(100):
        journal.add(month_ago + 100 + n)  # not critical: never posted, yet read
    sender = notifier(tmp_path, hook.url)
    sender.sent.started = month_ago
    feed = notify.HealthFeed(sender, journal, sender.sent, month_ago)

    def one_pass():
        asked = len(journal.asked)
        feed.watch({"n1": ""})
        wait_for("a read", lambda: len(journal.asked) > asked, timeout=10)
    one_pass()
    wait_for("the finding posted", lambda: len(hook.bodies) == 1, timeout=10)
    one_pass()
    one_pass()
    journal.add(month_ago + 500, "health-finding", "critical", "ecc gpu 2 double-bit ECC error")
    one_pass()
    wait_for("the second finding posted", lambda: len(hook.bodies) == 2, timeout=10)
    one_pass()
    feed.stop()
    sender.stop()
    assert journal.asked[0] <= month_ago
    assert all(since >= month_ago + 197 for since in journal.asked[2:4]), journal.asked  # not the month again
    assert journal.asked[-1] >= month_ago + 497, journal.asked
    assert [b["text"].rsplit(": ", 1)[1] for b in hook.bodies] == ["xid 79 gpu 1 GPU has fallen off the bus",
                                                                  "ecc gpu 2 double-bit ECC error"]
    # the cursor is kept with the rest: a restarted notifier reads on from it
    again = notify.Sent(tmp_path / notify.SENT_FILE)
    assert again.read_from("n1", month_ago) >= month_ago + 498  # the newest line read


def test_a_drained_node_whose_journal_has_nothing_new_is_not_read_from_a_month_back_again(tmp_path):
    month_ago = time.time() - 30 * 86400
    journal = _Journal()  # nothing in it since the notifier's first start
    sender = notifier(tmp_path, "http://127.0.0.1:9/h")
    feed = notify.HealthFeed(sender, journal, sender.sent, month_ago)
    for passes in (1, 2, 3):
        feed.watch({"n1": ""})
        wait_for("a read", lambda: len(journal.asked) == passes, timeout=10)
    feed.stop()
    sender.stop()
    assert journal.asked[0] <= month_ago
    assert all(since > time.time() - 3600 for since in journal.asked[1:]), journal.asked

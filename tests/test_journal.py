"""Reading the node journal (`slurm_ext.journal`, `slurm-ext events`): real files, the CLI as a child process."""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers.cli import cli
from slurm_ext import events
from slurm_ext.journal import (EventFilter, JournalEvent, follow_events, format_event, parse_since, read_events,
                               read_newest)

UTC = timezone.utc


def line(when: str, component: str, event: str, message: str, severity: str = "info", **fields) -> str:
    """A journal line as events.emit writes it, at a time the test chooses."""
    return json.dumps({"time": when, "component": component, "event": event, "severity": severity,
                       "message": message, **fields}) + "\n"


@pytest.fixture
def journal_dir(tmp_path) -> Path:
    """Three rotated files and the current one, each with events of its own hour of 2025-01-31 (UTC)."""
    (tmp_path / "journal.jsonl.3").write_text(
        line("2025-01-31T10:00:00+0000", "supervisor", "started", "agent up")
        + line("2025-01-31T10:30:00+0000", "gres", "gpu-new", "gpu A is new"))
    (tmp_path / "journal.jsonl.2").write_text(
        line("2025-01-31T11:00:00+0000", "supervisor", "crash-loop", "slurmd crash-looping", "error", worker="slurmd"))
    (tmp_path / "journal.jsonl.1").write_text(
        line("2025-01-31T12:00:00+0000", "prolog_epilog", "leftovers-cleaned", "killed 3", "warning", job="42"))
    (tmp_path / "journal.jsonl").write_text(
        line("2025-01-31T13:00:00+0100", "gres", "gpu-missing", "gpu B gone", "error")  # 12:00 UTC: another offset
        + line("2025-01-31T13:30:00+0000", "supervisor", "recovered", "slurmd fine"))
    return tmp_path


def names(found) -> list[str]:
    return [e.event for e in found]


def collect_bad_lines():
    bad = []
    return bad, lambda path, number, problem: bad.append((Path(path).name, number, problem))


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


def test_the_rotated_files_are_read_oldest_first(journal_dir):
    found = list(read_events(str(journal_dir)))
    assert names(found) == ["started", "gpu-new", "crash-loop", "leftovers-cleaned", "gpu-missing", "recovered"]
    crash = found[2]
    assert (crash.component, crash.severity, crash.message, crash.fields) == \
        ("supervisor", "error", "slurmd crash-looping", {"worker": "slurmd"})
    assert crash.time == datetime(2025, 1, 31, 11, tzinfo=UTC)
    assert json.loads(crash.line)["worker"] == "slurmd" and not crash.line.endswith("\n")


def test_since_keeps_events_at_or_after_the_time_whatever_their_offset(journal_dir):
    since = datetime(2025, 1, 31, 12, tzinfo=UTC)
    found = list(read_events(str(journal_dir), EventFilter(since=since)))
    assert names(found) == ["leftovers-cleaned", "gpu-missing", "recovered"]


def test_component_event_and_severity_filters(journal_dir):
    state = str(journal_dir)
    assert names(read_events(state, EventFilter(components=("gres",)))) == ["gpu-new", "gpu-missing"]
    assert names(read_events(state, EventFilter(components=("gres", "prolog_epilog")))) == \
        ["gpu-new", "leftovers-cleaned", "gpu-missing"]
    assert names(read_events(state, EventFilter(names=("recovered", "started")))) == ["started", "recovered"]
    assert names(read_events(state, EventFilter(severity="warning"))) == \
        ["crash-loop", "leftovers-cleaned", "gpu-missing"]
    assert names(read_events(state, EventFilter(severity="error", components=("gres",)))) == ["gpu-missing"]


def test_a_torn_last_line_and_foreign_lines_are_skipped_and_reported(tmp_path):
    (tmp_path / "journal.jsonl.1").write_text(
        "written by hand\n" + line("2025-01-31T10:00:00+0000", "supervisor", "started", "up") + "[1, 2]\n\n"
        + json.dumps({"time": "2025-01-31T10:05:00+0000", "event": "stop"}) + "\n")
    torn = line("2025-01-31T11:00:00+0000", "supervisor", "stop", "SIGTERM")
    (tmp_path / "journal.jsonl").write_bytes(
        line("2025-01-31T10:30:00+0000", "gres", "gpu-new", "new").encode() + b"\xff\xfe\n" + torn[:25].encode())
    bad, on_bad_line = collect_bad_lines()
    assert names(read_events(str(tmp_path), on_bad_line=on_bad_line)) == ["started", "gpu-new"]
    assert [(name, number) for name, number, _ in bad] == [
        ("journal.jsonl.1", 1), ("journal.jsonl.1", 3), ("journal.jsonl.1", 5), ("journal.jsonl", 2),
        ("journal.jsonl", 3)]
    assert all(problem.startswith("not a journal event") for _, _, problem in bad)
    assert "lacks one of the fields" in bad[2][2]


def test_read_newest_reads_from_the_end_back_to_since_and_keeps_the_same_events(tmp_path):
    """An agent's /events reads the journal from its end back (issue 28, item 2), not all of it: for a `since`, the
    events of a full read, slightly out-of-order lines too; without one, the newest `limit`; what the bytes or the
    time leave out is counted; a line too long to be an event is left out whole."""
    start = datetime(2025, 1, 31, tzinfo=UTC)
    lines = ["not an event\n"]
    for second in range(30000):
        when = start + timedelta(seconds=second - (2 if second % 97 == 0 else 0))  # a writer a little late
        lines.append(line(when.isoformat(), "health", "health-finding", f"finding {second}", pad="x" * 40))
    (tmp_path / "journal.jsonl.1").write_text("".join(lines[:20000]) + "x" * (5 * 2**20) + "\n")
    (tmp_path / "journal.jsonl").write_text("".join(lines[20000:]) + '{"time": "2025-')  # a torn last line
    assert (tmp_path / "journal.jsonl.1").stat().st_size > 3 * 2**20
    every = [e.line.encode() for e in read_events(str(tmp_path))]
    assert len(every) == 30000
    since = start + timedelta(seconds=29000)
    full = [e.line.encode() for e in read_events(str(tmp_path), EventFilter(since=since))]
    tail = read_newest(str(tmp_path), since.timestamp(), 20000, 2**30, 60.0)
    assert list(tail.lines) == full and len(full) == 1000 and tail.cut == 0, full[:1]
    assert tail.first_time == json.loads(full[0])["time"]
    assert read_newest(str(tmp_path), (start - timedelta(seconds=10)).timestamp(), 30000, 2**30, 60.0).lines == \
        tuple(every)  # `since` before the first line: all of it
    newest = read_newest(str(tmp_path), None, 100, 2**30, 60.0)
    assert (newest.lines, newest.cut) == (tuple(every[-100:]), 0)  # the limit asked is not a cut
    size = len(every[-1]) + 1
    bounded = read_newest(str(tmp_path), None, 20000, 250 * size, 60.0)
    assert (len(bounded.lines), bounded.cut) == (250, 20000 - 250), bounded.cut
    assert bounded.lines == tuple(every[-250:])
    timed_out = read_newest(str(tmp_path), None, 20000, 2**30, 0.5, clock=itertools.count().__next__)  # 1 s a line
    assert (timed_out.lines, timed_out.cut, timed_out.out_of_time) == ((), 1, True)


def test_a_file_seen_under_two_names_is_read_once(tmp_path):
    """What a rotation between the reader's opens looks like: journal.jsonl became .1 meanwhile."""
    current = tmp_path / "journal.jsonl"
    current.write_text(line("2025-01-31T10:00:00+0000", "supervisor", "started", "up"))
    os.link(current, tmp_path / "journal.jsonl.1")
    assert names(read_events(str(tmp_path))) == ["started"]


def test_no_journal_is_no_events(tmp_path):
    assert list(read_events(str(tmp_path / "none"))) == []


def test_events_written_by_emit_read_back_across_rotations(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 2048)
    logging.getLogger("events").disabled = True
    try:
        for n in range(100):
            events.emit(str(tmp_path), "gres", "gpu-new", f"event {n}", n=n)
    finally:
        logging.getLogger("events").disabled = False
    assert (tmp_path / "journal.jsonl.3").exists()
    kept = [e.fields["n"] for e in read_events(str(tmp_path))]
    assert kept == list(range(kept[0], 100)) and kept[0] > 0


# ---------------------------------------------------------------------------
# --since and the line format
# ---------------------------------------------------------------------------


NOW = datetime(2025, 1, 31, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ("10m", NOW - timedelta(minutes=10)),
    ("2h", NOW - timedelta(hours=2)),
    ("30s", NOW - timedelta(seconds=30)),
    ("1d", NOW - timedelta(days=1)),
    ("2025-01-31T12:00:00+01:00", datetime(2025, 1, 31, 11, tzinfo=UTC)),
    ("2025-01-31T12:00:00Z", datetime(2025, 1, 31, 12, tzinfo=UTC)),
])
def test_since_takes_a_duration_or_an_iso_time(text, expected):
    assert parse_since(text, now=NOW) == expected


def test_since_without_an_offset_is_local_time():
    assert parse_since("2025-01-31 12:00") == datetime(2025, 1, 31, 12).astimezone()


@pytest.mark.parametrize("text", ["yesterday", "10 minutes", "-5m", "2025-13-01"])
def test_a_bad_since_says_what_is_accepted(text):
    with pytest.raises(ValueError, match="expected a duration back from now .* or an ISO time"):
        parse_since(text, now=NOW)


def test_the_line_format_escapes_what_users_chose():
    event = JournalEvent(datetime(2025, 1, 31, 12, tzinfo=UTC), "prolog_epilog", "script-failed", "error",
                         "job-start script /s: exit 1: \x1b[2Jgone\nslurm-ext: forged", {}, "{}")
    assert format_event(event) == ("2025-01-31T12:00:00+00:00 error    prolog_epilog: script-failed: "
                                   "job-start script /s: exit 1: \\x1b[2Jgone\\nslurm-ext: forged")


# ---------------------------------------------------------------------------
# following
# ---------------------------------------------------------------------------


def test_follow_goes_on_across_a_rotation_and_waits_for_a_line_being_written(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 600)
    logging.getLogger("events").disabled = True
    state = str(tmp_path)
    events.emit(state, "supervisor", "started", "before the reader")
    plan = iter(range(1, 30))
    written: list[int] = []

    def stop() -> bool:  # called each time the reader has caught up: write the next event, or stop
        n = next(plan, None)
        if n is None:
            return True
        if n == 5:  # half a line, as a writer between its write() and the next; the rest comes with event 6
            with open(events.journal_path(state), "a") as f:
                f.write(line("2025-01-31T12:00:00+0000", "gres", "gpu-new", "split")[:30])
            return False
        if n == 6:
            with open(events.journal_path(state), "a") as f:
                f.write(line("2025-01-31T12:00:00+0000", "gres", "gpu-new", "split")[30:])
        burst = range(100 + n * 10, 100 + n * 10 + 10) if n == 10 else ()  # two rotations or more between looks
        for number in (n, *burst):
            events.emit(state, "gres", "gpu-new", f"event {number}", n=number)
            written.append(number)
        return False

    try:
        found = list(follow_events(state, poll=0.01, stop=stop))
    finally:
        logging.getLogger("events").disabled = False
    assert (tmp_path / "journal.jsonl.2").exists()  # it did rotate, twice at least
    assert found[0].event == "started" and [e.message for e in found if e.message == "split"] == ["split"]
    assert [e.fields["n"] for e in found if "n" in e.fields] == written


# ---------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------


def test_cli_prints_every_event_oldest_first(journal_dir):
    proc = cli("events", "--state-dir", str(journal_dir))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "2025-01-31T10:00:00+00:00 info     supervisor: started: agent up"
    assert lines[2] == "2025-01-31T11:00:00+00:00 error    supervisor: crash-loop: slurmd crash-looping"
    assert len(lines) == 6 and proc.stderr == ""


def test_cli_json_since_component(journal_dir):
    proc = cli("events", "--state-dir", str(journal_dir), "--json", "--since", "2025-01-31T11:30:00Z",
               "--component", "gres")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(text)["event"] for text in proc.stdout.splitlines()] == ["gpu-missing"]
    assert proc.stdout == (journal_dir / "journal.jsonl").read_text().splitlines(keepends=True)[0]


def test_cli_since_a_duration_and_severity(tmp_path):
    state = str(tmp_path)
    old = (datetime.now(UTC) - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%S%z")
    (tmp_path / "journal.jsonl").write_text(line(old, "gres", "gpu-missing", "long ago", "error"))
    events.emit(state, "gres", "gpu-new", "just now")
    events.emit(state, "gres", "gpu-lost", "just now too")
    proc = cli("events", "--state-dir", state, "--since", "1h")
    assert [text.split(": ")[1] for text in proc.stdout.splitlines()] == ["gpu-new", "gpu-lost"], proc.stderr
    proc = cli("events", "--state-dir", state, "--severity", "error")
    assert [text.split(": ")[1] for text in proc.stdout.splitlines()] == ["gpu-missing", "gpu-lost"]


def test_one_severity_ladder_with_the_findings_words(tmp_path):
    """A critical health finding is `critical` in the journal, as on the page and in `health show` (it was `error`,
    so `--severity critical` was refused and the same fault had two names)."""
    state = str(tmp_path)
    events.emit(state, "gres", "gpu-missing", "a script of ours failed", "error")
    events.emit(state, "health", "health-finding", "critical: xid 79 gpu 1 GPU has fallen off the bus", "critical")
    events.emit(state, "health", "health-finding", "warning: thermal gpu 0", "warning")
    proc = cli("events", "--state-dir", state, "--severity", "critical")
    assert proc.returncode == 0, proc.stderr
    assert [text.split(": ", 2)[2] for text in proc.stdout.splitlines()] == \
        ["critical: xid 79 gpu 1 GPU has fallen off the bus"]
    assert proc.stdout.split()[1] == "critical"
    proc = cli("events", "--state-dir", state, "--severity", "error")
    assert len(proc.stdout.splitlines()) == 2, proc.stdout
    # the component starts in the same column whatever the severity
    lines = cli("events", "--state-dir", state).stdout.splitlines()
    assert len({text.index(" gres:" if "gres:" in text else " health:") for text in lines}) == 1, lines


def test_cli_reads_the_state_dir_from_the_config(tmp_path):
    state = tmp_path / "state"
    events.emit(str(state), "supervisor", "started", "from the config's state dir")
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{state}"\n')
    proc = cli("--config", str(config), "events")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("supervisor: started: from the config's state dir\n")


def test_cli_warns_about_bad_lines_with_file_and_line(tmp_path):
    (tmp_path / "journal.jsonl").write_text(line("2025-01-31T10:00:00+0000", "supervisor", "started", "up")
                                            + '{"time": "2025-01-31T1')
    proc = cli("events", "--state-dir", str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1
    assert f"slurm-ext: warning: {tmp_path / 'journal.jsonl'}, line 2: not a journal event" in proc.stderr


def test_cli_errors_an_operator_can_act_on(tmp_path):
    proc = cli("events", "--state-dir", str(tmp_path), "--since", "yesterday")
    assert proc.returncode == 2 and "--since 'yesterday': expected a duration" in proc.stderr
    proc = cli("events", "--state-dir", str(tmp_path / "none"))
    assert proc.returncode == 3 and proc.stdout == ""  # nothing read is not "nothing happened"
    assert f"no journal in {tmp_path / 'none'}" in proc.stderr
    events.emit(str(tmp_path), "supervisor", "started", "up")
    proc = cli("events", "--state-dir", str(tmp_path), "--event", "startd")
    assert proc.returncode == 0 and proc.stdout == ""
    assert "--event startd: not an event of this slurm-ext" in proc.stderr


def test_cli_follow_prints_new_events_until_interrupted(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 2048)
    logging.getLogger("events").disabled = True
    state = str(tmp_path)
    events.emit(state, "gres", "gpu-baseline", "before the follower")
    # SIGINT at its default, as at a terminal: a suite started in the background (`.ci/run &`) has it ignored, the
    # follower would inherit that and never see the Ctrl-C (CI caught it sleeping in follow_events)
    follower = subprocess.Popen(["env", "--default-signal=INT", sys.executable, "-m", "slurm_ext.cli", "events",
                                 "--follow", "--state-dir", state, "--component", "gres"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    printed: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [printed.put(text) for text in follower.stdout], daemon=True).start()
    try:
        assert printed.get(timeout=20).endswith("gres: gpu-baseline: before the follower\n")
        for n in range(40):  # about six rotations while it follows
            events.emit(state, "gres", "gpu-new", f"event {n}", n=n)
            events.emit(state, "supervisor", "mainpid", "not shown: another component")
            time.sleep(0.02)
        seen = [printed.get(timeout=20) for _ in range(40)]
        assert (tmp_path / "journal.jsonl.3").exists()
        assert [text.rsplit(": ", 1)[1] for text in seen] == [f"event {n}\n" for n in range(40)]
    finally:
        logging.getLogger("events").disabled = False
        code, stderr = _interrupt(follower)
    assert code == 130, f"SIGINT did not stop the follower (exit {code}); its stderr:\n{stderr}"


def _interrupt(process: subprocess.Popen) -> tuple[int, str]:
    """Ctrl-C, then its exit code and stderr. One that does not stop is aborted: with PYTHONFAULTHANDLER set, its
    stderr then shows where each of its threads was, and no follower is left running after the test."""
    process.send_signal(signal.SIGINT)
    try:
        code = process.wait(30)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        code = process.wait(10)
    stderr = process.stderr.read()
    process.stderr.close()
    return code, stderr


# ---------------------------------------------------------------------------
# issue 29, item 7: what a new operator tripped on
# ---------------------------------------------------------------------------


def test_since_takes_weeks():
    """`--since 1w` was refused."""
    assert parse_since("1w", now=NOW) == NOW - timedelta(weeks=1)
    assert parse_since("2w", now=NOW) == NOW - timedelta(days=14)


def test_cli_refuses_an_unknown_component_and_its_help_names_every_one(tmp_path):
    """--component took any word (a typo printed nothing, exit 0), and its help named four components of eight."""
    from slurm_ext.eventnames import CATALOGUE
    events.emit(str(tmp_path), "supervisor", "started", "up")
    proc = cli("events", "--state-dir", str(tmp_path), "--component", "supervsior")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--component supervsior: not a component" in proc.stderr and "supervisor" in proc.stderr
    emitting = {component for entry in CATALOGUE.values() for component in entry.components}
    shown = cli("events", "--help").stdout
    assert all(component in shown for component in emitting), sorted(c for c in emitting if c not in shown)
    assert cli("events", "--state-dir", str(tmp_path), "--component", "supervisor").stdout.count("\n") == 1


def test_global_flags_work_after_the_subcommand_too(tmp_path):
    """`slurm-ext events --config FILE` was refused: --config and -v were taken only before the subcommand."""
    state = tmp_path / "state"
    events.emit(str(state), "supervisor", "started", "from the config's state dir")
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{state}"\n')
    for args in (("--config", str(config), "events"), ("events", "--config", str(config)),
                 ("events", "-v", "--config", str(config)), ("config", "check", "--config", str(config))):
        proc = cli(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    assert cli("events", "--config", str(config)).stdout.endswith("from the config's state dir\n")
    assert cli("config", "show", "--config", str(config)).stdout.count(str(state)) == 1


def test_the_top_level_help_names_every_component():
    """The description named the node agent, job cleanup, GRES and accounting: half of what there is."""
    shown = " ".join(cli("--help").stdout.split())
    for part in ("node agent", "job cleanup", "GRES", "accounting", "health", "repair", "page", "dev cluster"):
        assert part in shown, part


# ---------------------------------------------------------------------------
# read_after: the collector's cursor


def _read_all(state_dir, cursor: str = "", size: int = 2**20, clock=lambda: time.time() + 60):
    """Every line after `cursor`, page after page as the collector asks: (lines, the last cursor, lost on the way)."""
    from slurm_ext.journal import read_after
    lines, lost = [], False
    while True:
        chunk = read_after(str(state_dir), cursor, size, clock=clock)
        lines += chunk.lines
        lost |= chunk.lost
        if chunk.cursor == cursor and not chunk.lines:
            return lines, cursor, lost
        cursor = chunk.cursor


def test_a_cursor_takes_each_line_once_across_rotations_and_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 4000)
    taken, cursor = [], ""
    for batch in range(6):  # the journal rotates between the reads, and each read is in small pages
        for number in range(batch * 20, batch * 20 + 20):
            events.emit(str(tmp_path), "supervisor", "started", f"event {number}", seq=number)
        lines, cursor, lost = _read_all(tmp_path, cursor, size=700)
        assert not lost
        taken += [json.loads(found)["seq"] for found in lines]
    assert taken == list(range(120))
    assert len(events.journal_files(str(tmp_path))) == 4 and (tmp_path / "journal.jsonl.3").exists()


def test_a_cursor_whose_file_is_gone_says_lost_and_starts_at_the_oldest_file(tmp_path, monkeypatch):
    from slurm_ext.journal import read_after
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 2000)
    for number in range(5):
        events.emit(str(tmp_path), "supervisor", "started", f"event {number}", seq=number)
    _, cursor, _ = _read_all(tmp_path)
    for number in range(5, 200):  # far more than the four files keep: the cursor's file is rotated out
        events.emit(str(tmp_path), "supervisor", "started", f"event {number}", seq=number)
    chunk = read_after(str(tmp_path), cursor, 2**20, clock=lambda: time.time() + 60)
    oldest = json.loads((tmp_path / "journal.jsonl.3").read_text().splitlines()[0])["seq"]
    assert chunk.lost and json.loads(chunk.lines[0])["seq"] == oldest > 5
    assert read_after(str(tmp_path), "0123456789abcdef:10", 100).lost  # a state folder replaced: the same
    assert not read_after(str(tmp_path), "", 100).lost  # the first read of a journal loses nothing


def test_a_line_still_being_written_waits_and_a_rotated_file_is_left_until_it_is_quiet(tmp_path):
    from slurm_ext.journal import read_after
    current = tmp_path / "journal.jsonl"
    current.write_text(line("2025-01-31T10:00:00+0000", "supervisor", "started", "one"))
    with open(current, "a") as journal:
        journal.write('{"time": "2025-01-31T10:00:01+0000", "comp')  # no newline yet
    chunk = read_after(str(tmp_path), "", 2**20)
    assert len(chunk.lines) == 1 and not chunk.more
    assert read_after(str(tmp_path), chunk.cursor, 2**20).lines == ()
    with open(current, "a") as journal:
        journal.write('onent": "supervisor", "event": "stop", "message": "two"}\n')
    assert [json.loads(found)["message"] for found in read_after(str(tmp_path), chunk.cursor, 2**20).lines] == ["two"]
    # rotated just now: a writer that opened it before the rename may still append its line
    _, cursor, _ = _read_all(tmp_path)
    os.replace(current, tmp_path / "journal.jsonl.1")
    current.write_text(line("2025-01-31T10:00:02+0000", "supervisor", "stop", "three"))
    assert read_after(str(tmp_path), cursor, 2**20).lines == ()
    later = read_after(str(tmp_path), cursor, 2**20, clock=lambda: time.time() + 60)
    assert [json.loads(found)["message"] for found in later.lines] == ["three"]


def test_an_event_longer_than_the_page_comes_alone_and_garbage_without_newlines_is_skipped(tmp_path):
    from slurm_ext.journal import read_after
    big = line("2025-01-31T10:00:00+0000", "acceptance", "acceptance-done", "x" * 5000)
    (tmp_path / "journal.jsonl").write_text(line("2025-01-31T09:00:00+0000", "supervisor", "started", "a") + big
                                            + "y" * (5 * 2**20) + "\n"
                                            + line("2025-01-31T11:00:00+0000", "supervisor", "stop", "b"))
    first = read_after(str(tmp_path), "", 1000)
    assert len(first.lines) == 1 and first.more
    second = read_after(str(tmp_path), first.cursor, 1000)
    assert second.lines == (big.rstrip("\n").encode(),) and second.more
    third = read_after(str(tmp_path), second.cursor, 1000)
    assert third.skipped == 1 and [json.loads(found)["message"] for found in third.lines] == ["b"]


@pytest.mark.parametrize("cursor", ["x", "0123456789abcdef", "0123456789ABCDEF:1", "0123456789abcdef:-1",
                                    "0123456789abcdef:1234567890123456"])
def test_a_cursor_that_is_not_one_is_refused_with_its_form(tmp_path, cursor):
    from slurm_ext.journal import read_after
    with pytest.raises(ValueError, match="expected <16 hex digits>:<offset>"):
        read_after(str(tmp_path), cursor, 100)


def test_a_quiet_rotated_file_torn_at_its_end_is_read_past_and_a_restored_file_goes_on_from_its_end(tmp_path):
    """A full disk tore the last line of a file that was then rotated: its end is skipped and counted once, and
    the files after it are read (the node's history would otherwise stop there for 48 MiB). A cursor past its
    file's end (a file restored from an older backup) goes on from that end, said lost, and never re-takes the
    older files."""
    from slurm_ext.journal import read_after
    rotated = tmp_path / "journal.jsonl.1"
    rotated.write_text(line("2025-01-31T10:00:00+0000", "supervisor", "started", "one") + '{"time": "2025-01')
    (tmp_path / "journal.jsonl").write_text(line("2025-01-31T10:00:02+0000", "supervisor", "stop", "two"))
    os.utime(rotated, (time.time() - 60, time.time() - 60))
    first = read_after(str(tmp_path), "", 2**20)
    assert [json.loads(found)["message"] for found in first.lines] == ["one", "two"] and first.skipped == 1
    assert read_after(str(tmp_path), first.cursor, 2**20) == read_after(str(tmp_path), first.cursor, 2**20)
    assert read_after(str(tmp_path), first.cursor, 2**20).skipped == 0
    name = first.cursor.split(":")[0]
    past = read_after(str(tmp_path), f"{name}:999999", 2**20)
    assert past.lost and past.lines == () and past.cursor == f"{name}:{(tmp_path / 'journal.jsonl').stat().st_size}"
    older = read_after(str(tmp_path), read_after(str(tmp_path), "", 10).cursor.split(":")[0] + ":999999", 2**20)
    assert older.lost and [json.loads(found)["message"] for found in older.lines] == ["two"]

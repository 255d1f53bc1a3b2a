"""The event catalogue, the journal writer and its rotation: real files, real processes.

The catalogue is checked against the code (every literal event name passed
to an emitter), against itself (no entry that nothing emits) and against the
table in docs/reference/events.md, so none of the three can drift from the others.
"""

from __future__ import annotations

import ast
import configparser
import json
import logging
import multiprocessing
import os
import re
import threading
import time
from pathlib import Path

import pytest

from helpers.wait import wait_for
from slurm_ext import events
from slurm_ext.eventnames import CATALOGUE, SEVERITIES, markdown_table

REPO = Path(__file__).resolve().parent.parent
EMITTERS = ("emit", "_emit")


def _source_dirs() -> list[str]:
    """Every folder whose Python is slurm-ext's own code: setup.cfg's package_dir, so a new component is seen."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return [line.split("=")[1].strip() for line in parser["options"]["package_dir"].strip().splitlines()]


SOURCE_DIRS = _source_dirs()


def source_files() -> list[Path]:
    return sorted(path for folder in SOURCE_DIRS if (REPO / folder).is_dir()
                  for path in (REPO / folder).rglob("*.py"))


def emitted_names() -> list[tuple[str, int, ast.expr]]:
    """(file, line, event-name expression) of every call of emit/_emit/x.emit in slurm-ext's code.

    `events.emit(state_dir, component, event, ...)` names its event third;
    every other emitter (an `events.emitter` function, `self.emit`,
    `context.emit`, `_emit(config, event, ...)`) takes it as the first
    string among its first two arguments.
    """
    found = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in EMITTERS:
                continue
            direct = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "events"
            keyword = next((k.value for k in node.keywords if k.arg == "event"), None)
            if direct:
                candidates = node.args[2:3] or ([keyword] if keyword is not None else [])
            else:
                candidates = [a for a in node.args[:2] if isinstance(a, (ast.Constant, ast.JoinedStr))][:1]
            found += [(str(path.relative_to(REPO)), node.lineno, arg) for arg in candidates]
    return found


def pattern_of(fstring: ast.JoinedStr) -> re.Pattern:
    """f"{phase}-failed" -> ^.+-failed$: the names an f-string can make."""
    parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in fstring.values]
    return re.compile("^" + "".join(parts) + "$")


# ---------------------------------------------------------------------------
# the catalogue against the code
# ---------------------------------------------------------------------------


def test_every_event_name_the_code_emits_is_in_the_catalogue():
    calls = emitted_names()
    literals = [(f, line, a.value) for f, line, a in calls if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    # the scan must see the code's events, or this test could never fail
    assert len({name for _, _, name in literals}) >= 40, literals
    assert {f.split("/")[0] for f, _, _ in literals} >= {"supervisor", "prolog_epilog", "gres"}
    unknown = [f"{f}:{line}: {name}" for f, line, name in literals if name not in CATALOGUE]
    assert not unknown, "event names missing from slurm_ext/eventnames.py:\n" + "\n".join(unknown)
    for f, line, arg in calls:
        if isinstance(arg, ast.JoinedStr):
            pattern = pattern_of(arg)
            assert any(pattern.match(name) for name in CATALOGUE), f"{f}:{line}: no catalogued name fits {pattern}"


def test_every_catalogued_name_is_emitted_somewhere():
    """An entry no code emits is stale (renamed or removed): the docs would explain an event that never comes."""
    strings, patterns = set(), []
    for path in source_files():
        if path.name == "eventnames.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    patterns = [pattern_of(arg) for _, _, arg in emitted_names() if isinstance(arg, ast.JoinedStr)]
    stale = [name for name in CATALOGUE if name not in strings and not any(p.match(name) for p in patterns)]
    assert not stale, f"catalogued but never emitted: {stale}"


def test_script_results_name_catalogued_events():
    from slurm_ext.prolog_epilog.scripts import ScriptResult
    results = [ScriptResult("/s", "root", 0), ScriptResult("/s", "root", 3), ScriptResult("/s", "root", None, True),
               ScriptResult("/s", "root", None, refused="bad")]
    assert [r.event for r in results] == ["script-ok", "script-failed", "script-timeout", "script-refused"]
    assert all("prolog_epilog" in CATALOGUE[r.event].components for r in results)


def test_catalogue_entries_are_well_formed():
    for name, entry in CATALOGUE.items():
        assert entry.name == name and re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name), name
        assert entry.severity in SEVERITIES, name
        assert entry.components and all(re.fullmatch(r"[a-z_]+", c) for c in entry.components), name
        assert entry.meaning and "|" not in entry.meaning and "\n" not in entry.meaning, name


def test_the_docs_table_of_events_is_the_catalogue():
    page = (REPO / "docs" / "reference" / "events.md").read_text()
    marker = "<!-- event-catalogue -->\n"
    assert marker in page, "docs/reference/events.md has no table of events (marker <!-- event-catalogue -->)"
    table = page.split(marker, 1)[1].split("\n\n", 1)[0].rstrip("\n") + "\n"  # the table may end the page
    assert table == markdown_table(), (
        "docs/reference/events.md's table of events differs from slurm_ext/eventnames.py; put this under the "
        "marker:\n" + markdown_table())


# ---------------------------------------------------------------------------
# emit and emitter
# ---------------------------------------------------------------------------


def journal(state: Path) -> list[dict]:
    return [json.loads(line) for line in events.journal_path(str(state)).read_text().splitlines()]


def test_an_unknown_event_name_is_refused_and_not_written(tmp_path):
    with pytest.raises(ValueError, match="'gpu-misssing' is not in the catalogue"):
        events.emit(str(tmp_path), "gres", "gpu-misssing", "typo")
    with pytest.raises(ValueError, match="component 'supervisor' is not one of its components"):
        events.emit(str(tmp_path), "supervisor", "gpu-missing", "wrong component")
    with pytest.raises(ValueError, match="severity 'fatal'"):
        events.emit(str(tmp_path), "gres", "gpu-missing", "no such severity", "fatal")
    assert not events.journal_path(str(tmp_path)).exists()


def test_the_severity_defaults_to_the_catalogue_and_a_caller_may_give_another(tmp_path):
    events.emit(str(tmp_path), "gres", "gpu-missing", "gone")
    events.emit(str(tmp_path), "prolog_epilog", "leftovers-cleaned", "killed 2")
    events.emit(str(tmp_path), "prolog_epilog", "leftovers-cleaned", "one unkillable", "error")
    assert [(e["event"], e["severity"]) for e in journal(tmp_path)] == [
        ("gpu-missing", "error"), ("leftovers-cleaned", "warning"), ("leftovers-cleaned", "error")]


def test_an_emitter_binds_component_and_fields(tmp_path):
    emit = events.emitter(str(tmp_path), "supervisor", role="worker")
    record = emit("crash-loop", "slurmd is crash-looping", worker="slurmd")
    emit("started", "supervising", role="controller")  # a call's field wins over a fixed one
    first, second = journal(tmp_path)
    assert first == record
    assert (first["component"], first["severity"], first["role"], first["worker"]) == \
        ("supervisor", "error", "worker", "slurmd")
    assert second["role"] == "controller" and second["severity"] == "info"
    with pytest.raises(ValueError):
        emit("gres-written", "not the supervisor's")


def test_an_emitter_without_state_dir_logs_and_writes_no_journal(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="events"):
        events.emitter(None, "gres")("gpu-baseline", "8 GPUs are this node's")
    assert "gres: gpu-baseline: 8 GPUs are this node's" in caplog.text
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# rotation
# ---------------------------------------------------------------------------


@pytest.fixture
def small_journal(monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 4096)
    logging.getLogger("events").disabled = True
    yield 4096
    logging.getLogger("events").disabled = False


def numbers_kept(state: Path) -> list[int]:
    """The `n` field of every event in the journal files, oldest file first."""
    kept = []
    for path in events.journal_files(str(state)):
        if path.exists():
            kept += [json.loads(line)["n"] for line in path.read_text().splitlines()]
    return kept


def test_rotation_keeps_three_older_files_and_the_newest_events_in_order(tmp_path, small_journal):
    for n in range(400):  # about 40 KiB: far more than four files hold
        events.emit(str(tmp_path), "gres", "gpu-new", f"event {n:04d} " + "x" * 60, n=n)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["journal.jsonl", "journal.jsonl.1", "journal.jsonl.2", "journal.jsonl.3", "journal.lock"], names
    kept = numbers_kept(tmp_path)
    assert kept == list(range(kept[0], 400)), "the kept events are the newest ones, oldest file first, no gap"
    for name in names[1:-1]:  # each rotated at the first line that took it past the limit
        text = (tmp_path / name).read_bytes()
        last = text.splitlines(keepends=True)[-1]
        assert len(text) > small_journal >= len(text) - len(last), (name, len(text))


def _write_events(state: str, writer: int, count: int, max_bytes: int, start) -> None:
    events.JOURNAL_MAX_BYTES = max_bytes
    logging.getLogger("events").disabled = True
    start.wait()
    for n in range(count):
        events.emit(state, "gres", "gpu-new", f"writer {writer} event {n} " + "y" * 40, writer=writer, n=n)


def test_concurrent_writers_rotate_each_full_file_once_and_tear_no_line(tmp_path):
    """Six processes writing at once: a file that several of them found full is rotated once, not again.

    Rotated again, the second rename would push a nearly empty journal.jsonl
    to .1, and older events out of the kept files early.
    """
    max_bytes, writers = 2048, 6
    context = multiprocessing.get_context("fork")
    start = context.Barrier(writers)
    processes = [context.Process(target=_write_events, args=(str(tmp_path), w, 1000, max_bytes, start))
                 for w in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-4:] == ["journal.jsonl.1", "journal.jsonl.2", "journal.jsonl.3", "journal.lock"], names
    assert set(names) <= {"journal.jsonl", "journal.jsonl.1", "journal.jsonl.2", "journal.jsonl.3",
                          "journal.lock"}, names
    last_seen: dict[int, int] = {}
    for path in events.journal_files(str(tmp_path)):
        if not path.exists():
            continue
        text = path.read_text()
        assert text.endswith("\n")
        for line in text.splitlines():
            record = json.loads(line)  # no torn or interleaved line
            writer, n = record["writer"], record["n"]
            assert n > last_seen.get(writer, -1), "each writer's events stay in order across the files"
            last_seen[writer] = n
        if path.name != "journal.jsonl":
            assert path.stat().st_size > max_bytes, f"{path.name} was rotated before it was full"


def test_a_rotation_waits_for_a_writer_between_opening_and_writing_so_its_line_is_in_the_file_before_the_rename(
        tmp_path, small_journal, monkeypatch):
    """A line is never appended to a rotated file, which the controller's collector may already have read to its
    end: a writer held up between opening the journal and writing to it holds the rotation back until it wrote."""
    opened, go_on = threading.Event(), threading.Event()
    real_open = events._open_journal

    def held_up_once(path):
        fd = real_open(path)
        if threading.current_thread().name == "held-up" and not opened.is_set():
            opened.set()
            go_on.wait(30)
        return fd

    def fill():
        n = 0
        while not (tmp_path / "journal.jsonl.1").exists():  # the emit that finds the file full rotates it
            events.emit(str(tmp_path), "gres", "gpu-new", f"event {n:04d} " + "x" * 60, n=n)
            n += 1

    monkeypatch.setattr(events, "_open_journal", held_up_once)
    threads = [threading.Thread(name="held-up", target=lambda: events.emit(
        str(tmp_path), "gres", "gpu-new", "the held-up writer's line", n=-1)), threading.Thread(target=fill)]
    threads[0].start()
    assert opened.wait(30)
    threads[1].start()
    journal = tmp_path / "journal.jsonl"
    wait_for("the journal full", lambda: (tmp_path / "journal.jsonl.1").exists() or (
        journal.exists() and journal.stat().st_size > small_journal), 30, 0.01)
    time.sleep(0.5)
    assert not (tmp_path / "journal.jsonl.1").exists(), "rotated while a writer had the journal open"
    go_on.set()
    for thread in threads:
        thread.join(30)
    rotated = [json.loads(line)["n"] for line in (tmp_path / "journal.jsonl.1").read_text().splitlines()]
    assert rotated[-1] == -1 and rotated[:-1] == list(range(len(rotated) - 1)), rotated
    assert not journal.exists() or -1 not in [json.loads(line)["n"] for line in journal.read_text().splitlines()]


def test_an_unwritable_state_dir_loses_the_line_not_the_caller(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.ERROR, logger="events"):
        record = events.emit(str(blocker / "state"), "gres", "gpu-new", "no journal")
    assert record["event"] == "gpu-new" and "cannot write" in caplog.text


def test_the_journal_files_are_listed_oldest_first(tmp_path):
    assert [p.name for p in events.journal_files(str(tmp_path))] == [
        "journal.jsonl.3", "journal.jsonl.2", "journal.jsonl.1", "journal.jsonl"]
    assert events.JOURNAL_KEEP == 3 and os.path.dirname(events.journal_files(str(tmp_path))[0]) == str(tmp_path)

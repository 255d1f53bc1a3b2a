"""slurm_ext.words: counts and times in operators' sentences (issue 29.7: "1 findings", "1 nodes", four formats)."""

import json
import re
import time
from datetime import datetime

from slurm_ext import events
from slurm_ext.words import counted, moment, stamped


def test_one_finding_two_findings():
    assert [counted(n, "finding") for n in (0, 1, 2)] == ["0 findings", "1 finding", "2 findings"]


def test_an_irregular_plural_is_given():
    assert counted(1, "query", "queries") == "1 query" and counted(3, "query", "queries") == "3 queries"


def test_one_time_format_iso_8601_with_the_zone(monkeypatch):
    """The format of every time an operator reads (issue 29.7: there were four, two without a zone)."""
    for zone, expected in (("UTC0", "1970-01-02T00:00:00+00:00"), ("CET-1", "1970-01-02T01:00:00+01:00"),
                           ("EST+5", "1970-01-01T19:00:00-05:00"), ("IST-5:30", "1970-01-02T05:30:00+05:30")):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        assert moment(86400) == expected
        assert datetime.fromisoformat(moment(86400)).timestamp() == 86400
    monkeypatch.undo()
    time.tzset()


def test_the_journal_writes_the_same_format(tmp_path):
    events.emit(str(tmp_path), "supervisor", "started", "up")
    written = json.loads((tmp_path / "journal.jsonl").read_text())["time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", written), written


def test_json_says_epoch_seconds_under_a_name_that_says_so(monkeypatch):
    monkeypatch.setenv("TZ", "UTC0")
    time.tzset()
    try:
        assert stamped({"node": "n1", "opened": 86400.5, "closed": None}, "opened", "closed") == {
            "node": "n1", "opened": "1970-01-02T00:00:00+00:00", "opened_epoch": 86400.5, "closed": None,
            "closed_epoch": None}
    finally:
        monkeypatch.undo()
        time.tzset()

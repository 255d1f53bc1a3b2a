"""`kmsg.LineParser` on 216 real kernel-log lines from public logs (tests/data/kmsg-corpus, its README says where
they come from): every line parses as its `expected` says. The lines of one log are read in order by one parser,
as the monitor reads a kernel log; each line also parses the same in a kmsg record of facility kernel, and never
as a record when user space wrote it (facility user)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_ext.health.kmsg import LineParser, message_of
from slurm_ext.health.records import SXid, Xid

CORPUS = Path(__file__).parent / "data" / "kmsg-corpus" / "lines.jsonl"
ROWS = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
NOW = 1_700_000_000.0


def _verdict(record, expected: dict) -> str:
    """'' when `record` is what `expected` says, else what is wrong."""
    kind = expected["kind"]
    if kind in ("xid", "xid79"):
        if not isinstance(record, Xid):
            return f"expected Xid {expected['xid']}, got {record!r}"
        got = {"xid": record.xid, "pci_bus_id": record.pci_bus_id}
        want = {"xid": expected["xid"], "pci_bus_id": expected["pci_bus_id"]}
        if expected.get("fatal") is not None:
            got["fatal"], want["fatal"] = record.fatal, expected["fatal"]
        if expected.get("recovery"):
            got["recovery"], want["recovery"] = record.recovery, expected["recovery"]
        return "" if got == want else f"expected {want}, got {got}"
    if kind in ("sxid", "sxid-nosev"):
        if not isinstance(record, SXid):
            return f"expected SXid {expected['sxid']}, got {record!r}"
        got = (record.sxid, record.pci_bus_id, record.fatal)
        want = (expected["sxid"], expected["pci_bus_id"], expected.get("fatal"))
        return "" if got == want else f"expected {want}, got {got}"
    if kind == "xid79-restated":
        return "" if record is None or (isinstance(record, Xid) and record.xid == 79) else f"got {record!r}"
    return "" if record is None else f"expected no record ({kind}), got {record!r}"


def _by_log() -> dict[str, list[dict]]:
    logs: dict[str, list[dict]] = {}
    for row in ROWS:
        logs.setdefault(row["log"], []).append(row)
    return logs


def test_the_corpus_is_whole():
    assert len(ROWS) == 216
    kinds = {row["expected"]["kind"] for row in ROWS}
    assert {"xid", "sxid", "sxid-nosev", "sxid-detail", "driver-error", "quoted", "benign"} <= kinds


@pytest.mark.parametrize("log", sorted(_by_log()))
def test_every_line_parses_as_expected(log):
    parser = LineParser()
    wrong = []
    for row in _by_log()[log]:
        problem = _verdict(parser.parse(row["line"], now=NOW), row["expected"])
        if problem:
            wrong.append(f"{row['line'][:120]!r}: {problem}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("log", sorted(_by_log()))
def test_every_line_as_a_kernel_record_and_as_a_users_record(log):
    """The same message in a /dev/kmsg record: of facility kernel it parses as the line did; written from user
    space (facility user) it is never a record."""
    kernel, user = LineParser(), LineParser()
    wrong = []
    for seq, row in enumerate(_by_log()[log]):
        message = message_of(row["line"])
        problem = _verdict(kernel.parse(f"4,{seq},{seq * 1000},-;{message}", now=NOW), row["expected"])
        if problem:
            wrong.append(f"kernel record {message[:100]!r}: {problem}")
        if user.parse(f"12,{seq},{seq * 1000},-;{message}", now=NOW) is not None:
            wrong.append(f"user record {message[:100]!r} parsed")
    assert not wrong, "\n".join(wrong)

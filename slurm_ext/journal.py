"""Reading the node journal: what `slurm-ext events` shows.

`read_events(state_dir, selection, on_bad_line)` yields the `JournalEvent`s
of every journal file (`events.journal_files`: the rotated ones oldest
first, then journal.jsonl) that `selection` (an `EventFilter`) keeps;
`follow_events` goes on with the events written after that, across
rotations. `read_newest` reads the newest lines from the end back, within a
byte and a time budget (what an agent's /events sends). `read_after` reads on from a cursor (what the controller's
collector takes of an agent's journal, each event once: `JournalChunk`). `parse_since` turns
`--since` (an ISO time or a duration back from now) into a time;
`format_event` is the one-line form.

Why it is built this way:

- The files are opened newest first and then read oldest first, and a
  file already opened under another name is read once: a rotation while
  the reader opens them shifts names, not contents, so no event is missed
  or shown twice.
- A line that is not a JSON event (a torn last line after a full disk or a
  crash, a line someone wrote by hand) is skipped and reported through
  `on_bad_line(path, line number, problem)`; one bad line never hides the
  rest of the journal.
- Messages and fields hold text that users chose (script output, process
  names); `format_event` escapes control characters, so a journal can never
  send escape sequences to an operator's terminal.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from . import events
from .config import parse_duration
from .eventnames import SEVERITIES
from .log import printable

__all__ = ["JournalEvent", "EventFilter", "JournalTail", "JournalChunk", "CURSOR", "read_events", "read_after", "read_newest", "follow_events", "parse_since",
           "format_event"]

#: how often `follow_events` looks for new lines (a file rotated out of the kept ones between looks is missed)
FOLLOW_POLL = 0.2

# the fields every journal line has; the rest are the event's own
_HEAD = ("time", "component", "event", "severity", "message")


@dataclass(frozen=True, slots=True)
class JournalEvent:
    """One line of the node journal."""

    #: when it was emitted (with the node's UTC offset at that time)
    time: datetime
    component: str
    event: str
    severity: str
    message: str
    #: the event's own fields (job, worker, node, exit_code, ...)
    fields: dict
    #: the line as written, without its newline (what --json prints)
    line: str


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events to show; an empty field keeps every event."""

    #: only events at or after this time
    since: datetime | None = None
    #: only events of these components
    components: tuple[str, ...] = ()
    #: only events of these names
    names: tuple[str, ...] = ()
    #: only events at least this severe (info, warning, error)
    severity: str = ""

    def keeps(self, event: JournalEvent) -> bool:
        return ((self.since is None or event.time >= self.since)
                and (not self.components or event.component in self.components)
                and (not self.names or event.event in self.names)
                and (not self.severity or _rank(event.severity) >= _rank(self.severity)))


@dataclass(frozen=True, slots=True)
class JournalTail:
    """The newest lines of the journal, as `read_newest` found them."""

    #: journal lines as written, without their newline, oldest first
    lines: tuple[bytes, ...]
    #: the time of the first of `lines` as written ("" when there is none)
    first_time: str
    #: events among the newest asked that are not in `lines` (their bytes or the time ran out); when the time ran
    #: out, one more than were counted: the rest of the journal was not read
    cut: int
    #: the time ran out before the reading was done
    out_of_time: bool = False


@dataclass(frozen=True, slots=True)
class JournalChunk:
    """The journal's lines after a cursor, as `read_after` found them."""

    #: whole lines as written, without their newline, in the order written
    lines: tuple[bytes, ...]
    #: where the next read begins: after the last of `lines` (the cursor asked when there is none)
    cursor: str
    #: more lines are written after `cursor` (the byte budget ended the read)
    more: bool
    #: the cursor's file is no longer kept (rotated out before it was read to its end, or the state folder was
    #: replaced): the read began at the oldest file kept, and what was between is gone
    lost: bool = False
    #: lines longer than _LONGEST_LINE, left out
    skipped: int = 0


#: a cursor: the first bytes' digest of the file it is in (a file's first line never changes, and renames keep it),
#: and a byte offset in that file
CURSOR = re.compile(r"\A(?:([0-9a-f]{16}):([0-9]{1,15}))?\Z")
#: bytes that name a journal file: the head of its first line (a file of fewer bytes and no newline yet is not named)
_NAMED_BY = 4096
#: a rotated file is read past its end only once it has been left alone this long: `events.emit` never appends to
#: a rotated file (journal.lock), but a writer of an older slurm-ext running through an upgrade, or one on a
#: filesystem that takes no locks, may append its one line
_SETTLED = 2.0


#: on_bad_line(path, line number (from 1), problem)
BadLineHandler = Callable[[Path, int, str], None]


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """The time `--since` names: a duration back from `now` (10m, 2h, 1d, 1w) or an ISO time.

    An ISO time without a UTC offset is local time.

    Raises:
        ValueError: neither (the message says what is accepted).
    """
    text = text.strip()
    now = now or datetime.now().astimezone()
    days = {"d": 1, "w": 7}.get(text[-1:])
    if days and text[:-1].replace(".", "", 1).isdigit():
        return now - timedelta(days=days * float(text[:-1]))
    try:
        return now - timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected a duration back from now (30s, 10m, 2h, 1d, 1w) or an ISO time "
                         "(2025-01-31T14:00, 2025-01-31 14:00:00+01:00)") from None
    return when if when.tzinfo else when.astimezone()


def read_events(state_dir: str, selection: EventFilter = EventFilter(),
                on_bad_line: BadLineHandler | None = None) -> Iterator[JournalEvent]:
    """The journal's events that `selection` keeps, oldest first; never raises for a bad line.

    Raises:
        OSError: a journal file exists but cannot be read (no permission).
    """
    opened = _open_oldest_first(state_dir)
    try:
        for path, stream in opened:
            if selection.since is not None and os.fstat(stream.fileno()).st_mtime < selection.since.timestamp() - 1:
                continue  # last written before `since`: none of its events is kept
            yield from _events_of(path, stream, selection, on_bad_line)
    finally:
        for _, stream in opened:
            stream.close()


def follow_events(state_dir: str, selection: EventFilter = EventFilter(),
                  on_bad_line: BadLineHandler | None = None, poll: float = FOLLOW_POLL,
                  stop: Callable[[], bool] = lambda: False) -> Iterator[JournalEvent]:
    """`read_events`, then every event written after it, until `stop()` (or for ever, as `tail -F`).

    A rotation renames the file being followed: its rest is read, then every
    file that came after it (more than one when the journal rotated several
    times between two looks), and the newest is followed in turn. A line
    still being written (no newline yet) is waited for.
    """
    current = events.journal_path(state_dir)
    path, stream = current, None
    number, pending = 0, b""
    try:
        while True:
            if stream is not None:
                chunk = stream.read()
                if chunk:  # read up to the end before looking at anything else
                    *lines, pending = (pending + chunk).split(b"\n")
                    yield from _kept(path, number, lines, selection, on_bad_line)
                    number += len(lines)
                    continue
            if stop():
                return
            newer = _newer_than(state_dir, stream) if stream is None or _replaced(stream, current) else []
            if not newer:
                time.sleep(poll)
                continue
            if stream is not None:  # a torn last line is not waited for any more
                rest = (pending + stream.read()).split(b"\n")  # written between the last read and the rename
                yield from _kept(path, number, rest, selection, on_bad_line)
                stream.close()
            for older_path, older in newer[:-1]:
                with older:
                    yield from _events_of(older_path, older, selection, on_bad_line)
            (path, stream), number, pending = newer[-1], 0, b""
    finally:
        if stream is not None:
            stream.close()


#: a line written more than this before `since` ends `read_newest`'s reading back: the agent, its workers and the
#: hooks write to the journal at once, and their lines reach it a little out of time order
_LATE = 300.0
#: bytes read at a time, from a file's end back
_BLOCK = 2**20
#: a line longer than this is no journal event (one holds a few fields of events.FIELD_MAX_CHARS): left out whole
_LONGEST_LINE = 4 * 2**20
#: the head of every line events.emit writes ({"time": "<ISO time>", ...); json.dumps escapes what is not ASCII
_TIME_HEAD = re.compile(rb'\{"time": "([0-9T:.+-]{10,40})", ')


def read_newest(state_dir: str, since: float | None, limit: int, max_bytes: int, seconds: float,
                clock: Callable[[], float] = time.monotonic) -> JournalTail:
    """The newest `limit` events written at or after `since` (epoch seconds; None: all of them), read from the
    journal's end back, as many of them as fit in `max_bytes` (each line with its newline) and in `seconds`.

    Why from the end: an agent's /events?since=0 (or a `since` far back) wants the newest events, and parsing the
    whole journal to keep its end (64 MiB: 2 s) was all the probe thread did while clients asked in a loop. Here
    the work is bounded by what is sent (`limit` lines, `max_bytes`) and by `seconds`, whatever the journal's size;
    the events left out for want of bytes or time are counted (`cut`) as far as `limit` and the time go. A line
    counts as an event by its head as events.emit writes it ({"time": ..., up to a closing "}"), and is parsed whole
    only when it has another (written by hand); what is no event is skipped. The reading back ends at the first line
    written more than _LATE before `since`.

    Raises:
        OSError: a journal file exists but cannot be read (no permission).
    """
    deadline = clock() + seconds
    kept: list[bytes] = []
    first_time = ""
    size = cut = 0
    opened = _open_oldest_first(state_dir)
    try:
        for _, stream in reversed(opened):
            if since is not None and os.fstat(stream.fileno()).st_mtime < since - 1:
                break  # last written before `since`, and the older files too
            for line in _lines_back(stream):
                if clock() > deadline:
                    return JournalTail(tuple(reversed(kept)), first_time, cut + 1, out_of_time=True)
                found = _time_of(line)
                if found is None:
                    continue
                when, text = found
                if since is not None and when < since:
                    if when < since - _LATE:
                        return JournalTail(tuple(reversed(kept)), first_time, cut)
                    continue
                if not cut and len(kept) < limit and size + len(line) + 1 <= max_bytes:
                    kept.append(line)
                    size += len(line) + 1
                    first_time = text
                    continue
                if len(kept) + cut >= limit:  # the newest `limit`, sent or counted
                    return JournalTail(tuple(reversed(kept)), first_time, cut)
                cut += 1
    finally:
        for _, stream in opened:
            stream.close()
    return JournalTail(tuple(reversed(kept)), first_time, cut)


def read_after(state_dir: str, cursor: str, max_bytes: int, clock: Callable[[], float] = time.time) -> JournalChunk:
    """The whole lines written after `cursor` ("": from the oldest file kept), as many as fit in `max_bytes` (one
    longer line is still sent alone, up to _LONGEST_LINE), and the cursor after them.

    Why a cursor of (file, offset) and not a time: the journal's times are whole seconds and its writers (the agent,
    its workers, the hooks) append a little out of time order, so no time tells which lines were taken; a byte
    offset does, exactly. A file is named by a digest of its head, which rotation (a rename) keeps, so a cursor
    survives rotations, restarts of the agent and a reboot (the state folder is on disk); one whose file is gone
    says so (`lost`) and the read starts at the oldest file kept (one whose offset is past its file's end, a file
    restored from a backup, goes on from that end, also `lost`). A line still being written (no newline) is left
    for the next read; a rotated file is read past only once it is quiet for _SETTLED (a clock stepped back counts
    as quiet), and a quiet one's end that is no whole line (torn by a full disk) is skipped and counted.

    Raises:
        ValueError: `cursor` is not one (the message says the form).
        OSError: a journal file exists but cannot be read (no permission).
    """
    asked = CURSOR.match(cursor)
    if asked is None:
        raise ValueError(f"cursor {cursor[:40]!r}: expected <16 hex digits>:<offset>, or empty for the start")
    opened = _open_oldest_first(state_dir)
    try:
        names = [_name_of(stream) for _, stream in opened]
        index, offset, lost = 0, 0, False
        if asked.group(1):
            if asked.group(1) in names:
                index, offset = names.index(asked.group(1)), int(asked.group(2))
                end = os.fstat(opened[index][1].fileno()).st_size
                if offset > end:  # not a place in that file (one restored from a backup): on from its end
                    offset, lost = end, True
            else:
                lost = True
        lines: list[bytes] = []
        size = skipped = 0
        at = f"{asked.group(1)}:{offset}" if asked.group(1) in names else ""
        while index < len(opened):
            _, stream = opened[index]
            if names[index] is None:
                break  # its first line is still being written
            taken, offset, full, dropped = _lines_from(stream, offset, max_bytes - size, not lines)
            lines += taken
            size += sum(len(line) + 1 for line in taken)
            skipped += dropped
            at = f"{names[index]}:{offset}"
            if full:
                return JournalChunk(tuple(lines), at, True, lost, skipped)
            info = os.fstat(stream.fileno())
            if index + 1 == len(opened) or abs(clock() - info.st_mtime) < _SETTLED:
                break  # the newest file (its last line may be being written), or a rotated file a writer may reach
            if offset < info.st_size:  # a quiet rotated file ending in no whole line: torn by a full disk
                skipped += 1
                at = f"{names[index]}:{info.st_size}"
            index, offset = index + 1, 0
        return JournalChunk(tuple(lines), at, False, lost, skipped)
    finally:
        for _, stream in opened:
            stream.close()


def _name_of(stream: BinaryIO) -> str | None:
    """The digest that names a journal file (its first line, or its first _NAMED_BY bytes), None while it has
    neither."""
    import hashlib
    stream.seek(0)
    head = stream.read(_NAMED_BY)
    end = head.find(b"\n")
    if end < 0 and len(head) < _NAMED_BY:
        return None
    return hashlib.sha256(head if end < 0 else head[:end + 1]).hexdigest()[:16]


def _lines_from(stream: BinaryIO, offset: int, budget: int, alone: bool) -> tuple[list[bytes], int, bool, int]:
    """(whole lines from `offset` within `budget` bytes, the offset after them, whether the budget ended the read
    with more written, lines over _LONGEST_LINE skipped). With `alone` (nothing taken yet), a first line longer
    than `budget` is taken by itself: one event larger than the client's page is sent, not stuck for ever."""
    skipped = 0
    while True:
        if budget <= 0:
            return [], offset, _pending(stream, offset), skipped
        stream.seek(offset)
        block = stream.read(budget)
        end = block.rfind(b"\n")
        if end >= 0:
            offset += end + 1
            return ([line for line in block[:end].split(b"\n") if line], offset,
                    len(block) == budget and _pending(stream, offset), skipped)
        if len(block) < budget:
            return [], offset, False, skipped  # the end of the file, or a line still being written
        if not alone:
            return [], offset, True, skipped  # the next page takes it by itself
        length = _line_length(stream, offset)
        if length is None:
            return [], offset, False, skipped
        if length - 1 > _LONGEST_LINE:  # no event is this long: a file of garbage must not be gathered in memory
            offset, skipped = offset + length, skipped + 1
            continue
        stream.seek(offset)
        line = stream.read(length)
        offset += length
        return [line[:-1]] if line.strip() else [], offset, _pending(stream, offset), skipped


def _line_length(stream: BinaryIO, offset: int) -> int | None:
    """The length of the line at `offset` with its newline, read through in blocks and not kept; None when it has no
    newline yet."""
    stream.seek(offset)
    length = 0
    while block := stream.read(_BLOCK):
        end = block.find(b"\n")
        if end >= 0:
            return length + end + 1
        length += len(block)
    return None


def _pending(stream: BinaryIO, offset: int) -> bool:
    return os.fstat(stream.fileno()).st_size > offset


def format_event(event: JournalEvent) -> str:
    """`<time> <severity> <component>: <event>: <message>`, control characters escaped."""
    return (f"{event.time.isoformat()} {event.severity:<8} {printable(event.component)}: {printable(event.event)}: "
            f"{printable(event.message)}")


def _rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return None


def _lines_back(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of `stream` up to its size now, without their newlines, the last first (empty ones left out), read
    in blocks from its end; a line longer than _LONGEST_LINE is left out whole (a file of garbage without newlines
    must not be gathered into memory)."""
    position = os.fstat(stream.fileno()).st_size
    rest = b""  # the end of a line whose start is in a block not read yet
    overlong = False  # the line being gathered passed _LONGEST_LINE: what is left of it is dropped
    while position > 0:
        step = min(_BLOCK, position)
        position -= step
        stream.seek(position)
        pieces = stream.read(step).split(b"\n")
        if overlong:
            if len(pieces) == 1:
                continue  # all of this block is the overlong line
            pieces[-1], overlong = b"", False
        else:
            pieces[-1] += rest
        rest = pieces[0]
        for line in reversed(pieces[1:]):
            if line:
                yield line
        if len(rest) > _LONGEST_LINE:
            rest, overlong = b"", True
    if rest and not overlong:
        yield rest


def _time_of(line: bytes) -> tuple[float, str] | None:
    """(epoch seconds, the time as written) of a journal line, or None when it is no journal event."""
    head = _TIME_HEAD.match(line)
    if head is None or not line.endswith(b"}"):
        event = _parse(Path(), 0, line, None)  # not as events.emit writes: parsed whole
        return None if event is None else (event.time.timestamp(), event.time.isoformat())
    text = head.group(1).decode()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (when if when.tzinfo else when.astimezone()).timestamp(), text


def _open_oldest_first(state_dir: str) -> list[tuple[Path, BinaryIO]]:
    """(path, open binary file) of each journal file, oldest first, each file once."""
    opened, seen = [], set()
    for path in reversed(events.journal_files(state_dir)):  # newest first: a rotation now shifts what is left
        stream = _open(path)
        if stream is None:
            continue
        identity = _identity(stream)
        if identity in seen:
            stream.close()
            continue
        seen.add(identity)
        opened.append((path, stream))
    opened.reverse()
    return opened


def _newer_than(state_dir: str, stream: BinaryIO | None) -> list[tuple[Path, BinaryIO]]:
    """The journal files written after `stream`'s, oldest first (all of them when `stream` is None or gone)."""
    opened = _open_oldest_first(state_dir)
    if stream is None:
        return opened
    ids = [_identity(older) for _, older in opened]
    mine = _identity(stream)
    if mine not in ids:  # rotated out of the kept files: every one left is newer
        return opened
    for _, older in opened[:ids.index(mine) + 1]:
        older.close()
    return opened[ids.index(mine) + 1:]


def _replaced(stream: BinaryIO, path: Path) -> bool:
    """`path` is now another file than `stream`'s: the journal rotated since `stream` was opened."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) != _identity(stream)


def _identity(stream: BinaryIO) -> tuple[int, int]:
    info = os.fstat(stream.fileno())
    return info.st_dev, info.st_ino


def _kept(path: Path, number: int, lines: list[bytes], selection: EventFilter,
          on_bad_line: BadLineHandler | None) -> Iterator[JournalEvent]:
    """The events of `lines` that `selection` keeps; `number`: the line number before the first."""
    for offset, text in enumerate(lines, 1):
        found = _parse(path, number + offset, text, on_bad_line)
        if found is not None and selection.keeps(found):
            yield found


def _events_of(path: Path, stream: BinaryIO, selection: EventFilter, on_bad_line: BadLineHandler | None
               ) -> Iterator[JournalEvent]:
    for number, text in enumerate(stream, 1):
        found = _parse(path, number, text.rstrip(b"\n"), on_bad_line)
        if found is not None and selection.keeps(found):
            yield found


def _parse(path: Path, number: int, text: bytes, on_bad_line: BadLineHandler | None) -> JournalEvent | None:
    """The event on one line, or None (reported to `on_bad_line`) when it is not one."""
    if not text.strip():
        return None
    try:
        line = text.decode()
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        head = [record.get(key) for key in _HEAD]
        if not all(isinstance(value, str) for value in head):
            raise ValueError(f"lacks one of the fields {', '.join(_HEAD)}")
        when = datetime.fromisoformat(head[0])
        if when.tzinfo is None:
            when = when.astimezone()
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if on_bad_line is not None:
            on_bad_line(path, number, f"not a journal event ({err}); skipped")
        return None
    fields = {key: value for key, value in record.items() if key not in _HEAD}
    return JournalEvent(when, head[1], head[2], head[3], head[4], fields, line)

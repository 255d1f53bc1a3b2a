"""Numbers and times in what operators read: "1 finding", never "1 findings"; one time format everywhere.

The time format is ISO 8601 with the zone's offset (`2026-12-05T06:30:00+01:00`): one an operator can paste into
`--since`, `sacct -S` or `date -d`, sortable, and not ambiguous across zones or a change of summer time. JSON
carries epoch seconds under names that say so (`opened_epoch`), beside the same moment in this format.
"""

from __future__ import annotations

import time

__all__ = ["counted", "moment", "stamped"]


def counted(count: int, noun: str, plural: str = "") -> str:
    """`count` and `noun`, the noun in the plural unless the count is one (`plural` where adding "s" is wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def moment(epoch: float | None = None) -> str:
    """`epoch` (now when None) in the one time format: local time, to the second, with the zone's offset."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch))
    return f"{text[:-2]}:{text[-2:]}"  # +0100 -> +01:00, the form RFC 3339 and Python's isoformat() write


def stamped(record: dict, *names: str) -> dict:
    """`record` for JSON with each epoch-seconds field of `names` said twice: the number under `<name>_epoch`, the
    moment in the one format under `<name>`. A bare number named `opened` left a reader to guess its unit and zone;
    a field that is None stays None under both names."""
    out = dict(record)
    for name in names:
        epoch = out.get(name)
        out[f"{name}_epoch"] = epoch
        out[name] = None if epoch is None else moment(epoch)
    return out

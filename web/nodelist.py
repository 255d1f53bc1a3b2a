"""The Nodes list's page of rows: filtered, sorted and cut on the server (/api/nodes).

The page holds every node's row without its GPU readings (changes.py); the
list shows each GPU, so it asks for the rows it draws, whole, with the
operator's filters: at 10,000 nodes of 8 GPUs the whole view is 26 MiB, a
page of 100 rows about 250 KiB. Filters and sorts are the list's own: state,
a part of the name (or `=NAME`, that node alone), and a column.
"""

from __future__ import annotations

import re

from slurm_ext.repair.status import STATES


__all__ = ["SORTS", "page_of", "ordered"]

#: the columns the list sorts by
SORTS = ("name", "state", "gpus_used", "utilization", "memory", "temperature", "jobs", "reason")
_DIGITS = re.compile(r"(\d+)")


def page_of(rows: list[dict], state: str = "", name: str = "", sort: str = "name", desc: bool = False,
            offset: int = 0, limit: int = 100) -> tuple[int, list[dict]]:
    """(how many rows match, the `limit` of them from `offset` in the order asked); ties go by name, n2 before
    n10, and a node without a figure comes first in ascending order."""
    found = ordered(rows, state, name, sort, desc)
    return len(found), found[offset:offset + limit]


def ordered(rows: list[dict], state: str = "", name: str = "", sort: str = "name", desc: bool = False) -> list[dict]:
    """The rows that match, in the order asked (page_of's; what a caller caches per view and question)."""
    exact = name[1:] if name.startswith("=") else None
    part = name.lower()
    found = [row for row in rows if (not state or row.get("state") == state)
             and (not name or (row.get("name") == exact if exact is not None else part in str(row.get("name")).lower()))]
    found.sort(key=lambda row: _natural(str(row.get("name", ""))))
    if sort != "name":
        found.sort(key=lambda row: _value(row, sort))
    if desc:
        found.reverse()  # ties by name descending too, as a sort by name descending
    return found


def _natural(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def _value(row: dict, sort: str):
    if sort == "state":
        return STATES.index(row["state"]) if row.get("state") in STATES else len(STATES)
    if sort == "jobs":
        return len(row.get("jobs") or ())
    if sort == "gpus_used":
        return row.get("gpus_used") or 0
    if sort == "reason":
        return str(row.get("reason") or "")
    utilization, used, total, temperature, _ = row.get("figures") or (None, None, None, None, 0)
    value = {"utilization": utilization, "memory": used / total if used is not None and total else None,
             "temperature": temperature}[sort]
    return -1 if value is None else value

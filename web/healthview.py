"""The Health checks tab's history: each health event of the node journals as one row, and the end of every finding.

A finding's journal events are health-finding (opened), health-escalated and
health-cleared; a cleared row carries the finding's severity in its fields,
and the tab reads it as "cleared", never as that severity. A finding the node
ended by rebooting has no health-cleared event (the monitor starts on the new
boot with none of the last boot's findings, and says nothing of them): a
finding the journal shows opened and not cleared, that the node's agent no
longer holds open, and after which the monitor started again, gets a
"cleared" row at that start, marked as made by the page from what is recorded.
"""

from __future__ import annotations

__all__ = ["history_rows", "SEVERITY_OF"]

#: the journal's severities in a finding's words, for health events that carry no finding_severity (a check's own
#: failure is an error of the check, not of the node)
SEVERITY_OF = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}
#: what a row's state is, by its event
_STATE_OF = {"health-finding": "open", "health-escalated": "open", "health-cleared": "cleared"}


def _severity(data: dict) -> str:
    found = data.get("finding_severity")
    if isinstance(found, str) and found:
        return found
    return SEVERITY_OF.get(str(data.get("severity")), "")


def _row(when: float, node: str, data: dict, state: str, why: str = "", made: bool = False) -> dict:
    return {"time": when, "node": node, "event": data.get("event", ""), "check": data.get("check", ""),
            "subject": data.get("subject", ""), "severity": _severity(data), "state": state, "why": why,
            "gpu": data.get("gpu"), "evidence": data.get("evidence", ""), "action": data.get("action", ""),
            "message": data.get("message", ""), "made_by_page": made}


def history_rows(events: list[tuple[float, str, dict]], open_now: dict[str, set]) -> list[dict]:
    """The rows of health events `events` (epoch, node, event; newest first, as `Watcher.journal` gives them: the
    journal's times are whole seconds, and one second's events are taken in the order written), newest first, with
    a "cleared" row added for each
    finding ended by a reboot. `open_now`: node -> the (check, subject) its agent holds open now; a node missing
    from it (its agent does not answer) gets no added row, since what it holds is not known."""
    rows = []
    #: (node, check, subject) -> the finding's last opening event, and the first start of the monitor after it
    opened: dict[tuple[str, str, str], tuple[dict, float | None]] = {}
    for when, node, data in sorted(reversed(events), key=lambda item: item[0]):  # oldest first, stable
        name = data.get("event", "")
        state = _STATE_OF.get(name, "")
        rows.append(_row(when, node, data, state, str(data.get("why", "")) if state == "cleared" else ""))
        key = (node, str(data.get("check", "")), str(data.get("subject", "")))
        if state == "open":
            opened[key] = (data, None)
        elif state == "cleared":
            opened.pop(key, None)
        elif name == "health-started":
            for found, (found_data, started) in opened.items():
                if found[0] == node and started is None:
                    opened[found] = (found_data, when)
    for (node, check, subject), (data, started) in opened.items():
        if started is None or node not in open_now or (check, subject) in open_now[node]:
            continue
        cleared = {**data, "event": "health-cleared",
                   "message": f"{check} {subject}: cleared (the node rebooted: its health monitor started again "
                              "without it; no health-cleared event was written, this row is the page's)"}
        rows.append(_row(started, node, cleared, "cleared", "reboot", made=True))
    rows.sort(key=lambda row: row["time"])  # stable: one second's rows as written, a made row after its start
    rows.reverse()
    return rows

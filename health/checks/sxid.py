"""SXid: an NVSwitch error line, judged by the line's Fatal/Non-fatal and the Fabric Manager guide's lists.

A Fatal line takes the fabric (and every GPU on it) down: critical, the check's action (reboot: the guide's
recovery is a reset of every GPU and NVSwitch or a restart of the host). An SXid the guide calls always fatal is
critical whatever the line says. A Non-fatal line is a warning, or info for those the guide says have no impact
(single-bit ECC, 22013); a line that says neither (the switch's SOE: "26006, SOE HALTED") is judged by the
guide's list, a warning when it is not there.

What one source can cost is bounded as for Xids: at most `MAX_SWITCHES` NVSwitch bus ids have findings of their
own within the window (the rest share `nvswitch/sxid`), and each at most `MAX_SXIDS_PER_SWITCH` SXid numbers (the
rest share `<bus>/sxid-other`); the window is the check's, or an hour.
"""

from __future__ import annotations

from .. import xids
from ..check import Check, View
from ..records import Observation, SXid
from ..settings import Params

#: NVSwitch bus ids with findings of their own within the window (an HGX board has 4 to 6 switches)
MAX_SWITCHES = 8
#: SXid numbers with a finding of their own per switch within the window
MAX_SXIDS_PER_SWITCH = 8
#: the window of those bounds when the check has none of its own
BOUND_WINDOW = 3600.0


def judge(sxid: SXid, view: View, params: Params) -> list:
    entry = xids.sxid_entry(sxid.sxid)
    if sxid.fatal or entry.kind == "always-fatal":
        severity, action = params.severity, params.action
    else:
        severity, action = entry.severity, entry.action
    said = {True: "Fatal", False: "Non-fatal", None: "unstated"}[sxid.fatal]
    return [Observation(params.id, subject_of(sxid, view.recent, params.window or BOUND_WINDOW), severity, action,
                        f"{sxid.sxid} {said} nvswitch {sxid.pci_bus_id or 'unknown'}",
                        pci_bus_id=sxid.pci_bus_id, detail=sxid.text, sticky=severity == "critical",
                        fields={"sxid": sxid.sxid, "name": entry.name, "class": entry.kind, "expected": "none"})]


def subject_of(sxid: SXid, recent, window: float) -> str:
    """`<bus>/sxid<n>` for the first switches and numbers seen within `window`, else a shared finding."""
    switches: list[str] = []
    numbers: list[int] = []
    for old in recent:
        if isinstance(old, SXid) and 0 <= sxid.time - old.time <= window:
            if old.pci_bus_id not in switches:
                switches.append(old.pci_bus_id)
            if old.pci_bus_id == sxid.pci_bus_id and old.sxid not in numbers:
                numbers.append(old.sxid)
    bus = sxid.pci_bus_id or "nvswitch"
    if sxid.pci_bus_id not in switches[:MAX_SWITCHES] and len(switches) >= MAX_SWITCHES:
        return "nvswitch/sxid"
    if sxid.sxid not in numbers[:MAX_SXIDS_PER_SWITCH] and len(numbers) >= MAX_SXIDS_PER_SWITCH:
        return f"{bus}/sxid-other"
    return f"{bus}/sxid{sxid.sxid}"


CHECK = Check("sxid", "kernel", on_event=judge, events=(SXid,))

"""SXid: an NVSwitch error line; Fatal ones take the fabric (and every GPU on it) down."""

from ..check import Check, View
from ..records import Observation, SXid
from ..settings import Params


def judge(sxid: SXid, view: View, params: Params) -> list:
    severity, action = (params.severity, params.action) if sxid.fatal else ("warning", "none")
    kind = "Fatal" if sxid.fatal else "Non-fatal"
    return [Observation(params.id, f"{sxid.pci_bus_id or 'nvswitch'}/sxid{sxid.sxid}", severity, action,
                        f"{sxid.sxid} {kind} nvswitch {sxid.pci_bus_id} (expected none)",
                        pci_bus_id=sxid.pci_bus_id, detail=sxid.text, sticky=sxid.fatal,
                        fields={"sxid": sxid.sxid})]


CHECK = Check("sxid", "kernel", on_event=judge, events=(SXid,))

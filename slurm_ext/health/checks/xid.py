"""Xid: from the kernel log or an NVML event, judged by NVIDIA's catalog (catalog.py).

An application's Xid is a warning; the same one on the same GPU `threshold`
times within `window` becomes critical with action reboot (a GPU that keeps
faulting under different jobs is the GPU's fault). NVLink5 Xids follow the
line's Fatal/Nonfatal; Xid 154 acts on the action the driver states. An Xid
for a bus id no GPU has is still a finding, for the node.
"""

from slurm_ext.config import format_duration

from .. import catalog
from ..check import Check, View
from ..records import Observation, Xid
from ..settings import Params


def judge(xid: Xid, view: View, params: Params) -> list:
    entry = catalog.entry(xid.xid)
    severity, action, sticky = entry.severity, entry.action, entry.sticky
    meaning = entry.meaning
    if xid.fatal is not None and 144 <= xid.xid <= 150:
        severity, sticky = ("critical", True) if xid.fatal else ("warning", False)
        action = entry.action if xid.fatal else "none"
    if xid.xid == 154 and xid.recovery:
        meaning, severity, action = catalog.recovery_entry(xid.recovery)
        sticky = severity == "critical"
    gpu = view.gpu(xid.pci_bus_id, xid.uuid)
    subject = gpu.uuid if gpu else (xid.uuid or xid.pci_bus_id or "node")
    repeats = 1 + sum(1 for old in view.recent if isinstance(old, Xid) and old.xid == xid.xid
                      and _same_gpu(old, xid) and xid.time - old.time <= params.window)
    escalated = entry.application and params.threshold is not None and repeats >= params.threshold
    if escalated:
        severity, action, sticky = "critical", "reboot", True
    override = view.xid_overrides.get(str(xid.xid))
    if override is not None:
        severity = override.severity or severity
        action = override.action or action
        sticky = override.sticky if override.sticky is not None else severity == "critical"
    where = f"gpu {gpu.index}" if gpu else (f"bus {xid.pci_bus_id} (no such gpu)" if xid.pci_bus_id else "node")
    count = f", {repeats} in {format_duration(params.window)} (limit {params.threshold - 1:g})" if escalated else ""
    return [Observation(params.id, f"{subject}/xid{xid.xid}", severity, action,
                        f"{xid.xid} {where} {entry.mnemonic}" + (count if escalated else " (expected none)"),
                        gpu=gpu, pci_bus_id=gpu.pci_bus_id if gpu else xid.pci_bus_id, detail=xid.text,
                        sticky=sticky, fields={"xid": xid.xid, "source": xid.source, "meaning": meaning,
                                               "bucket": entry.bucket, "repeats": repeats})]


def _same_gpu(a: Xid, b: Xid) -> bool:
    return (a.uuid and a.uuid == b.uuid) or (a.pci_bus_id and a.pci_bus_id == b.pci_bus_id)


CHECK = Check("xid", "kernel", on_event=judge, events=(Xid,))

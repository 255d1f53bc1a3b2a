"""Xid: from the kernel log or an NVML event, judged by NVIDIA's catalog (xids.py).

Faults are counted, not lines: a crash prints a burst of Xid lines (16 Xid 13
lines in 2 ms from one process, in a real log), so the lines of one burst
(`BURST` seconds from its first) or of one process on one GPU are one fault.
An application's Xid is a warning; when NVIDIA's investigatory step for it
asks to look further on repeats (13, 31: diagnostics), `threshold` faults
of it on one GPU within `window` make it a warning with action reset-gpu
that names that step: never a drain, because the jobs on the node are other
users' and NVIDIA calls it investigation, not recovery. NVLink5 Xids
(144-150) follow NVIDIA's decode of the line's unit, Fatal/Nonfatal and
status; Xid 154 acts on the action the driver states.

What one source can cost is bounded: every Xid for a bus id no GPU has (or
with no GPU named) is the one node finding `node/xid`, whose severity is the
worst of them; a GPU has a finding per Xid number for at most
`MAX_XIDS_PER_GPU` numbers within `window`, and one `<uuid>/xid-other` for
the rest and for numbers the catalog does not know.
"""

from __future__ import annotations

from slurm_ext.config import format_duration

from .. import xids
from ..check import Check, View
from ..records import Observation, Xid
from ..settings import Params

#: lines of one Xid on one GPU within this many seconds of the first are one fault (a crash prints a burst)
BURST = 5.0
#: distinct Xid numbers with a finding of their own per GPU within the window; the rest share `<uuid>/xid-other`
MAX_XIDS_PER_GPU = 8
#: the one finding of every Xid whose GPU is not known
NODE_SUBJECT = "node/xid"


def judge(xid: Xid, view: View, params: Params) -> list:
    entry = xids.entry(xid.xid)
    gpu = view.gpu(xid.pci_bus_id, xid.uuid)
    severity, action, meaning, bucket = entry.severity, entry.action, entry.meaning, entry.bucket
    if 144 <= xid.xid <= 150:
        bucket = xids.nvlink5_bucket(xid.xid, xid.unit, xid.fatal, xid.intrinfo, xid.error_status)
        severity, action = xids.bucket_verdict(bucket)
    if xid.xid == 154 and xid.recovery:
        meaning, severity, action = xids.recovery_entry(xid.recovery)
    sticky = severity == "critical"
    names = _gpu_names(view)
    mine = _same_xid_same_gpu(xid, names, view.recent, params.window)
    faults = count_faults([*mine, xid])
    step = xids.REPEAT_WORKFLOWS.get(entry.investigatory) if entry.application else None
    escalated = step is not None and params.threshold is not None and faults >= params.threshold
    if escalated:
        severity, action, sticky = "warning", "reset-gpu", False
    override = view.xid_overrides.get(str(xid.xid))
    if override is not None:
        severity = override.severity or severity
        action = override.action or action
        sticky = override.sticky if override.sticky is not None else severity == "critical"
    where = f"gpu {gpu.index}" if gpu else (f"bus {xid.pci_bus_id} (no such gpu)" if xid.pci_bus_id else "node")
    # what the drain reason shows: the code first (repair tells faults apart by it), the GPU, NVIDIA's words
    evidence = f"{xid.xid} {where} {xids.short_meaning(entry)}"
    expected = "none"
    if escalated:
        evidence += f", {faults} faults in {format_duration(params.window)}: {step} (NVIDIA {entry.investigatory})"
        expected = f"at most {params.threshold - 1:g} faults in {format_duration(params.window)}"
    fields = {"xid": xid.xid, "source": xid.source, "meaning": meaning, "bucket": bucket, "mnemonic": entry.mnemonic,
              "investigatory": entry.investigatory, "repeats": faults, "expected": expected}
    fields.update({name: value for name, value in (("pid", xid.pid), ("gpu_instance", xid.gpu_instance),
                                                   ("compute_instance", xid.compute_instance), ("unit", xid.unit))
                   if value not in (None, "")})
    subject = subject_of(xid, gpu, names, view.recent, params.window)
    return [Observation(params.id, subject, severity, action, evidence, gpu=gpu,
                        pci_bus_id=gpu.pci_bus_id if gpu else xid.pci_bus_id, detail=xid.text, sticky=sticky,
                        fields=fields)]


def subject_of(xid: Xid, gpu, names: dict[str, str], recent, window: float) -> str:
    """The finding an Xid belongs to: its GPU's finding for its number; `<uuid>/xid-other` past the GPU's first
    MAX_XIDS_PER_GPU numbers within `window`, or for a number the catalog does not know; `node/xid` when no GPU
    has its bus id (a line can name any bus: one finding, however many it names)."""
    if gpu is None:
        return NODE_SUBJECT
    if xid.xid not in xids.KNOWN:
        return f"{gpu.uuid}/xid-other"
    seen = []
    for old in recent:
        if isinstance(old, Xid) and xid.time - old.time <= window and old.xid in xids.KNOWN \
                and old.xid not in seen and _gpu_key(old, names) == gpu.uuid:
            seen.append(old.xid)
    if xid.xid in seen[:MAX_XIDS_PER_GPU] or len(seen) < MAX_XIDS_PER_GPU:
        return f"{gpu.uuid}/xid{xid.xid}"
    return f"{gpu.uuid}/xid-other"


def count_faults(records: list[Xid]) -> int:
    """How many faults `records` (one Xid on one GPU) are: a line is part of an earlier fault when it comes within
    BURST seconds of that fault's first line, or names a process an earlier line named."""
    faults, started, pids = 0, None, set()
    for record in sorted(records, key=lambda r: r.time):
        same_process = record.pid is not None and record.pid in pids
        same_burst = started is not None and 0 <= record.time - started <= BURST
        if not (same_process or same_burst):
            faults += 1
            started = record.time
        if record.pid is not None:
            pids.add(record.pid)
    return faults


def _same_xid_same_gpu(xid: Xid, names: dict[str, str], recent, window: float) -> list[Xid]:
    key = _gpu_key(xid, names)
    return [old for old in recent if isinstance(old, Xid) and old.xid == xid.xid
            and 0 <= xid.time - old.time <= window and _gpu_key(old, names) == key]


def _gpu_names(view: View) -> dict[str, str]:
    """Bus id and UUID -> UUID of every GPU the view knows (View.gpu's GPUs), looked up once per judgement."""
    for snapshot in reversed(view.snapshots):
        if snapshot.gpus:
            return {name: s.gpu.uuid for s in snapshot.gpus for name in (s.gpu.uuid, s.gpu.pci_bus_id) if name}
    return {}


def _gpu_key(xid: Xid, names: dict[str, str]) -> str:
    """One name per GPU whichever the source (a kernel line names the bus, an NVML event the UUID)."""
    return names.get(xid.uuid) or names.get(xid.pci_bus_id) or xid.uuid or xid.pci_bus_id


CHECK = Check("xid", "kernel", on_event=judge, events=(Xid,))

"""NVIDIA's Xid catalog as this project acts on it: what each Xid means and what to do.

The buckets are NVIDIA's (Xid catalog, "Resolution Buckets"): RESTART_APP
means the application, not the GPU; RESET_GPU and RESTART_BM mean the GPU
or the node. Ours maps them onto the one list of actions
(settings.ACTIONS) and a severity: an application's Xid (13, 31, 43, 45,
94, ...) is a warning, never a drain, because one job's crash flagging a
whole rack is the best-known failure of GPU health tools; the same one
repeating on one GPU escalates (the xid check). Xids whose fix is a reset
or a reboot are sticky: a quiet hour does not make the GPU good again.

An Xid missing here is an event (a warning naming NVIDIA's catalog), never
a crash; [health.xid.N] adds or overrides entries per site.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["XidEntry", "entry", "KNOWN", "RECOVERY_ACTIONS", "recovery_entry"]


@dataclass(frozen=True, slots=True)
class XidEntry:
    xid: int
    mnemonic: str
    meaning: str
    #: NVIDIA's immediate resolution bucket
    bucket: str
    severity: str
    action: str
    #: an application's fault: a warning that escalates when it repeats on one GPU
    application: bool = False
    sticky: bool = False


def _app(xid, mnemonic, meaning, bucket="RESTART_APP", action="restart-job"):
    return XidEntry(xid, mnemonic, meaning, bucket, "warning", action, application=True)


def _hw(xid, mnemonic, meaning, bucket, action, severity="critical"):
    return XidEntry(xid, mnemonic, meaning, bucket, severity, action, sticky=severity == "critical")


def _info(xid, mnemonic, meaning, bucket="IGNORE"):
    return XidEntry(xid, mnemonic, meaning, bucket, "info", "none")


_ENTRIES = (
    _app(8, "ROBUST_CHANNEL_GPU_TIMEOUT", "GPU stopped processing (the application's work timed out)"),
    _app(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (SM warp exception, out-of-range address)"),
    _app(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (MMU fault)"),
    _app(32, "ROBUST_CHANNEL_PBDMA_ERROR", "invalid or corrupted push buffer stream"),
    _app(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (the application's fault)"),
    # a by-product of another error (follow that one): a warning that never escalates, however often it comes
    # (one job's crash on an NVL72 made hundreds of them, and their escalation drained racks: NVSentinel #1710)
    XidEntry(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive clean-up after an earlier error (follow that one)",
             "WORKFLOW_XID_45", "warning", "none"),
    _app(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "video decoder exception"),
    _app(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error"),
    _app(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained ECC error: only the application that touched it is hit"),
    _app(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", bucket="RESTART_APP"),
    _hw(38, "DRIVER_FIRMWARE_ERROR", "driver firmware error", "RESTART_BM", "reboot"),
    _hw(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error", "WORKFLOW_XID_48", "reset-gpu"),
    _hw(54, "ROBUST_CHANNEL_AUXILIARY_POWER", "auxiliary power is not connected to the GPU", "CHECK_MECHANICALS",
        "remove"),
    _hw(56, "ROBUST_CHANNEL_DISPLAY_ENGINE_ERROR", "display engine error", "RESET_GPU", "reset-gpu"),
    _hw(57, "ROBUST_CHANNEL_FB_INTERFACE_ERROR", "error programming video memory interface", "RESET_GPU",
        "reset-gpu"),
    _hw(58, "ROBUST_CHANNEL_UNSTABLE_VIDEO_MEMORY", "unstable video memory interface detected", "RESET_GPU",
        "reset-gpu"),
    _hw(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint", "CONTACT_SUPPORT", "reboot"),
    _hw(62, "PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", "reset-gpu"),
    _info(63, "INFOROM_DRAM_RETIREMENT_EVENT", "a row was marked for remapping (the row-remap check says when a "
          "reset is due)"),
    _hw(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "recording a row remap or page retirement failed", "RESET_GPU",
        "reset-gpu"),
    _hw(74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR", "reboot"),
    _hw(79, "GPU_HAS_FALLEN_OFF_THE_BUS", "the GPU has fallen off the bus", "RESTART_BM", "reboot"),
    _hw(92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", "IGNORE", "none", severity="warning"),
    _hw(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained ECC error: every application on the GPU is hit",
        "RESET_GPU", "reset-gpu"),
    _hw(119, "GSP_RPC_TIMEOUT", "GSP firmware did not answer an RPC in time", "RESET_GPU", "reboot"),
    _hw(120, "GSP_ERROR", "GSP firmware error", "RESET_GPU", "reboot"),
    _hw(121, "C2C_ERROR", "chip-to-chip (C2C) link error", "RESTART_BM", "reboot"),
    _hw(136, "ALI_TRAINING_FAIL", "NVLink link training failed", "RESET_GPU", "reset-gpu"),
    _hw(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "an ECC error escaped containment", "RESET_GPU", "reset-gpu"),
    _hw(143, "GPU_INIT_ERROR", "GPU initialisation failed", "RESET_GPU", "reset-gpu"),
    *(_hw(n, f"NVLINK_{unit}_ERROR", f"NVLink5 {unit} error (Fatal lines are critical, Nonfatal a warning)",
          "WORKFLOW_NVLINK5_ERR", "reboot")
      for n, unit in ((144, "SAW"), (145, "RLW"), (146, "TLW"), (147, "TREX"), (148, "NVLPW_CTRL"),
                      (149, "NETIR"), (150, "MSE"))),
    _info(154, "GPU_RECOVERY_ACTION_CHANGED", "the driver states the recovery action of an earlier error",
          bucket="XID_154"),
)

#: the catalog, by Xid number
KNOWN: dict[int, XidEntry] = {e.xid: e for e in _ENTRIES}

#: Xid 154's stated action ("... to 0x2 (Node Reboot Required)") and NVML's nvmlGpuRecoveryAction_t values
RECOVERY_ACTIONS = {
    "none": ("info", "none"),
    "gpu reset required": ("critical", "reset-gpu"),
    "node reboot required": ("critical", "reboot"),
    "drain p2p": ("warning", "restart-job"),
    "drain and reset": ("critical", "reset-gpu"),
}
_RECOVERY_CODES = {0: "none", 1: "gpu reset required", 2: "node reboot required", 3: "drain p2p",
                   4: "drain and reset"}


def entry(xid: int) -> XidEntry:
    """The catalog's entry for `xid`; one not in the catalog is a warning with no action, never a crash."""
    found = KNOWN.get(xid)
    if found is not None:
        return found
    return XidEntry(xid, "UNKNOWN", "not in this catalog: look it up in NVIDIA's Xid catalog "
                    "(docs.nvidia.com/deploy/xid-errors)", "UNKNOWN", "warning", "none")


def recovery_entry(stated: str | int) -> tuple[str, str, str]:
    """(words, severity, action) of a recovery action, as Xid 154 states it or NVML's field gives it."""
    words = _RECOVERY_CODES.get(stated, "") if isinstance(stated, int) else stated.strip().lower()
    severity, action = RECOVERY_ACTIONS.get(words, ("warning", "none"))
    return words or f"recovery action {stated}", severity, action

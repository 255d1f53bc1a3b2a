"""NVIDIA's Xid catalog and Fabric Manager's SXid list, as this project acts on them.

Source, and the revision followed:
- Xids: NVIDIA's Xid Catalog for Ampere and newer GPUs, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
  and its Xid-Catalog.xlsx: the revision that lists Xids 1-172 and the "XID 144-150 Decode" sheet in its V1 (driver
  < R575) and V2 (>= R575) IntrInfo forms (newest trigger notes: CUDA 12.9 / driver R575), read 2026-12-04.
  Rows NVIDIA marks "Unused" on every GPU it lists are left out: they are judged as unknown Xids.
- SXids: NVIDIA Fabric Manager User Guide DU-09883-001_v1.3 (October 2023), appendix D.4-D.7 (non-fatal, fatal,
  always fatal and other notable NVSwitch SXid errors).

NVIDIA gives each Xid an immediate resolution bucket (what recovers the node now: RESTART_APP, RESET_GPU,
RESTART_BM, IGNORE, ...) and an investigatory one (what to look into when it comes back). `BUCKETS` maps the
immediate bucket onto this project's severities and its closed list of actions (settings.ACTIONS): RESET_GPU is
reset-gpu, RESTART_BM reboot, RESTART_APP restart-job (a warning: the job's fault, never a drain), IGNORE no
action (info). Xids whose fix is a reset or a reboot are sticky: a quiet hour does not make the GPU good again.
Where slurm-ext departs from NVIDIA it says so in `DEPARTURES`, with the reason (docs/operator/health.md lists
them too). An Xid missing here is a warning naming NVIDIA's catalog, never a crash; [health.xid.N] overrides any
entry per site.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["XidEntry", "SXidEntry", "entry", "sxid_entry", "KNOWN", "SXIDS", "BUCKETS", "DEPARTURES",
           "REPEAT_WORKFLOWS", "RECOVERY_ACTIONS", "CATALOG_REVISION", "SXID_REVISION", "recovery_entry", "short_meaning",
           "nvlink5_bucket", "bucket_verdict"]

CATALOG_REVISION = ("NVIDIA Xid Catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "
                    "Xid-Catalog.xlsx): Xids 1-172, Xid 144-150 Decode V1 (<R575) and V2 (>=R575); read 2026-12-04")
SXID_REVISION = "NVIDIA Fabric Manager User Guide DU-09883-001_v1.3 (October 2023), appendix D.4-D.7"


@dataclass(frozen=True, slots=True)
class XidEntry:
    xid: int
    mnemonic: str
    meaning: str
    #: NVIDIA's immediate resolution bucket
    bucket: str
    severity: str
    action: str
    #: an application's fault (NVIDIA: RESTART_APP): a warning, never a drain
    application: bool = False
    sticky: bool = False
    #: NVIDIA's investigatory resolution bucket: what to look into when it comes back
    investigatory: str = ""


@dataclass(frozen=True, slots=True)
class SXidEntry:
    sxid: int
    name: str
    #: the Fabric Manager guide's class: non-fatal (D.4), fatal (D.5: fatal on the port or partition),
    #: always-fatal (D.6: the whole fabric), notable (D.7)
    kind: str
    severity: str
    action: str


#: NVIDIA's immediate bucket -> (severity, action). Critical drains the node; warning and info are events.
BUCKETS: dict[str, tuple[str, str]] = {
    "RESTART_APP": ("warning", "restart-job"),
    "IGNORE": ("info", "none"),
    "RESET_GPU": ("critical", "reset-gpu"),
    "RESTART_BM": ("critical", "reboot"),
    # the VM that owns the GPU: where slurm-ext runs in that VM, restarting it is the node's reboot
    "RESTART_VM": ("critical", "reboot"),
    # seating and connections: hands on the hardware, so the node leaves the pool
    "CHECK_MECHANICALS": ("critical", "remove"),
    # "if UVM is used, RESET_GPU": every CUDA context uses nvidia-uvm
    "CHECK_UVM": ("critical", "reset-gpu"),
    # solo: RESET_GPU; with Xid 63/64: drain and reset: the same action here
    "WORKFLOW_XID_48": ("critical", "reset-gpu"),
    # solo: restart Fabric Manager; with another Xid (the usual case: an application aborted): follow that one
    "WORKFLOW_XID_45": ("warning", "none"),
    # "a GPU reset or node reboot is needed to clear this error": the lesser of the two
    "WORKFLOW_NVLINK_ERR": ("critical", "reset-gpu"),
    # decoded per line (nvlink5_bucket); a line whose unit and severity cannot be read is left to Xid 154
    "WORKFLOW_NVLINK5_ERR": ("warning", "none"),
    # "if an Xid 154 is seen with this error take that action, else RESTART_APP": the 154 line is judged itself
    "XID_154_EVAL": ("warning", "restart-job"),
    # the recovery action the line states decides (recovery_entry)
    "XID_154": ("info", "none"),
    # newer firmware and software: a node image of its own
    "UPDATE_SWFW": ("warning", "reprovision"),
    "CONTACT_SUPPORT": ("warning", "none"),
    # NVIDIA gives no bucket (Xids 162-172): the row's text is all there is
    "": ("warning", "none"),
}

#: investigatory buckets for an application Xid that repeats on one GPU across faults: NVIDIA's repeat workflows
#: (13: same GPC/TPC, 31: same GPU -> DCGM diagnostics, then field diagnostics) and the ones that say to look
#: further when it comes back
REPEAT_WORKFLOWS = {"WORKFLOW_XID_13": "run DCGM diagnostics (dcgmi diag -r 3), then field diagnostics",
                    "WORKFLOW_XID_31": "run DCGM diagnostics (dcgmi diag -r 3), then field diagnostics",
                    "CONTACT_SUPPORT": "contact support", "INVESTIGATE_SW": "investigate the driver and software"}

# Code | mnemonic | immediate bucket | investigatory bucket | NVIDIA's description (abridged; an indented line goes on)
_XIDS = """
8 | ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT | RESTART_APP | CONTACT_SUPPORT | GPU stopped processing
11 | ROBUST_CHANNEL_GR_ERROR_MISSING_HW | RESTART_APP | CHECK_APP/CUDA | invalid or corrupted push buffer stream
13 | ROBUST_CHANNEL_GR_EXCEPTION | RESTART_APP | WORKFLOW_XID_13 | graphics engine exception (SM warp exception,
    out-of-range address)
14 | ROBUST_CHANNEL_FAKE_ERROR | IGNORE | CONTACT_SUPPORT | fake or injected error from user space
25 | ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY | RESTART_APP | CHECK_APP/CUDA | invalid or illegal push buffer stream
31 | ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT | RESTART_APP | WORKFLOW_XID_31 | GPU memory page fault (MMU fault)
32 | ROBUST_CHANNEL_PBDMA_ERROR | RESTART_APP | CHECK_APP/CUDA | invalid or corrupted push buffer stream (DMA, PCIe
    quality)
37 | ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD | IGNORE | CHECK_APP/CUDA | driver firmware error
38 | ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT | IGNORE | CONTACT_SUPPORT | driver firmware error
39 | ROBUST_CHANNEL_CE0_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine exception
40 | ROBUST_CHANNEL_CE1_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine exception
41 | ROBUST_CHANNEL_CE2_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine exception
43 | ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR | IGNORE | CONTACT_SUPPORT | GPU stopped processing (the application's
    fault; the GPU stays healthy)
44 | ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW | IGNORE | CONTACT_SUPPORT | graphics engine fault during context switch
45 | ROBUST_CHANNEL_PREEMPTIVE_REMOVAL | WORKFLOW_XID_45 | WORKFLOW_XID_45 | preemptive clean-up after an earlier
    error or an aborted application
46 | ROBUST_CHANNEL_GPU_TIMEOUT_ERROR | RESET_GPU | CONTACT_SUPPORT | GPU stopped processing
48 | ROBUST_CHANNEL_GPU_ECC_DBE | WORKFLOW_XID_48 | WORKFLOW_XID_48 | double-bit ECC error
54 | SILENT_RUNNING_PWR_REDUCED_CLOCKING | CHECK_MECHANICALS | CONTACT_SUPPORT | auxiliary power is not connected to
    the GPU board
60 | ROBUST_CHANNEL_SEC2_ERROR | RESTART_APP | INVESTIGATE_SW | video processor exception
62 | PMU_HALT_ERROR | RESET_GPU | CONTACT_SUPPORT | internal micro-controller halt
63 | INFOROM_DRAM_RETIREMENT_EVENT | IGNORE | IGNORE | GPU memory remapping event (the row-remap check says when a
    reset is due)
64 | INFOROM_DRAM_RETIREMENT_FAILURE | RESET_GPU | CONTACT_SUPPORT | GPU memory remapping failure
66 | ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION | IGNORE | INVESTIGATE_SW | illegal access by driver
67 | ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION | IGNORE | CONTACT_SUPPORT | illegal access by driver
68 | ROBUST_CHANNEL_NVDEC0_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC0 exception
69 | ROBUST_CHANNEL_GR_CLASS_ERROR | RESTART_APP | CHECK_APP/CUDA | graphics engine class error
70 | ROBUST_CHANNEL_CE3_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 3 error
71 | ROBUST_CHANNEL_CE4_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 4 error
72 | ROBUST_CHANNEL_CE5_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 5 error
74 | NVLINK_ERROR | WORKFLOW_NVLINK_ERR | CONTACT_SUPPORT | NVLink error (a GPU reset or node reboot clears it)
75 | ROBUST_CHANNEL_CE6_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 6 error
76 | ROBUST_CHANNEL_CE7_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 7 error
77 | ROBUST_CHANNEL_CE8_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 8 error
78 | VGPU_START_ERROR | UPDATE_SWFW | UPDATE_SWFW | vGPU start error
79 | GPU_HAS_FALLEN_OFF_THE_BUS | RESTART_BM | CONTACT_SUPPORT | the GPU has fallen off the bus
80 | PBDMA_PUSHBUFFER_CRC_MISMATCH | RESTART_APP | CHECK_APP/CUDA | corrupted data sent to GPU
82 | ROBUST_CHANNEL_NVJPG0_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG0 error
83 | ROBUST_CHANNEL_NVDEC1_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC1 error
84 | ROBUST_CHANNEL_NVDEC2_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC2 error
85 | ROBUST_CHANNEL_CE9_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 9 error
86 | ROBUST_CHANNEL_OFA0_ERROR | RESTART_APP | CONTACT_SUPPORT | OFA exception
88 | ROBUST_CHANNEL_NVDEC3_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC3 error
89 | ROBUST_CHANNEL_NVDEC4_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC4 error
92 | EXCESSIVE_SBE_INTERRUPTS | IGNORE | CONTACT_SUPPORT | high single-bit ECC error rate
93 | INFOROM_ERASE_LIMIT_EXCEEDED | IGNORE | CONTACT_SUPPORT | non-fatal violation of the provisioned InfoROM wear
    limit
94 | ROBUST_CHANNEL_CONTAINED_ERROR | RESTART_APP | IGNORE (sympathetic) | contained memory error: only the
    application that touched it is hit (reset the GPU when convenient)
95 | ROBUST_CHANNEL_UNCONTAINED_ERROR | RESET_GPU | IGNORE (sympathetic) | uncontained memory error: every application
    on the GPU is hit
96 | ROBUST_CHANNEL_NVDEC5_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC5 error
97 | ROBUST_CHANNEL_NVDEC6_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC6 error
98 | ROBUST_CHANNEL_NVDEC7_ERROR | RESTART_APP | CONTACT_SUPPORT | NVDEC7 error
99 | ROBUST_CHANNEL_NVJPG1_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG1 error
100 | ROBUST_CHANNEL_NVJPG2_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG2 error
101 | ROBUST_CHANNEL_NVJPG3_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG3 error
102 | ROBUST_CHANNEL_NVJPG4_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG4 error
103 | ROBUST_CHANNEL_NVJPG5_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG5 error
104 | ROBUST_CHANNEL_NVJPG6_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG6 error
105 | ROBUST_CHANNEL_NVJPG7_ERROR | RESTART_APP | CONTACT_SUPPORT | NVJPG7 error
106 | SMBPBI_TEST_MESSAGE | IGNORE | IGNORE | SMBPBI test message
107 | SMBPBI_TEST_MESSAGE_SILENT | IGNORE | IGNORE | SMBPBI test message (silent)
108 | NVLINK_REMOTE_TRANSLATION_ERROR | IGNORE | XID_137_FLOW | NVLink remote translation error
109 | ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR | RESET_GPU | CONTACT_SUPPORT | context switch timeout
110 | SEC_FAULT_ERROR | RESET_GPU | INVESTIGATE_SW | security fault (uncommon unless the hardware fails)
119 | GSP_RPC_TIMEOUT | RESET_GPU | INVESTIGATE_SW | GSP firmware did not answer an RPC in time
120 | GSP_ERROR | RESET_GPU | INVESTIGATE_SW | GSP firmware error
121 | C2C_ERROR | IGNORE | CONTACT_SUPPORT | corrected errors on the C2C link to the Grace CPU (no operational impact;
    reset at a service window)
126 | ROBUST_CHANNEL_CE10_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 10 error
127 | ROBUST_CHANNEL_CE11_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 11 error
128 | ROBUST_CHANNEL_CE12_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 12 error
129 | ROBUST_CHANNEL_CE13_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 13 error
130 | ROBUST_CHANNEL_CE14_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 14 error
131 | ROBUST_CHANNEL_CE15_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 15 error
132 | ROBUST_CHANNEL_CE16_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 16 error
133 | ROBUST_CHANNEL_CE17_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 17 error
134 | ROBUST_CHANNEL_CE18_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 18 error
135 | ROBUST_CHANNEL_CE19_ERROR | RESTART_APP | CONTACT_SUPPORT | copy engine 19 error
136 | ALI_TRAINING_FAIL | RESET_GPU | INVESTIGATE_LINK_SI | NVLink link training failed
137 | NVLINK_PRIV_ERR | IGNORE | XID_137_FLOW | NVLink privilege error (an illegal peer-to-peer access: usually the
    application's)
139 | ROBUST_CHANNEL_OFA1_ERROR | RESTART_APP | CONTACT_SUPPORT | OFA1 error
140 | UNRECOVERABLE_ECC_ERROR_ESCAPE | RESET_GPU | CONTACT_SUPPORT | an uncorrectable ECC error escaped page offlining
    or row remapping
141 | ROBUST_CHANNEL_FAST_PATH_ERROR | IGNORE | CONTACT_SUPPORT | CUDA fast path error
142 | ROBUST_CHANNEL_NVENC3_ERROR | CONTACT_SUPPORT |  | NVENC3 error
143 | GPU_INIT_ERROR | RESET_GPU | CONTACT_SUPPORT | GPU initialisation failed
144 | NVLINK_SAW_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 SAW error
145 | NVLINK_RLW_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 RLW error
146 | NVLINK_TLW_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 TLW error
147 | NVLINK_TREX_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 TREX error
148 | NVLINK_NVLPW_CTRL_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 NVLPW_CTRL error
149 | NVLINK_NETIR_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 NETIR error
150 | NVLINK_MSE_ERROR | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR | NVLink5 MSE error
151 | ROBUST_CHANNEL_KEY_ROTATION_ERROR | RESTART_VM | CONTACT_SUPPORT | key rotation error (confidential computing)
154 | GPU_RECOVERY_ACTION_CHANGED | XID_154 | N/A | the driver states the recovery action of an earlier error
155 | NVLINK_SW_DEFINED_ERROR | RESET_GPU | INVESTIGATE_SW_USER | NVLink link down flagged as intentional (including
    sleep)
156 | RESOURCE_RETIREMENT_EVENT | RESET_GPU | IGNORE | resource retirement event
157 | RESOURCE_RETIREMENT_FAILURE | IGNORE | CONTACT_SUPPORT | resource retirement failure (no repair possible:
    workloads may run, the Xid may return)
158 | GPU_FATAL_TIMEOUT | RESET_GPU | CONTACT_SUPPORT | GPU fatal timeout
159 | ROBUST_CHANNEL_CHI_NON_DATA_ERROR | CHECK_UVM | SYMPATHETIC_REPORT_SOLO | CHI non-data error (C2C-connected
    GPUs)
160 | CHANNEL_RETIREMENT_EVENT | IGNORE | INVESTIGATE_SW | channel retirement event
161 | CHANNEL_RETIREMENT_FAILURE | IGNORE | INVESTIGATE_SW | channel retirement failure
162 | PSHC_REENGAGED |  |  | power smoothing circuitry re-engaged
163 | PSHC_DISENGAGED |  |  | power smoothing circuitry disengaged (no GPU reset required; resolve the thermal events,
    or reload the driver after a timeout)
164 | PSHC_LOW_LIFETIME |  |  | power smoothing circuitry low lifetime reached
165 | PSHC_ZERO_LIFETIME |  |  | power smoothing circuitry lifetime exhausted
166 | NVLINK_SECURE_CRYPTO_ERR |  |  | confidential computing traffic before the link was set up for it
167 | PCIE_FATAL_TIMEOUT |  |  | PCIe fatal timeout
168 | REDUCED_GPU_MEMORY_CAPACITY |  |  | errors found in the write-protected region (ECC off: enable ECC, or boot
    again)
169 | SEC2_HALT_ERROR |  |  | internal micro-controller halt (SEC2)
170 | NVLINK_SECURE_OTHER |  |  | interrupt seen in confidential computing mode
171 | UNCORRECTABLE_DRAM_ERROR |  |  | details of an Xid 48 (DRAM): the 48 line is the event
172 | UNCORRECTABLE_SRAM_ERROR |  |  | details of an Xid 48 (SRAM): the 48 line is the event
"""

#: where slurm-ext's verdict is not what NVIDIA's immediate bucket maps to, and why: Xid -> (severity, action, why)
DEPARTURES: dict[int, tuple[str, str, str]] = {
    92: ("warning", "none", "NVIDIA: IGNORE. No action either, but a warning rather than info: a high single-bit "
                            "ECC rate is a trend an operator should see (NVIDIA's investigatory bucket: contact "
                            "support)"),
    162: ("info", "none", "NVIDIA gives no bucket: power smoothing coming back is good news"),
    171: ("info", "none", "NVIDIA gives no bucket: a detail line of an Xid 48, which is judged itself"),
    172: ("info", "none", "NVIDIA gives no bucket: a detail line of an Xid 48, which is judged itself"),
}

#: the departures that are not per Xid (listed in docs/operator/health.md with the ones above)
GENERAL_DEPARTURES = (
    "application Xids (RESTART_APP) are warnings with action restart-job: slurm-ext does not restart jobs, and one "
    "job's crash must never drain a node that runs other users' jobs",
    "lines of one burst (5s from its first line) or of one process on one GPU are one fault; an application Xid whose investigatory "
    "bucket asks to look further (WORKFLOW_XID_13/31, CONTACT_SUPPORT, INVESTIGATE_SW) that comes back as "
    "`threshold` faults on one GPU within `window` becomes a warning with action reset-gpu, the evidence naming "
    "NVIDIA's investigatory step (diagnostics): the project has no diagnostics action, and reset-gpu is the one "
    "that takes the GPU out of service for a procedure; it is never a drain (NVIDIA calls it investigatory)",
    "Xids whose fix is a reset or a reboot are sticky: the finding stays until the node reboots or an operator "
    "clears it",
    "Xid 74's registers are not decoded: every Xid 74 is critical with reset-gpu, including the bits NVIDIA says "
    "can be ignored",
    "Xid 144-150 lines that give neither Fatal nor Nonfatal are warnings: the Xid 154 that comes with a real fault "
    "carries its action",
    "Xid 45 (WORKFLOW_XID_45) is a warning without action that never escalates: NVIDIA's solo case (restart Fabric "
    "Manager) cannot be told from the usual one (an aborted application) line by line",
    "Xid 79 keeps the short mnemonic GPU_HAS_FALLEN_OFF_THE_BUS (NVIDIA: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) "
    "in the finding's fields; drain reasons show NVIDIA's description (GPU has fallen off the bus)",
    "SXid lines that say Fatal are critical with action reboot (the guide: reset every GPU and NVSwitch, or "
    "restart the host; on a node that is one reboot); Non-fatal ones are warnings, and those the guide says have "
    "no impact (single-bit ECC, 22013) info",
)


def _rows() -> tuple[XidEntry, ...]:
    rows = []
    for line in _XIDS.strip().replace("\n    ", " ").splitlines():
        number, mnemonic, bucket, investigatory, meaning = (part.strip() for part in line.split("|", 4))
        xid = int(number)
        severity, action = BUCKETS[bucket]
        if xid in DEPARTURES:
            severity, action, _ = DEPARTURES[xid]
        rows.append(XidEntry(xid, mnemonic, meaning, bucket, severity, action,
                             application=bucket == "RESTART_APP", sticky=severity == "critical",
                             investigatory=investigatory))
    return tuple(rows)


#: the catalog, by Xid number
KNOWN: dict[int, XidEntry] = {e.xid: e for e in _rows()}

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


def bucket_verdict(bucket: str) -> tuple[str, str]:
    """(severity, action) of one of NVIDIA's immediate buckets; one not known here is a warning without action."""
    return BUCKETS.get(bucket, ("warning", "none"))


def short_meaning(found: XidEntry) -> str:
    """NVIDIA's description of an Xid up to its first aside (a parenthesis or a colon), as a drain reason shows it
    within its first 40 characters: "GPU has fallen off the bus", "double-bit ECC error"."""
    words = found.meaning.split(" (", 1)[0].split(":", 1)[0].strip()
    return words.removeprefix("the ").removeprefix("an ") or found.mnemonic


def recovery_entry(stated: str | int) -> tuple[str, str, str]:
    """(words, severity, action) of a recovery action, as Xid 154 states it or NVML's field gives it."""
    words = _RECOVERY_CODES.get(stated, "") if isinstance(stated, int) else stated.strip().lower()
    severity, action = RECOVERY_ACTIONS.get(words, ("warning", "none"))
    return words or f"recovery action {stated}", severity, action


# -- NVLink5 (Xid 144-150): NVIDIA's "XID 144-150 Decode" sheet ---------------------------------------------

#: Xid 149 NETIR_LINK_EVT / NETIR_LINK_DOWN: the link-down reason in IntrInfo bits 20-25 (both layouts) whose
#: immediate bucket is IGNORE although the line says (Link) Fatal: 0b100110 (INVESTIGATE_SW/USER) and 0b101000
#: (INVESTIGATE_HOST: a secondary indicator of another action or fault)
_LINK_DOWN_IGNORED = {0b100110, 0b101000}
#: Nonfatal rows whose bucket is XID_154_EVAL (take the Xid 154's action, else restart the application): unit ->
#: ErrorStatus values
_XID_154_EVAL = {"RLW_REMAP": {0x1, 0x2, 0x4, 0x8, 0x10, 0x20}, "RLW_SRC_TRACK": {0x4, 0x8}}


def nvlink5_bucket(xid: int, unit: str, fatal: bool | None, intrinfo: int | None, status: int | None) -> str:
    """NVIDIA's immediate bucket for one Xid 144-150 line, from its unit, Fatal/Nonfatal and (IntrInfo,
    ErrorStatus).

    Every row of the decode sheet whose severity is Fatal (or Link Fatal) has bucket RESET_GPU but two link-down
    reasons of Xid 149 (IGNORE); every Non-fatal row has IGNORE but the RLW rows that defer to Xid 154
    (XID_154_EVAL); a "Non-fatal*" row that the driver promotes is printed Fatal and then resets. A line that does
    not say Fatal or Nonfatal cannot be decoded: WORKFLOW_NVLINK5_ERR (a warning).
    """
    if fatal is None:
        return "WORKFLOW_NVLINK5_ERR"
    names = set(unit.upper().split("/"))
    if fatal:
        if xid == 149 and names & {"NETIR_LINK_EVT", "NETIR_LINK_DOWN"} and intrinfo is not None \
                and (intrinfo >> 20) & 0x3F in _LINK_DOWN_IGNORED:
            return "IGNORE"
        return "RESET_GPU"
    if xid == 145 and status is not None and any(status in _XID_154_EVAL.get(name, ()) for name in names):
        return "XID_154_EVAL"
    return "IGNORE"


# -- SXids: the Fabric Manager guide's lists ----------------------------------------------------------------

_SXID_LISTS = {
    "non-fatal": """11004 ingress invalid ACL; 11012 single-bit ECC error; 11021 single-bit ECC error;
        11022 single-bit ECC error; 11023 single-bit ECC error; 12021 single-bit ECC error; 12023 single-bit ECC error;
        15008 single-bit ECC error; 15011 single-bit ECC error; 19049 single-bit ECC error;
        19055 single-bit ECC error; 19057 single-bit ECC error; 19059 single-bit ECC error;
        19062 single-bit ECC error; 19065 single-bit ECC error; 19068 single-bit ECC error;
        19071 single-bit ECC error; 24001 single-bit ECC error; 24002 single-bit ECC error;
        24003 single-bit ECC error; 20001 TX replay error; 12028 egress non-posted PRIV error;
        19084 AN1 heartbeat timeout error; 20012 broken or inconsistent connection;
        22013 Minion link DLREQ interrupt""",
    "fatal": """11001 ingress invalid command; 11009 ingress invalid VCSet; 11013 ingress header DBE;
        11018 ingress RID DBE; 11019 ingress RLAN DBE; 11020 ingress control parity; 12001 egress crossbar overflow;
        12002 egress packet route; 12022 egress input ECC DBE error; 12024 egress output ECC DBE error;
        12025 egress credit overflow; 12026 egress destination request ID error;
        12027 egress destination response ID error; 12030 egress control parity error;
        12031 egress credit parity error; 12032 egress flit type mismatch; 14017 TS ATO timeout;
        15001 route buffer over/underflow; 15006 route transdone over/underflow; 15009 route GLT DBE;
        15010 route parity; 15012 route incoming DBE; 15013 route credit parity; 19047 NCISOC HDR ECC DBE error;
        19048 NCISOC DAT ECC DBE error; 19054 HDR RAM ECC DBE error; 19056 DAT0 RAM ECC DBE error;
        19058 DAT1 RAM ECC DBE error; 19060 CREQ RAM HDR ECC DBE error; 19061 CREQ RAM DAT ECC DBE error;
        19063 response RAM HDR ECC DBE error; 19064 response RAM DAT ECC DBE error; 19066 COM RAM HDR ECC DBE error;
        19067 COM RAM DAT ECC DBE error; 19069 RSP1 RAM HDR ECC DBE error; 19070 RSP1 RAM DAT ECC DBE error;
        20034 LTSSM fault up; 22012 Minion link NA interrupt; 24004 sourcetrack TCEN0 crumbstore DBE;
        24005 sourcetrack TCEN0 TD crumbstore DBE; 24006 sourcetrack TCEN1 crumbstore DBE;
        24007 sourcetrack timeout error""",
    "always-fatal": """12020 egress sequence ID error; 22003 Minion halt; 22011 Minion exterror;
        23001 ingress SRC-VC buffer overflow; 23002 ingress SRC-VC buffer underflow;
        23003 egress DST-VC credit overflow; 23004 egress DST-VC credit underflow; 23005 ingress packet burst error;
        23006 ingress packet sticky error; 23007 possible bubbles at ingress; 23008 ingress packet invalid dst error;
        23009 ingress packet parity error; 23010 ingress SRC-VC buffer overflow; 23011 ingress SRC-VC buffer underflow;
        23012 egress DST-VC credit overflow; 23013 egress DST-VC credit underflow; 23014 ingress packet burst error;
        23015 ingress packet sticky error; 23016 possible bubbles at ingress; 23017 ingress credit parity error;
        10003 host unhandled interrupt (never expected: fatal to the fabric)""",
    "notable": """10001 host PRIV error (may be followed by fatal events); 10002 host PRIV timeout (may be followed
        by fatal events); 10004 host thermal event start (cooling may be insufficient); 10005 host thermal event end""",
}
#: non-fatal SXids the guide says have no impact at all
_NO_IMPACT = {11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059, 19062, 19065,
              19068, 19071, 24001, 24002, 24003, 22013}


def _sxid_rows() -> dict[int, SXidEntry]:
    rows = {}
    for kind, text in _SXID_LISTS.items():
        for item in " ".join(text.split()).split(";"):
            number, name = item.strip().split(" ", 1)
            sxid = int(number)
            severity, action = (("critical", "reboot") if kind == "always-fatal" else
                                ("info", "none") if sxid in _NO_IMPACT else ("warning", "none"))
            rows[sxid] = SXidEntry(sxid, name, kind, severity, action)
    return rows


#: the Fabric Manager guide's SXids, by number
SXIDS: dict[int, SXidEntry] = _sxid_rows()


def sxid_entry(sxid: int) -> SXidEntry:
    """The guide's entry for `sxid`; one it does not list is a warning without action."""
    return SXIDS.get(sxid) or SXidEntry(sxid, "not in the Fabric Manager guide's lists", "unknown", "warning", "none")

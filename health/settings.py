"""The health monitor's config: [health], its [health.checks.<id>] and [health.xid.<number>] tables.

Every check's defaults are in `CHECKS` below, one row per check, so that
`slurm-ext config show`, docs/operator/health.md and the checks themselves read one
table. A [health.checks.<id>] table changes only the keys it gives. A
threshold is a string with its unit ("60%", "5C", "100/s", "1GiB") or an
integer count; a threshold without its unit, or for a check that has
none, is refused with the key named. Keep this module light: a config
with a [health] section is loaded by every Prolog that falls back to
Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["HealthSection", "CheckSection", "XidSection", "CheckDefaults", "Params", "CHECKS", "ACTIONS",
           "SEVERITIES", "parse_threshold"]

#: what a finding recommends, least disruptive first (the repair service maps them to its executors)
ACTIONS = ("none", "restart-job", "reset-gpu", "reboot", "reprovision", "failover", "remove")
#: a finding's severity: critical drains the node, warning and info are events and metrics only
SEVERITIES = ("info", "warning", "critical")

#: threshold units: share of a window, degrees Celsius, events per time, bytes or share of a size, a count
_UNITS = {
    "share": "a share with %, such as '60%'",
    "celsius": "degrees with C, such as '5C'",
    "rate": "a rate such as '100/s', '8/m' or '10/h'",
    "size": "a size such as '1GiB', '500MiB' or a share such as '5%'",
    "count": "an integer such as 3",
}
_SIZES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class CheckDefaults:
    """One check's built-in settings: safe for H100, H200 and B200 nodes."""

    severity: str
    action: str
    #: the unit kind of `threshold` (a key of _UNITS), or "" for a check without one
    unit: str = ""
    threshold: str | int | None = None
    #: the span a windowed check judges (a share of it, a count in it)
    window: float = 0.0
    #: how long a condition must last before it is a finding (and drains)
    hold: float = 0.0
    #: how long a finding's condition must stay away before it is cleared (no flapping)
    quiet: float = 60.0
    #: polled checks only: how often (0: every health.interval)
    interval: float = 0.0
    doc: str = ""


_M, _H = 60.0, 3600.0

CHECKS: dict[str, CheckDefaults] = {
    "gpu-lost": CheckDefaults("critical", "reboot", quiet=5 * _M,
                              doc="NVML answers GPU_IS_LOST (reboot) or RESET_REQUIRED (reset-gpu) for a GPU"),
    "gpu-count": CheckDefaults("critical", "reboot", quiet=30.0,
                               doc="NVML shows fewer GPUs than the node's baseline (gres/baseline.json) while the "
                                   "node runs (gres judges it at start); cleared once they have all been back for "
                                   "`quiet`"),
    "xid": CheckDefaults("critical", "reboot", "count", 3, window=_H, quiet=10 * _M,
                         doc="an Xid from the kernel log (the kernel's own lines only) or an NVML event, judged by "
                             "NVIDIA's catalog (action and severity per Xid, [health.xid.N] overrides); an "
                             "application Xid is a warning, and `threshold` faults of it (a burst or one process "
                             "is one) on one GPU within `window` a warning with action reset-gpu (diagnostics), "
                             "never a drain"),
    "sxid": CheckDefaults("critical", "reboot", quiet=10 * _M,
                          doc="an NVSwitch SXid line: Fatal (or always fatal in Fabric Manager's guide) is "
                              "critical, Non-fatal a warning (info where the guide says no impact)"),
    "fabric": CheckDefaults("critical", "reboot", hold=5 * _M, quiet=5 * _M,
                            doc="NVML's GPU fabric state is not completed, or its status an error (NVLink "
                                "fabric nodes; `hold` covers the fabric's training at boot)"),
    "throttle": CheckDefaults("critical", "failover", "share", "60%", window=10 * _M, quiet=10 * _M,
                              doc="hardware slowdown, hardware thermal or software thermal slowdown, or power "
                                  "brake, for at least `threshold` of the samples over a full `window`"),
    "temperature": CheckDefaults("warning", "failover", "celsius", "0C", hold=2 * _M, quiet=5 * _M,
                                 doc="the GPU within `threshold` of its own slowdown temperature, or memory at "
                                     "its maximum, for `hold`"),
    "row-remap": CheckDefaults("critical", "reset-gpu", quiet=_M,
                               doc="row remapping pending (reset-gpu) or failed (remove: RMA)"),
    "ecc": CheckDefaults("critical", "reset-gpu", "count", 1, quiet=_M,
                         doc="volatile uncorrectable (double-bit) ECC errors at or above `threshold`"),
    "retired-pages": CheckDefaults("critical", "remove", "count", 60, quiet=_M,
                                   doc="older GPUs: page retirement pending (reset-gpu), or `threshold` pages "
                                       "retired (remove: RMA)"),
    "nvlink": CheckDefaults("critical", "reboot", "count", 0, hold=30.0, quiet=5 * _M,
                            doc="fewer active NVLinks than expected: `threshold` links per GPU, or 0 for the most "
                                "each GPU has shown this boot (kept across the monitor's restarts; `health clear "
                                "--check nvlink` accepts the count it has now)"),
    "nvlink-errors": CheckDefaults("warning", "none", "rate", "100/s", window=_M, quiet=10 * _M,
                                   doc="NVLink CRC and replay errors faster than `threshold` over `window`"),
    "pcie-link": CheckDefaults("warning", "reboot", hold=_M, quiet=5 * _M,
                               doc="PCIe link width below the GPU's maximum, or generation below it while the GPU "
                                   "is busy (an idle GPU lowers its generation to save power)"),
    "pcie-replay": CheckDefaults("warning", "none", "rate", "8/m", window=5 * _M, quiet=10 * _M,
                                 doc="PCIe replays faster than `threshold` over `window`"),
    "persistence": CheckDefaults("warning", "none", hold=_M, quiet=_M,
                                 doc="persistence mode off (every job then pays the driver's start-up)"),
    "nvml": CheckDefaults("critical", "reboot", "count", 3, quiet=2 * _M,
                          doc="NVML itself failing or hanging for `threshold` polls in a row (one slow call is "
                              "not a GPU fault)"),
    "link-down": CheckDefaults("critical", "reboot", hold=25.0, quiet=2 * _M,
                               doc="a configured network interface (health.interfaces) down for `hold`"),
    "link-flap": CheckDefaults("critical", "reboot", "count", 3, window=10 * _M, quiet=10 * _M,
                               doc="a configured interface went down `threshold` times within `window`"),
    "filesystem": CheckDefaults("critical", "none", "size", "1GiB", quiet=_M, interval=_M,
                                doc="a configured path (health.paths) read-only, unreadable or with less free "
                                    "space than `threshold`"),
    "kernel": CheckDefaults("critical", "reboot", "count", 3, window=10 * _M, quiet=30 * _M,
                            doc="kernel hung-task or soft-lockup lines: a soft lockup, or `threshold` hung tasks "
                                "within `window`, is critical; fewer are warnings"),
    "slurmd": CheckDefaults("warning", "none", hold=_M, quiet=_M, interval=_M,
                            doc="Slurm shows this node's slurmd not responding"),
    "foreign-drain": CheckDefaults("info", "none", quiet=0.0, interval=_M,
                                   doc="the node drained by someone else (an admin, NHC, slurm-operator): reported, "
                                       "never acted on"),
}


@dataclass(frozen=True, slots=True)
class CheckSection:
    """[health.checks.<id>]: a key left out keeps the check's default (`slurm-ext config show` lists them)."""

    enabled: bool | None = setting(None, "run this check", "bool")
    severity: str | None = setting(None, "critical (drains), warning or info", "choice", choices=SEVERITIES)
    action: str | None = setting(None, "the recommended action", "choice", choices=ACTIONS)
    threshold: str | int | None = setting(None, "the limit, with its unit (the check's doc says which)",
                                          "quantity")
    window: float | None = setting(None, "the span a windowed check judges", "duration", minimum=0.0,
                                   maximum=7 * 86400.0)
    hold: float | None = setting(None, "a condition lasts this long before it is a finding", "duration",
                                 minimum=0.0, maximum=86400.0)
    quiet: float | None = setting(None, "a finding clears once its condition has been away this long", "duration",
                                  minimum=0.0, maximum=7 * 86400.0)
    interval: float | None = setting(None, "polled checks: how often", "duration", minimum=0.1, maximum=86400.0)


@dataclass(frozen=True, slots=True)
class XidSection:
    """[health.xid.<number>]: NVIDIA's catalog entry for one Xid, overridden."""

    severity: str | None = setting(None, "critical (drains), warning or info", "choice", choices=SEVERITIES)
    action: str | None = setting(None, "the recommended action", "choice", choices=ACTIONS)
    sticky: bool | None = setting(None, "the finding stays until the node reboots or `slurm-ext health clear` "
                                  "(not cleared by a quiet window)", "bool")


@dataclass(frozen=True, slots=True)
class Params:
    """One check's effective settings: its defaults with [health.checks.<id>] applied."""

    id: str
    enabled: bool
    severity: str
    action: str
    #: the threshold in base units: share 0..1, degrees, per second, bytes (or a share 0..1 when `relative`), count
    threshold: float | None
    relative: bool
    window: float
    hold: float
    quiet: float
    interval: float


def _validate_check(name: str, section: CheckSection) -> None:
    if name not in CHECKS:
        raise ValueError("", f"unknown check {name!r}; checks: {', '.join(CHECKS)}")
    if name == "xid" and (section.severity or section.action):
        raise ValueError("severity" if section.severity else "action",
                         "an Xid's severity and action come from NVIDIA's catalog: set them per Xid in "
                         "[health.xid.<number>]")
    if section.threshold is not None:
        try:
            parse_threshold(CHECKS[name].unit, section.threshold)
        except ValueError as err:
            raise ValueError("threshold", f"{section.threshold!r}: {err}") from None


def _validate_xid(name: str, section: XidSection) -> None:
    # "013" would be accepted and never applied: overrides are looked up by str(xid)
    if not name.isdigit() or name != str(int(name)) or not 0 < int(name) < 1000:
        raise ValueError("", "expected an Xid number (1-999) as the table's name, such as [health.xid.79]")


def parse_threshold(unit: str, value: str | int) -> tuple[float, bool]:
    """The threshold in base units, and whether it is relative (a size given as a share).

    Raises:
        ValueError: the value lacks the unit the check needs, or the check takes no threshold.
    """
    if not unit:
        raise ValueError("this check takes no threshold")
    if unit == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"expected {_UNITS[unit]}")
        return float(value), False
    text = value.strip() if isinstance(value, str) else ""
    number = r"(\d+(?:\.\d+)?)"
    if unit in ("share", "size") and (found := re.fullmatch(number + r"\s*%", text)):
        share = float(found.group(1)) / 100
        if share > 1:
            raise ValueError("a share is at most 100%")
        return share, unit == "size"
    if unit == "celsius" and (found := re.fullmatch(number + r"\s*C", text)):
        return float(found.group(1)), False
    if unit == "rate" and (found := re.fullmatch(number + r"\s*/\s*(s|m|h)", text)):
        return float(found.group(1)) / _PER[found.group(2)], False
    if unit == "size" and (found := re.fullmatch(number + r"\s*(B|KiB|MiB|GiB|TiB)", text)):
        return float(found.group(1)) * _SIZES[found.group(2)], False
    raise ValueError(f"expected {_UNITS[unit]}")


@dataclass(frozen=True, slots=True)
class HealthSection:
    """Passive GPU and node checks: the node agent's `health` worker (`slurm-ext health monitor`)."""

    enabled: bool = setting(True, "run the health monitor as the worker agent's `health` worker (false "
                                   "also lifts its drains, which nothing would clear otherwise; true again drains anew "
                                   "for the findings it kept this boot)", "bool")
    interval: float = setting(10.0, "how often the polled checks read NVML and the node", "duration",
                              minimum=0.1, maximum=3600.0)
    kernel_log: str = setting("/dev/kmsg", "the kernel log: /dev/kmsg, or a file of kernel lines that grows (a "
                              "simulated node of its own: a file is trusted as a whole, never point it at syslog, "
                              "which any user writes to with `logger -t kernel`); "
                              "read from its end at start (never replayed); empty: no kernel checks",
                              "path", empty_ok=True)
    nvml_events: bool = setting(True, "wait in nvmlEventSetWait for NVML events (Xid, double-bit ECC, recovery "
                                "action) besides the kernel log",
                                "bool")
    call_timeout: float = setting(30.0, "an NVML, file-system or Slurm read running longer than this counts as "
                                  "hung (an NVML hang counts as a failed poll; `health check` then reports NVML "
                                  "failing now)", "duration",
                                  minimum=0.1, maximum=3600.0)
    interfaces: tuple = setting((), "network interfaces whose link state and flaps are watched through "
                                "netlink (e.g. the InfiniBand or RoCE ports)", "list", item={"kind": "str",
                                                                           "pattern": r"^[A-Za-z0-9._@:-]+$"})
    network_namespace: str = setting("", "the network namespace (a name under /run/netns) of `interfaces`; empty: "
                                     "the monitor's own", "str", pattern=r"^[A-Za-z0-9._-]*$")
    paths: tuple = setting(("/", "/tmp"), "file systems checked for free space and for being writable", "list",
                           item={"kind": "path"})
    checks: dict = setting({}, "per-check settings, [health.checks.<id>]", "sections", section=CheckSection,
                           validate=_validate_check)
    xid: dict = setting({}, "per-Xid overrides of NVIDIA's catalog, [health.xid.<number>]", "sections",
                        section=XidSection, validate=_validate_xid)
    gpu_reset_command: tuple = setting(("nvidia-smi", "--gpu-reset", "-i", "{gpu}"),
                                       "how the node's agent resets one GPU for an approved reset-gpu repair: a "
                                       "program and its arguments, never `sh -c`; {gpu} is the GPU's NVML index, as "
                                       "one argument (on NVSwitch systems, HGX H100/H200, nvidia-smi may need every "
                                       "GPU reset together, and no process may hold the GPU)", "list",
                                       item={"kind": "str"}, min_items=1)
    gpu_reset_timeout: float = setting(120.0, "longest a GPU reset may run before it is killed and the repair "
                                       "fails (at most 540s: the repair service waits 600s for the node's answer)",
                                       "duration", minimum=1.0, maximum=540.0)

    def params(self, check: str) -> Params:
        """`check`'s effective settings."""
        base = CHECKS[check]
        own = self.checks.get(check) or CheckSection()
        raw = own.threshold if own.threshold is not None else base.threshold
        threshold, relative = parse_threshold(base.unit, raw) if raw is not None else (None, False)

        def pick(name: str):
            value = getattr(own, name)
            return getattr(base, name) if value is None else value
        return Params(check, own.enabled is not False, pick("severity"), pick("action"), threshold, relative,
                      pick("window"), pick("hold"), pick("quiet"), pick("interval") or self.interval)


register_section("health", HealthSection)

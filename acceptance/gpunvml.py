"""GPU tests that only read NVML: `inventory` (count, model, memory, driver, memory health) and `nvlink`.

Nothing here loads the GPUs: these are the quick level's first look, seconds on 8 GPUs. An answer of
NOT_SUPPORTED is a feature the part lacks (a Hopper's retired pages, the NVLinks of an H200 without
NVLink peers, as the real H200 of tests/data/real-gpu answered), never a fault. GPU_IS_LOST and
RESET_REQUIRED are faults of that GPU (reboot, reset-gpu, as health's gpu-lost check acts); any
other error of a call is that GPU's error result, never a drain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slurm_ext import nvml

from .catalog import Given
from .profiles import GENERIC, PROFILES
from .records import ERROR, FAIL, PASS, Figure, NotApplicable, Result, TestError

__all__ = ["inventory", "nvlink"]

_GIB = 2**30
#: answers that mean "this GPU lacks the feature"
_ABSENT = (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND, nvml.NOT_FOUND)
#: what a link past the GPU's last answers (NOT_SUPPORTED; INVALID_ARGUMENT on GB200 drivers)
_NO_SUCH_LINK = (*_ABSENT, nvml.INVALID_ARGUMENT)
#: the GPU cannot be read at all: lost (reboot) or waiting for a reset (reset-gpu)
_LOST = {nvml.GPU_IS_LOST: "reboot", nvml.RESET_REQUIRED: "reset-gpu"}
#: actions by weight: a GPU with several faults gets the heaviest one's
_WEIGHT = {"none": 0, "reset-gpu": 1, "reboot": 2, "reprovision": 3, "remove": 4}


class _NvmlFailed(Exception):
    pass


def _module() -> Any:
    try:
        return nvml.load()
    except nvml.NvmlUnavailable as err:
        raise TestError(err.problem) from err


def _session(module: Any):
    def fail(err: BaseException) -> Exception:
        return TestError(nvml.describe(f"NVML cannot start: {err}", nvml.error_code(err)))
    return nvml.session(module, fail)


@dataclass(slots=True)
class _Findings:
    """One GPU's faults as they are found: what is wrong, and the heaviest repair."""

    faults: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    action: str = "none"

    def fault(self, what: str, action: str) -> None:
        self.faults.append(what)
        if _WEIGHT[action] > _WEIGHT[self.action]:
            self.action = action


# -- inventory ------------------------------------------------------------------------------------------------


def inventory(given: Given) -> list[Result]:
    """The GPUs NVML shows against the expected count and the profile: one result for the count and the driver
    (target ""), one per GPU ("gpu N").

    Raises:
        TestError: pynvml is not installed or NVML cannot start.
    """
    started = time.monotonic()
    module = _module()
    with _session(module):
        caught = nvml.errors(module)
        try:
            count = module.nvmlDeviceGetCount()
            driver = nvml.text(module.nvmlSystemGetDriverVersion())
        except caught as err:
            raise TestError(nvml.describe(f"NVML cannot count the GPUs: {err}", nvml.error_code(err))) from err
        results = [_count_result(given, count, driver, started)]
        for index in range(count):
            results.append(_gpu_result(module, index, given, caught))
    return results


def _expected(given: Given) -> tuple[int | None, str]:
    """How many GPUs the node must have, and where that number comes from."""
    configured = int(getattr(given.settings, "gpus", 0) or 0)
    if configured:
        return configured, "[acceptance] gpus"
    if "gpu_count" in given.limits:
        return int(given.limits["gpu_count"]), "[acceptance.tests.gpu-inventory] limits"
    if given.state_dir:
        from slurm_ext.gres.generation import baseline
        known = baseline(given.state_dir)
        if known:
            return len(known), "gres/baseline.json"
    return None, "no [acceptance] gpus and no gres baseline yet"


def _count_result(given: Given, count: int, driver: str, started: float) -> Result:
    expected, source = _expected(given)
    figures = [Figure("gpu_count", count, "", None if expected is None else float(expected))]
    major = _major(driver)
    if major is not None:
        figures.append(Figure("driver_major", major, "", given.limits.get("driver_major")))
    outside = [f for f in figures if not f.within]
    seconds = time.monotonic() - started
    what = f"{count} GPUs" + (f" (expected {expected}, from {source})" if expected is not None
                              else f" (count not judged: {source})") + f"; driver {driver}"
    if not outside:
        return Result("gpu-inventory", "gpu", "", PASS, what, tuple(figures), seconds)
    faults = []
    action = "none"
    if not figures[0].within:
        faults.append(f"{expected - count} GPU{'s' if expected - count > 1 else ''} missing: {count} of {expected} "
                      f"(from {source})")
        action = "reboot"
    if major is not None and not figures[1].within:
        faults.append(f"driver {driver} older than {figures[1].limit:g} (the profile's {given.profile}): "
                      f"install a newer driver")
        action = "reprovision" if action == "none" else action
    return Result("gpu-inventory", "gpu", "", FAIL, "; ".join(faults), tuple(figures), seconds, action)


def _major(driver: str) -> int | None:
    head = driver.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _gpu_result(m: Any, index: int, given: Given, caught: tuple) -> Result:
    started = time.monotonic()
    target = f"gpu {index}"
    found = _Findings()
    figures: list[Figure] = []
    try:
        h = m.nvmlDeviceGetHandleByIndex(index)
        name = nvml.text(m.nvmlDeviceGetName(h))
        found.shown.append(name)
        _judge_name(name, given, found)
        total = m.nvmlDeviceGetMemoryInfo(h).total
        figures.append(Figure("memory_gib", round(total / _GIB, 2), "GiB", given.limits.get("memory_gib")))
        vbios = _optional(m, m.nvmlDeviceGetVbiosVersion, h)
        found.shown.append(f"VBIOS {nvml.text(vbios)}" if vbios is not None else "VBIOS not reported")
        persistence = _optional(m, m.nvmlDeviceGetPersistenceMode, h)
        if persistence is not None:
            found.shown.append(f"persistence {'on' if persistence else 'off'}")
        _judge_ecc(m, h, given, found)
        _judge_remap(m, h, found)
        pending = _optional(m, m.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending:
            found.fault("page retirement pending (retired at the next reset)", "reset-gpu")
    except caught as err:
        code = nvml.error_code(err)
        seconds = time.monotonic() - started
        if code in _LOST:
            return Result("gpu-inventory", "gpu", target, FAIL, f"{target}: " + nvml.describe(f"NVML: {err}", code),
                          tuple(figures), seconds, _LOST[code])
        return Result("gpu-inventory", "gpu", target, ERROR,
                      f"{target}: " + nvml.describe(f"an NVML call failed: {err}", code), tuple(figures), seconds)
    for figure in figures:
        if not figure.within:
            found.fault(f"{figure.text()}: less memory than the model has", "none")
    seconds = time.monotonic() - started
    if found.faults:
        return Result("gpu-inventory", "gpu", target, FAIL, f"{target}: " + "; ".join(found.faults), tuple(figures),
                      seconds, found.action)
    return Result("gpu-inventory", "gpu", target, PASS,
                  f"{target}: " + ", ".join([*found.shown, *(f.text() for f in figures)]), tuple(figures), seconds)


def _optional(m: Any, call, *args) -> Any:
    return nvml.optional(m, call, *args, default=None, codes=_ABSENT)


def _judge_name(name: str, given: Given, found: _Findings) -> None:
    profile = PROFILES.get(given.profile, GENERIC)
    if profile.names and name.strip().casefold() not in (n.casefold() for n in profile.names):
        found.fault(f"{name!r} is not the profile's ({given.profile}: {', '.join(profile.names)})", "none")


def _judge_ecc(m: Any, h: Any, given: Given, found: _Findings) -> None:
    """ECC off on a data-centre part (a named profile's) fails: its memory errors then go uncorrected and unseen,
    and the health checks' ECC and row-remap readings mean nothing. Under the generic profile it is only shown: a
    workstation part ships with ECC off."""
    modes = _optional(m, m.nvmlDeviceGetEccMode, h)
    if modes is None:
        return
    current, pending = modes
    if current:
        found.shown.append("ECC on")
        return
    if given.profile == GENERIC.name:
        found.shown.append("ECC off")
        return
    after = "on at the next reboot" if pending else "enable it (nvidia-smi -e 1) and reboot"
    found.fault(f"ECC off (memory errors go uncorrected and unreported on a data-centre GPU; {after})", "reboot")


def _judge_remap(m: Any, h: Any, found: _Findings) -> None:
    rows = _optional(m, m.nvmlDeviceGetRemappedRows, h)
    if rows is None:
        return
    corrected, uncorrected, pending, failure = rows
    if failure:
        found.fault(f"row remapping failed ({uncorrected} rows remapped for uncorrectable errors): "
                    f"the GPU has no spare rows left, replace it", "remove")
    if pending:
        found.fault("row remapping pending (applied at the next GPU reset)", "reset-gpu")
    if corrected or uncorrected:
        found.shown.append(f"rows remapped {corrected} correctable, {uncorrected} uncorrectable")


# -- NVLink ----------------------------------------------------------------------------------------------------


def nvlink(given: Given) -> list[Result]:
    """Active NVLinks per GPU: every link it has, at most the profile's nvlink_links (reboot below it, as health's
    nvlink check acts).

    Raises:
        NotApplicable: no GPU has NVLink (NVML answers NOT_SUPPORTED for link 0, as on a PCIe part or the real
            H200 without NVLink peers), or there is no GPU.
        TestError: pynvml is not installed or NVML cannot start.
    """
    module = _module()
    with _session(module):
        caught = nvml.errors(module)
        try:
            count = module.nvmlDeviceGetCount()
        except caught as err:
            raise TestError(nvml.describe(f"NVML cannot count the GPUs: {err}", nvml.error_code(err))) from err
        if not count:
            raise NotApplicable("NVML shows no GPU")
        readings = [_links(module, index, caught) for index in range(count)]
    if all(isinstance(r, tuple) and not r[1] for r in readings):
        raise NotApplicable("no NVLink on these GPUs (NVML: not supported on link 0)")
    limit = given.limits.get("nvlink_links")
    results = []
    for index, reading in enumerate(readings):
        if isinstance(reading, Result):
            results.append(reading)
            continue
        seconds, links, active = reading
        target = f"gpu {index}"
        # every link the GPU has must be up; the SKU's count caps that (a board that wires fewer links than the
        # part has, such as a mesh, is judged by what NVML shows it has)
        expected = float(links) if limit is None else min(float(limit), float(links))
        figure = Figure("nvlink_links", len(active), "", expected)
        if figure.within:
            results.append(Result("gpu-nvlink", "gpu", target, PASS, f"{target}: {len(active)} of {links} NVLinks "
                                  f"active", (figure,), seconds))
            continue
        down = [k for k in range(links) if k not in active]
        shown = ", ".join(map(str, down[:8])) + (" ..." if len(down) > 8 else "")
        results.append(Result("gpu-nvlink", "gpu", target, FAIL,
                              f"{target}: {len(active)} active NVLinks (expected >= {expected:g}); "
                              f"{'inactive: ' + shown if down else 'it has ' + str(links)}", (figure,), seconds,
                              "reboot"))
    return results


def _links(m: Any, index: int, caught: tuple) -> tuple[float, int, list[int]] | Result:
    """(seconds, links the GPU has, the active ones), or the GPU's fail or error result."""
    started = time.monotonic()
    active: list[int] = []
    try:
        h = m.nvmlDeviceGetHandleByIndex(index)
        for link in range(m.NVML_NVLINK_MAX_LINKS):
            try:
                state = m.nvmlDeviceGetNvLinkState(h, link)
            except caught as err:
                if nvml.error_code(err) in _NO_SUCH_LINK:
                    return time.monotonic() - started, link, active
                raise
            if state:
                active.append(link)
    except caught as err:
        code = nvml.error_code(err)
        target = f"gpu {index}"
        seconds = time.monotonic() - started
        if code in _LOST:
            return Result("gpu-nvlink", "gpu", target, FAIL, f"{target}: " + nvml.describe(f"NVML: {err}", code),
                          (), seconds, _LOST[code])
        return Result("gpu-nvlink", "gpu", target, ERROR,
                      f"{target}: " + nvml.describe(f"NVML cannot read its NVLinks: {err}", code), (), seconds)
    return time.monotonic() - started, m.NVML_NVLINK_MAX_LINKS, active

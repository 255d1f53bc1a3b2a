"""The acceptance tests' config: [acceptance], its [acceptance.tests.<test>] and [acceptance.interfaces.<name>].

Off by default: a small or short-lived cluster wants its nodes taking work seconds after they start.
Keep this module light: the config is loaded by every Prolog that falls back to Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

from .catalog import TESTS, limit_words
from .records import AREAS, LEVELS

__all__ = ["AcceptanceSection", "TestSection", "InterfaceSection", "WHY_OFF"]

#: what `status`, the page and the README say where the operator decides
WHY_OFF = ("off: a node takes work as soon as it registers (right for small or short-lived clusters); turn it on "
           "([acceptance] enabled = true) for multi-GPU training and long-running production clusters, where a "
           "bad node caught at provisioning costs a quick test (seconds) and one found mid-run costs the job")

_LEVEL_OR_OFF = ("off", *LEVELS)


@dataclass(frozen=True, slots=True)
class TestSection:
    """[acceptance.tests.<test>]: a key left out keeps the test's default (`slurm-ext accept list` shows them)."""

    enabled: bool | None = setting(None, "run this test", "bool")
    deadline: float | None = setting(None, "kill the test's process after this long (an error, never a drain)",
                                     "duration", minimum=1.0, maximum=6 * 3600.0)
    limits: dict | None = setting(None, "limits over the SKU profile's: { h2d_gbps = 40 } (`accept list` names each "
                                  "test's)", "table", item={"kind": "number"})

    __test__ = False  # not a pytest class


@dataclass(frozen=True, slots=True)
class InterfaceSection:
    """[acceptance.interfaces.<name>]: an interface that must be up, at this speed and MTU."""

    speed_mbps: int | None = setting(None, "its expected link speed in Mb/s (400000 for NDR); left out: any", "int",
                                     minimum=1, maximum=10_000_000)
    mtu: int | None = setting(None, "its expected MTU; left out: any", "int", minimum=68, maximum=65536)


def _validate_test(name: str, section: TestSection) -> None:
    if name not in TESTS:
        raise ValueError("", f"unknown test {name!r}; tests: {', '.join(TESTS)}")
    known = TESTS[name].limits
    for key in section.limits or ():
        if key not in known:
            allowed = limit_words(known) if known else "none (this test judges by what it finds, not by a limit)"
            raise ValueError("limits", f"unknown limit {key!r} for {name}; its limits: {allowed}")


def _validate_interface(name: str, section: InterfaceSection) -> None:
    if len(name) > 15:
        raise ValueError("", "an interface name is at most 15 characters (IFNAMSIZ)")


@dataclass(frozen=True, slots=True)
class AcceptanceSection:
    """Active GPU, network and storage tests before a node takes work, on demand and after every repair."""

    enabled: bool = setting(False, WHY_OFF, "bool")
    at_start: str = setting("quick", "the level run at node start, before slurmd registers the node: a failing node "
                            "registers drained with its reason and a recommendation (off: none)", "choice",
                            choices=_LEVEL_OR_OFF)
    after_repair: str = setting("quick", "the level a repair's verify step runs before it resumes the node",
                                "choice", choices=LEVELS)
    after_reset: str = setting("standard", "the level after a GPU reset or a reprovision (the GPUs themselves "
                               "changed)", "choice", choices=LEVELS)
    areas: tuple = setting(AREAS, "which areas' tests run (gpu, network, storage)", "list",
                           item={"kind": "choice", "choices": AREAS}, min_items=1)
    profile: str = setting("auto", "the SKU profile of the limits: auto (from NVML's GPU name) or one of "
                           "h100-sxm, h200-sxm, h200-nvl, b200, generic", "choice",
                           choices=("auto", "h100-sxm", "h200-sxm", "h200-nvl", "b200", "generic"))
    gpus: int = setting(0, "the GPUs the node must have; 0: as many as gres found at its first start "
                        "(gres/baseline.json)", "int", minimum=0, maximum=64)
    hcas: tuple = setting((), "RDMA devices tested with a loopback ib_write_bw (mlx5_0, ...)", "list",
                          item={"kind": "str", "pattern": r"^[A-Za-z0-9._-]+$"})
    interfaces: dict = setting({}, "network interfaces that must be up: [acceptance.interfaces.<name>] with "
                               "speed_mbps and mtu", "sections", section=InterfaceSection,
                               validate=_validate_interface)
    paths: tuple = setting((), "file systems whose fsync latency and throughput are tested (a scratch directory is "
                           "made in each and removed)", "list", item={"kind": "path"})
    idle_period: float = setting(0.0, "test each idle node at the quick level this often, as one exclusive job of "
                                 "the lowest priority (the controller's agent submits it; at most 1 % of the nodes "
                                 "at once, at least one); 0: never", "duration", minimum=0.0, maximum=30 * 86400.0)
    idle_qos: str = setting("", "the QOS of the idle nodes' test jobs: one the site made preemptible by every other "
                            "job (PreemptType=preempt/qos, the other QOSes' Preempt listing it, PreemptMode cancel or "
                            "requeue); without one (\"\") such a job is only of the lowest priority, not "
                            "preemptible, and holds its node until it ends (the quick level: a few minutes at most)",
                            "str", pattern=r"^[A-Za-z0-9._-]*$")
    job_command: tuple = setting(("slurm-ext", "accept", "run"), "what `accept cluster`'s job runs on each node: a "
                                 "program and its arguments (never `sh -c`), given --level, --json, --trigger cluster "
                                 "and --apply after them; it must run the node's own `slurm-ext accept run` with the "
                                 "node's config (the job does not inherit the controller's SLURM_EXT_CONFIG)", "list",
                                 item={"kind": "str"}, min_items=1)
    tests: dict = setting({}, "per-test settings, [acceptance.tests.<test>]", "sections", section=TestSection,
                          validate=_validate_test)

    def test_enabled(self, name: str) -> bool:
        own = self.tests.get(name)
        return own is None or own.enabled is not False

    def deadline(self, name: str, level: str) -> float:
        from .catalog import DEADLINES
        own = self.tests.get(name)
        return own.deadline if own is not None and own.deadline is not None else DEADLINES[level]

    def limits(self, name: str, profile_limits: dict) -> dict:
        """The test's limits: the profile's, with this config's over them."""
        known = TESTS[name].limits
        own = self.tests.get(name)
        merged = {key: profile_limits[key] for key in known if key in profile_limits}
        if own is not None and own.limits:
            merged.update(own.limits)
        return merged


register_section("acceptance", AcceptanceSection)

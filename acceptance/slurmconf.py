"""Acceptance as Slurm's own HealthCheckProgram at slurmd's start, on a Slurm that can run it only then.

Slurm 25.11 added HealthCheckNodeState=START_ONLY: the program runs when slurmd starts, before it
registers, and never again on a timer. Where slurmd is not under slurm-ext's worker agent (a
distribution's slurmd.service), this is how a node is tested before it takes work; under the agent,
its start step has tested the node already on this boot and the program only says so. 26.05 added
HealthCheckTimeout (the program is killed after 60 s by default): the quick level fits it, a longer
one needs the timeout raised with it. Older Slurm would refuse START_ONLY in slurm.conf (slurmctld
does not start), so the lines are given only for a Slurm that has it.
"""

from __future__ import annotations

from slurm_ext.slurm import version_tuple

__all__ = ["START_ONLY_SINCE", "slurm_conf_lines"]

#: the first Slurm with HealthCheckNodeState=START_ONLY
START_ONLY_SINCE = (25, 11)
#: the first Slurm with HealthCheckTimeout
TIMEOUT_SINCE = (26, 5)


def slurm_conf_lines(version: str, program: str, timeout: float = 0.0) -> list[str]:
    """The slurm.conf lines that run `program` (the `slurm-ext-accept-start` entry point: `slurm-ext accept
    health-check`) at slurmd's start, for Slurm
    `version`; none for a Slurm before 25.11, which cannot run it only then. `timeout` > 0: HealthCheckTimeout
    (26.05 and later) for a level longer than Slurm's default 60 s."""
    have = version_tuple(version)
    if have < START_ONLY_SINCE:
        return []
    # no HealthCheckInterval: slurmd runs the program at its start with START_ONLY alone (slurmd.c
    # run_script_health_check: interval, or START_ONLY, or REBOOT_ONLY), and START_ONLY takes no other state
    lines = [f"HealthCheckProgram={program}", "HealthCheckNodeState=START_ONLY"]
    if timeout > 0 and have >= TIMEOUT_SINCE:
        lines.append(f"HealthCheckTimeout={int(timeout)}")
    return lines

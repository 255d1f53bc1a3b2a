"""The drain a node's agent wants and Slurm does not show yet: one small file, for the Prolog.

The node-state owner (slurm_ext.nodestate, in the agent of the node's
slurmd) keeps `<runtime_dir>/drain-unshown` saying the drain it wants while
Slurm does not show it: held behind someone else's drain, or on its way.
The Prolog refuses a job while it is there. An admin who resumes a node
that has a critical finding behind their drain gives Slurm a moment to
start a job before our drain lands; the node-state owner looks twice a
second meanwhile, and this closes the rest of that moment. It lives in the
core, not in nodestate, so that the Prolog reads it without importing the
Slurm client.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["NAME", "path", "unshown_drain"]

NAME = "drain-unshown"


def path(runtime_dir: str | Path) -> Path:
    return Path(runtime_dir) / NAME


def unshown_drain(runtime_dir: str | Path) -> str:
    """The drain the node's agent wants and Slurm does not show ('' when none)."""
    try:
        with open(path(runtime_dir), encoding="utf-8", errors="replace") as file:
            return file.read(4096).strip()
    except OSError:
        return ""

"""Where lifecycle scripts live: one small module that the hooks' fast path can import cheaply.

`<scripts dir>/<role>/<phase>.d/` for the cluster's admin scripts, and
`~/.config/slurm-ext/<phase>/` for a user's own hooks.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm_ext import command
from slurm_ext.config import Config

__all__ = ["PHASES", "SCRIPT_ROLES", "DEFAULT_SCRIPTS_DIR", "CLEAN_PATH", "scripts_dir", "script_dirs", "phase_dir",
           "user_hook_dir"]

PHASES = ("node-boot", "job-start", "job-end")
SCRIPT_ROLES = ("worker", "login", "controller")
#: where the script directories are when the config names none and was read from no file
DEFAULT_SCRIPTS_DIR = Path("/etc/slurm-ext")
#: PATH of every script and hook (nothing of the caller's PATH is kept)
CLEAN_PATH = command.CLEAN_PATH


def scripts_dir(config: Config) -> Path:
    """The directory holding `<role>/<phase>.d/`.

    `prolog_epilog.scripts_dir` when set, else the directory of the config
    file the config was read from, else /etc/slurm-ext (no file: defaults).
    """
    if config.prolog_epilog.scripts_dir:
        return Path(config.prolog_epilog.scripts_dir)
    if config.source and not config.source.startswith("<"):  # "<config>": built from a dict, no file
        return Path(config.source).absolute().parent
    return DEFAULT_SCRIPTS_DIR


def phase_dir(config: Config, role: str, phase: str) -> Path:
    return scripts_dir(config) / role / f"{phase}.d"


def script_dirs(top: Path) -> list[Path]:
    """Every lifecycle script directory under `top`, existing or not."""
    return [Path(top) / role / f"{phase}.d" for role in SCRIPT_ROLES for phase in PHASES]


def user_hook_dir(home: str | os.PathLike, phase: str) -> Path:
    """Where a user keeps the hooks of `phase`: ~/.config/slurm-ext/<phase>/."""
    return Path(home) / ".config" / "slurm-ext" / phase

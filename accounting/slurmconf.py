"""The few slurm.conf values accounting needs, read from the file itself.

The storage guard runs before slurmctld, so `scontrol show config` cannot be
asked; the file is. Keys are case-insensitive, the first one wins (as in
Slurm), comments and NodeName/PartitionName lines are skipped, an Include is
followed once (relative to the including file's directory).
"""

from __future__ import annotations

import re
from pathlib import Path

from slurm_ext.errors import ConfigError

__all__ = ["read", "DEFAULTS"]

#: Slurm's own defaults for the keys read here (slurm.conf(5))
DEFAULTS = {"statesavelocation": "/var/spool/slurmctld", "slurmuser": "root", "authtype": "auth/munge",
            "jobcomptype": "jobcomp/none", "jobcomploc": "", "clustername": ""}
_LINE = re.compile(r"^\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")


def read(path: str | Path, _depth: int = 0) -> dict[str, str]:
    """slurm.conf's simple `Key=Value` lines, keys lower-cased, Slurm's defaults under them.

    Raises:
        ConfigError: the file cannot be read.
    """
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise ConfigError(path, f"cannot read slurm.conf: {err.strerror}") from None
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0]
        words = line.split()
        if words and words[0].lower() == "include" and len(words) == 2 and _depth < 2:
            included = Path(words[1]) if words[1].startswith("/") else path.parent / words[1]
            if included.exists():
                for key, value in read(included, _depth + 1).items():
                    values.setdefault(key, value)
            continue
        match = _LINE.match(line)
        if not match or " " in match.group(2):  # NodeName=... CPUs=...: several pairs, not ours
            continue
        values.setdefault(match.group(1).lower(), match.group(2).strip('"'))
    if _depth:
        return values
    return {**DEFAULTS, **values}

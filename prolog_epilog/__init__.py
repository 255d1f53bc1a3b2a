"""The Prolog and Epilog that slurmd runs, lifecycle scripts, and (later) job cleanup.

Entry points: `prolog_main` (console script slurm-ext-prolog) and
`epilog_main` (slurm-ext-epilog). slurmd executes `Prolog=`/`Epilog=` paths
with no arguments and a job environment of its own making.

Lifecycle scripts live in `<config dir>/<role>/<phase>.d/` (`script_dirs`);
`validate_script` / `validate_dir` check them before anything runs them.
"""

from pathlib import Path

from .hooks import epilog_main, prolog_main
from .validate import Problem, validate_dir, validate_script

__all__ = ["prolog_main", "epilog_main", "script_dirs", "validate_dir", "validate_script", "Problem",
           "PHASES", "SCRIPT_ROLES"]

PHASES = ("node-boot", "job-start", "job-end")
SCRIPT_ROLES = ("worker", "login", "controller")


def script_dirs(config_dir: Path) -> list[Path]:
    """Every lifecycle script directory under `config_dir`, existing or not."""
    return [Path(config_dir) / role / f"{phase}.d" for role in SCRIPT_ROLES for phase in PHASES]

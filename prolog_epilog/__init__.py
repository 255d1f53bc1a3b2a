"""The Prolog and Epilog that slurmd runs: job cleanup, GPU release, lifecycle scripts.

slurmd runs `slurm-ext-hook` (hook.c, compiled by `build_hook`) as Prolog=
and Epilog=; it hands the job to the hook service (`serve`, run by the
worker role's agent) and waits for its verdict; without a service it runs
`prolog_main` / `epilog_main` (console scripts slurm-ext-prolog and
slurm-ext-epilog), which do the same work in a fresh Python.

Lifecycle scripts live in `<scripts dir>/<role>/<phase>.d/` (`script_dirs`,
`scripts_dir`); `run_scripts` runs them, `validate_script` / `validate_dir`
check them before anything runs them.
"""

from pathlib import Path

from .hooks import epilog_main, prolog_main
from .scripts import run_scripts, scripts_dir
from .service import build_hook, serve, socket_path
from .validate import Problem, validate_dir, validate_script

__all__ = ["prolog_main", "epilog_main", "run_scripts", "scripts_dir", "serve", "build_hook", "socket_path",
           "script_dirs", "validate_dir", "validate_script", "Problem", "PHASES", "SCRIPT_ROLES"]

PHASES = ("node-boot", "job-start", "job-end")
SCRIPT_ROLES = ("worker", "login", "controller")


def script_dirs(config_dir: Path) -> list[Path]:
    """Every lifecycle script directory under `config_dir`, existing or not."""
    return [Path(config_dir) / role / f"{phase}.d" for role in SCRIPT_ROLES for phase in PHASES]

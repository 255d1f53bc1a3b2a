"""The Prolog and Epilog that slurmd runs: job cleanup, GPU release, lifecycle scripts.

slurmd runs `slurm-ext-hook` (hook.c, compiled by `build_hook`) as Prolog=
and Epilog=; it hands the job to the hook service (`serve`, run by the
worker role's agent) and waits for its verdict; without a service it runs
`prolog_main` / `epilog_main` (console scripts slurm-ext-prolog and
slurm-ext-epilog), which do the same work in a fresh Python. On bare metal
without the agent, `install_units` writes systemd units that start the
service on the first connection (socket activation).

Lifecycle scripts live in `<scripts dir>/<role>/<phase>.d/` (`script_dirs`,
`scripts_dir`); `run_scripts` runs them, `validate_script` / `validate_dir`
check them before anything runs them.
"""

from slurm_ext.lazy import lazy_names

from .hooks import epilog_main, prolog_main
from .places import PHASES, SCRIPT_ROLES, script_dirs, scripts_dir

__all__ = ["prolog_main", "epilog_main", "run_scripts", "scripts_dir", "serve", "build_hook", "write_launchers",
           "socket_path", "install_units",
           "script_dirs", "validate_dir", "validate_script", "Problem", "PHASES", "SCRIPT_ROLES", "gpu_jobs"]

# Imported on first use: slurmd starts the Python hooks (the fallback path) once per job, and
# every module imported here is paid for by every job on a node without the hook service.
_LAZY = {"run_scripts": "scripts", "serve": "service", "build_hook": "service", "socket_path": "service",
         "write_launchers": "service", "install_units": "units",
         "validate_dir": "validate", "validate_script": "validate", "Problem": "validate", "gpu_jobs": "jobrecord"}


__getattr__ = lazy_names(__name__, _LAZY)

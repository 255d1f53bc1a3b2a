"""What prolog_epilog gives the node agent (slurm_ext.plugin): the hook service (the Prolog's and Epilog's warm
side) before slurmd, the lifecycle scripts checked at start and the node-boot scripts run once per boot."""

from __future__ import annotations

import sys

from slurm_ext.plugin import Plugin, PluginWorker, StartStep, StepContext, WorkerSpec

from .places import PHASES, SCRIPT_ROLES, scripts_dir

__all__ = ["PLUGIN"]


def validate_scripts(context: StepContext) -> None:
    """Check the role's lifecycle scripts now, so a bad one is reported at start, not at the first job."""
    from .validate import validate_dir
    top = scripts_dir(context.config) / context.role
    errors = [problem for phase in PHASES
              for problems in validate_dir(top / f"{phase}.d", shellcheck=False).values()
              for problem in problems if problem.severity == "error"]
    if errors:
        shown = "; ".join(map(str, errors[:5])) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise ValueError(f"{len(errors)} problem(s) in lifecycle scripts, which the hooks will refuse to run "
                         f"(`slurm-ext scripts validate` lists them): {shown}")


def node_boot_scripts(context: StepContext) -> None:
    """Run <role>/node-boot.d/ once per boot, before the workers (each script's result is an event)."""
    from .scripts import run_scripts
    outcome = run_scripts("node-boot", context.config, role=context.role)
    failed = [result.path for result in outcome.results if not result.ok]
    if failed:
        raise RuntimeError(f"node-boot script(s) failed: {', '.join(failed)} (see their events for output)")


def _steps(role: str) -> list[StartStep]:
    """A failed node-boot script blocks the start (retried with backoff, all node-boot scripts again): a node
    whose boot set-up failed must not take jobs. `supervisor.step_failure = {node-boot-scripts = "continue"}`
    starts the workers anyway."""
    if role not in SCRIPT_ROLES:
        return []
    return [StartStep("validate-scripts", validate_scripts),
            StartStep("node-boot-scripts", node_boot_scripts, once_per_boot=True, on_failure="block")]


PLUGIN = Plugin(
    name="prolog_epilog",
    # the Prolog/Epilog's warm side (prolog_epilog.service), up before slurmd runs the first hook;
    # -I: isolated, so neither the cwd (sys.path[0] of `-m`) nor PYTHON* variables choose what root imports
    workers=(PluginWorker(WorkerSpec("hooks", ("worker",), (sys.executable, "-I", "-m", "slurm_ext.cli", "hooks",
                                                            "serve")), before="slurmd"),),
    steps=_steps,
)

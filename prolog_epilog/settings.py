"""The Prolog's and Epilog's config: [prolog_epilog].

Declared by the component and registered with the core
(`slurm_ext.config.register_section`), which imports this module by name
when a config needs the section (every Python hook run does: keep it light).
"""

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["PrologEpilogSection"]

_HOOK_PHASES = ("job-start", "job-end")


@dataclass(frozen=True, slots=True)
class PrologEpilogSection:
    """The Prolog and Epilog: job cleanup, GPU release checks, lifecycle scripts."""

    scripts_dir: str = setting("", "holds <role>/<phase>.d/ lifecycle script directories (node-boot.d, job-start.d, "
                               "job-end.d); empty means the config file's directory", "path", empty_ok=True)
    script_timeout: float = setting(60.0, "longest run of one lifecycle script or user hook; then its process group "
                                    "is killed and it counts as failed", "duration", minimum=0.1, maximum=86400.0)
    script_timeouts: dict = setting({}, "per-script timeout by file name, e.g. { \"10-mounts\" = \"5m\" } (admin "
                                    "scripts only)",
                                    "table", item={"kind": "duration", "minimum": 0.1, "maximum": 86400.0})
    on_failure: dict = setting({"job-start": "drain", "job-end": "ignore"},
                               "per phase: drain (non-zero exit to Slurm, which drains the node and requeues a "
                               "starting job) or ignore (event only); a phase left out keeps its default",
                               "table", keys=_HOOK_PHASES, item={"kind": "choice", "choices": ("drain", "ignore")})
    allow_user_hooks: bool = setting(False, "run the job user's ~/.config/slurm-ext/{job-start,job-end}/ executables, "
                                     "as that user", "bool")
    min_uid: int = setting(1000, "the Epilog kills every process of a job's user who has no other job on the node "
                           "only when the uid is at least this (never root)", "int", minimum=1, maximum=2**32 - 2)
    kill_timeout: float = setting(10.0, "longest wait for killed job processes to be gone; one still there (state D) "
                                  "drains the node", "duration", minimum=0.1, maximum=600.0)
    gpu_memory_threshold: int = setting(1024, "MiB of memory a GPU may still show in use after its job's processes "
                                        "are gone before the node is drained", "int", minimum=0, maximum=10**7)

    def failure_policy(self, phase: str) -> str:
        """drain or ignore: what a failed `phase` script does (a phase left out keeps its default)."""
        return self.on_failure.get(phase, {"job-start": "drain"}.get(phase, "ignore"))


register_section("prolog_epilog", PrologEpilogSection)

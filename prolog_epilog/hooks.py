"""slurm-ext-prolog and slurm-ext-epilog.

Job cleanup is not built yet (issue 4): for now each hook records that it ran
for the job, in one log line, and exits 0. A non-zero exit would make slurmd
drain the node ("Prolog error") and requeue-hold the job, so a hook that has
nothing to do must never fail, not even on a bad config file.
"""

import os
import sys

from slurm_ext import config, log
from slurm_ext.errors import ConfigError


def prolog_main() -> int:
    return _run("prolog")


def epilog_main() -> int:
    return _run("epilog")


def _run(phase: str) -> int:
    try:
        settings = config.load()
    except ConfigError as err:
        print(f"slurm-ext-{phase}: {err}; using defaults", file=sys.stderr)
        settings = config.Config()
    logger = log.setup(settings.log, phase)
    env = os.environ
    logger.info("job %s user %s (uid %s) on %s: %s ran; job cleanup is not built yet",
                env.get("SLURM_JOB_ID", "?"), env.get("SLURM_JOB_USER", "?"), env.get("SLURM_JOB_UID", "?"),
                env.get("SLURMD_NODENAME", "?"), phase)
    return 0

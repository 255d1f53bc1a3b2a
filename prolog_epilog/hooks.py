"""slurm-ext-prolog and slurm-ext-epilog.

The Prolog records the job (see jobrecord); the Epilog reads that record and
removes it. Job cleanup, GPU checks and lifecycle scripts are built on this
by the job-cleanup issue. A non-zero exit would make slurmd drain the node
("Prolog error") and requeue-hold the job, so a hook that cannot do its own
bookkeeping reports it (log line and node event) and still exits 0: a
missing record costs the Epilog precision, never a job.
"""

import os
import sys
import time

from slurm_ext import config, events, log
from slurm_ext.errors import ConfigError

from . import jobrecord


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
    env = dict(os.environ)
    state_dir = settings.node.state_dir
    job = env.get("SLURM_JOB_ID", "?")
    try:
        if phase == "prolog":
            record = jobrecord.from_environ(env)
            jobrecord.write(record, state_dir)
            logger.info("job %s user %s (uid %d) gpus %s: recorded", job, record.user, record.uid,
                        ",".join(map(str, record.gpus)) or "none")
        else:
            record = jobrecord.read(int(job) if job.isdigit() else -1, state_dir)
            if record is None:
                logger.warning("job %s: no record from its Prolog in %s/jobs", job, state_dir)
            else:
                logger.info("job %s user %s (uid %d): ran %.1fs; epilog done", job, record.user, record.uid,
                            max(0.0, time.time() - record.start))
                jobrecord.remove(record.job_id, state_dir)
    except (jobrecord.JobEnvironmentError, OSError) as err:
        events.emit(state_dir, "prolog_epilog", f"{phase}-failed", f"job {job}: {phase}: {err}", "error",
                    job=job)
    return 0

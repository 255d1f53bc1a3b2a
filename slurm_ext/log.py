"""Logging set-up shared by every entry point.

One line per event, in the form operators grep for:
``2026-11-29T17:00:01 slurm-ext[4242] prolog INFO: job 12: ...``.
"""

import logging
import sys

from .config import LogSection

__all__ = ["setup"]

_FORMAT = "%(asctime)s slurm-ext[%(process)d] %(name)s %(levelname)s: %(message)s"
_DATEFMT = "%Y-%m-%dT%H:%M:%S"


def setup(section: LogSection, component: str = "slurm-ext") -> logging.Logger:
    """Configure the root logger from [log] and return the component's logger.

    A log file that cannot be opened falls back to standard error with a
    warning: losing the file must not stop a hook that slurmd is waiting on.
    """
    handler: logging.Handler
    problem = None
    if section.file:
        try:
            handler = logging.FileHandler(section.file)
        except OSError as err:
            handler = logging.StreamHandler(sys.stderr)
            problem = f"log.file {section.file}: {err.strerror}; logging to standard error"
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(section.level.upper())
    logger = logging.getLogger(component)
    if problem:
        logger.warning(problem)
    return logger

"""The Prolog and Epilog that slurmd runs, and (later) job cleanup and lifecycle scripts.

Entry points: `prolog_main` (console script slurm-ext-prolog) and
`epilog_main` (slurm-ext-epilog). slurmd executes `Prolog=`/`Epilog=` paths
with no arguments and a job environment of its own making.
"""

from .hooks import epilog_main, prolog_main

__all__ = ["prolog_main", "epilog_main"]

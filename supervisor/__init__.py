"""The node agent (PID 1 or subreaper) that keeps Slurm's daemons alive.

Not built yet: this package only reserves the layout's place (issue 3).
"""

__all__: list[str] = []

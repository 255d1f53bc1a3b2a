"""The local development cluster: real Slurm on this host, on 127.0.0.1.

munge, MariaDB (datadir in the state directory), slurmdbd, slurmctld and
slurmd with fake GPUs (mknod'd devices plus the fake libnvidia-ml in every
daemon's and hook's environment), Prolog/Epilog pointing at slurm-ext's entry
points. `slurm-ext dev ...` and the test suite's fixtures both use this code.
"""

from .cluster import DaemonStatus, DemoResult, Status, client, demo, down, job_cgroups, status, up
from .deps import install as install_deps

__all__ = ["up", "down", "status", "demo", "install_deps", "client", "job_cgroups",
           "Status", "DaemonStatus", "DemoResult"]

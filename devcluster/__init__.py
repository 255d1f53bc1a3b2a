"""The local development cluster: real Slurm on this host, on 127.0.0.1.

munge, MariaDB (datadir in the state directory), slurmdbd, slurmctld and
slurmd with fake GPUs (mknod'd devices plus the fake libnvidia-ml, built from
the C sources this package carries as package data, in every daemon's and
hook's environment), Prolog/Epilog pointing at slurm-ext's entry points.
`slurm-ext dev ...` (its commands: `cli`), the test suite's fixtures and the
images all use this code; its config section is [dev] (`settings`).

`up(settings)`, `down(settings)`, `status(settings)`, `demo(settings)` and
`install_deps()` are the commands' work; `client(settings)` is a Slurm client
pointed at the cluster.
"""

from slurm_ext.lazy import lazy_names

__all__ = ["up", "down", "status", "demo", "install_deps", "client", "job_cgroups", "reboot_node", "shared_munged",
           "Status", "DaemonStatus", "DemoResult", "DevSection"]

# Imported on first use: the core imports this package for its config section ([dev]) and
# its commands whenever a config or the CLI needs them, and the cluster code pulls in the
# Slurm client and more.
_LAZY = {"up": "cluster", "down": "cluster", "status": "cluster", "demo": "cluster", "client": "cluster", "reboot_node": "cluster",
         "shared_munged": "cluster",
         "job_cgroups": "cluster", "Status": "cluster", "DaemonStatus": "cluster", "DemoResult": "cluster",
         "install_deps": "deps", "DevSection": "settings"}
_RENAMED = {"install_deps": "install"}


__getattr__ = lazy_names(__name__, _LAZY, _RENAMED)

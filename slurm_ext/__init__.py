"""slurm-ext: self-healing for Slurm GPU nodes, on bare metal and in Slinky pods.

The core package holds what every component shares: the config
(`slurm_ext.config`), the Slurm client and node-state ownership
(`slurm_ext.slurm`), the error family (`slurm_ext.errors`), command running
and the `slurm-ext` CLI. Components live in their own folders and are
imported as `slurm_ext.supervisor`, `slurm_ext.prolog_epilog`,
`slurm_ext.gres`, `slurm_ext.accounting` and `slurm_ext.devcluster` (the
local cluster, which assembles the others). The core imports none of them:
each component declares its config section and its commands, and the core
loads those by name when a config or the command line needs them.
"""

__version__ = "0.1.0"

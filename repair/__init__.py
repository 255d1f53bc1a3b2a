"""Human-approved node repair, and one history of what happened to the cluster.

Recommendations come from the nodes' health drains (`recommend`); an
operator approves or rejects them (`decide`: cooldown, the cluster guard,
the pause switch); the controller agent's `repair` worker carries approved
ones through drain, jobs, action, boot, checks and resume (`flow`,
`service`), with reboot through Slurm and the other actions through an
executor (`executors`); everything is kept durably (`store`).

Public surface: `serve()` (the worker), `open_store(config)`; the CLI's
`repair`, `status` and `history` commands (`cli`). Imported on first use:
the core CLI loads `cli` to build its parser for every command, and the
service pulls in threads, the store and the executors.
"""

from slurm_ext.lazy import lazy_names

__all__ = ["serve", "open_store"]

_LAZY = {"serve": "service", "open_store": "store"}


__getattr__ = lazy_names(__name__, _LAZY)

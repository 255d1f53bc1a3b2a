"""Human-approved node repair, and one history of what happened to the cluster.

Recommendations come from the nodes' health drains (`recommend`); an
operator approves or rejects them (`decide`: cooldown, the cluster guard,
the pause switch); the controller agent's `repair` worker carries approved
ones through drain, jobs, action, boot, checks and resume (`flow`,
`service`), with reboot through Slurm and the other actions through an
executor (`executors`); everything is kept durably (`store`).

Public surface: `serve()` (the worker), `open_store(config)`; the CLI's
`repair`, `history` and `status` commands (`cli`).
"""

from .service import serve
from .store import open_store

__all__ = ["serve", "open_store"]

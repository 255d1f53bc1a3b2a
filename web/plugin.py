"""What web gives the node agent (slurm_ext.plugin): the cluster page on the controller, with web.enabled."""

from __future__ import annotations

import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]


def _enabled(config: Config, role: str) -> bool:
    return role != "controller" or config.web.enabled


def _spec_changes(config: Config, role: str) -> dict[str, dict]:
    """The page runs as web.user, with copies of the secrets it reads (slurm_ext.credentials): the agent
    credential (to ask the agents), the proxy's shared secret, the sign-in's client secret and session key, and its own
    database account's password
    (accounting.page_password_file), never slurmdbd's: where slurm-ext runs the database every part's account
    has slurmdbd's password unless given one of its own. The token file of hashes is read in place
    (root:<its group> 0640)."""
    if role != "controller" or config.web.user == "root":
        return {}
    return {"web": {"user": config.web.user, "events": "web",
                    "credentials": ("node.agent_credential", "web.proxy_secret_file",
                                    "web.oidc_client_secret_file", "web.session_key_file",
                                    "accounting.page_password_file")}}


PLUGIN = Plugin(
    name="web",
    # reads Slurm only while someone looks; never the controller's readiness
    workers=(PluginWorker(WorkerSpec("web", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "web"),
                                     gates_ready=False, after=("slurmctld",))),),
    enabled=_enabled,
    spec_changes=_spec_changes,
)

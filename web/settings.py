"""The cluster page's config: [web].

Every default is the safe one: the page listens on 127.0.0.1 only, viewing
needs nothing, and no operation is possible until an operator's token file
(root's, readable by no one else) or a trusted proxy is configured.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["WebSection"]


@dataclass(frozen=True, slots=True)
class WebSection:
    """The cluster page (`slurm-ext web`), a worker of the controller agent when enabled."""

    enabled: bool = setting(False, "run the page as the controller agent's `web` worker", "bool")
    user: str = setting("slurm-ext-web", "the Unix user the page runs as (with its groups): the agent copies the "
                        "secrets it reads for it at each start (docs/operator/web.md); it must exist on the "
                        "controller (useradd --system --no-create-home --shell /usr/sbin/nologin slurm-ext-web); "
                        "root: as root, beside slurmctld's key and the database passwords (not recommended)", "str",
                        pattern=r"^[a-z_][a-z0-9_-]*[$]?$")
    listen: str = setting("127.0.0.1:9820", "host:port the page is served on; keep it on 127.0.0.1 behind a reverse "
                          "proxy, or open it on purpose (viewing needs no login, operations do)", "str",
                          pattern=r"^[A-Za-z0-9.:\[\]_-]+:\d{1,5}$")
    refresh: float = setting(5.0, "how often the server reads the cluster while someone looks: one Slurm query per "
                             "table, shared by every open page", "duration", minimum=1.0, maximum=3600.0)
    timeline: float = setting(7 * 86400.0, "how far back the event timeline and the health and repair histories go",
                              "duration", minimum=3600.0, maximum=90 * 86400.0)
    token_file: str = setting("/etc/slurm-ext/web-tokens", "operators' bearer tokens, one `USER sha256:HASH` a line "
                              "(`slurm-ext web add-token USER` adds one; `slurm-ext web hash-tokens` hashes a file of "
                              "plain `USER TOKEN` lines); root's and readable by no one else, never a link, or "
                              "ignored with an error in the log; empty: no tokens", "path", empty_ok=True)
    proxy_user_header: str = setting("", "the header a trusted reverse proxy (oauth2-proxy, mod_auth_openidc) names "
                                     "the signed-in user in, such as X-Forwarded-User; empty: off", "str",
                                     pattern=r"^([A-Za-z0-9-]+)?$")
    trusted_proxies: tuple = setting((), "addresses whose proxy_user_header is believed (the reverse proxy's, as "
                                     "the page sees it); from any other address the header is refused", "list",
                                     item={"kind": "str", "pattern": r"^[0-9A-Fa-f.:]+$"})
    proxy_secret_file: str = setting("", "a file of root's (mode 600, at least 32 bytes: `openssl rand -hex 32`) "
                                     "holding a secret the reverse proxy sends on every request in the "
                                     "X-Slurm-Ext-Proxy-Secret header: proxy_user_header is then believed only beside "
                                     "it (for a proxy address others can send from too); empty: off", "path",
                                     empty_ok=True)
    prometheus_url: str = setting("", "a Prometheus that scrapes the agents (DCGM_FI_DEV_*, slurm_ext_network_*): the "
                                  "usage panels ask it instead of the agents; empty: the agents", "str",
                                  pattern=r"^(https?://[A-Za-z0-9.:\[\]_-]+(/[A-Za-z0-9._/-]*)?)?$")
    grafana_url: str = setting("", "the Grafana dashboard the usage panels link to ({node} in a node's own link: its "
                               "name); empty: no links", "str", pattern=r"^(https?://\S+)?$")
    ssh_command: str = setting("ssh {node}", "the command the Nodes tab copies for a node ({node}: its name, {addr}: "
                               "its NodeAddr)", "str", pattern=r"^[^\n]*$")
    fields: dict = setting({}, "free-form facts shown with the cluster's configuration: { region = \"eu-west\", "
                           "\"billing rate\" = \"2.10 USD per GPU-hour\" }", "table", item={"kind": "str"})
    idle_gpu_below: str = setting("5%", "a GPU that a job holds is flagged idle on the page while its utilization "
                                  "stays under this for idle_gpu_after (the waste operators hunt)", "str",
                                  pattern=r"^(100|[1-9]?[0-9])%$")
    idle_gpu_after: float = setting(900.0, "how long a GPU that a job holds stays under idle_gpu_below before the "
                                    "page flags it idle", "duration", minimum=0.0, maximum=7 * 86400.0)
    agent_timeout: float = setting(2.0, "longest wait for one node agent (its health, its journal) per refresh",
                                   "duration", minimum=0.1, maximum=60.0)

    @property
    def idle_utilization(self) -> int:
        """idle_gpu_below as a whole percent."""
        return int(self.idle_gpu_below.rstrip("%"))

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


register_section("web", WebSection)

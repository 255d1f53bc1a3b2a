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
    oidc_client_id: str = setting("", "the page's client id at the IdP of [oidc] (its ID tokens' audience): the page "
                                  "signs people in with OpenID Connect (authorization code flow with PKCE); empty: no "
                                  "sign-in (tokens and the trusted proxy only)", "str", pattern=r"^\S{0,255}$")
    oidc_client_secret_file: str = setting("", "a file of root's (mode 600) holding the client's secret, for an IdP "
                                           "that registered the page as a confidential client (the agent copies it "
                                           "for web.user); empty: a public client (PKCE only)", "path", empty_ok=True)
    oidc_redirect_url: str = setting("", "the URL the IdP sends people back to: the page's public URL + "
                                     "/auth/callback, registered at the IdP (required with trusted_proxies; "
                                     "https://...: the cookies are Secure); empty: the URL the request came to + "
                                     "/auth/callback", "str",
                                     pattern=r"^(https?://\S+/auth/callback)?$")
    oidc_scopes: tuple = setting(("openid", "profile", "email"), "the scopes the sign-in asks for (openid always; "
                                 "add the one your IdP needs to put the groups claim in the ID token)", "list",
                                 item={"kind": "str", "pattern": r"^[\x21\x23-\x5b\x5d-\x7e]{1,64}$"})
    oidc_groups_claim: str = setting("groups", "the ID token's claim that lists the person's groups (a list of "
                                     "strings), mapped to a role by roles", "str", pattern=r"^[A-Za-z0-9_:./-]{1,128}$")
    roles: dict = setting({}, "the IdP's groups each role of the page takes: { viewer = [\"slurm-users\"], operator = "
                          "[\"slurm-operators\"], admin = [\"slurm-admins\"] }; a person in groups of several roles "
                          "has the highest; viewer views, operator and admin also approve, reject, reopen, clear and "
                          "check", "table", keys=("viewer", "operator", "admin"),
                          item={"kind": "list", "item": {"kind": "str", "pattern": r"^[^\n]{1,256}$"}})
    viewing: str = setting("anyone", "who may view the page: anyone (as without sign-in) or signed-in (a person the "
                           "IdP signed in with a role, or an operator token); operations always need an operator",
                           "choice", choices=("anyone", "signed-in"))
    session_lifetime: float = setting(3600.0, "how long a sign-in lasts before the page asks again (the IdP's own "
                                      "session usually makes that one click): short, so a person removed from a "
                                      "group loses the role soon and a stolen cookie soon stops working", "duration",
                                      minimum=60.0, maximum=8 * 3600.0)
    session_key_file: str = setting("", "a file of root's (mode 600, at least 32 bytes: `openssl rand -hex 32`) with "
                                    "the key that signs the sign-in cookies, so sessions outlive a restart of the "
                                    "page; empty: a random key per process (a restart signs everyone out)", "path",
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

    def check_together(self) -> None:
        """Keys wrong only together (slurm_ext.config calls it at every load, so `config check` and the agent's
        reload refuse them, not the page's start): sign-in behind a reverse proxy without web.oidc_redirect_url would
        take the page's URL from the request's Host header, which the client chooses.

        Raises:
            ValueError(key, message)
        """
        if self.oidc_client_id and self.trusted_proxies and not self.oidc_redirect_url:
            raise ValueError("oidc_redirect_url", "sign-in behind a reverse proxy (web.oidc_client_id with "
                             "web.trusted_proxies) needs the page's public URL + /auth/callback, as registered at the "
                             "IdP (https://HOST/auth/callback)")

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

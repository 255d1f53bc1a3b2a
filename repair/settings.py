"""The repair service's config: [repair].

Every default is the safe one: nothing is approved without an operator,
a repair waits for the node's jobs instead of killing them, at most
max(guard_nodes, guard_percent of the cluster) nodes are under repair at
once, and a node just repaired is left alone for `cooldown`.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["RepairSection", "HistorySection", "ACTIONS", "KEEPS_DATA"]

#: what a repair does, least disruptive first (health's actions that a repair can carry out); reset-gpu resets the
#: one GPU the finding names, through the node's agent (health.gpu_reset_command), and waits only for its jobs
ACTIONS = ("reset-gpu", "reboot", "reprovision", "failover", "remove")
#: the actions that keep the node's local data: the only ones auto-approve may take
KEEPS_DATA = ("reset-gpu", "reboot")


@dataclass(frozen=True, slots=True)
class RepairSection:
    """Human-approved node repair (`slurm-ext repair ...`), run by the controller agent's `repair` worker."""

    enabled: bool = setting(True, "run the repair service in the controller agent", "bool")
    interval: float = setting(10.0, "how often the service reads the cluster (one Slurm query per table) and moves "
                              "repairs on", "duration", minimum=0.1, maximum=3600.0)
    database: str = setting("auto", "where recommendations, decisions and steps are kept: mariadb (a database of "
                            "slurm-ext's own on the accounting server, in its backups), sqlite (a file on the "
                            "controller's state volume), or auto (mariadb where [accounting] has a password_file, "
                            "else sqlite); the MariaDB database is accounting.own_database", "choice", choices=("auto", "mariadb", "sqlite"))
    sqlite_file: str = setting("/var/lib/slurm-ext/repair.db", "the SQLite file (on the controller's state volume)",
                               "path")
    actions: dict = setting({}, "the action for a signature (a health check, or check/code as xid/79), when not the "
                            "one its finding recommends: { \"xid/48\" = \"reboot\", temperature = \"failover\" }",
                            "table", item={"kind": "choice", "choices": ACTIONS})
    escalate_after: int = setting(2, "the same signature on a node after this many reboots within escalate_window: "
                                  "remove is recommended (gpud's rule); on the same GPU after this many GPU resets: "
                                  "reboot", "int", minimum=1, maximum=100)
    escalate_window: float = setting(7 * 86400.0, "the window of escalate_after", "duration", minimum=60.0,
                                     maximum=365 * 86400.0)
    cooldown: float = setting(1800.0, "after a repair ends, no new repair of that node is approved for this long",
                              "duration", minimum=0.0, maximum=30 * 86400.0)
    guard_nodes: int = setting(1, "nodes under repair at once, at least (the guard allows max(guard_nodes, "
                               "guard_percent of the nodes))", "int", minimum=0, maximum=100000)
    guard_percent: int = setting(10, "nodes under repair at once, as a percentage of the cluster's nodes", "int",
                                 minimum=0, maximum=100)
    auto_approve: tuple = setting((), "signatures whose repair is approved without an operator (only for actions "
                                  "that keep data: reset-gpu, reboot); off by default", "list", item={"kind": "str"})
    dry_run: bool = setting(False, "record every step as it would run, and run none (no drain, no action)", "bool")
    drain_deadline: float = setting(7200.0, "how long an approved repair waits for the node's jobs to end; past it "
                                    "the repair fails with the node still drained", "duration", minimum=0.0,
                                    maximum=30 * 86400.0)
    requeue: bool = setting(False, "requeue the node's jobs that allow it (scontrol requeue) instead of waiting for "
                            "them", "bool")
    reboot_action: str = setting("", "a PowerAction of slurm.conf that a reboot runs instead of RebootProgram "
                                 "(`scontrol reboot action=NAME`, Slurm 26.05 and later): a power cycle through the "
                                 "BMC, which a GPU fallen off the bus may need; empty: RebootProgram", "str",
                                 pattern=r"^[A-Za-z0-9_.-]{0,64}$")
    boot_timeout: float = setting(900.0, "how long a node may take to come back from its action", "duration",
                                  minimum=1.0, maximum=86400.0)
    verify_timeout: float = setting(300.0, "how long the node's health checks may take to pass after it came back",
                                    "duration", minimum=1.0, maximum=86400.0)
    executor: str = setting("command", "how reprovision, failover and remove run: command (`commands`, bare metal) or "
                            "kubernetes (the kubernetes_* keys: delete the node's pod, cordon or label its "
                            "Kubernetes node)", "choice", choices=("command", "kubernetes"))
    commands: dict = setting({}, "the command of each executed action, as a list: a program and its arguments, "
                             "never `sh -c`; {node} is the node's name, as one argument: "
                             "{ remove = [\"/usr/local/sbin/rma\", \"{node}\"] }", "table",
                             item={"kind": "list", "item": {"kind": "str"}, "min_items": 1})
    command_timeout: float = setting(1800.0, "longest an executor command may run before it is killed and the "
                                     "repair fails", "duration", minimum=1.0, maximum=86400.0)
    agent_port: int = setting(9810, "the worker agents' HTTP port (their events and health, read-only)", "int",
                              minimum=1, maximum=65535)
    agents: dict = setting({}, "a node's agent address as host:port, where it is not the node's NodeAddr and "
                           "agent_port (the dev cluster's nodes, all on 127.0.0.1)", "table",
                           item={"kind": "str", "pattern": r"^[A-Za-z0-9.:\[\]_-]+:\d+$"})
    kubernetes_api: str = setting("", "the Kubernetes API server's URL; empty: the in-cluster service account's "
                                  "(a controller pod's)", "str",
                                  pattern=r"^(https?://[A-Za-z0-9.:\[\]_-]+(/[A-Za-z0-9._/-]*)?)?$")
    kubernetes_token_file: str = setting("/var/run/secrets/kubernetes.io/serviceaccount/token",
                                         "the bearer token's file (root-owned)", "path", empty_ok=True)
    kubernetes_ca_file: str = setting("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                                      "the CA that verifies repair.kubernetes_api's certificate; empty: the "
                                      "executor refuses to send its token, unless kubernetes_insecure", "path",
                                      empty_ok=True)
    kubernetes_insecure: bool = setting(False, "let the executor send its bearer token to repair.kubernetes_api "
                                        "unverified (plain http, or no kubernetes_ca_file): a test server only",
                                        "bool")
    kubernetes_namespace: str = setting("slurm", "the namespace of the NodeSet's worker pods", "str",
                                        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    kubernetes_pod: str = setting("{node}", "the worker pod of a Slurm node ({node}: its name; Slinky names a "
                                  "NodeSet's pods after their nodes)", "str", pattern=r"^[a-z0-9{}.-]+$")
    kubernetes_rma_label: str = setting("slurm-ext.io/rma", "the label `remove` puts on the node's Kubernetes node "
                                        "(value true)", "str", pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9_.-]+$")
    notify_url_file: str = setting("", "a file of root's (mode 0600) holding the webhook URL that each "
                                   "recommendation, approval, failed repair and critical health finding is posted "
                                   "to; empty: no notifier", "path", empty_ok=True)
    notify_format: str = setting("slack", "what the webhook is posted: slack (a Slack-compatible {\"text\": ...}, "
                                 "Mattermost and Teams' incoming webhooks take it too) or alertmanager (a list of "
                                 "alerts, as Alertmanager's /api/v2/alerts takes them)", "choice",
                                 choices=("slack", "alertmanager"))
    notify_queue: int = setting(1000, "notices waiting to be posted, at most; when full, the oldest is dropped "
                                "(counted, and said in a repair-notify-dropped event)", "int", minimum=1,
                                maximum=100000)
    notify_retries: int = setting(5, "tries again of a notice the webhook refused or did not answer, before it is "
                                  "dropped", "int", minimum=0, maximum=100)
    notify_backoff: float = setting(1.0, "the wait before the first retry, doubled for each next one (at most "
                                    "5m)", "duration", minimum=0.01, maximum=300.0)
    notify_timeout: float = setting(10.0, "longest wait for the webhook's answer to one post", "duration",
                                    minimum=0.1, maximum=300.0)

register_section("repair", RepairSection)


@dataclass(frozen=True, slots=True)
class HistorySection:
    """The node agents' journals collected into the repair database ([repair] database) by the controller agent's
    `collector` worker: what `slurm-ext history` and the cluster page read, one query for every node."""

    enabled: bool = setting(True, "run the collector in the controller agent", "bool")
    interval: float = setting(15.0, "how often each node's agent is asked for the journal lines written since its "
                              "last answer (one that had more is asked again at once)", "duration", minimum=0.5,
                              maximum=3600.0)
    parallel: int = setting(16, "agents asked at once", "int", minimum=1, maximum=256)
    timeout: float = setting(5.0, "longest wait for one agent's answer", "duration", minimum=0.5, maximum=120.0)
    page_bytes: int = setting(2**20, "journal bytes asked of one agent at once", "int", minimum=4096,
                              maximum=8 * 2**20)
    batch: int = setting(5000, "events stored in one transaction, at most", "int", minimum=1, maximum=100000)
    backlog: int = setting(50000, "events taken from the agents and not stored yet, at most: past it no agent is "
                           "asked until the database caught up (the agents' journals hold the rest)", "int",
                           minimum=1000, maximum=10000000)
    backlog_bytes: int = setting(256 * 2**20, "bytes of events taken from the agents and not stored yet, at most "
                                 "(beside history.backlog: a few events may be large)", "int", minimum=16 * 2**20,
                                 maximum=16 * 2**30)
    retry_max: float = setting(300.0, "an agent that does not answer is asked again after a wait that doubles from "
                               "`interval` up to this", "duration", minimum=1.0, maximum=86400.0)
    keep: float = setting(90 * 86400.0, "events older than this are removed from the database", "duration",
                          minimum=3600.0, maximum=10 * 365 * 86400.0)
    max_events: int = setting(50_000_000, "events kept at most (about 1 KiB each in the database); the oldest "
                              "beyond are removed", "int", minimum=10000, maximum=10**10)


register_section("history", HistorySection)

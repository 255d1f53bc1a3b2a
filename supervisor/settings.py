"""The node agent's config: [supervisor] and its [supervisor.workers.<name>] tables.

The component declares its section here and registers it with the core
(`slurm_ext.config.register_section`); the core imports this module by name
when a config needs the section. Keep it light: the Python hook fallback may
load it for every job.
"""

from dataclasses import dataclass

from slurm_ext.config import ROLES, register_section, setting

__all__ = ["SupervisorSection", "WorkerSection"]

_DEFAULT_PORTS = {"worker": 9810, "controller": 9811, "accounting": 9812, "login": 9813}
_SIGNALS = ("TERM", "INT", "QUIT", "HUP", "USR1", "USR2", "KILL")


@dataclass(frozen=True, slots=True)
class WorkerSection:
    """One program the node agent runs, [supervisor.workers.<name>].

    Every key is optional: a key left out keeps the built-in default of a
    worker of that name (slurmd, slurmctld, slurmdbd, mariadbd, munged, sshd),
    or the generic default below for a new name.
    """

    roles: tuple | None = setting(None, "roles that run this worker", "list",
                                  item={"kind": "choice", "choices": ROLES})
    command: tuple | None = setting(None, "program and arguments, run in the foreground; the program is looked up "
                                    "in PATH", "list", item={"kind": "str"}, min_items=1)
    environment: dict | None = setting(None, "extra environment variables", "table", item={"kind": "str"})
    restart: str | None = setting(None, "when to restart it after it exits: always, on-failure, never", "choice",
                                  choices=("always", "on-failure", "never"))
    stop_signal: str | None = setting(None, "signal that asks it to stop", "choice", choices=_SIGNALS)
    stop_grace: float | None = setting(None, "wait this long after stop_signal before SIGKILL", "duration",
                                       minimum=0.0, maximum=3600.0)
    notify: bool | None = setting(None, "serve it a NOTIFY_SOCKET (sd_notify: READY=1, MAINPID=, STATUS=)", "bool")
    ready: str | None = setting(None, "when it counts as ready: running, notify (READY=1), slurm-node (this node "
                                "registered and responding in Slurm)", "choice",
                                choices=("running", "notify", "slurm-node"))
    drain_on_crash_loop: bool | None = setting(None, "drain this node (owned reason) while it crash-loops", "bool")
    after: tuple | None = setting(None, "workers of the same role that must be ready before this one starts or "
                                  "restarts (slurmdbd after mariadbd)", "list", item={"kind": "str"})
    user: str | None = setting(None, "the user it runs as, with that user's groups (the page: web.user); empty: the "
                               "agent's own (root)", "str", pattern=r"^([a-z_][a-z0-9_-]*[$]?)?$")


@dataclass(frozen=True, slots=True)
class SupervisorSection:
    """The node agent, `slurm-ext supervise --role ROLE`."""

    listen: str = setting("127.0.0.1", "address of the HTTP listener for /livez, /readyz, /metrics", "str",
                          pattern=r"^[0-9A-Za-z.:-]+$")
    ports: dict = setting(_DEFAULT_PORTS,
                          "HTTP port of each role's agent (0: no listener); a role left out keeps its default",
                          "table", keys=ROLES, item={"kind": "int", "minimum": 0, "maximum": 65535})
    open_metrics: bool = setting(True, "serve /metrics without the agent credential (a Prometheus scrapes it); "
                                 "false: /metrics, like /events and /health, answers only who proves "
                                 "node.agent_credential", "bool")
    backoff_initial: float = setting(0.01, "delay before restarting a worker that died after it had got ready "
                                     "(READY=1, registered, or up stable_after), and before the first restart of "
                                     "one that had not", "duration", minimum=0.0, maximum=60.0)
    backoff_max: float = setting(30.0, "cap of the delay that doubles while a worker dies before getting ready, and "
                                 "its delay while it crash-loops so", "duration", minimum=0.01, maximum=3600.0)
    stable_after: float = setting(2.0, "a worker up this long started fine: its next restart delay starts over "
                                  "from backoff_initial (like supervisord's startsecs)", "duration",
                                  minimum=0.1, maximum=86400.0)
    crash_loop_count: int = setting(5, "this many exits within crash_loop_window is a crash loop", "int",
                                    minimum=2, maximum=1000)
    crash_loop_window: float = setting(10.0, "window for crash_loop_count (5 in 10s is also systemd's start limit); "
                                       "a crash loop is over once the worker has run this long", "duration",
                                       minimum=1.0, maximum=86400.0)
    ready_interval: float = setting(30.0, "how often readiness is asked of Slurm once ready (every node asks "
                                    "slurmctld: keep it long on large clusters)", "duration",
                                    minimum=0.1, maximum=600.0)
    stale_drain_reasons: tuple = setting(("slurm-ext: slurmd crash loop",),
                                         "at start, resume this node once slurmd has registered when its reason "
                                         "starts with one of these (drains a previous life of this node left "
                                         "behind)", "list",
                                         item={"kind": "str"})
    step_failure: dict = setting({}, "per start step: block (do not start workers until it succeeds) or continue",
                                 "table", item={"kind": "choice", "choices": ("block", "continue")})
    leave_root_cgroup: bool = setting(True, "as PID 1 in a cgroup v2 container, move out of the root cgroup so "
                                      "slurmd can enable controllers", "bool")
    cgroup_writable: bool = setting(True, "as PID 1 of a worker container, remount its read-only cgroup file systems "
                                    "read-write (Docker's default; needs CAP_SYS_ADMIN) so slurmd's cgroup plugins "
                                    "can make job cgroups; set false where Slurm runs with CgroupPlugin=disabled, to "
                                    "silence the warning", "bool")
    workers: dict = setting({}, "per-worker settings, [supervisor.workers.<name>]", "sections", section=WorkerSection)

    def port(self, role: str) -> int:
        """The HTTP port of `role`'s agent (a role missing from `ports` keeps its default)."""
        return self.ports.get(role, _DEFAULT_PORTS[role])


register_section("supervisor", SupervisorSection)

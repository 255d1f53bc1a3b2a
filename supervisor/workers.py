"""What each role runs: built-in worker definitions merged with [supervisor.workers.*].

Workers are started in the order listed here (munge and the database before
the Slurm daemons that need them), then any worker only the config names.
"""

import dataclasses
import re
import signal
import sys
from dataclasses import dataclass

from .settings import SupervisorSection, WorkerSection

__all__ = ["WorkerSpec", "BUILTIN", "ROLE_DAEMON", "ROLE_DAEMON_OPTIONS", "NOTIFY_SLURMD", "workers_for",
           "speaks_notify", "local_database"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str
    roles: tuple[str, ...]
    command: tuple[str, ...]
    environment: dict = dataclasses.field(default_factory=dict)
    #: always, on-failure, never
    restart: str = "always"
    stop_signal: str = "TERM"
    #: seconds between stop_signal and SIGKILL
    stop_grace: float = 10.0
    notify: bool = False
    #: running, notify, slurm-node
    ready: str = "running"
    drain_on_crash_loop: bool = False
    #: workers that must be ready before this one starts (slurmdbd after its database)
    after: tuple[str, ...] = ()
    #: the user it speaks sd_notify as, when it drops root before it is ready (mariadbd: mysql)
    notify_user: str = ""
    #: sent to it after the agent reloaded its config (the health monitor rereads the same file)
    reload_signal: str = ""
    #: the role is ready only while it runs: false for a helper whose failure must not take the node out of
    #: service (a health monitor that crash-loops is its own problem, reported, not the node's)
    gates_ready: bool = True

    @property
    def signal(self) -> int:
        return getattr(signal, f"SIG{self.stop_signal}")


#: slurmd's readiness is its node answering in Slurm. Slurm 22.05 has no `--systemd`; from 23.11 on
#: the agent runs NOTIFY_SLURMD instead (workers_for's slurmd_notify), unless the config names a command.
BUILTIN = (
    WorkerSpec("munged", (), ("munged", "--foreground")),
    WorkerSpec("mariadbd", (), ("mariadbd",), stop_grace=60.0),
    WorkerSpec("sshd", ("login",), ("/usr/sbin/sshd", "-D", "-e")),
    WorkerSpec("slurmdbd", ("accounting",), ("slurmdbd", "-D"), stop_grace=30.0),
    WorkerSpec("slurmctld", ("controller",), ("slurmctld", "-D"), stop_grace=30.0),
    # the Prolog/Epilog's warm side (prolog_epilog.service), up before slurmd runs the first hook;
    # -I: isolated, so neither the cwd (sys.path[0] of `-m`) nor PYTHON* variables choose what root imports
    WorkerSpec("hooks", ("worker",), (sys.executable, "-I", "-m", "slurm_ext.cli", "hooks", "serve")),
    WorkerSpec("slurmd", ("worker",), ("slurmd", "-D"), ready="slurm-node", drain_on_crash_loop=True),
    # the passive health checks (slurm_ext.health), in a process of their own: a check that hangs or crashes is
    # restarted and reported, never the agent's or slurmd's problem; SIGHUP after the agent's reload
    WorkerSpec("health", ("worker",), (sys.executable, "-I", "-m", "slurm_ext.cli", "health", "monitor"),
               reload_signal="HUP", gates_ready=False),
    # the repair service (slurm_ext.repair): recommendations, approved repairs step by step; its record is durable,
    # so a restart carries on; never the controller's readiness
    WorkerSpec("repair", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "repair", "serve"),
               reload_signal="HUP", gates_ready=False, after=("slurmctld",)),
    # the cluster page (slurm_ext.web), with web.enabled: reads Slurm only while someone looks; never the
    # controller's readiness
    WorkerSpec("web", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "web"), gates_ready=False,
               after=("slurmctld",)),
)


#: slurmd >= 23.11 on the agent's NOTIFY_SOCKET: on `scontrol reconfigure` the old process execs a new one
#: and announces MAINPID=<new>, which the agent follows (without it, that exit would look like a crash)
NOTIFY_SLURMD = {"command": ("slurmd", "--systemd"), "notify": True}
#: the first Slurm release whose slurmd has --systemd
_NOTIFY_SINCE = (23, 11)

#: the worker that `slurm-ext supervise --role ROLE -- ARGS...` gives ARGS to: the role's Slurm daemon (a
#: Slinky NodeSet passes slurmd's as the container's arguments: -Z --conf-server HOST:6817 --conf ...)
ROLE_DAEMON = {"worker": "slurmd", "controller": "slurmctld", "accounting": "slurmdbd", "login": "sshd"}
#: the environment variable whose words (shell-split) also go to the role's daemon, after the arguments:
#: what Debian's /etc/default files and Slinky's own images use (SLURMD_OPTIONS)
ROLE_DAEMON_OPTIONS = {"worker": "SLURMD_OPTIONS", "controller": "SLURMCTLD_OPTIONS",
                       "accounting": "SLURMDBD_OPTIONS", "login": "SSHD_OPTS"}


def local_database(my_cnf: str, init_sql: str) -> dict:
    """The built-in mariadbd of an accounting role that runs its own database (accounting.run_database): on a
    NOTIFY_SOCKET (Debian's mariadbd says READY=1 once it takes connections), and slurmdbd after it, so that
    slurmdbd's first connection finds it (slurmdbd would otherwise retry every 5 s)."""
    return {"roles": ("accounting",), "command": ("mariadbd", f"--defaults-file={my_cnf}", f"--init-file={init_sql}"),
            "notify": True, "ready": "notify", "notify_user": "mysql"}


def workers_for(role: str, settings: SupervisorSection, daemon_args: tuple[str, ...] = (),
                slurmd_notify: bool = False, database: dict | None = None) -> list[WorkerSpec]:
    """The workers `role` runs, in start order, with the config's keys applied.

    `daemon_args` are appended to the command of the role's daemon (ROLE_DAEMON), after the config's.
    `slurmd_notify` (the installed slurmd has --systemd: speaks_notify) makes the built-in slurmd
    NOTIFY_SLURMD, unless the config gives slurmd a command or a notify of its own, or the arguments
    hold -D (slurmd refuses it beside --systemd). `database` (local_database) puts the built-in mariadbd in the
    accounting role, before slurmdbd; the config's [supervisor.workers.mariadbd] still wins.

    Raises:
        ValueError: a worker of the role without a command, or `daemon_args` for a daemon the role
            does not run (the config took it out).
    """
    specs = {spec.name: spec for spec in BUILTIN}
    own = settings.workers.get("slurmd")
    # slurmd refuses --systemd with -D ("mutually exclusive") and without a NOTIFY_SOCKET: keep -D then
    if slurmd_notify and (own is None or (own.command is None and own.notify is None)) and "-D" not in daemon_args:
        specs["slurmd"] = dataclasses.replace(specs["slurmd"], **NOTIFY_SLURMD)
    if database:
        specs["mariadbd"] = dataclasses.replace(specs["mariadbd"], **database)
        specs["slurmdbd"] = dataclasses.replace(specs["slurmdbd"], after=("mariadbd",))
    for name, section in settings.workers.items():
        specs[name] = _apply(specs.get(name) or WorkerSpec(name, (), ()), section)
    chosen = [spec for spec in specs.values() if role in spec.roles]
    names = {spec.name for spec in chosen}
    for spec in chosen:
        if not spec.command:
            raise ValueError(f"supervisor.workers.{spec.name}: runs in role {role} but has no command")
        spec_after = [name for name in spec.after if name not in names]
        if spec_after:
            raise ValueError(f"supervisor.workers.{spec.name}: starts after {', '.join(spec_after)}, which role "
                             f"{role} does not run")
    _check_order(chosen)
    if daemon_args:
        daemon = ROLE_DAEMON[role]
        if daemon not in {spec.name for spec in chosen}:
            raise ValueError(f"arguments after -- are for {daemon}, which role {role} does not run here "
                             f"(supervisor.workers.{daemon})")
        chosen = [dataclasses.replace(spec, command=spec.command + tuple(daemon_args)) if spec.name == daemon
                  else spec for spec in chosen]
    return chosen


def _check_order(specs: list[WorkerSpec]) -> None:
    """`after` must name workers listed before: the start order, whose reverse is the stop order.

    Raises:
        ValueError: a worker after one listed later (or itself), which would wait forever.
    """
    seen: set[str] = set()
    for spec in specs:
        late = [name for name in spec.after if name not in seen]
        if late:
            raise ValueError(f"supervisor.workers.{spec.name}: starts after {', '.join(late)}, which starts later "
                             f"(built-in workers first, in their order, then the config's): it would wait forever")
        seen.add(spec.name)


def speaks_notify(version_line: str) -> bool:
    """Whether `slurmd -V`'s answer ("slurm 26.05.5", "slurm-wlm 22.05.8") is a Slurm with --systemd."""
    found = re.search(r"(\d+)\.(\d+)", version_line)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= _NOTIFY_SINCE


def _apply(spec: WorkerSpec, section: WorkerSection) -> WorkerSpec:
    changes = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
               if getattr(section, f.name) is not None}
    return dataclasses.replace(spec, **changes)

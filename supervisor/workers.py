"""What each role runs: the agent's own daemons and the plug-ins' workers, merged with [supervisor.workers.*].

Workers are started in the built-in order (the agent's DAEMONS with the
plug-ins' workers in their places: plugins.builtin_workers), then any worker
only the config names.
"""

import dataclasses
import re

from slurm_ext.plugin import WorkerSpec

from .plugins import builtin_workers
from .settings import SupervisorSection, WorkerSection

__all__ = ["WorkerSpec", "DAEMONS", "ROLE_DAEMON", "ROLE_DAEMON_OPTIONS", "NOTIFY_SLURMD", "workers_for",
           "speaks_notify", "slurmd_speaks_notify"]


#: the agent's own workers, Slurm's daemons and munge, in start order; the plug-ins add theirs
#: (plugins.builtin_workers: the hook service before slurmd, the health monitor, repair and web after).
#: slurmd's readiness is its node answering in Slurm. Slurm 22.05 has no `--systemd`; from 23.11 on the agent
#: runs NOTIFY_SLURMD instead (workers_for's slurmd_notify), unless the config names a command.
DAEMONS = (
    WorkerSpec("munged", (), ("munged", "--foreground")),
    WorkerSpec("sshd", ("login",), ("/usr/sbin/sshd", "-D", "-e")),
    WorkerSpec("slurmdbd", ("accounting",), ("slurmdbd", "-D"), stop_grace=30.0),
    WorkerSpec("slurmctld", ("controller",), ("slurmctld", "-D"), stop_grace=30.0),
    WorkerSpec("slurmd", ("worker",), ("slurmd", "-D"), ready="slurm-node", drain_on_crash_loop=True),
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


def workers_for(role: str, settings: SupervisorSection, daemon_args: tuple[str, ...] = (),
                slurmd_notify: bool = False, changes: dict[str, dict] | None = None) -> list[WorkerSpec]:
    """The workers `role` runs, in start order, with the config's keys applied.

    `daemon_args` are appended to the command of the role's daemon (ROLE_DAEMON), after the config's.
    `slurmd_notify` (the installed slurmd has --systemd: speaks_notify) makes the built-in slurmd
    NOTIFY_SLURMD, unless the config gives slurmd a command or a notify of its own, or the arguments
    hold -D (slurmd refuses it beside --systemd). `changes` are the plug-ins' field changes of built-in workers,
    by name (Plugin.spec_changes: accounting's own mariadbd, before slurmdbd); the config's
    [supervisor.workers.*] still wins.

    Raises:
        ValueError: a worker of the role without a command, or `daemon_args` for a daemon the role
            does not run (the config took it out).
    """
    specs = {spec.name: spec for spec in builtin_workers(DAEMONS)}
    own = settings.workers.get("slurmd")
    # slurmd refuses --systemd with -D ("mutually exclusive") and without a NOTIFY_SOCKET: keep -D then
    if slurmd_notify and (own is None or (own.command is None and own.notify is None)) and "-D" not in daemon_args:
        specs["slurmd"] = dataclasses.replace(specs["slurmd"], **NOTIFY_SLURMD)
    for name, change in (changes or {}).items():
        specs[name] = dataclasses.replace(specs[name], **change)
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


def slurmd_speaks_notify(environ: dict[str, str]) -> bool:
    """Whether the slurmd in PATH has --systemd (`slurmd -V`: Slurm >= 23.11); False when there is none."""
    from slurm_ext import command
    from slurm_ext.errors import CommandError
    try:
        answer = command.run(["slurmd", "-V"], 10.0, env=environ, check=True)
    except CommandError:  # CommandTimeout is one too
        return False
    return speaks_notify(answer.stdout + answer.stderr)


def _apply(spec: WorkerSpec, section: WorkerSection) -> WorkerSpec:
    changes = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
               if getattr(section, f.name) is not None}
    return dataclasses.replace(spec, **changes)

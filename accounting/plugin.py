"""What accounting gives the node agent (slurm_ext.plugin): its database worker, slurmdbd.conf and the storage
guard before the daemons that write to the volume, the watch on slurmctld's queue of records and on the volumes'
space, their metrics, and slurmctld's hold on SIGKILL while it holds records."""

from __future__ import annotations

import logging

from slurm_ext.config import Config
from slurm_ext.errors import SlurmExtError
from slurm_ext.plugin import Live, Plugin, PluginWorker, StartStep, StepContext, WorkerSpec

from .settings import PASSWORD_ENV

__all__ = ["PLUGIN", "local_database"]

log = logging.getLogger("supervisor")


def local_database(my_cnf: str, init_sql: str) -> dict[str, dict]:
    """The built-in mariadbd of an accounting role that runs its own database (accounting.run_database): on a
    NOTIFY_SOCKET (Debian's mariadbd says READY=1 once it takes connections), and slurmdbd after it, so that
    slurmdbd's first connection finds it (slurmdbd would otherwise retry every 5 s)."""
    return {"mariadbd": {"roles": ("accounting",), "notify": True, "ready": "notify", "notify_user": "mysql",
                         "command": ("mariadbd", f"--defaults-file={my_cnf}", f"--init-file={init_sql}")},
            "slurmdbd": {"after": ("mariadbd",)}}


def _spec_changes(config: Config, role: str) -> dict[str, dict]:
    if role != "accounting" or not config.accounting.run_database:
        return {}
    from . import places_of
    where = places_of(config)
    return local_database(str(where.etc / "my.cnf"), str(where.etc / "init.sql"))


def accounting_config(context: StepContext) -> None:
    """slurmdbd.conf and, with accounting.run_database, MariaDB's files, from [accounting] and the password
    (`slurm-ext accounting config`): at every start, so a rotated password reaches both sides."""
    from slurm_ext import accounting
    if not accounting.configured(context.config):
        log.info("accounting: no database password given (accounting.password_file, $%s) and no database to "
                 "run: slurmdbd.conf is left as it is", accounting.PASSWORD_ENV)
        return
    written = accounting.write_config(context.config, slurmdbd="slurmdbd" in context.workers)
    log.info("accounting: wrote %s", ", ".join(str(p) for p in (written.slurmdbd_conf, written.my_cnf) if p))


def check_storage(context: StepContext) -> None:
    """The durability guard before mariadbd or slurmctld (`slurm-ext accounting check-storage`): refuses
    ephemeral, read-only, full or replaced volumes; initialises a new database and marks its volume."""
    from slurm_ext import accounting
    verdict = accounting.prepare_storage(context.config, context.role)
    for note in verdict.notes:
        ephemeral = note.startswith(accounting.EPHEMERAL_NOTE)
        context.emit("storage-checked", note, severity="warning" if ephemeral else "info")


def _steps(role: str) -> list[StartStep]:
    """The accounting role writes slurmdbd's and MariaDB's files; it and the controller guard their storage
    (check-storage blocks: a replaced volume must not be initialised over), also before every restart of what
    writes to the volume."""
    steps = []
    if role == "accounting":
        steps.append(StartStep("accounting-config", accounting_config, on_failure="block"))
    if role in ("accounting", "controller"):
        steps.append(StartStep("check-storage", check_storage, on_failure="block",
                               before_restart_of="mariadbd" if role == "accounting" else "slurmctld"))
    return steps


class _Watches(Live):
    """The controller reads slurmctld's queue of accounting records; both roles watch their volumes' space."""

    def __init__(self, host):
        from slurm_ext import accounting, events
        self.host = host
        config, role = host.config, host.role
        a = config.accounting
        emit = events.emitter(config.node.state_dir, "accounting", role=role)
        self.queue_watch = self.space_watch = None
        if role == "controller":
            self.queue_watch = accounting.QueueWatch(host.slurm, a.queue_interval, a.queue_alert_after, emit)
            self.queue_watch.start()
        try:
            volumes = accounting.guarded_volumes(config, role)
        except SlurmExtError as err:
            log.warning("accounting: not watching the volumes' free space: %s", err)
            return
        if volumes:
            self.space_watch = accounting.SpaceWatch(volumes, a.min_free, emit)
            self.space_watch.start()

    def close(self) -> None:
        for watch in (self.queue_watch, self.space_watch):
            if watch:
                watch.stop()

    def metrics(self):
        from prometheus_client.core import GaugeMetricFamily
        role = self.host.role
        if role == "controller":
            yield from _reconcile_metrics(self.host)
        watch = self.queue_watch
        if watch is not None and watch.size is not None:
            queue = GaugeMetricFamily("slurm_ext_accounting_dbd_queue", "Accounting records slurmctld holds for "
                                      "slurmdbd (sdiag's DBD agent queue size): above 0 while slurmdbd or its "
                                      "database is away", labels=["role"])
            queue.add_metric([role], watch.size)
            yield queue

    def stop_hold(self, spec: WorkerSpec, pid: int, requested: float):
        """A slurmctld that held accounting records when asked to stop writes them to dbd.messages on its way
        out: it gets until accounting.stop_deadline before SIGKILL, and a SIGKILL past that is said loudly."""
        if spec.name != "slurmctld" or self.queue_watch is None:
            return None
        queued = self.queue_watch.size or 0
        if not queued:
            return None
        host, limit = self.host, self.host.config.accounting.stop_deadline
        deadline, said = requested + limit, []

        def held_until(now: float) -> float | None:
            if now < deadline:
                if not said:
                    said.append(True)
                    host.emit("slurmctld-stop-held", f"{spec.name} (pid {pid}) still running {spec.stop_grace:g}s "
                              f"after SIG{spec.stop_signal} with {queued} accounting records queued for slurmdbd: "
                              f"not sending SIGKILL before accounting.stop_deadline ({limit:g}s), so that it can "
                              "save them to dbd.messages", worker=spec.name, queued=queued)
                return deadline
            host.emit("slurmctld-killed-with-records", f"SIGKILL {spec.name} (pid {pid}) {limit:g}s after "
                      f"SIG{spec.stop_signal} with {queued} accounting records queued: those it did not save to "
                      "dbd.messages are LOST; run `slurm-ext accounting reconcile` once slurmdbd is back",
                      worker=spec.name, queued=queued)
            return None

        return held_until


def _reconcile_metrics(host):
    """The last `slurm-ext accounting reconcile` on this node (it keeps its counts in node.state_dir)."""
    from prometheus_client.core import GaugeMetricFamily
    from .reconcile import last_result
    result = last_result(host.config.node.state_dir)
    if result is None:
        return
    for name, key, text in (("missing_jobs", "missing", "Job ends the witness saw that sacct lacks"),
                            ("runaway_jobs", "runaway", "Runaway jobs (sacctmgr show runawayjobs)")):
        family = GaugeMetricFamily(f"slurm_ext_accounting_{name}", f"{text}, at the last reconcile",
                                   labels=["role"])
        family.add_metric([host.role], result.get(key, 0))
        yield family
    when = GaugeMetricFamily("slurm_ext_accounting_reconcile_timestamp_seconds", "When the last reconcile ran "
                             "(Unix time)", labels=["role"])
    when.add_metric([host.role], result.get("time", 0))
    yield when


def _attach(host) -> Live | None:
    return _Watches(host) if host.role in ("controller", "accounting") else None


PLUGIN = Plugin(
    name="accounting",
    # the database of an accounting role that runs its own (accounting.run_database: spec_changes gives it the
    # role), before the agent's own daemons but munged
    workers=(PluginWorker(WorkerSpec("mariadbd", (), ("mariadbd",), stop_grace=60.0), before="sshd"),),
    steps=_steps,
    spec_changes=_spec_changes,
    # the database password is for the accounting-config step (which reads the agent's own environment), not for
    # any worker
    private_env=(PASSWORD_ENV,),
    attach=_attach,
)

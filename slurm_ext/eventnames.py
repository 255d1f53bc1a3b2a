"""The catalogue of node events: every event name slurm-ext emits, in one place.

`CATALOGUE` maps each name to an `EventName`: the components that emit it,
its default severity and one line of what it means. `events.emit` refuses a
name that is not here (ValueError), and a unit test scans the source for
every literal name passed to an emitter, so a typo or a new name without an
entry fails the tests instead of reaching an operator's journal unexplained.
The table of events in docs/reference/events.md is `markdown_table()`; a
test keeps the two the same.

Add an entry when adding an event; change the entry (and the docs' table)
when changing what an event means. An operator greps the journal for these
names, so a name is renamed only with a note in the changelog.

This module imports nothing: `events` loads it in every Prolog and Epilog.
"""

from dataclasses import dataclass

__all__ = ["EventName", "CATALOGUE", "SEVERITIES", "markdown_table"]

#: the severities an event may have, least severe first: one ladder with the health findings' words, so that
#: `events --severity critical` and the page's "critical" mean the same thing. "error": a part of slurm-ext or of
#: Slurm failed (a script, a drain, a write); "critical": a node's hardware is not fit for work (a critical health
#: finding, which drains the node).
SEVERITIES = ("info", "warning", "error", "critical")


@dataclass(frozen=True, slots=True)
class EventName:
    """One event name of the node journal."""

    #: the journal's "event" field, lower-case words joined by hyphens
    name: str
    #: the components that emit it (the journal's "component" field)
    components: tuple[str, ...]
    #: the severity when the emitter gives none (a caller may pass another where it varies)
    severity: str
    #: one line: what happened, for the operator reading the journal
    meaning: str


_SUPERVISOR, _GRES, _HOOKS, _NODESTATE = ("supervisor",), ("gres",), ("prolog_epilog",), ("nodestate",)
_ACCOUNTING = ("accounting",)
_HEALTH = ("health",)
_REPAIR = ("repair",)
_ACCEPTANCE = ("acceptance",)
_WEB = ("web",)

_ENTRIES = (
    # -- the node agent (supervisor/) ---------------------------------------------------------------
    EventName("started", _SUPERVISOR, "info", "the node agent started supervising its role's workers"),
    EventName("running", _SUPERVISOR, "info",
              "the start steps succeeded: the agent starts its workers (its state goes from starting to running)"),
    EventName("stop", _SUPERVISOR, "info", "SIGTERM or SIGINT: the agent stops every worker, last started first"),
    EventName("exited", _SUPERVISOR, "info",
              "the agent stopped with every worker down (warning: a worker needed SIGKILL)"),
    EventName("reload", ("supervisor", "health", "repair"), "info", "SIGHUP: the agent (or its health monitor, or "
              "repair service) reloaded its "
              "config"),
    EventName("reload-failed", ("supervisor", "prolog_epilog", "health", "repair"), "error",
              "the config file changed but is invalid; the running config is kept"),
    EventName("worker-added", _SUPERVISOR, "info", "the reloaded config adds a worker; it is started"),
    EventName("worker-removed", _SUPERVISOR, "info", "the reloaded config drops a worker; it is stopped"),
    EventName("worker-changed", _SUPERVISOR, "info",
              "the reloaded config changes a worker's definition; it is restarted with the new one"),
    EventName("subreaper-failed", _SUPERVISOR, "error",
              "the agent could not become child subreaper: orphans of its workers escape it"),
    EventName("cgroup-failed", _SUPERVISOR, "error",
              "as PID 1, the agent could not leave the root cgroup (slurmd cannot enable controllers), or could not "
              "make the container's read-only cgroups writable (warning: slurmd's cgroup plugins cannot run)"),
    EventName("cgroup-leaf", _SUPERVISOR, "info",
              "as PID 1, the agent moved out of the root cgroup into a leaf of its own"),
    EventName("preflight-problem", _SUPERVISOR, "warning",
              "the node lacks something a Slurm daemon needs (its authentication key, say): what, and the mount "
              "or flag that provides it; the daemon is started anyway and retried"),
    EventName("start-step-failed", _SUPERVISOR, "error",
              "a start step failed: the workers wait for it (block) or start anyway (continue)"),
    EventName("start-steps-abandoned", _SUPERVISOR, "warning",
              "the agent was stopped while start steps ran; what they had started was killed"),
    EventName("crash-loop", _SUPERVISOR, "error",
              "a worker exited supervisor.crash_loop_count times within crash_loop_window (a drain for slurmd); "
              "one that had got ready is still restarted after backoff_initial, one that never did every "
              "backoff_max"),
    EventName("recovered", _SUPERVISOR, "info", "a crash-looping worker has run crash_loop_window without exiting: "
              "the crash loop is over (its drain is cleared)"),
    EventName("worker-exited", _SUPERVISOR, "warning",
              "a worker's main process ended: exit status or signal, core dump, uptime, restarts, the delay "
              "before the next start (info when it was asked to stop)"),
    EventName("worker-state", _SUPERVISOR, "info",
              "a worker's state changed (stopped, running, backoff, stopping; `was` and `state`), and why: started "
              "with its pid, the restart and its delay, a stop (warning: backoff or stopping)"),
    EventName("worker-ready", _SUPERVISOR, "info",
              "a running worker met its readiness condition (READY=1, or slurmd registered in Slurm): from now on "
              "its exit is restarted after backoff_initial"),
    EventName("worker-events-dropped", _SUPERVISOR, "warning",
              "a worker running as its own user (the page) sent more events than the agent writes a minute, or "
              "events it may not write (another component's, malformed, too big): the minute's counts (dropped, "
              "refused), once a minute"),
    EventName("mainpid", _SUPERVISOR, "info", "a notify worker named a new main process (MAINPID=), now followed"),
    EventName("kill", _SUPERVISOR, "warning", "a worker outlived its stop grace and was sent SIGKILL"),
    EventName("stop-drain-late", _SUPERVISOR, "warning",
              "at SIGTERM, Slurm did not show the node's stop drain within 5 s; slurmd is stopped anyway"),
    # -- node state: the one owner of drains and resumes (slurm_ext/nodestate/) ---------------------
    EventName("drain", ("nodestate", "prolog_epilog"), "warning",
              "prolog_epilog: the Prolog or Epilog found the node unfit and wants it drained (error); nodestate: "
              "slurm-ext drained the node, or re-worded its drain, with a reason of its catalogue (the most "
              "severe wanted; '(+N more)' counts the others)"),
    EventName("resume", _NODESTATE, "info",
              "slurm-ext resumed the node from a reason of its own: no want is left (why=cleared), or the drain "
              "was left by a previous run (why=stale); only after slurmd has registered"),
    EventName("drain-skipped", _NODESTATE, "info",
              "the node is drained by someone else (an admin, NHC, slurm-operator): their reason is kept and "
              "ours waits behind it"),
    EventName("resume-skipped", _NODESTATE, "info",
              "an owner cleared its drain, but the node stays drained: its current reason is not slurm-ext's"),
    EventName("resume-waiting", _NODESTATE, "info",
              "no owner wants the node drained, but its resume waits for slurmd to register (this run's slurmd, "
              "for a drain a previous run left)"),
    EventName("drain-overridden", _NODESTATE, "warning",
              "someone resumed or re-reasoned a drain of ours while it was wanted: an operator's decision, "
              "kept; not drained again until its owner asks anew"),
    EventName("drain-failed", ("nodestate", "prolog_epilog"), "error",
              "the node should be drained or resumed but Slurm could not be told now; retried"),
    EventName("nodestate-socket-failed", _NODESTATE, "error",
              "the agent cannot serve the node-state socket: the hook service drains the node itself"),
    # -- GPUs and gres.conf (gres/) -----------------------------------------------------------------
    EventName("inventory-failed", _GRES, "warning",
              "NVML could not be read: gres.conf left as it is (error, and a drain, with gres.expected)"),
    EventName("inventory-problem", _GRES, "warning",
              "a GPU detail (cores, links, MIG devices, type) could not be read; gres.conf does without it"),
    EventName("gpu-baseline", _GRES, "info", "the GPUs seen now are taken as the node's (first start, or --accept)"),
    EventName("gpu-missing", _GRES, "error", "a GPU of the baseline is not shown by NVML now (the node is drained)"),
    EventName("gpu-lost", _GRES, "error", "a GPU failed during the inventory and is left out of gres.conf"),
    EventName("gpu-new", _GRES, "info", "a GPU not in the baseline appeared"),
    EventName("gpu-renumbered", _GRES, "warning", "a GPU has another minor number than before; gres.conf follows"),
    EventName("gres-written", _GRES, "info", "gres.conf was rewritten because its content changed"),
    EventName("gres-rejected", _GRES, "error", "slurmd -G does not find in gres.conf what NVML reports"),
    EventName("gres-drain-pending", _GRES, "warning",
              "a configless node needs a GPU drain Slurm cannot be told yet: slurmd starts (it brings the config) "
              "and the drain is shown as soon as Slurm answers"),
    # -- Prolog, Epilog, lifecycle scripts (prolog_epilog/) -----------------------------------------
    EventName("prolog-failed", _HOOKS, "error",
              "the Prolog failed; the job starts (the message says what went wrong)"),
    EventName("epilog-failed", _HOOKS, "error", "the Epilog failed; the job's leftovers may remain"),
    EventName("job-refused", _HOOKS, "error", "the Prolog refused a job: a drain of slurm-ext's waits for Slurm to "
              "show it (an admin resumed the node over a critical finding); Slurm requeues the job"),
    EventName("record-failed", _HOOKS, "error", "the Prolog could not write the job's record (the node is drained)"),
    EventName("record-missing", _HOOKS, "warning",
              "the Epilog found no record of its job; it cleans up from its environment"),
    EventName("record-stale", _HOOKS, "warning", "records of jobs that no longer run here were removed"),
    EventName("uid-lock-timeout", _HOOKS, "warning",
              "a hook did not get the user's lock in time; it goes on as if the user had another job"),
    EventName("gpu-check-failed", _HOOKS, "error", "NVML did not say whether the job's GPUs are free"),
    EventName("gpu-held", _HOOKS, "error",
              "a GPU still holds memory after its job's processes are gone (the node is drained)"),
    EventName("leftovers-cleaned", _HOOKS, "warning",
              "the Epilog killed processes or removed IPC its job left (error: some could not be)"),
    EventName("script-ok", _HOOKS, "info", "a lifecycle script or user hook exited 0"),
    EventName("script-failed", _HOOKS, "error",
              "a lifecycle script or user hook exited non-zero, was killed or did not start"),
    EventName("script-timeout", _HOOKS, "error",
              "a lifecycle script or user hook ran past its timeout; its process group was killed"),
    EventName("script-refused", _HOOKS, "error", "a lifecycle script or user hook failed its checks and did not run"),
    EventName("user-hooks-skipped", _HOOKS, "warning", "the job user's hooks were not run (the message says why)"),
    EventName("hook-cgroup-left", _HOOKS, "warning",
              "a user hook's cgroup still holds processes after SIGKILL (state D?); left in place"),
    EventName("hook-service-failed", _HOOKS, "error",
              "the hook service could not listen; the hooks fall back to running in Python"),
    EventName("storage-checked", _SUPERVISOR, "info",
              "the durability guard accepted a database volume or StateSaveLocation (and marked a new one); "
              "a warning when ephemeral storage was allowed"),
    EventName("storage-refused", _ACCOUNTING, "error",
              "`slurm-ext accounting check-storage` refused a volume (the agents' own refusals are start-step-failed "
              "events of step check-storage)"),
    EventName("storage-low", _ACCOUNTING, "error",
              "a guarded volume (the database's, StateSaveLocation) has less free space than accounting.min_free"),
    EventName("storage-ok", _ACCOUNTING, "info", "a volume that was low on space has accounting.min_free again"),
    EventName("dbd-queue-growing", _ACCOUNTING, "warning",
              "slurmctld has held accounting records for slurmdbd for a minute (sdiag's DBD agent queue above 0): "
              "slurmdbd or its database is away"),
    EventName("dbd-queue-half-full", _ACCOUNTING, "error",
              "the DBD agent queue reached MaxDBDMsgs/2 (Slurm's RESTART SLURMDBD NOW): records will be "
              "discarded when it is full"),
    EventName("dbd-queue-drained", _ACCOUNTING, "info",
              "the DBD agent queue is empty again after an alert: slurmdbd has every record"),
    EventName("slurmctld-stop-held", _SUPERVISOR, "warning",
              "slurmctld's stop grace ran out while it held queued accounting records: SIGKILL is held back "
              "until accounting.stop_deadline"),
    EventName("slurmctld-killed-with-records", _SUPERVISOR, "error",
              "slurmctld was SIGKILLed past accounting.stop_deadline with accounting records queued: those not "
              "saved to dbd.messages are lost (reconcile lists them)"),
    # -- passive health checks (health/) ---------------------------------------------------
    EventName("health-started", _HEALTH, "info", "the health monitor started: its checks, sources and the open "
              "findings it kept from before"),
    EventName("health-finding", _HEALTH, "warning",
              "a check found a fault: check, GPU (index, UUID, bus id), evidence (a GPU's: the GPU and the fault in "
              "NVIDIA's words; what was expected in the expected field), finding_severity, the recommended action "
              "and the jobs that held the GPU; critical when critical (the node is drained for it), info for an "
              "informational one"),
    EventName("health-escalated", _HEALTH, "warning",
              "an open finding got worse in place (an application Xid repeating on one GPU, a worse reading): "
              "its new severity and action, and what it was"),
    EventName("health-cleared", _HEALTH, "info",
              "a finding is over: its condition stayed away for the check's quiet window (why=quiet), an operator "
              "cleared it (why=operator; by: who, the user on the node or the operator token's from the controller), "
              "or its check was disabled; check, GPU and signature (xid/79) as its finding's; its drain is lifted "
              "with it"),
    EventName("health-check-failed", _HEALTH, "error",
              "a check or reader raised (a bug, or input it could not read): the other checks go on, it runs again "
              "at its next turn"),
    EventName("health-check-hung", _HEALTH, "error",
              "a reader (NVML, the file systems, Slurm) has not answered within health.call_timeout: its checks "
              "wait for it, the others go on; an NVML hang counts as a failed poll each interval"),
    EventName("health-source-failed", _HEALTH, "error",
              "a pushing source (kernel log, NVML events, netlink) cannot be read: the monitor goes on without it "
              "and retries every 30 s"),
    EventName("health-source-ok", _HEALTH, "info", "a source that had failed is read again"),
    # -- active acceptance tests (acceptance/) -------------------------------------------------
    EventName("acceptance-started", _ACCEPTANCE, "info",
              "an acceptance run started on the node: its level, trigger (start, cluster, repair, idle, manual) and "
              "tests"),
    EventName("acceptance-profile", _ACCEPTANCE, "warning",
              "the limits' SKU profile was not the GPUs' own (an unknown GPU: the generic profile's limits)"),
    EventName("acceptance-test", _ACCEPTANCE, "error",
              "a test did not pass: fail (critical: measured bad, its figures against their limits and the "
              "recommended action) or error (the test could not run: never a drain); test, target (gpu N, an "
              "interface, a path) and figures"),
    EventName("acceptance-done", _ACCEPTANCE, "info",
              "an acceptance run ended: its verdict (pass; fail, critical: the node is drained with a "
              "recommendation; error: a test could not run), the failed tests and the time it took"),
    EventName("acceptance-drain", _ACCEPTANCE, "critical",
              "the node failed its acceptance at start (it registers drained with the reason) or in a run the "
              "controller asked of its agent (a repair's before its resume, `accept cluster`'s: drained by the agent, "
              "behind a repair's drain while one holds the node); a repair is recommended"),
    EventName("acceptance-kept", _ACCEPTANCE, "warning",
              "the node passed a shorter level than the failed run that drained it (a quick pass after a standard "
              "fail): the drain stays until a pass of that level"),
    EventName("acceptance-cleared", _ACCEPTANCE, "info",
              "the node passed its acceptance: an acceptance drain of an earlier run is lifted"),
    EventName("acceptance-cluster-started", _ACCEPTANCE, "info",
              "`accept cluster` (on the controller) made its MAINT reservation and starts one job per node: the "
              "level, the reservation, the nodes, and the ones not tested (drained, down) with why"),
    EventName("acceptance-cluster-done", _ACCEPTANCE, "info",
              "`accept cluster` ended and removed its reservation: its verdict (fail, critical: a node failed and "
              "was drained by its agent; error: a node could not be tested or a test could not run), each node's "
              "outcome"),
    EventName("acceptance-offer", _ACCEPTANCE, "info",
              "the controller saw [acceptance] enabled turned on: nodes are tested at their next start, and one "
              "`slurm-ext accept cluster` tests the nodes running now (said once)"),
    EventName("acceptance-idle-submitted", _ACCEPTANCE, "info",
              "the controller's idle testing ([acceptance] idle_period) submitted a node's quick acceptance as one "
              "exclusive job of the lowest priority (preemptible with idle_qos): the node, the job, when its last "
              "test ended"),
    EventName("acceptance-idle-refused", _ACCEPTANCE, "error",
              "sbatch refused an idle node's acceptance job (a wrong idle_qos, a partition the node left): its words, "
              "said once until they change; the node is tried again after idle_period"),
    EventName("backup-done", _ACCOUNTING, "info",
              "a backup of the accounting database was written, with its manifest"),
    EventName("backup-failed", _ACCOUNTING, "error",
              "a backup of the accounting database failed; nothing was kept of it"),
    EventName("restore-done", _ACCOUNTING, "info", "a backup was restored into the accounting database"),
    EventName("restore-failed", _ACCOUNTING, "error", "a restore was refused or failed; the database was not changed"),
    EventName("verify-done", _ACCOUNTING, "info", "a backup restored into a scratch MariaDB with the manifest's counts"),
    EventName("verify-failed", _ACCOUNTING, "error", "a backup did not verify: damaged, truncated or counts differ"),
    EventName("reconcile-missing", _ACCOUNTING, "error",
              "jobs the witness (jobcomp log) saw end are missing from sacct, or runaway jobs exist"),
    EventName("reconcile-clean", _ACCOUNTING, "info", "every job the witness saw end is in sacct"),
    # -- repair (repair/, in the controller agent) ------------------------------------------
    EventName("repair-started", _REPAIR, "info", "the repair service started; repairs under way carry on from "
              "their records"),
    EventName("repair-recommended", _REPAIR, "info", "a node's health drain became a recommended repair, with its "
              "action, evidence and jobs"),
    EventName("repair-escalated", _REPAIR, "warning", "a recommendation's action got stronger in place (its fault "
              "got worse, or came back after repair.escalate_after reboots)"),
    EventName("repair-cleared", _REPAIR, "info", "a recommendation went away: its fault cleared before anyone "
              "decided (or a rejected one's fault is over)"),
    EventName("repair-approved", _REPAIR, "info", "an operator (or auto-approve) approved a node's repair"),
    EventName("repair-rejected", _REPAIR, "info", "an operator rejected a recommendation, with the reason; nothing "
              "runs"),
    EventName("repair-reopened", _REPAIR, "info", "an operator reopened a rejected recommendation: it awaits "
              "approval again; who, and the rejection it undoes"),
    EventName("repair-refused", _REPAIR, "warning", "an approval was refused: paused, cooldown or the guard; the "
              "message says which"),
    EventName("repair-step", _REPAIR, "info", "a repair moved on: drained, jobs ended or requeued, action run, node "
              "back, checks passed"),
    EventName("repair-done", _REPAIR, "info", "a repair ended well: the node resumed (or, removed, left out of the "
              "pool)"),
    EventName("repair-failed", _REPAIR, "error", "a repair failed at a step; the node stays drained and its reason "
              "says so"),
    EventName("repair-notify-started", _REPAIR, "info", "the repair service posts recommendations, approvals, failed "
              "repairs and critical findings to the webhook of repair.notify_url_file"),
    EventName("repair-notify-failed", _REPAIR, "error", "a notice was not posted after repair.notify_retries tries "
              "(the webhook refused it or did not answer), or the URL file cannot be used (no notifier then); "
              "repairs go on"),
    EventName("repair-notify-dropped", _REPAIR, "warning", "the webhook's queue was full (repair.notify_queue): its "
              "oldest notice was dropped; said once until a post gets through, every drop counted in "
              "slurm_ext_repair_notify_dropped_total"),
    EventName("history-collector-started", _REPAIR, "info", "the collector started taking the node agents' "
              "journals into the repair database, each node from its cursor"),
    EventName("history-journal-lost", _REPAIR, "warning", "a node's journal rotated lines out before the collector "
              "took them (the node's cursor named a file no longer kept): those events are missing from the history, "
              "which says so for the node"),
    EventName("history-backlog-full", _REPAIR, "warning", "events read from the agents and not stored reached "
              "history.backlog: no agent is asked until the database took them (the journals hold the rest)"),
    EventName("history-backlog-cleared", _REPAIR, "info", "the database took the collector's backlog: agents are "
              "asked again"),
    EventName("history-store-failed", _REPAIR, "error", "the collector could not store the agents' events in the "
              "repair database; it tries again every few seconds"),
    EventName("history-store-recovered", _REPAIR, "info", "the repair database takes the collector's events again"),
    EventName("history-page-refused", _REPAIR, "error", "the repair database refused a page of a node's journal that "
              "others beside it went in with (a value no column takes): set aside, marked in the node's history as "
              "missing, the node's cursor moved past it"),
    EventName("repair-paused", _REPAIR, "warning", "an operator paused every approval"),
    EventName("repair-unpaused", _REPAIR, "info", "an operator let approvals through again"),
    # -- web (web/, the cluster page, in the controller agent) ------------------------------------------
    EventName("web-started", _WEB, "info", "the cluster page listens; how operators are recognised"),
    EventName("web-operation", _WEB, "info", "an operator ran a node's health checks, cleared its findings, or "
              "approved, rejected or reopened its repair, from the page or `health clear NODE` (user, how signed in, "
              "address)"),
    EventName("web-refused", _WEB, "warning", "an operation was refused: no or unknown credentials, a proxy header "
              "from an untrusted address, a missing, forged or stale CSRF token, another site's request"),
    EventName("web-signin", _WEB, "info", "a person signed in to the page with the IdP ([oidc]): their name and "
              "subject, role, address and the session's end"),
    EventName("web-signout", _WEB, "info", "a person signed out of the page (their session ended; the browser is sent "
              "to the IdP's logout where it has one)"),
    EventName("web-signin-refused", _WEB, "warning", "a sign-in was refused, with no session: the IdP's error, a "
              "state mismatch or a replayed callback, a code the token endpoint refused, an ID token not believed "
              "(signature, issuer, audience, expiry, issue time, nonce), a groups claim that is not a list, no mapped "
              "group where viewing needs sign-in, the IdP away (at most one a minute for an address)"),
    EventName("web-sessions-unkept", _WEB, "warning", "the page cannot write its file of sessions ended by logout "
              "(state_dir's web/ folder, web.user's): after a restart a signed-out cookie works again until it expires "
              "(said once, at the start)"),
    EventName("web-source-failed", _WEB, "warning", "Slurm, the repair database or Prometheus stopped answering the "
              "page; it shows their last answer, with its age"),
    EventName("web-source-ok", _WEB, "info", "a source of the page answers again"),
    EventName("web-token-added", _WEB, "info", "`slurm-ext web add-token` made an operator's token (user, "
              "fingerprint: never the token)"),
    EventName("web-token-revoked", _WEB, "info", "`slurm-ext web revoke-token` (or `add-token --replace`) removed "
              "an operator's tokens (user, fingerprints): the page refuses them from its next request"),
    # -- oidc (oidc/: `slurm-ext oidc slurm`) -------------------------------------------------------------
    EventName("oidc-slurm-jwks-written", ("oidc",), "info",
              "`oidc slurm` wrote the IdP's RSA signing keys for Slurm's auth/jwt, first or after the IdP rotated "
              "them (file, kids, added, removed, dropped: the IdP's keys left out and why, reconfigured)"),
    EventName("oidc-slurm-jwks-refused", ("oidc",), "error",
              "`oidc slurm` could not use the IdP's keys (unreachable, a discovery document or JWKS that is not "
              "OpenID Connect's, no RSA signing key) or write the file: Slurm keeps the JWKS file it has"),
    EventName("oidc-slurm-reconfigure-failed", ("oidc",), "error",
              "the JWKS file changed but `scontrol reconfigure` failed: Slurm reads the new keys only when its "
              "daemons restart or reconfigure"),
    EventName("oidc-slurm-reconfigured", ("oidc",), "info",
              "`oidc slurm` retried a `scontrol reconfigure` owed since it wrote the JWKS file (it had failed, or "
              "the run ended before it), and it succeeded: slurmctld and slurmd read the keys written before"),
    EventName("oidc-slurm-marker-stuck", ("oidc",), "error",
              "`scontrol reconfigure` succeeded but the marker that remembers a reconfigure owed (in "
              "node.state_dir, oidc-slurm/) cannot be removed: every refresh reconfigures Slurm again until it is "
              "removed (marker)"),
    EventName("oidc-slurm-refresh-failed", ("oidc",), "error",
              "`oidc slurm --watch`: a refresh failed on an unexpected error (the message and the traceback say "
              "which); the watch goes on and tries again at the next turn"),
    # -- drills on the dev cluster (devcluster/: `slurm-ext dev inject`, `dev heal`) -------------------------
    EventName("drill-injected", ("devcluster",), "warning",
              "DRILL, not a real fault: `slurm-ext dev inject` made a fault on this dev node (fault, gpu, user; "
              "drill=true)"),
    EventName("drill-healed", ("devcluster",), "info",
              "DRILL: `slurm-ext dev heal` undid the drills injected on this dev node (faults, user; drill=true); "
              "the node is resumed by its monitor or an approved repair, not by the heal"),
)

#: every event name slurm-ext emits, by name
CATALOGUE: dict[str, EventName] = {entry.name: entry for entry in _ENTRIES}


def markdown_table() -> str:
    """docs/reference/events.md's table of events (name, component, severity, meaning), one row per entry."""
    rows = ["| event | component | severity | meaning |", "|---|---|---|---|"]
    rows += [f"| `{e.name}` | {', '.join(e.components)} | {e.severity} | {e.meaning} |" for e in _ENTRIES]
    return "\n".join(rows) + "\n"

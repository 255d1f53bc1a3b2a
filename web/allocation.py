"""Who uses the cluster: jobs per partition, GPUs allocated, and which job and user hold each GPU (pure functions).

The page answers "is it being used?" from one read of Slurm's job queue per
refresh (`SlurmClient.queue`: each running job with the GPU indexes it holds
on each node) beside what it already reads: the node table (GPUs configured
and allocated per node) and each agent's GPU readings (utilization and
memory per GPU). Nothing here asks anything: the Watcher passes what it read.

A GPU that a job holds while it stays under [web] idle_gpu_below for
idle_gpu_after is flagged idle: `IdleGpus` remembers, per GPU, since when it
has been held and idle by the same jobs (another job, or one busy reading,
starts the count again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_ext.slurm import Job, Node, expand_hostlist

__all__ = ["IdleGpus", "GpuHolder", "holders", "queue_summary", "allocation_summary", "node_jobs"]


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A job that holds a GPU, as the page names it."""

    job_id: int
    user: str
    partition: str
    name: str


@dataclass
class IdleGpus:
    """Since when each held GPU has been idle, across refreshes: node -> {GPU index: (the jobs holding it, since)}."""

    since: dict = field(default_factory=dict)

    def node(self, node: str, gpus: list[tuple[int, tuple[int, ...], int | None]], below: int,
             now: float) -> list[float | None]:
        """Since when each of a node's GPUs ((index, the jobs holding it, its utilization)) has been held by the same
        jobs and under `below` percent: None where it is not held, busy, or its utilization unknown, which starts the
        count again. The node's GPUs not in `gpus` are forgotten."""
        before, kept, found = self.since.get(node, {}), {}, []
        for index, jobs, utilization in gpus:
            if not jobs or utilization is None or utilization >= below:
                found.append(None)
                continue
            held = before.get(index)
            if held is None or held[0] != jobs:
                held = (jobs, now)
            kept[index] = held
            found.append(held[1])
        if kept:
            self.since[node] = kept
        else:
            self.since.pop(node, None)
        return found

    def forget_except(self, nodes: set) -> None:
        """Drop the GPUs of the nodes not read this refresh (a node gone, an agent that did not answer: counted again
        later)."""
        for name in [n for n in self.since if n not in nodes]:
            del self.since[name]


def holders(jobs: list[Job]) -> dict[str, dict[int, list[GpuHolder]]]:
    """node -> GPU index -> the running jobs Slurm allocated it to."""
    found: dict[str, dict[int, list[GpuHolder]]] = {}
    for job in jobs:
        if job.state != "RUNNING":
            continue
        holder = GpuHolder(job.job_id, job.user, job.partition, job.name)
        for node, _, indexes in job.gpus:
            here = found.setdefault(node, {})
            for index in indexes:
                here.setdefault(index, []).append(holder)
    return found


def node_jobs(jobs: list[Job]) -> dict[str, list[dict]]:
    """node -> its running jobs (id, user, partition, name, the GPU indexes each holds there), from Slurm's queue."""
    found: dict[str, list[dict]] = {}
    for job in jobs:
        if job.state != "RUNNING":
            continue
        gpus: dict[str, list[int]] = {}
        for node, _, indexes in job.gpus:  # one entry per GPU type on a node
            gpus.setdefault(node, []).extend(indexes)
        for node in expand_hostlist(job.nodes):
            found.setdefault(node, []).append({"job_id": job.job_id, "user": job.user, "partition": job.partition,
                                               "name": job.name, "gpus": gpus.get(node, [])})
    return found


def queue_summary(jobs: list[Job]) -> dict:
    """Running and pending jobs per partition (a pending job that names several partitions counts in each), GPUs
    running jobs hold per partition, and per user; totals count each job once."""
    partitions: dict[str, dict] = {}
    users: dict[str, dict] = {}
    running = pending = 0
    for job in jobs:
        if job.state not in ("RUNNING", "PENDING"):
            continue
        gpus = sum(len(indexes) for _, _, indexes in job.gpus) if job.state == "RUNNING" else 0
        if job.state == "RUNNING":
            running += 1
        else:
            pending += 1
        for name in (job.partition or "-").split(","):
            row = partitions.setdefault(name, {"name": name, "running": 0, "pending": 0, "gpus": 0})
            row[job.state.lower()] += 1
            row["gpus"] += gpus
        user = users.setdefault(job.user, {"user": job.user, "running": 0, "pending": 0, "gpus": 0})
        user[job.state.lower()] += 1
        user["gpus"] += gpus
    return {"running": running, "pending": pending,
            "partitions": sorted(partitions.values(), key=lambda p: p["name"]),
            "users": sorted(users.values(), key=lambda u: (-u["gpus"], -u["running"], u["user"]))}


def allocation_summary(nodes: list[Node], jobs: list[Job], configured: dict[str, int], idle: int) -> dict:
    """GPUs allocated against configured: the cluster's (Slurm's own count per node, AllocTRES), per GPU type (the
    types of the running jobs' GPUs), and how many held GPUs are flagged idle."""
    allocated = sum(n.gpus_used for n in nodes)
    total = sum(configured.values())
    by_type = {kind: {"total": count, "allocated": 0} for kind, count in configured.items()}
    for job in jobs:
        if job.state == "RUNNING":
            for _, kind, indexes in job.gpus:
                by_type.setdefault(kind, {"total": 0, "allocated": 0})["allocated"] += len(indexes)
    return {"gpus": total, "allocated": allocated, "share": round(100.0 * allocated / total, 1) if total else None,
            "by_type": by_type, "idle": idle}

"""Idle-node acceptance (acceptance/idle.py): which nodes get a test job, and what job.

The selection is pure (nodes, jobs and the worker's record in; the nodes to submit to out) and is tested with
literal records. A pass of the worker (`IdleTester.run_pass`) runs against fake Slurm tools: real scripts named
scontrol, squeue, sbatch and scancel in [slurm] bin_dir that answer from files and record what they were asked, so the
real SlurmClient, the real sbatch options and batch script, the real record file and the real journal are checked.
The nodes' agents are asked through the real AgentClient at a closed local port (they do not answer: the worker's own
record decides). The same on a real dev cluster: test_acceptance_idle_cluster.py."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from slurm_ext import config
from slurm_ext.acceptance.cluster import job_minutes
from slurm_ext.acceptance.idle import (IDLE_JOB_NAME, NICE, IdleTester, Seen, choose, due, interval, load_seen, share,
                                       state_path)
from slurm_ext.journal import read_events
from slurm_ext.plugin import Plugin
from slurm_ext.slurm import Job, Node

PERIOD = 3600.0
NOW = 1_800_000_000.0


def _node(name: str, state: str = "IDLE", *flags: str, gres: str = "gpu:h200:8") -> Node:
    return Node(name, state, frozenset(flags), gres=gres, partitions=("gpu",))


def _job(job_id: int, nodes: str, state: str = "RUNNING", name: str = "train") -> Job:
    return Job(job_id, name, "alice", state, nodes)


# -- the selection ------------------------------------------------------------------------------------------------


def test_only_idle_nodes_without_a_job_or_a_flag_of_someone_are_due():
    nodes = [_node("gpu01"), _node("gpu02", "ALLOCATED"), _node("gpu03", "MIXED"), _node("gpu04", "IDLE", "DRAIN"),
             _node("gpu05", "DOWN"), _node("gpu06", "IDLE", "RESERVED"), _node("gpu07", "IDLE", "NOT_RESPONDING"),
             _node("gpu08", "IDLE", "POWERED_DOWN"), _node("gpu09", "IDLE", "PLANNED"), _node("gpu10"),
             _node("gpu11", "IDLE", "MAINTENANCE"), _node("gpu12", "IDLE", "COMPLETING"),
             _node("gpu13", "IDLE", "REBOOT_REQUESTED"), _node("gpu14", "IDLE", "CLOUD")]
    # gpu10 is IDLE in the node list, but squeue already has a job there (the two reads are not one moment)
    jobs = [_job(1, "gpu02"), _job(2, "gpu[03,10]"), _job(3, "", "PENDING"), _job(4, "gpu01", "COMPLETED")]
    assert [n.name for n in due(nodes, jobs, {}, PERIOD, NOW)] == ["gpu01", "gpu14"]


def test_a_node_is_due_once_its_last_test_or_our_last_job_is_a_period_old_longest_waiting_first():
    nodes = [_node(f"gpu0{i}") for i in range(1, 7)]
    seen = {"gpu01": Seen(submitted=NOW - 7200, ended=NOW - 100),       # tested 100 s ago: not due
            "gpu02": Seen(submitted=NOW - 3000, ended=0),                 # our job 3000 s ago (a refusal): not due
            "gpu03": Seen(submitted=NOW - 9000, ended=NOW - 8000),        # due, waited longest but for gpu05
            "gpu04": Seen(submitted=NOW - 4000, ended=NOW - 3700),        # due
            "gpu06": Seen(submitted=NOW - 9999, ended=0, job_id=77)}      # our job in flight (squeue lags): not due
    assert [n.name for n in due(nodes, [], seen, PERIOD, NOW)] == ["gpu05", "gpu03", "gpu04"]


def test_at_most_one_percent_of_the_nodes_at_least_one_are_tested_at_once_counting_our_jobs_in_flight():
    assert [share(n) for n in (1, 99, 100, 250, 1000)] == [1, 1, 1, 2, 10]
    two = [_node("gpu01"), _node("gpu02")]
    assert choose(two, [], {}, PERIOD, NOW) == ["gpu01"]
    # our job on gpu01 (by its name: also one the record lost) leaves no room for gpu02
    assert choose(two, [_job(9, "gpu01", name=IDLE_JOB_NAME)], {}, PERIOD, NOW) == []
    assert choose(two, [_job(9, "", "PENDING", name=IDLE_JOB_NAME)], {}, PERIOD, NOW) == []
    many = [_node(f"gpu{i:03}") for i in range(300)]
    busy = [_job(1, "gpu[000-009]"), _job(2, "gpu100", name=IDLE_JOB_NAME)]
    assert choose(many, busy, {}, PERIOD, NOW) == ["gpu010", "gpu011"]


def test_the_worker_looks_every_tenth_of_the_period_at_most_a_minute():
    assert [interval(p) for p in (5.0, 20.0, 300.0, 3600.0, 86400.0)] == [1.0, 2.0, 30.0, 60.0, 60.0]


def test_the_controller_runs_the_worker_only_with_acceptance_on_and_a_period(tmp_path):
    from slurm_ext.acceptance.plugin import PLUGIN
    from slurm_ext.supervisor.reload import switched_off
    assert isinstance(PLUGIN, Plugin)
    (worker,) = PLUGIN.workers
    spec = worker.spec
    assert (spec.name, spec.roles, spec.command[-2:]) == ("accept-idle", ("controller",), ("accept", "idle"))
    assert not spec.gates_ready and spec.reload_signal == "HUP"
    path = tmp_path / "c.toml"
    for text, off in (("", True), ("[acceptance]\nenabled = true\n", True),
                      ('[acceptance]\nidle_period = "1h"\n', True),
                      ('[acceptance]\nenabled = true\nidle_period = "1h"\n', False)):
        path.write_text(text)
        loaded = config.load(path)
        assert ("accept-idle" in switched_off(loaded, "controller")) is off, text


def test_idle_qos_takes_a_qos_name_only(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[acceptance]\nidle_qos = "accept-idle"\n')
    assert config.load(path).acceptance.idle_qos == "accept-idle"
    path.write_text('[acceptance]\nidle_qos = "a b;c"\n')
    with pytest.raises(config.ConfigError, match="idle_qos"):
        config.load(path)


# -- a pass over fake Slurm tools ---------------------------------------------------------------------------------


class _Tools:
    """scontrol, squeue, sbatch, scancel as sh scripts: the nodes and jobs they show are files the test writes;
    sbatch records its arguments and script and prints the next job id (or refuses, when `refuse` holds words)."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.nodes_file, self.jobs_file = root / "nodes.txt", root / "jobs.txt"
        self.calls, self.refuse = root / "calls", root / "refuse"
        self.calls.mkdir()
        self.nodes_file.write_text("")
        self.jobs_file.write_text("")
        self._tool("scontrol", f'cat "{self.nodes_file}"')
        self._tool("squeue", f'cat "{self.jobs_file}"')
        self._tool("scancel", f'echo "$@" >> "{root / "scancel.log"}"')
        self._tool("sbatch", f'''if [ -s "{self.refuse}" ]; then cat "{self.refuse}" >&2; exit 1; fi
n=$(ls "{self.calls}" | wc -l); id=$((100 + n))
mkdir "{self.calls}/$id"; for a in "$@"; do echo "$a"; done > "{self.calls}/$id/args"
cat > "{self.calls}/$id/script"; echo "SLURM_EXT_CONFIG=${{SLURM_EXT_CONFIG:-}}" > "{self.calls}/$id/env"
echo "$id"''')

    def _tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    def show(self, nodes: list[tuple[str, str]], jobs: list[str]) -> None:
        """`nodes`: (name, State= as scontrol prints it); `jobs`: squeue's %i|%j|%u|%T|%N|%P|%S|%e lines."""
        self.nodes_file.write_text("".join(
            f"NodeName={name} Arch=x86_64 CPUTot=64 Gres=gpu:h200:8 NodeAddr={name} RealMemory=1000 State={state} "
            f"Partitions=gpu,debug Reason=(null)\n" for name, state in nodes))
        self.jobs_file.write_text("".join(f"{line}\n" for line in jobs))

    def submitted(self) -> dict[int, tuple[list[str], str, str]]:
        return {int(d.name): ((d / "args").read_text().split("\n")[:-1], (d / "script").read_text(),
                              (d / "env").read_text().strip()) for d in sorted(self.calls.iterdir())}


@pytest.fixture
def tools(tmp_path):
    return _Tools(tmp_path)


def _tester(tmp_path: Path, tools: _Tools, extra: str = "") -> IdleTester:
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nname = "ctl"\nstate_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
                    f'[slurm]\nbin_dir = "{tools.bin}"\njson = "never"\n'
                    # every node's agent at a local port nobody listens on: none answers
                    '[repair]\nagents = { gpu01 = "127.0.0.1:9", gpu02 = "127.0.0.1:9", gpu03 = "127.0.0.1:9" }\n'
                    f'[acceptance]\nenabled = true\nidle_period = "1h"\njob_command = ["/opt/node/accept", "--x"]\n'
                    f'{extra}')
    return IdleTester(config.load(path), str(path))


def _events(tmp_path: Path, name: str) -> list:
    return [e for e in read_events(str(tmp_path / "state")) if e.event == name]


def test_a_pass_submits_one_lowest_priority_exclusive_job_to_the_idle_node_and_none_to_the_busy(tmp_path, tools,
                                                                                                 monkeypatch):
    monkeypatch.setenv("SLURM_EXT_CONFIG", "/etc/controller.toml")
    tools.show([("gpu01", "ALLOCATED"), ("gpu02", "IDLE"), ("gpu03", "IDLE+DRAIN")],
               ["7|train|alice|RUNNING|gpu01|gpu|2026-01-01T00:00:00|2026-01-02T00:00:00"])
    tester = _tester(tmp_path, tools, 'idle_qos = "scavenger"\n')
    assert tester.run_pass(now=NOW) == [100]
    ((job_id, (args, script, env)),) = tools.submitted().items()
    assert {"--exclusive", "--mem=0", "--gres=gpu:8", "-N1", "--no-requeue", f"--nice={NICE}", "--qos=scavenger",
            f"--job-name={IDLE_JOB_NAME}", "--partition=gpu,debug", "--parsable"} <= set(args), args
    assert args[args.index("-w") + 1] == "gpu02"
    # the quick level's deadlines and two minutes: an upper bound, each test is killed at its deadline
    assert [a for a in args if a.startswith("--time=")] == [f"--time={job_minutes(tester.config, 'quick')}"]
    assert 5 <= job_minutes(tester.config, "quick") <= 15
    assert script.splitlines()[-1] == "exec /opt/node/accept --x --level quick --json --trigger idle --apply"
    assert env == "SLURM_EXT_CONFIG="  # the job runs the node's config, not the controller's
    assert load_seen(str(tmp_path / "state")) == {"gpu02": Seen(NOW, 0.0, 100)}
    (told,) = _events(tmp_path, "acceptance-idle-submitted")
    assert (told.fields["node"], told.fields["job_id"], told.fields["qos"]) == ("gpu02", 100, "scavenger")
    assert "gpu02: job 100" in told.message and "QOS scavenger, preemptible" in told.message

    # its job runs: nothing more (one at a time on 3 nodes); it ends: the node waits a period from then
    tools.show([("gpu01", "ALLOCATED"), ("gpu02", "ALLOCATED"), ("gpu03", "IDLE+DRAIN")],
               ["7|train|alice|RUNNING|gpu01|gpu|N/A|N/A", f"100|{IDLE_JOB_NAME}|root|RUNNING|gpu02|gpu|N/A|N/A"])
    assert tester.run_pass(now=NOW + 60) == []
    tools.show([("gpu01", "ALLOCATED"), ("gpu02", "IDLE"), ("gpu03", "IDLE+DRAIN")],
               ["7|train|alice|RUNNING|gpu01|gpu|N/A|N/A"])
    assert tester.run_pass(now=NOW + 120) == []
    assert load_seen(str(tmp_path / "state")) == {"gpu02": Seen(NOW, NOW + 120, 0)}
    assert tester.run_pass(now=NOW + 120 + PERIOD - 1) == []
    # the busy node's job ended: it is the one never tested, and goes first
    tools.show([("gpu01", "IDLE"), ("gpu02", "IDLE"), ("gpu03", "IDLE+DRAIN")], [])
    assert tester.run_pass(now=NOW + 120 + PERIOD) == [101]
    assert tools.submitted()[101][0][tools.submitted()[101][0].index("-w") + 1] == "gpu01"


def test_a_job_pending_too_long_is_cancelled_and_the_node_waits_a_period(tmp_path, tools):
    tools.show([("gpu02", "IDLE")], [])
    tester = _tester(tmp_path, tools)
    assert tester.run_pass(now=NOW) == [100]
    tools.show([("gpu02", "ALLOCATED")], [f"100|{IDLE_JOB_NAME}|root|PENDING||gpu|N/A|N/A",
                                          "8|train|bob|RUNNING|gpu02|gpu|N/A|N/A"])
    assert tester.run_pass(now=NOW + 30) == []
    assert not (tmp_path / "scancel.log").exists()
    assert tester.run_pass(now=NOW + 300) == []
    assert (tmp_path / "scancel.log").read_text().split() == ["100"]
    tools.show([("gpu02", "IDLE")], [])
    assert tester.run_pass(now=NOW + 400) == []
    assert tester.run_pass(now=NOW + PERIOD) == [101]
    told = _events(tmp_path, "acceptance-idle-submitted")
    assert "no idle_qos: lowest priority, not preemptible" in told[-1].message


def test_a_refused_job_is_said_once_and_the_node_waits_a_period(tmp_path, tools):
    tools.show([("gpu01", "IDLE"), ("gpu02", "IDLE")], [])
    tools.refuse.write_text("sbatch: error: Batch job submission failed: Invalid qos specification\n")
    tester = _tester(tmp_path, tools, 'idle_qos = "nosuch"\n')
    assert tester.run_pass(now=NOW) == []
    assert tester.run_pass(now=NOW + 10) == []  # gpu01 waits a period now: gpu02 is tried, refused the same
    refused = _events(tmp_path, "acceptance-idle-refused")
    assert len(refused) == 1 and refused[0].severity == "error", refused
    assert "Invalid qos specification" in refused[0].message and "idle_qos" in refused[0].message
    assert set(load_seen(str(tmp_path / "state"))) == {"gpu01", "gpu02"}
    assert tester.run_pass(now=NOW + 20) == []
    assert not tools.submitted()


def test_nothing_is_submitted_with_idle_testing_off_and_a_torn_record_starts_anew(tmp_path, tools):
    tools.show([("gpu01", "IDLE")], [])
    tester = _tester(tmp_path, tools)
    state_path(str(tmp_path / "state")).parent.mkdir(parents=True)
    state_path(str(tmp_path / "state")).write_text("{not json")
    assert load_seen(str(tmp_path / "state")) == {}
    path = tmp_path / "off.toml"
    path.write_text(Path(tester.config_path).read_text().replace('idle_period = "1h"', 'idle_period = "0s"'))
    assert IdleTester(config.load(path), str(path)).run_pass(now=NOW) == []
    assert tester.run_pass(now=NOW) == [100]
    assert json.loads(state_path(str(tmp_path / "state")).read_text())["nodes"]["gpu01"]["job_id"] == 100

"""The Nodes list's page of rows (web/nodelist.py, /api/nodes): filtered by state and name (a part, any case, or
=NAME, that node alone), sorted by a column (names as people read them, n2 before n10; a node without a figure first
in ascending order; descending reverses all), cut at offset/limit; the route over a real refresh (Slurm and the
agents stood in by literal answers, as in test_web_changes.py) answers whole rows, each GPU's readings in its row,
and a 400 naming a bad key or value."""

from __future__ import annotations

from types import SimpleNamespace

from pathlib import Path

import pytest

from helpers.page import LiteralSlurm
from slurm_ext import config
from slurm_ext.agentapi import HealthAnswer
from slurm_ext.repair.store import open_sqlite
from slurm_ext.slurm import Node
from slurm_ext.web.app import create_app
from slurm_ext.web.changes import figures_of
from slurm_ext.web.nodelist import SORTS, page_of
from slurm_ext.web.watch import Watcher


def _row(name: str, state: str = "healthy", utilization=None, used=None, temperature=None, jobs: int = 0,
         gpus_used: int = 0) -> dict:
    """A node row as the view holds it: one GPU with these readings (None: not read)."""
    gpu = {"index": 0, "utilization": utilization, "memory_used_mib": used, "temperature": temperature,
           "memory_total_mib": None if used is None else 100.0, "idle": False}
    return {"name": name, "state": state, "gpus_used": gpus_used, "jobs": [{"job_id": str(i)} for i in range(jobs)],
            "gpu_readings": [gpu], "reason": "",
            "figures": figures_of([SimpleNamespace(**{k: gpu[k] for k in ("utilization", "memory_used_mib",
                                                                          "memory_total_mib", "temperature")})], 0)}


def _names(found: tuple[int, list[dict]]) -> tuple[int, list[str]]:
    total, rows = found
    return total, [row["name"] for row in rows]


ROWS = [_row("n10", "paused", 90, 80.0, 70, jobs=2, gpus_used=1), _row("n2", "healthy", 10, 20.0, 40),
        _row("n1", "unhealthy", None, None, None, jobs=1), _row("gpu-a", "healthy", 50, 50.0, 50, gpus_used=1),
        _row("N3", "booting", 10, 90.0, 60)]


def test_by_name_as_people_read_it_n2_before_n10():
    assert _names(page_of(ROWS)) == (5, ["N3", "gpu-a", "n1", "n2", "n10"])  # Python's order of letters: N before g
    assert _names(page_of(ROWS, desc=True)) == (5, ["n10", "n2", "n1", "gpu-a", "N3"])
    many = [_row(f"n{i}") for i in (100, 9, 20, 1, 11, 2)]
    assert _names(page_of(many))[1] == ["n1", "n2", "n9", "n11", "n20", "n100"]


def test_filters_by_state_and_by_a_part_of_the_name_in_any_case_or_the_name_itself():
    assert _names(page_of(ROWS, state="healthy")) == (2, ["gpu-a", "n2"])
    assert _names(page_of(ROWS, name="n1")) == (2, ["n1", "n10"])  # a part
    assert _names(page_of(ROWS, name="=n1")) == (1, ["n1"])  # that node alone, not n10
    assert _names(page_of(ROWS, name="n3")) == (1, ["N3"]) and _names(page_of(ROWS, name="=n3")) == (0, [])
    assert _names(page_of(ROWS, state="healthy", name="GPU")) == (1, ["gpu-a"])
    assert _names(page_of(ROWS, state="pending")) == (0, [])


def test_each_column_sorts_ties_by_name_and_a_node_without_a_figure_comes_first():
    by = {sort: _names(page_of(ROWS, sort=sort))[1] for sort in SORTS}
    assert by["state"] == ["gpu-a", "n2", "N3", "n1", "n10"]  # healthy, booting, unhealthy, pending, paused
    assert by["utilization"] == ["n1", "N3", "n2", "gpu-a", "n10"]  # n1 read none; N3 and n2 tie at 10 %
    assert by["memory"] == ["n1", "n2", "gpu-a", "n10", "N3"]  # the share used: 20 %, 50 %, 80 %, 90 %
    assert by["temperature"] == ["n1", "n2", "gpu-a", "N3", "n10"]
    assert by["jobs"] == ["N3", "gpu-a", "n2", "n1", "n10"]
    assert by["gpus_used"] == ["N3", "n1", "n2", "gpu-a", "n10"]
    # descending reverses all, ties by name descending too (as a sort by name descending)
    assert _names(page_of(ROWS, sort="utilization", desc=True))[1] == ["n10", "gpu-a", "n2", "N3", "n1"]


def test_offset_and_limit_cut_the_page_and_the_total_counts_every_match():
    many = [_row(f"n{i}") for i in range(1, 251)]
    assert _names(page_of(many)) == (250, [f"n{i}" for i in range(1, 101)])  # 100 a page unless asked
    assert _names(page_of(many, offset=100, limit=100)) == (250, [f"n{i}" for i in range(101, 201)])
    assert _names(page_of(many, offset=200, limit=100)) == (250, [f"n{i}" for i in range(201, 251)])
    assert _names(page_of(many, offset=300)) == (250, [])
    assert _names(page_of(many, name="n1", offset=1, limit=3)) == (111, ["n10", "n11", "n12"])


# -- /api/nodes --------------------------------------------------------------------------------------------------------

def _slurm(count: int) -> LiteralSlurm:
    """slurmctld's answers as literal records: n1..n`count`, n2 drained by an admin."""
    return LiteralSlurm([Node(f"n{i}", "IDLE", frozenset({"DRAIN"}) if i == 2 else frozenset(),
                              "admin: fan" if i == 2 else "", "root" if i == 2 else "", gres="gpu:h200:2",
                              addr="127.0.0.1") for i in range(1, count + 1)])


class _Agents:
    """Every node's agent: two GPUs, node nK's at K % utilization."""

    def health(self, node, addr="", timeout=None):
        busy = int(node[1:])
        return HealthAnswer.of({"node": node, "boot": "b", "time": 1.0, "monitor": {"driver": "560.35.03", "gpus": [
            {"gpu": {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H200"}, "utilization": busy, "fb_used_mib": 10.0,
             "fb_free_mib": 90.0, "temperature": 40, "jobs": []} for i in range(2)]}})

    def acceptance(self, node, addr="", trigger="", timeout=None):
        from slurm_ext.agentapi import AcceptanceAnswer
        return AcceptanceAnswer(node, "b", False, False, None)


@pytest.fixture
def page(tmp_path: Path):
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\n'
                    f'[repair]\nsqlite_file = "{tmp_path / "repair.db"}"\n')
    store = open_sqlite(str(tmp_path / "repair.db"))
    watcher = Watcher(config.load(path), _slurm(120), store, lambda url, timeout: (None, "refused"), _Agents())
    watcher.refresh()
    yield create_app(config.load(path), watcher).test_client()
    store.close()


def test_the_route_answers_a_page_of_whole_rows_filtered_and_sorted(page):
    answer = page.get("/api/nodes")
    assert answer.status_code == 200
    data = answer.get_json()
    assert (data["total"], data["offset"], len(data["rows"])) == (120, 0, 100)  # 100 a page unless asked
    assert [row["name"] for row in data["rows"][:11]] == [f"n{i}" for i in range(1, 12)]
    first = data["rows"][0]
    assert [(g["index"], g["utilization"]) for g in first["gpu_readings"]] == [(0, 1), (1, 1)]  # whole: each GPU
    assert first["agent"]["answered"] and "checks" in first and first["ssh"]
    data = page.get("/api/nodes?sort=utilization&desc=1&offset=1&limit=3").get_json()
    assert (data["total"], data["offset"], [r["name"] for r in data["rows"]]) == (120, 1, ["n119", "n118", "n117"])
    data = page.get("/api/nodes?state=paused").get_json()
    assert (data["total"], [(r["name"], r["state"]) for r in data["rows"]]) == (1, [("n2", "paused")])
    data = page.get("/api/nodes?name=n11&limit=500").get_json()
    assert [r["name"] for r in data["rows"]] == ["n11", *(f"n{i}" for i in range(110, 120))]
    assert [r["name"] for r in page.get("/api/nodes?name==n11").get_json()["rows"]] == ["n11"]
    data = page.get("/api/nodes?offset=200").get_json()
    assert (data["total"], data["offset"], data["rows"]) == (120, 200, [])


@pytest.mark.parametrize("query, said", [
    ("x=1", "unknown query key 'x'"),
    ("state=drained", "state='drained': expected one of healthy, booting, unhealthy, pending, paused"),
    ("sort=owner", "sort='owner': expected one of name, state"),
    ("desc=2", "desc='2': expected one of 0, 1"),
    ("desc=true", "desc='true'"),
    ("limit=0", "limit='0': expected a count from 1 to 500"),
    ("limit=501", "limit='501': expected a count from 1 to 500"),
    ("offset=-1", "offset='-1': expected a count from 0"),
    ("offset=abc", "offset='abc'"),
    ("name=no such", "name='no such': expected a node name"),
    ("name==", "name='=': expected a node name"),
    ("name=", "name='': expected a node name"),
    ("sort=name&sort=state", "query key 'sort' given 2 times"),
])
def test_a_bad_key_or_value_is_a_400_naming_it(page, query, said):
    answer = page.get(f"/api/nodes?{query}")
    assert answer.status_code == 400 and said in answer.get_json()["error"], answer.get_json()

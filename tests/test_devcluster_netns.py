"""`dev down` removes the network namespaces of its own cluster, every one (a node's of an earlier, larger up, one a
killed run left), and never another cluster's: real namespaces under /run/netns, no daemon running."""

from __future__ import annotations

import pytest

from slurm_ext import devcluster as dev
from slurm_ext.devcluster import nodenet
from slurm_ext.devcluster.layout import Layout, netns_prefix
from slurm_ext.devcluster.settings import DevSection


@pytest.fixture
def namespaces():
    made = []

    def make(name: str) -> str:
        nodenet.ensure(name)
        made.append(name)
        return name
    yield make
    for name in made:
        nodenet.remove(name)


def test_down_removes_every_namespace_of_its_cluster_and_no_other(tmp_path, namespaces):
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    settings = DevSection(state_dir=str(mine), node_name="nsnode1", nodes=2)
    layout = Layout(settings)
    assert [n.netns for n in layout.nodes] == [f"{netns_prefix(mine)}nsnode1", f"{netns_prefix(mine)}nsnode2"]
    present = [namespaces(n.netns) for n in layout.nodes]
    beyond = namespaces(f"{netns_prefix(mine)}nsnode7")  # an earlier up with more nodes, or a killed run's
    others = namespaces(f"{netns_prefix(other)}nsnode1")
    dev.down(settings)
    left = nodenet.listed()
    assert not set(present) & set(left) and beyond not in left, left
    assert others in left, "another cluster's namespace was removed"

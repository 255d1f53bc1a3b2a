"""slurm_ext.words: counts in operators' sentences (issue 29.7: "1 findings", "1 nodes")."""

from slurm_ext.words import counted


def test_one_finding_two_findings():
    assert [counted(n, "finding") for n in (0, 1, 2)] == ["0 findings", "1 finding", "2 findings"]


def test_an_irregular_plural_is_given():
    assert counted(1, "query", "queries") == "1 query" and counted(3, "query", "queries") == "3 queries"

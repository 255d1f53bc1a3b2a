"""The README and docs/: a short README with its two commands and a map of docs/, every link and anchor
there, the CLI reference made from the parser, the metrics reference against the metrics in the code.

The configuration reference and the example config are checked in test_config.py, the table of events
in test_events.py: each beside what it is made from.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from slurm_ext import clidoc

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: the component folders whose code may serve metrics
SOURCES = ("slurm_ext", "supervisor", "gres", "accounting", "prolog_epilog", "health", "repair", "acceptance", "web",
           "devcluster")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def links(page: Path) -> list[tuple[str, str]]:
    """(target, anchor) of each relative Markdown link and image outside code blocks and code spans."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found.append((path, anchor))
    return found


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    made = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        made.add(re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-"))
    return made


def test_the_readme_is_short_and_keeps_its_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200, "README.md is the front page: what and why, the two commands, a first " \
                                           "fault, the map of docs/; the rest belongs in docs/"
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):
        after = readme.split(marker + "\n", 1)
        assert len(after) == 2 and after[1].startswith("```sh\n"), f"README.md: no ```sh block right after {marker}"
    # .ci/run extracts the test command exactly so: it must find one line that runs the suite
    extract = subprocess.run(["awk", "/<!-- test-command -->/ {found=1; next} found && /^```sh/ {inside=1; next} "
                              "inside && /^```/ {exit} inside {print}", str(REPO / "README.md")],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    assert extract.count("\n") == 1 and "pytest" in extract and extract.startswith("apt-get update"), extract


def test_every_link_and_anchor_in_the_readme_and_docs_resolves():
    broken = []
    for page in pages():
        for target, anchor in links(page):
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `title`: here\n\n[there](other.md#gone) [self](#a-title-here) `[code](x.md)`\n")
    (tmp_path / "other.md").write_text("## Present\n")
    assert links(page) == [("other.md", "gone"), ("", "a-title-here")]
    assert anchors(page) == {"a-title-here"} and anchors(tmp_path / "other.md") == {"present"}


def test_the_readme_maps_every_page_of_docs():
    mapped = {(REPO / target).resolve() for target, _ in links(REPO / "README.md")}
    unmapped = [str(page.relative_to(REPO)) for page in sorted(DOCS.rglob("*.md")) if page not in mapped]
    assert not unmapped, f"README.md's map of docs/ lacks {unmapped}"


def test_one_operator_page_per_component_with_a_section_links_its_configuration():
    from slurm_ext import config
    for name in config.section_names():
        if name in ("node", "log", "slurm"):  # the core's: the reference is their page
            continue
        page = DOCS / "operator" / f"{'devcluster' if name == 'dev' else name}.md"
        assert page.exists(), f"no operator page for [{name}]: {page.relative_to(REPO)}"
        assert f"../reference/configuration.md#{name}" in page.read_text(), f"{page.name} does not link [{name}]"


def test_the_cli_reference_is_made_from_the_parser():
    committed = (REPO / clidoc.REFERENCE).read_text() if (REPO / clidoc.REFERENCE).exists() else ""
    assert committed == clidoc.reference(), f"{clidoc.REFERENCE} is not what the parser makes: run " \
                                            f"`{clidoc.REGENERATE}`"
    for command in ("slurm-ext supervise", "slurm-ext health show", "slurm-ext repair approve", "slurm-ext dev up"):
        assert f"`{command}`" in committed, command
    result = subprocess.run([sys.executable, "-m", "slurm_ext.clidoc", "--check", str(REPO)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def metrics_in_code() -> tuple[set[str], list[re.Pattern]]:
    """Every metric name the agents can serve, as Prometheus shows it (a counter with _total), and the patterns
    of names made with an f-string."""
    names, patterns = set(), []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            source = path.read_text()
            if "MetricFamily" not in source:
                continue
            tree = ast.parse(source)
            counters = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("MetricFamily") and node.args:
                    first, counter = node.args[0], node.func.id.startswith("Counter")
                    if isinstance(first, ast.Constant):
                        (counters if counter else names).add(first.value)
                    elif isinstance(first, ast.JoinedStr):
                        parts = [re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z_]+" for v in first.values]
                        patterns.append(re.compile("".join(parts) + ("_total" if counter else "")))
            for node in ast.walk(tree):  # tables of names (dcgm-exporter's, in supervisor/metrics.py): gauges
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        re.fullmatch(r"DCGM_FI_DEV_[A-Z_]+|slurm_ext_(supervisor|health|network|accounting)_[a-z_]+",
                                     node.value) and node.value not in counters:
                    names.add(node.value)
            names |= {f"{name}_total" for name in counters}
    return names, patterns


def test_the_metrics_reference_names_every_metric_in_the_code_and_no_other():
    page = (DOCS / "reference" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z_]+)` \|", page, flags=re.M))
    names, patterns = metrics_in_code()
    assert len(names) > 30 and patterns, "the metric scan found too little: has supervisor/metrics.py moved?"
    missing = sorted(names - documented)
    assert not missing, f"docs/reference/metrics.md lacks {missing}"
    for pattern in patterns:
        assert any(pattern.fullmatch(name) for name in documented), \
            f"docs/reference/metrics.md: no metric named like {pattern.pattern}"
    stale = sorted(name for name in documented - names if not any(p.fullmatch(name) for p in patterns))
    assert not stale, f"docs/reference/metrics.md names metrics no code serves: {stale}"


def test_the_health_checks_table_is_made_from_the_checks_defaults():
    """docs/operator/health.md's table of defaults after its marker is the one the code makes: a default changed
    in health/settings.py, or a check added, fails here until the page says it."""
    from slurm_ext.health.checks import markdown_table
    page = (DOCS / "operator" / "health.md").read_text()
    marker = page.index("<!-- health-checks:")
    start = page.index("\n", marker) + 1
    table = page[start:page.index("\n\n", start) + 1]
    assert table == markdown_table(), ("docs/operator/health.md's table of checks differs from the code; paste "
                                       "this after its <!-- health-checks --> marker:\n" + markdown_table())


def test_the_health_checks_table_changes_with_a_default(monkeypatch):
    """The table above must not pass by ignoring the settings: a changed default makes another table."""
    import dataclasses
    from slurm_ext.health import checks, settings
    before = checks.markdown_table()
    monkeypatch.setitem(settings.CHECKS, "ecc", dataclasses.replace(settings.CHECKS["ecc"], threshold=2))
    assert checks.markdown_table() != before and "| `ecc` | nvml | critical | reset-gpu | `2` |" in checks.markdown_table()

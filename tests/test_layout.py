"""The package layout: every top-level folder is a component, imports go down the floors, setup.cfg packages every part, and a wheel
carries what an installed slurm-ext needs without the checkout (the fake NVML's C sources)."""

from __future__ import annotations

import ast
import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _setup_cfg() -> tuple[dict[str, str], list[str]]:
    """setup.cfg's package_dir (import name -> folder) and packages."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    options = parser["options"]
    package_dir = {}
    for line in options["package_dir"].strip().splitlines():
        name, folder = (part.strip() for part in line.split("="))
        package_dir[name] = folder
    return package_dir, options["packages"].split()


def _imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module of `package`, at any depth
    (the CLI's imports inside functions count as much as those at the top)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from . import gres` and `from slurm_ext import gres` name the component as an alias
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


#: The floors: a component imports only from floors below its own, never from its own floor's other
#: components nor from above. The core (the modules directly in slurm_ext/) is floor 0 and imports no
#: component at all: each component declares its config section in its `settings` module and its
#: commands in its `cli` module, and the core imports those by name only when a config or the command
#: line needs them.
FLOORS = {
    "slurm_ext": 0,
    "slurm_ext.nodestate": 1,
    "slurm_ext.gres": 2, "slurm_ext.accounting": 2, "slurm_ext.prolog_epilog": 2, "slurm_ext.oidc": 2,
    "slurm_ext.health": 3, "slurm_ext.repair": 3, "slurm_ext.acceptance": 3,
    "slurm_ext.supervisor": 4, "slurm_ext.web": 4, "slurm_ext.devcluster": 4,
}

#: top-level folders that are not components: docs, tests, and the images and manifests (containers/: a
#: Dockerfile, Slinky's YAML and the scripts that build and run them from a checkout; nothing imports it)
NOT_COMPONENTS = {"docs", "tests", "containers"}


def _floor_of(module: str) -> str | None:
    """The part of the floors table a module belongs to: the longest name that is it or its package."""
    owners = [name for name in FLOORS if module == name or module.startswith(name + ".")]
    return max(owners, key=len) if owners else None


def _imports_where(path: Path, package: str, wanted) -> list[tuple[int, str]]:
    """(line, module) of each import in `path` (a module of `package`) of a part of the floors table that
    `wanted(part)` picks, once per statement (`from slurm_ext.health import nvmlread` is one import of
    slurm_ext.health.nvmlread)."""
    hits: list[tuple[int, str]] = []
    for line, module in sorted(_imported_modules(path, package)):
        part = _floor_of(module)
        if part is None or not wanted(part):
            continue
        if hits and hits[-1][0] == line and module.startswith(hits[-1][1] + "."):
            hits[-1] = (line, module)
        else:
            hits.append((line, module))
    return hits


def _floor_violations(path: Path, package: str) -> list[tuple[int, str]]:
    """Each import in `path` that does not go down the floors."""
    importer = _floor_of(package)
    return _imports_where(path, package, lambda part: part != importer and FLOORS[part] >= FLOORS[importer])


def _python_modules() -> list[tuple[Path, str]]:
    """(path, package) of every module of slurm-ext, in every folder setup.cfg maps."""
    package_dir, _ = _setup_cfg()
    modules = []
    for name, folder in package_dir.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.parent.relative_to(REPO / folder)
            modules.append((path, ".".join((name, *relative.parts))))
    return modules


def test_every_top_level_folder_is_a_component_imported_under_slurm_ext():
    package_dir, _ = _setup_cfg()
    folders = {path.name for path in REPO.iterdir()
               if path.is_dir() and not path.name.startswith(".") and not path.name.endswith(".egg-info")
               and path.name not in ("build", "dist")}
    components = {folder: name for name, folder in package_dir.items() if name != "slurm_ext"}
    for folder in sorted(folders - NOT_COMPONENTS - {"slurm_ext"}):
        assert components.get(folder) == f"slurm_ext.{folder}", \
            f"{folder}/ is a top-level folder: map it in setup.cfg as slurm_ext.{folder} = {folder}"
    assert set(package_dir) - {"slurm_ext"} == {f"slurm_ext.{folder}" for folder in components}
    # the core folder holds the core and the node-state owner, nothing else
    assert {path.name for path in (REPO / "slurm_ext").iterdir() if (path / "__init__.py").is_file()} == {"nodestate"}
    assert set(FLOORS) == set(package_dir) | {"slurm_ext.nodestate"}, "give every component its floor"


def test_every_cross_component_import_goes_down_the_floors():
    problems = [f"{path.relative_to(REPO)}:{line}: {_floor_of(package)} (floor {FLOORS[_floor_of(package)]}) imports "
                f"{module} (floor {FLOORS[_floor_of(module)]})"
                for path, package in _python_modules() for line, module in _floor_violations(path, package)]
    assert not problems, "an import that does not go down the floors (FLOORS above):\n" + "\n".join(problems)


def test_the_floor_check_fails_on_an_import_that_goes_up_or_sideways(tmp_path):
    """The check above must not pass by missing an import: one module per way of breaking the floors."""
    module = tmp_path / "mod.py"
    cases = {("slurm_ext.gres", "from slurm_ext.health import nvmlread\n"): "slurm_ext.health.nvmlread",
             ("slurm_ext.health", "from ..repair import store\n"): "slurm_ext.repair.store",
             ("slurm_ext.nodestate", "def f():\n    from .. import prolog_epilog\n"): "slurm_ext.prolog_epilog",
             ("slurm_ext", "import slurm_ext.supervisor.agent\n"): "slurm_ext.supervisor.agent"}
    for (package, source), imported in cases.items():
        module.write_text(source)
        assert [module for _, module in _floor_violations(module, package)] == [imported], (package, source)
    module.write_text("from ..gres import inventory\nfrom .. import nvml\nfrom . import monitor\n")
    assert _floor_violations(module, "slurm_ext.health") == []


def test_the_import_scan_sees_relative_absolute_and_nested_imports(tmp_path):
    """The scan above must not pass by missing an import form."""
    module = tmp_path / "cli.py"
    module.write_text("from . import config, errors\n"
                      "def f():\n    from .gres import generate\n"
                      "def g():\n    from . import devcluster\n"
                      "import slurm_ext.supervisor.agent\n"
                      "from slurm_ext import prolog_epilog\n"
                      "from .slurm import SlurmClient\n")
    found = _floor_violations(module, "slurm_ext")
    assert found == [(3, "slurm_ext.gres.generate"), (5, "slurm_ext.devcluster"),
                     (6, "slurm_ext.supervisor.agent"), (7, "slurm_ext.prolog_epilog")]


def test_setup_cfg_lists_every_package_of_the_checkout():
    """A package left out of setup.cfg is missing from the wheel (and from the images)."""
    package_dir, packages = _setup_cfg()
    expected = set()
    for name, folder in package_dir.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            expected.add(".".join((name, *relative.parts)))
    missing = sorted(expected - set(packages))
    assert not missing, f"add to [options] packages in setup.cfg: {', '.join(missing)}"


def test_loading_a_config_imports_only_the_components_its_file_names(tmp_path):
    """The Python hook fallback loads the config for every job: a component's section is
    imported when the file has it or code reads it, never all of them up front."""
    config_file = tmp_path / "slurm-ext.toml"
    config_file.write_text('[node]\nname = "n1"\n\n[prolog_epilog]\nmin_uid = 2000\n')
    probe = ("import json, sys\n"
             "from slurm_ext import config\n"
             f"loaded = config.load({str(config_file)!r})\n"
             "def parts():\n"
             "    return sorted({m.split('.')[1] for m in sys.modules if m.startswith('slurm_ext.') and\n"
             "                   m.split('.')[1] in ('supervisor', 'prolog_epilog', 'gres', 'devcluster')})\n"
             "after_load = parts()\n"
             "port = loaded.supervisor.port('worker')\n"
             "print(json.dumps([after_load, parts(), loaded.prolog_epilog.min_uid, port]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    after_load, after_read, min_uid, port = json.loads(result.stdout)
    assert after_load == ["prolog_epilog"]
    assert after_read == ["prolog_epilog", "supervisor"]
    assert (min_uid, port) == (2000, 9810)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from the checkout, as CI builds it."""
    import importlib.util
    assert importlib.util.find_spec("wheel"), "install the [test] extra: its wheel package builds the wheel offline"
    # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds
    tree = tmp_path_factory.mktemp("checkout") / "slurm-ext"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", "*.so", "*.so.1"))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "--wheel-dir", str(out), str(tree)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (built,) = out.glob("slurm_ext-*.whl")
    return built


def test_the_wheel_carries_the_fake_nvml_sources_and_every_component(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = REPO / "devcluster" / "fakenvml"
    for path in sorted(sources.glob("*.[ch]")) + [sources / "README.md"]:
        assert f"slurm_ext/devcluster/fakenvml/{path.name}" in names
    for part in ("config", "cli", "supervisor/settings", "supervisor/cli", "prolog_epilog/settings",
                 "prolog_epilog/cli", "gres/settings", "gres/cli", "devcluster/settings", "devcluster/cli",
                 "devcluster/fakenvml/__init__"):
        assert f"slurm_ext/{part}.py" in names
    assert "slurm_ext/prolog_epilog/hook.c" in names
    for asset in sorted((REPO / "web" / "static").iterdir()):  # the cluster page, served from the package
        assert f"slurm_ext/web/static/{asset.name}" in names
    assert not [name for name in names if name.startswith(("tests/", "slurm_ext/dev/"))]


def test_the_installed_wheel_builds_the_fake_nvml_from_its_own_files(wheel, tmp_path):
    """Unpacked where no checkout is importable, the fake NVML is built from the package's sources."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import sys\n"
             "from slurm_ext.devcluster import fakenvml\n"
             "lib = fakenvml.build(sys.argv[1])\n"
             "print(fakenvml.source_dir())\n"
             "print(lib)\n")
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "lib")], capture_output=True, text=True,
                            timeout=180, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    source, lib = result.stdout.split()
    assert Path(source) == site / "slurm_ext" / "devcluster" / "fakenvml"
    assert Path(lib).is_file() and Path(lib).name == "libnvidia-ml.so.1"


#: the node agent's one module that names other components: its list of plug-ins (as gpud's components/all)
PLUGIN_LIST = REPO / "supervisor" / "plugins.py"
#: what the node agent may import besides itself: the core and the node-state owner inside it
_AGENT_MAY_IMPORT = {"slurm_ext", "slurm_ext.nodestate", "slurm_ext.supervisor"}


def _components_imported(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of each import in `path` (a module of `package`) of a component the node agent may reach
    only through its plug-in list: any part of the floors table but the core, the node-state owner and itself."""
    return _imports_where(path, package, lambda part: part not in _AGENT_MAY_IMPORT)


def test_the_node_agent_reaches_components_only_through_its_plugin_list():
    problems = [f"{path.relative_to(REPO)}:{line}: imports {module}"
                for path, package in _python_modules() if package.startswith("slurm_ext.supervisor")
                and path != PLUGIN_LIST for line, module in _components_imported(path, package)]
    assert not problems, ("the node agent names a component outside supervisor/plugins.py: give the component a "
                          "plugin.py (slurm_ext.plugin) and list it there\n" + "\n".join(problems))
    tree = ast.parse(PLUGIN_LIST.read_text())
    listed = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["PLUGINS"])
    package_dir, _ = _setup_cfg()
    with_plugin = {f"{name}.plugin" for name, folder in package_dir.items()
                   if name != "slurm_ext" and (REPO / folder / "plugin.py").is_file()}
    assert set(listed) == with_plugin, "supervisor/plugins.py lists every component's plugin.py, and only those"
    assert len(listed) == len(set(listed))


def test_the_plugin_list_check_fails_on_a_component_imported_elsewhere_in_the_agent(tmp_path):
    """The check above must not pass by missing an import: each way a module of supervisor/ may name one."""
    module = tmp_path / "agent.py"
    cases = {"from slurm_ext.health import metrics_path\n": [(1, "slurm_ext.health.metrics_path")],
             "from .. import gres\n": [(1, "slurm_ext.gres")],
             "def f():\n    from ..accounting.settings import PASSWORD_ENV\n":
                 [(2, "slurm_ext.accounting.settings.PASSWORD_ENV")],
             "import slurm_ext.web.app\n": [(1, "slurm_ext.web.app")],
             "from slurm_ext import prolog_epilog, repair\n": [(1, "slurm_ext.prolog_epilog"), (1, "slurm_ext.repair")]}
    for source, found in cases.items():
        module.write_text(source)
        assert _components_imported(module, "slurm_ext.supervisor") == found, source
    module.write_text("from slurm_ext import events, nodestate\nfrom slurm_ext.plugin import Plugin\n"
                      "from . import pipeline\nfrom .plugins import plugins\nimport os\n")
    assert _components_imported(module, "slurm_ext.supervisor") == []


def test_every_plugin_gives_the_agent_a_plugin_of_its_own_name_and_the_start_order_stays():
    from slurm_ext import config
    from slurm_ext.plugin import Plugin
    from slurm_ext.supervisor import pipeline, plugins, workers
    loaded = plugins.plugins()
    assert [p.name for p in loaded] == [name.split(".")[1] for name in plugins.PLUGINS]
    assert all(isinstance(p, Plugin) for p in loaded)
    defaults = config.Config().supervisor
    assert [s.name for s in plugins.builtin_workers(workers.DAEMONS)] == [
        "munged", "mariadbd", "sshd", "slurmdbd", "slurmctld", "hooks", "slurmd", "health", "accept-idle", "repair",
        "collector", "web"]
    orders = {role: ([s.name for s in workers.workers_for(role, defaults)], [s.name for s in pipeline.steps_for(role)])
              for role in config.ROLES}
    assert orders == {
        "worker": (["hooks", "slurmd", "health"],
                   ["preflight", "clear-stale-drains", "gres-regenerate", "validate-scripts", "node-boot-scripts",
                    "acceptance"]),
        "controller": (["slurmctld", "accept-idle", "repair", "collector", "web"],
                       ["preflight", "check-storage", "validate-scripts", "node-boot-scripts"]),
        "accounting": (["slurmdbd"], ["preflight", "accounting-config", "check-storage"]),
        "login": (["sshd"], ["validate-scripts", "node-boot-scripts"])}


def test_the_agents_loop_stays_small_and_names_no_role_or_worker():
    """supervisor/agent.py is the loop only (processes, reload, stopping, readiness are modules of their own), and a
    rule for one role or one worker belongs to its plug-in or to slurmd_args, not to a test in the loop."""
    import re
    source = (REPO / "supervisor" / "agent.py").read_text()
    assert len(source.splitlines()) < 400
    assert not re.findall(r"\brole\s*[!=]=|[!=]=\s*self\.role\b|spec\.name\s*[!=]=", source)


def test_building_the_command_line_imports_no_drill_and_no_fake_nvml(tmp_path):
    """Every slurm-ext process (the agent and its workers) builds the parser: `dev inject --help`'s list of faults
    imported devcluster.drills and through it the fake NVML, about 5 MB more in each (bench_supervisor, bench_health
    after issue 29.4)."""
    probe = ("import json, sys\n"
             "from slurm_ext import cli\n"
             "cli._parser()\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('slurm_ext.devcluster.'))))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert not {"slurm_ext.devcluster.drills", "slurm_ext.devcluster.fakenvml"} & set(loaded), loaded

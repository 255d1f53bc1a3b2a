"""The package layout: the core imports no component, setup.cfg packages every part, and a wheel
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


def _components() -> dict[str, str]:
    """Every component: its import name (slurm_ext.gres) -> its folder (gres)."""
    package_dir, _ = _setup_cfg()
    return {name: folder for name, folder in package_dir.items() if name != "slurm_ext"}


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


def _component_imports(path: Path, package: str, components: dict[str, str]) -> list[tuple[int, str]]:
    """(line, module) of each import of a component, once per statement."""
    hits: list[tuple[int, str]] = []
    for line, module in sorted(_imported_modules(path, package)):
        if not any(module == name or module.startswith(name + ".") for name in components):
            continue
        if not (hits and hits[-1][0] == line and module.startswith(hits[-1][1] + ".")):
            hits.append((line, module))
    return hits


def test_the_core_modules_import_no_component():
    components = _components()
    assert {"slurm_ext.supervisor", "slurm_ext.prolog_epilog", "slurm_ext.gres", "slurm_ext.accounting",
            "slurm_ext.devcluster"} <= set(components)
    core = sorted((REPO / "slurm_ext").glob("*.py"))
    assert len(core) > 5
    problems = [f"slurm_ext/{path.name}:{line}: imports {module}"
                for path in core for line, module in _component_imports(path, "slurm_ext", components)]
    assert not problems, ("the core must import no component (a component registers its config section "
                          "and commands with the core instead):\n" + "\n".join(problems))


def test_the_import_scan_sees_relative_absolute_and_nested_imports(tmp_path):
    """The scan above must not pass by missing an import form."""
    module = tmp_path / "cli.py"
    module.write_text("from . import config, errors\n"
                      "def f():\n    from .gres import generate\n"
                      "def g():\n    from . import devcluster\n"
                      "import slurm_ext.supervisor.agent\n"
                      "from slurm_ext import prolog_epilog\n"
                      "from .slurm import SlurmClient\n")
    found = _component_imports(module, "slurm_ext", _components())
    assert found == [(3, "slurm_ext.gres"), (5, "slurm_ext.devcluster"),
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
    for asset in sorted((REPO / "slurm_ext" / "web" / "static").iterdir()):  # the cluster page, served from the package
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

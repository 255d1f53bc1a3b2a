"""systemd units for the hook service on bare metal: `install_units`.

Where slurmd runs under systemd and no slurm-ext agent runs the hook
service, systemd can: slurm-ext-hooks.socket listens on the hook socket from
boot and starts slurm-ext-hooks.service on the first Prolog or Epilog, which
serves the socket it is passed (service.serve). The units ship as package
data with the defaults (/run/slurm-ext/hooks.sock, /usr/local/bin/slurm-ext);
`install_units` writes them with this node's socket path, the installed
`slurm-ext` and the config file it was given, so what systemd listens on is
what slurm-ext-hook connects to.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.config import Config
from slurm_ext.errors import SlurmExtError
from slurm_ext.fileio import atomic_write

from .service import socket_path

__all__ = ["install_units", "render_units", "installed_program", "UnitFile", "UnitInstallError",
           "UNIT_NAMES", "DEFAULT_UNIT_DIR"]

UNIT_NAMES = ("slurm-ext-hooks.socket", "slurm-ext-hooks.service")
#: where an administrator's own units go (systemd.unit(5)): ahead of the distribution's, kept by upgrades
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
_TEMPLATES = Path(__file__).parent
# a unit file expands % specifiers, $ variables, quotes and backslashes: paths with none of them are taken as written
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./@+,:=-]*")


@dataclass(frozen=True, slots=True)
class UnitFile:
    """One unit written by `install_units`."""

    #: where it is
    path: Path
    #: False when the file already had this text (left untouched)
    changed: bool


class UnitInstallError(SlurmExtError):
    """The units cannot be written as they must be: `what` names the value or file, `problem` what is wrong."""

    def __init__(self, what: str, problem: str):
        self.what = what
        self.problem = problem
        super().__init__(f"cannot install the hook service's systemd units: {what}: {problem}")


def installed_program() -> Path:
    """The `slurm-ext` console script of this installation: beside this Python, else the one on PATH.

    Raises:
        UnitInstallError: neither exists.
    """
    beside = Path(sys.executable).parent / "slurm-ext"
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("slurm-ext")
    if found:
        return Path(os.path.abspath(found))
    raise UnitInstallError("slurm-ext", f"not found beside {sys.executable} nor on PATH (reinstall slurm-ext, "
                           "or pass --program PATH)")


def render_units(config: Config, program: Path) -> dict[str, str]:
    """The text of each unit by name, for this config's socket and `program` (the slurm-ext to run).

    ExecStart names the config file the config came from, so the service
    reads the same one whatever its environment; defaults (no file) stay
    defaults, and a file made later at the default path is read.

    Raises:
        UnitInstallError: a path a unit file would expand or split (spaces,
            %, $, quotes, backslashes), or a relative one.
    """
    listen = _plain("the hook socket (node.runtime_dir)", str(socket_path(config)))
    argv = [_plain("the slurm-ext program", str(program))]
    if config.source:
        argv += ["--config", _plain("the config file", os.path.abspath(config.source))]
    argv += ["hooks", "serve"]
    texts = {}
    for name, key, value in (("slurm-ext-hooks.socket", "ListenStream", listen),
                             ("slurm-ext-hooks.service", "ExecStart", " ".join(argv))):
        template = (_TEMPLATES / name).read_text()
        text, count = re.subn(rf"^{key}=.*$", f"{key}={value}", template, flags=re.M)
        if count != 1:
            raise UnitInstallError(str(_TEMPLATES / name), f"expected one {key}= line, found {count} "
                                   "(reinstall slurm-ext)")
        texts[name] = text
    return texts


def install_units(config: Config, unit_dir: Path = DEFAULT_UNIT_DIR, program: Path | None = None) -> list[UnitFile]:
    """Write slurm-ext-hooks.socket and .service into `unit_dir` (0644, atomically; unchanged ones untouched).

    It enables and starts nothing: `systemctl daemon-reload` and
    `systemctl enable --now slurm-ext-hooks.socket` are the operator's call
    (not on a node whose agent runs the service).

    Raises:
        UnitInstallError: see render_units; `program` missing.
        OSError: `unit_dir` cannot be made or written.
    """
    program = Path(program) if program is not None else installed_program()
    if not os.access(program, os.X_OK):
        raise UnitInstallError(str(program), "not an executable file")
    written = []
    unit_dir = Path(unit_dir)
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name, text in render_units(config, program).items():
        path = unit_dir / name
        try:
            unchanged = path.read_text() == text
        except OSError:
            unchanged = False
        if not unchanged:
            atomic_write(path, text, mode=0o644)
        written.append(UnitFile(path, not unchanged))
    return written


def _plain(what: str, value: str) -> str:
    if not _PLAIN_PATH.fullmatch(value):
        raise UnitInstallError(what, f"{value!r} must be an absolute path of letters, digits and _ . / @ + , : = - "
                               "only (a unit file would expand or split anything else)")
    return value

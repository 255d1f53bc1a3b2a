"""Check lifecycle scripts before anything runs them.

An admin script runs as root on every node at every job start or end: one
that a user can rewrite (wrong owner, group- or world-writable) is a root
shell for that user, and one with a syntax error fails every job on the
cluster at once. So every script is checked first: a regular file, owned by
the expected user, not writable by group or others, executable, a shebang
whose interpreter exists, and a clean syntax check (`bash -n`, `sh -n`, or
Python's compiler); shellcheck's warnings are added when it is installed.

`validate_script` returns the problems of one file; `validate_dir` those of a
directory's scripts, in the order run-parts would run them. `VerdictCache`
keeps verdicts by content hash so a hot path checks each version once.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Problem", "validate_script", "validate_dir", "script_names", "VerdictCache"]

_SHELLS = {"sh", "dash", "bash", "ksh", "zsh"}
_SYNTAX_TIMEOUT = 10.0
# bash: "FILE: line 3: message"; dash: "FILE: 3: message"
_SHELL_LINE = re.compile(r":(?: line)? (\d+):\s*(.*)")


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    #: 1-based line the problem is on; None when it is about the file itself
    line: int | None
    message: str
    #: error (the script must not run) or warning (shellcheck's advice)
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.severity}: {self.message}"


def script_names(directory: Path) -> list[Path]:
    """The scripts of `directory` in run order (lexical, like run-parts).

    Hidden files and editor or package leftovers (`~`, `.bak`, `.orig`,
    `.dpkg-*`, `.rpmsave`, `.rpmnew`, `.disabled`) are not scripts.
    """
    skip = re.compile(r"^\.|~$|\.(bak|orig|disabled|rpmsave|rpmnew|dpkg-[a-z]+)$")
    try:
        names = sorted(entry.name for entry in os.scandir(directory))
    except FileNotFoundError:
        return []
    return [Path(directory) / name for name in names if not skip.search(name)]


def validate_dir(directory: Path, owner: int = 0, shellcheck: bool = True) -> dict[Path, list[Problem]]:
    """Problems of every script in `directory`, by script, in run order."""
    return {path: validate_script(path, owner, shellcheck) for path in script_names(directory)}


def validate_script(path: Path, owner: int = 0, shellcheck: bool = True) -> list[Problem]:
    """Every problem of one script; an empty list means it may run.

    `owner` is the uid that must own it: root (0) for admin scripts, the job's
    user for user hooks.
    """
    path = Path(path)
    name = str(path)
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            info = path.stat()  # run-parts follows links: judge what would run
    except FileNotFoundError:
        return [Problem(name, None, "no such file (a dangling link?)")]
    except OSError as err:
        return [Problem(name, None, f"cannot read: {err.strerror}")]
    if not stat.S_ISREG(info.st_mode):
        return [Problem(name, None, "not a regular file")]
    problems = []
    if info.st_uid != owner:
        problems.append(Problem(name, None, f"owned by uid {info.st_uid} (expected {owner}): "
                                f"chown {owner} {name}"))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(Problem(name, None, f"mode {stat.S_IMODE(info.st_mode):04o} lets group or others "
                                f"change it: chmod go-w {name}"))
    if not info.st_mode & stat.S_IXUSR:
        problems.append(Problem(name, None, f"not executable: chmod u+x {name}"))
    try:
        content = path.read_bytes()
    except OSError as err:
        return problems + [Problem(name, None, f"cannot read: {err.strerror}")]
    interpreter, problem = _interpreter(name, content)
    if problem:
        return problems + [problem]
    problems += _syntax(name, path, content, interpreter)
    if shellcheck and Path(interpreter).name in _SHELLS and not any(p.line for p in problems):
        problems += _shellcheck(name, path)
    return problems


def _interpreter(name: str, content: bytes) -> tuple[str, Problem | None]:
    """The program the shebang names, resolved through PATH for `/usr/bin/env X`."""
    first = content.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return "", Problem(name, 1, "no shebang (#!/bin/sh, #!/bin/bash, #!/usr/bin/python3 ...) on the "
                           "first line: the kernel cannot run it")
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return "", Problem(name, 1, "empty shebang")
    program = words[0]
    if Path(program).name == "env" and len(words) > 1:
        found = shutil.which(words[-1])
        if not found:
            return "", Problem(name, 1, f"interpreter {words[-1]!r} (via env) is not in PATH")
        return found, None
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return "", Problem(name, 1, f"interpreter {program} does not exist or is not executable")
    return program, None


def _syntax(name: str, path: Path, content: bytes, interpreter: str) -> list[Problem]:
    base = Path(interpreter).name
    if base in _SHELLS:
        try:
            result = subprocess.run([interpreter, "-n", str(path)], capture_output=True, text=True,
                                    timeout=_SYNTAX_TIMEOUT)
        except subprocess.TimeoutExpired:
            return [Problem(name, None, f"{base} -n did not finish within {_SYNTAX_TIMEOUT:g}s")]
        if result.returncode == 0:
            return []
        by_line: dict[int, list[str]] = {}  # bash says what is wrong, then quotes the line
        for line in result.stderr.splitlines():
            match = _SHELL_LINE.search(line)
            if match:
                by_line.setdefault(int(match.group(1)), []).append(match.group(2))
        problems = [Problem(name, number, f"{base} syntax: {': '.join(texts)}") for number, texts in by_line.items()]
        return problems or [Problem(name, None, f"{base} -n failed: {result.stderr.strip()}")]
    if base.startswith("python"):
        try:
            compile(content, name, "exec")
        except SyntaxError as err:
            return [Problem(name, err.lineno, f"python syntax: {err.msg}")]
        except ValueError as err:
            return [Problem(name, None, f"python: {err}")]
    return []


def _shellcheck(name: str, path: Path) -> list[Problem]:
    program = shutil.which("shellcheck")
    if not program:
        return []
    try:
        result = subprocess.run([program, "--format=gcc", str(path)], capture_output=True, text=True,
                                timeout=_SYNTAX_TIMEOUT)
    except subprocess.TimeoutExpired:
        return []
    problems = []
    for line in result.stdout.splitlines():
        parts = line.split(":", 4)  # path:line:column: severity: message
        if len(parts) == 5 and parts[1].isdigit():
            problems.append(Problem(name, int(parts[1]), f"shellcheck: {parts[4].strip()}", "warning"))
    return problems


class VerdictCache:
    """Verdicts by (content hash, owner, mode): a script is checked once per version.

    Keyed on what the checks look at, so a chmod or chown is seen at once and
    an unchanged script costs one read and one hash.
    """

    def __init__(self, owner: int = 0, shellcheck: bool = False):
        self.owner = owner
        self.shellcheck = shellcheck
        self._verdicts: dict[tuple, list[Problem]] = {}

    def problems(self, path: Path) -> list[Problem]:
        try:
            info = Path(path).stat()
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return validate_script(path, self.owner, self.shellcheck)
        key = (str(path), digest, info.st_uid, info.st_mode)
        if key not in self._verdicts:
            self._verdicts[key] = validate_script(path, self.owner, self.shellcheck)
        return self._verdicts[key]

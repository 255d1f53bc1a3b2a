"""Check lifecycle scripts before anything runs them.

An admin script runs as root on every node at every job start or end: one
that a user can rewrite (wrong owner, group- or world-writable, in a
directory someone else can change) is a root shell for that user, and one
with a syntax error fails every job on the cluster at once. So every script
is checked first: a regular file, owned by the expected user, not writable
by group or others, executable, in directories that only root (for a user
hook: root or the user) can change, a shebang whose interpreter exists, and
a clean syntax check (`bash -n`, `sh -n`, or Python's compiler);
shellcheck's warnings are added when it is installed.

How the checks stay true until the script runs:

- A script is reached one directory at a time from /, each directory judged
  on its own descriptor, like sshd's StrictModes (`open_script`); a sticky
  ancestor such as /tmp and a read-only mount (a ConfigMap) pass. A
  symbolic link is followed only in a directory that root alone can change
  (anywhere else someone else chose where it leads); an admin script may be
  a link only to a file inside its own directory (a Kubernetes ConfigMap's
  `..data/`), never to an arbitrary root-owned program; a user hook may not
  be a link at all.
- The file is opened once (O_NOFOLLOW, O_NONBLOCK), judged with fstat and
  read through that descriptor, and that same descriptor is what runs
  (`/proc/self/fd/N`): renaming another file over the path after the check
  changes nothing. A file over MAX_SCRIPT_SIZE is refused unread.
- An admin script's interpreter must be root's alone too: `#!/tmp/x` would
  be a root shell. Nothing a user names is ever run as root: the syntax
  check of a user hook runs as that user, and only when its interpreter
  passes the admin rules (a user's own `#!/home/u/bin/bash` is not checked,
  only run, as the user).

`validate_script` returns the problems of one file; `validate_dir` those of a
directory's scripts, in the order run-parts would run them. `VerdictCache`
keeps syntax verdicts by content hash so a hot path checks each version once,
and hands the runner the checked descriptor (`VerdictCache.open`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .places import CLEAN_PATH

__all__ = ["Problem", "ScriptFile", "MAX_SCRIPT_SIZE", "validate_script", "validate_dir", "script_names",
           "open_script", "VerdictCache"]

#: bytes a script or user hook may have: a larger one is refused before anything reads it
MAX_SCRIPT_SIZE = 1 << 20

_SHELLS = {"sh", "dash", "bash", "ksh", "zsh"}
_SYNTAX_TIMEOUT = 10.0
# bash: "FILE: line 3: message"; dash: "FILE: 3: message"
_SHELL_LINE = re.compile(r":(?: line)? (\d+):\s*(.*)")
# the kernel's own limit of symbolic links on one path
_MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_USER_LINK = ("a symbolic link: user hooks must be regular files (a link could point at a file the user may "
              "not read)")
# Run by the script's own Python, in a child (as the hook's user for a user hook): a hostile file can
# exhaust that child's recursion or memory, never the checker's.
_PYTHON_CHECK = (
    "import sys\n"
    "try:\n"
    "    compile(open(sys.argv[1], 'rb').read(), sys.argv[2], 'exec')\n"
    "except SyntaxError as err:\n"
    "    sys.stdout.write('%d\\t%s\\n' % (err.lineno or 0, err.msg))\n"
    "    sys.exit(1)\n"
    "except Exception as err:\n"
    "    sys.stdout.write('0\\t%s: %s\\n' % (type(err).__name__, err))\n"
    "    sys.exit(1)\n")


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


class ScriptFile:
    """One script, opened and read for its checks: `fd` is what runs (as `exec_path`), never the path again.

    Close it (or use it in a `with` block) once the script has started.
    """

    def __init__(self, path: str, fd: int, info: os.stat_result, content: bytes):
        #: the path it was named by, for messages
        self.path = path
        self.fd = fd
        #: fstat of `fd`
        self.info = info
        self.content = content

    @property
    def exec_path(self) -> str:
        """The path that runs this very file in a child that inherited `fd` (subprocess pass_fds)."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ScriptFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Refused(Exception):
    """A problem after which nothing more of the file may be read or judged."""


def script_names(directory: Path, owner: int | None = None, limit: int | None = None) -> list[Path]:
    """The scripts of `directory` in run order (lexical, like run-parts).

    Hidden files and editor or package leftovers (`~`, `.bak`, `.orig`,
    `.dpkg-*`, `.rpmsave`, `.rpmnew`, `.disabled`) are not scripts. With
    `owner` (a user's hook directory), the directory is reached the way
    `open_script` reaches a hook, no link that the user controls is
    followed, and it is listed through its descriptor; with `limit`, a
    directory of more entries is not listed at all (root would sort every
    name a user made).

    Raises:
        OSError: the directory cannot be reached or listed (strerror says why).
    """
    skip = re.compile(r"^\.|~$|\.(bak|orig|disabled|rpmsave|rpmnew|dpkg-[a-z]+)$")
    try:
        if owner is None:
            names = _entry_names(directory, limit)
        else:
            fd = _open_dir(os.path.abspath(directory), owner, [], str(directory))[0]
            try:
                names = _entry_names(fd, limit)
            finally:
                os.close(fd)
    except FileNotFoundError:
        return []
    except _Refused as refusal:
        raise OSError(errno.EACCES, str(refusal), str(directory)) from None
    return [Path(directory) / name for name in sorted(names) if not skip.search(name)]


def _entry_names(directory: Path | int, limit: int | None) -> list[str]:
    names = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if limit is not None and len(names) == limit:
                raise OSError(errno.E2BIG, f"more than {limit} entries (expected at most {limit})", str(directory))
            names.append(entry.name)
    return names


def validate_dir(directory: Path, owner: int = 0, shellcheck: bool = True) -> dict[Path, list[Problem]]:
    """Problems of every script in `directory`, by script, in run order."""
    return {path: validate_script(path, owner, shellcheck) for path in script_names(directory)}


def validate_script(path: Path, owner: int = 0, shellcheck: bool = True) -> list[Problem]:
    """Every problem of one script; an empty list means it may run.

    `owner` is the uid that must own it: root (0) for admin scripts, the job's
    user for user hooks.
    """
    return VerdictCache(owner, shellcheck).problems(path)


def open_script(path: Path, owner: int = 0) -> tuple[ScriptFile | None, list[Problem]]:
    """Reach and open `path` under the rules above: (the open file, or None, and the problems of the file itself).

    `owner` 0 means an admin script: its directories must be root's. Any
    other uid means that user's hook: its directories may be root's or the
    user's, it may not be a link, and it is not read at all unless the user
    owns it. None comes back when the file must not be read: it cannot be
    reached under the rules, is not a regular file, is too large, or is a
    user hook someone else owns. The caller closes the ScriptFile.
    """
    name = str(path)
    problems: list[Problem] = []
    try:
        fd = _open_file(os.path.abspath(name), owner, problems, name)
    except FileNotFoundError:  # a directory on the way (or a link's) is missing
        return None, _unique(problems + [Problem(name, None, "no such file (a dangling link?)")])
    except _Refused as refusal:
        return None, _unique(problems + [Problem(name, None, str(refusal))])
    except OSError as err:
        return None, _unique(problems + [Problem(name, None, f"cannot read: {err.strerror or err}")])
    try:
        info = os.fstat(fd)
        refusal = _file_problems(name, info, _others_may_write(info, fd), owner, problems)
        content = b"" if refusal else _read(fd)
        if not refusal and len(content) > MAX_SCRIPT_SIZE:
            refusal = _too_large(len(content))
    except OSError as err:
        refusal = f"cannot read: {err.strerror}"
    if refusal:
        os.close(fd)
        return None, _unique(problems + [Problem(name, None, refusal)])
    return ScriptFile(name, fd, info, content), _unique(problems)


def _file_problems(name: str, info: os.stat_result, writable: bool, owner: int, problems: list[Problem]) -> str:
    """Add what is wrong with the file's owner and mode to `problems`; returns why it must not even be read."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != owner:
        if owner:  # someone else's file in a user's hook directory: not theirs to have root read
            return f"owned by uid {info.st_uid} (expected the job's user, uid {owner})"
        problems.append(Problem(name, None, f"owned by uid {info.st_uid} (expected {owner}): chown {owner} {name}"))
    if writable:
        problems.append(Problem(name, None, f"mode {stat.S_IMODE(info.st_mode):04o} lets group or others "
                                f"change it: chmod go-w {name}"))
    if not info.st_mode & stat.S_IXUSR:
        problems.append(Problem(name, None, f"not executable: chmod u+x {name}"))
    if info.st_size > MAX_SCRIPT_SIZE:
        return _too_large(info.st_size)
    return ""


def _too_large(size: int) -> str:
    return f"{size} bytes (expected at most {MAX_SCRIPT_SIZE}): not read"


def _read(fd: int) -> bytes:
    """At most MAX_SCRIPT_SIZE + 1 bytes of `fd`: one more than allowed says it is too large (it grew)."""
    chunks, total = [], 0
    while total <= MAX_SCRIPT_SIZE:
        chunk = os.pread(fd, MAX_SCRIPT_SIZE + 1 - total, total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _unique(problems: list[Problem]) -> list[Problem]:
    """`problems` without repeats (a link's target shares the directories of its link)."""
    return list(dict.fromkeys(problems))


# -- reaching a file one directory at a time --------------------------------------------------


def _open_file(path: str, owner: int, problems: list[Problem], name: str) -> int:
    """The descriptor of script `path` (absolute), reached without a link the rules forbid.

    An admin script's link is followed, through directories judged like
    its own, only while it stays inside the script's directory; a user
    hook's is refused. Raises _Refused, or FileNotFoundError for a missing directory.
    """
    directory, base = os.path.split(path)
    dir_fd, home = _open_dir(directory, owner, problems, name)
    where = home
    try:
        for _ in range(_MAX_LINKS):
            info = _lstat(base, dir_fd)
            if not stat.S_ISLNK(info.st_mode):
                break
            if owner:
                raise _Refused(_USER_LINK)
            target = os.path.join(where, os.readlink(base, dir_fd=dir_fd))
            os.close(dir_fd)
            dir_fd = -1
            dir_fd, where = _open_dir(os.path.dirname(target), owner, problems, name)
            base = os.path.basename(target)
            if not _inside(where, home):
                raise _Refused(f"a link to {os.path.join(where, base)}, outside {home}: a script may link only to a "
                               "file in its own directory")
        else:
            raise _Refused("too many levels of symbolic links")
        if not stat.S_ISREG(info.st_mode):
            raise _Refused("not a regular file")
        try:
            return os.open(base, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as err:
            if err.errno == errno.ELOOP:  # swapped for a link since the lstat
                raise _Refused(_USER_LINK if owner else "became a symbolic link while it was checked") from None
            raise _Refused(f"cannot read: {err.strerror}") from None
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)


def _lstat(base: str, dir_fd: int) -> os.stat_result:
    try:
        return os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise _Refused("no such file (a dangling link?)") from None
    except OSError as err:
        raise _Refused(f"cannot read: {err.strerror}") from None


def _inside(where: str, top: str) -> bool:
    return where == top or where.startswith(top.rstrip("/") + "/")


def _open_dir(path: str, owner: int, problems: list[Problem], name: str) -> tuple[int, str]:
    """Open directory `path` (absolute) one component at a time: (its descriptor, its real path).

    Every directory on the real path is judged on its own descriptor and
    what is wrong is added to `problems`: it must be owned by root or
    `owner` and not writable by group or others (a read-only mount is
    writable by no one, whatever its mode). A sticky ancestor (/tmp,
    /var/tmp) may be writable by all: in a sticky directory only an entry's
    owner (or root) can rename or remove it, and the entry below is judged
    as well, so nobody else can swap it; the directory holding the script
    gets no such exception, as anyone could add a file to it. A link is
    followed only in a directory that root alone can change.

    Raises:
        FileNotFoundError: a component is missing (to a listing, an empty directory).
        _Refused: a component is not a directory, or a link the rules do not follow.
    """
    chain: list[tuple[int, str, os.stat_result]] = []
    try:
        root = os.open("/", _DIR_FLAGS)
        chain.append((root, "/", os.fstat(root)))
        pending = list(reversed(Path(path).parts[1:]))
        links = 0
        while pending:
            part = pending.pop()
            fd, where, info = chain[-1]
            if part == "..":
                if len(chain) > 1:
                    os.close(chain.pop()[0])
                continue
            here = os.path.join(where, part)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as err:
                target = _link_target(part, fd)
                if target is None:
                    raise _Refused(f"cannot reach directory {here}: {err.strerror}") from None
                links += 1
                if links > _MAX_LINKS:
                    raise _Refused(f"cannot reach directory {here}: too many levels of symbolic links") from None
                if not _root_only(info, fd):
                    raise _Refused(f"{here} is a symbolic link in {where}, which uid {info.st_uid} or others can "
                                   "change: links are followed only where root alone could have made them") from None
                if target.startswith("/"):
                    for fd_, _, _ in chain[1:]:
                        os.close(fd_)
                    del chain[1:]
                pending.extend(reversed([p for p in Path(target).parts if p != "/"]))
                continue
            chain.append((child, here, os.fstat(child)))
        for index, (fd, where, info) in enumerate(chain):
            problems += _dir_problems(name, where, info, _others_may_write(info, fd), owner,
                                      last=index == len(chain) - 1)
        fd, where, _ = chain.pop()
        return fd, where
    finally:
        for fd, _, _ in chain:
            os.close(fd)


def _link_target(part: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(part, dir_fd=dir_fd)
    except OSError:
        return None


def _root_only(info: os.stat_result, fd: int) -> bool:
    return info.st_uid == 0 and not _others_may_write(info, fd)


def _others_may_write(info: os.stat_result, fd: int) -> bool:
    """Group or others may change it: its mode says so, and it is not on a read-only mount.

    A Kubernetes ConfigMap volume's directory is mode 0777, on a mount that
    is always read-only: no one but root (remounting it) can change it.
    """
    if not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    try:
        return not os.fstatvfs(fd).f_flag & os.ST_RDONLY
    except OSError:
        return True


def _dir_problems(name: str, where: str, info: os.stat_result, writable: bool, owner: int,
                  last: bool) -> list[Problem]:
    found = []
    if info.st_uid not in (0, owner):
        expected = "0" if owner == 0 else f"0 or {owner}"
        found.append(Problem(name, None, f"directory {where} is owned by uid {info.st_uid} (expected {expected}): "
                             f"chown {owner} {where}"))
    sticky_ancestor = not last and info.st_mode & stat.S_ISVTX
    if writable and not sticky_ancestor:
        found.append(Problem(name, None, f"directory {where} is writable by group or others: chmod go-w {where}"))
    return found


# -- the content: shebang, interpreter, syntax ----------------------------------------------------


def _interpreter(name: str, content: bytes) -> tuple[list[str], Problem | None]:
    """The programs the shebang runs: [the one the kernel runs] or [env, the one env finds in CLEAN_PATH]."""
    first = content.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return [], Problem(name, 1, "no shebang (#!/bin/sh, #!/bin/bash, #!/usr/bin/python3 ...) on the "
                           "first line: the kernel cannot run it")
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return [], Problem(name, 1, "empty shebang")
    program = words[0]
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return [], Problem(name, 1, f"interpreter {program} does not exist or is not executable")
    if Path(program).name == "env" and len(words) > 1:
        found = shutil.which(words[-1], path=CLEAN_PATH)
        if not found:
            return [], Problem(name, 1, f"interpreter {words[-1]!r} (via env) is not in PATH")
        return [program, found], None
    return [program], None


def _untrusted(name: str, program: str) -> list[Problem]:
    """Why `program` is not root's alone (file, real path and directories), as problems on line 1."""
    found: list[Problem] = []
    try:
        fd = _open_program(os.path.abspath(program), found, name)
    except FileNotFoundError:
        return [Problem(name, 1, f"interpreter {program} does not exist or is not executable")]
    except _Refused as refusal:
        return [Problem(name, 1, f"interpreter {program}: {refusal}")]
    try:
        info = os.fstat(fd)
        writable = _others_may_write(info, fd)
    finally:
        os.close(fd)
    found = [Problem(name, 1, f"interpreter {program}: {p.message}") for p in found]
    if info.st_uid != 0:
        found.append(Problem(name, 1, f"interpreter {program} is owned by uid {info.st_uid} (expected 0): a script "
                             "run as root must not name a program someone else can change"))
    if writable:
        found.append(Problem(name, 1, f"interpreter {program} has mode {stat.S_IMODE(info.st_mode):04o}, which "
                             "lets group or others change it"))
    return _unique(found)


def _open_program(path: str, problems: list[Problem], name: str) -> int:
    """An O_PATH descriptor of the file the kernel runs for `path`, links followed only in root's directories."""
    for _ in range(_MAX_LINKS):
        directory, base = os.path.split(path)
        dir_fd, where = _open_dir(directory, 0, problems, name)
        try:
            info = _lstat(base, dir_fd)
            if not stat.S_ISLNK(info.st_mode):
                if not stat.S_ISREG(info.st_mode):
                    raise _Refused("not a regular file")
                return os.open(base, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            directory_info = os.fstat(dir_fd)
            if not _root_only(directory_info, dir_fd):
                raise _Refused(f"a symbolic link in {where}, which uid {directory_info.st_uid} or others can change")
            path = os.path.join(where, os.readlink(base, dir_fd=dir_fd))
        finally:
            os.close(dir_fd)
    raise _Refused("too many levels of symbolic links")


class VerdictCache:
    """Syntax verdicts by content: each version of a script is syntax-checked once.

    Only the costly part is kept (the `-n` run, the compiler, shellcheck), by
    path, content hash and interpreter; the file, its directories and its
    interpreter are judged again at every call, so a chmod, a chown or a
    changed directory is seen at once. `owner` is the uid that must own the
    scripts (0: admin scripts); a user's hooks are opened and judged as
    files, but not syntax-checked (see `_content_problems`).
    """

    def __init__(self, owner: int = 0, shellcheck: bool = False):
        self.owner = owner
        self.shellcheck = shellcheck
        self._verdicts: dict[tuple, list[Problem]] = {}

    def problems(self, path: Path) -> list[Problem]:
        """Every problem of the script at `path` (validate_script's)."""
        script, problems = self.open(path)
        if script is not None:
            script.close()
        return problems

    def open(self, path: Path) -> tuple[ScriptFile | None, list[Problem]]:
        """Open and check `path`: (the file to run, or None when it must not even be read; every problem).

        Raises:
            OSError, subprocess.SubprocessError: a syntax checker could not be run.
        """
        script, problems = open_script(path, self.owner)
        if script is not None:
            try:
                problems = problems + self._content_problems(script)
            except BaseException:
                script.close()
                raise
        return script, problems

    def _content_problems(self, script: ScriptFile) -> list[Problem]:
        programs, problem = _interpreter(script.path, script.content)
        if problem:
            return [problem]
        if self.owner != 0:
            # A user's hook is not syntax-checked at all: a checker running as the user outside the hook's
            # cgroup could be ptraced by the user's other processes into forking out of reach, and one
            # running as root would run what the user names. A broken hook fails when it runs, in its cgroup.
            return []
        untrusted = [p for program in programs for p in _untrusted(script.path, program)]
        if untrusted:
            return untrusted  # an admin script must not name an interpreter that others can change
        # hash() is SipHash with a per-process key: no one can craft a collision, and unlike hashlib it does
        # not load libcrypto (3.7 MB of the node agent, which validates the scripts at its start)
        key = (script.path, len(script.content), hash(script.content), programs[-1])
        if key not in self._verdicts:
            self._verdicts[key] = self._syntax(script, programs[-1])
        return self._verdicts[key]

    def _syntax(self, script: ScriptFile, interpreter: str) -> list[Problem]:
        base = Path(interpreter).name
        problems = []
        if base in _SHELLS:
            problems = _shell_syntax(script, interpreter)
            if self.shellcheck and not any(p.line for p in problems):
                problems += _shellcheck(script)
        elif base.startswith("python"):
            problems = _python_syntax(script, interpreter)
        return problems


def _check(argv: list[str], script: ScriptFile) -> subprocess.CompletedProcess:
    """Run one syntax checker on the open script (never by its path), in a clean environment."""
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                          timeout=_SYNTAX_TIMEOUT, cwd="/", env={"PATH": CLEAN_PATH, "LANG": "C.UTF-8"},
                          pass_fds=(script.fd,))


def _shell_syntax(script: ScriptFile, interpreter: str) -> list[Problem]:
    base, name = Path(interpreter).name, script.path
    try:
        result = _check([interpreter, "-n", script.exec_path], script)
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


def _python_syntax(script: ScriptFile, interpreter: str) -> list[Problem]:
    name = script.path
    try:
        result = _check([interpreter, "-I", "-S", "-c", _PYTHON_CHECK, script.exec_path, name], script)
    except subprocess.TimeoutExpired:
        return [Problem(name, None, f"python compile did not finish within {_SYNTAX_TIMEOUT:g}s")]
    if result.returncode == 0:
        return []
    line, _, message = result.stdout.strip().partition("\t")
    if not line.isdigit():
        return [Problem(name, None, f"python: cannot check it: {(result.stderr or result.stdout).strip()[-500:]}")]
    if int(line):
        return [Problem(name, int(line), f"python syntax: {message}")]
    return [Problem(name, None, f"python: {message}")]


def _shellcheck(script: ScriptFile) -> list[Problem]:
    program = shutil.which("shellcheck")
    if not program:
        return []
    try:
        result = subprocess.run([program, "--format=gcc", "-"], input=script.content, capture_output=True,
                                timeout=_SYNTAX_TIMEOUT)
    except subprocess.TimeoutExpired:
        return []
    problems = []
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split(":", 4)  # -:line:column: severity: message
        if len(parts) == 5 and parts[1].isdigit():
            problems.append(Problem(script.path, int(parts[1]), f"shellcheck: {parts[4].strip()}", "warning"))
    return problems

"""`slurm-ext web ...`: serve the cluster page; add an operator's token; hash the plain tokens of a token file.

Every slurm-ext command builds its parser from this module: it imports only what argparse needs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from slurm_ext import config

__all__ = ["add_commands"]

#: what --listen takes (web.listen's own pattern)
_LISTEN = re.compile(r"^[A-Za-z0-9.:\[\]_-]+:\d{1,5}$")


def _serve(args: argparse.Namespace) -> int:
    from slurm_ext import log
    from .server import serve
    if args.listen is not None and not _LISTEN.match(args.listen):
        print(f"slurm-ext: error: --listen {args.listen!r}: expected HOST:PORT, such as 127.0.0.1:9820",
              file=sys.stderr)
        return 2
    log.setup(config.load(args.config).log, "web")
    return serve(args.config, args.listen)


def _token_file(args: argparse.Namespace) -> str | None:
    """The token file a command works on (--file, or web.token_file), or None after saying why not."""
    if os.geteuid() != 0:
        print("slurm-ext: error: run it as root: the page takes tokens only from a file of root's", file=sys.stderr)
        return None
    path = args.file or config.load(args.config).web.token_file
    if not path:
        print("slurm-ext: error: web.token_file is empty: set it, or give --file", file=sys.stderr)
    return path or None


def _open_token_file(path: str, flags: int) -> int:
    """The token file opened with `flags` (never through a link), checked root's and readable by no one else.

    Raises:
        OSError: it cannot be opened (a link: ELOOP), or it is not root's only (the message names it)."""
    import errno
    import stat
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError("a symbolic link: refused (put the file itself there); nothing written") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IXGRP
                                                                              | stat.S_IRWXO):
        os.close(fd)
        raise OSError(f"owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}: it must be a file of "
                      f"root's that no one else may read but the page's group (chown root:slurm-ext-web {path}; "
                      f"chmod 640 {path}); nothing written")
    return fd


def _page_group(args: argparse.Namespace) -> int | None:
    """The group of web.user, which may read the token file (hashes only: root:<group> 0640), so that the page
    running as that user reads it in place and sees each change at once; None when the page runs as root or its
    user is not on this host (the file is then root's alone, 0600)."""
    import pwd
    user = config.load(args.config).web.user
    if user == "root":
        return None
    try:
        return pwd.getpwnam(user).pw_gid
    except KeyError:
        print(f"slurm-ext: warning: web.user {user} is not on this host: the token file stays root's alone (0600), "
              f"which the page running as {user} cannot read (useradd --system --no-create-home --shell "
              f"/usr/sbin/nologin {user}, then run this again)", file=sys.stderr)
        return None


def _share_with_page(path: str, fd: int | None, group: int | None) -> None:
    """Make the token file root:<the page's group> 0640 (group None: leave it root's alone)."""
    if group is None:
        return
    if fd is not None:
        os.fchown(fd, 0, group)
        os.fchmod(fd, 0o640)
    else:
        os.chown(path, 0, group, follow_symlinks=False)
        os.chmod(path, 0o640)


def _add_token(args: argparse.Namespace) -> int:
    """A new random token for USER, its hash appended to web.token_file (root's, readable by web.user's group:
    root:slurm-ext-web 0640; root's alone, 0600, when the page runs as root); the token printed once: the file
    never holds it."""
    import secrets
    from .auth import _USER, token_hash
    path = _token_file(args)
    if path is None:
        return 1
    if not _USER.match(args.user):
        print(f"slurm-ext: error: {args.user!r} is not a user name (letters, digits, . _ @ + -)", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(32)
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    try:
        fd = _open_token_file(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    except OSError as err:
        print(f"slurm-ext: error: web.token_file {path}: {err.strerror or err}", file=sys.stderr)
        return 1
    try:
        size = os.fstat(fd).st_size
        ends_open = size and os.pread(fd, 1, size - 1) != b"\n"  # a line edited by hand
        os.write(fd, (("\n" if ends_open else "") + f"{args.user} {token_hash(token)}\n").encode())
        group = _page_group(args)
        _share_with_page(path, fd, group)
    finally:
        os.close(fd)
    print(token)
    print(f"added the hash of a token for {args.user} to {path}; give the token to them now: it is not kept "
          "anywhere (the page keeps it in the tab only)" + ("" if group is None else f"; the file holds hashes "
          f"only and is readable by the page's group (gid {group}, web.user), root:{group} 0640"), file=sys.stderr)
    return 0


def _hash_tokens(args: argparse.Namespace) -> int:
    """Replace every plain `USER TOKEN` line of the token file by `USER sha256:HASH`: the tokens stay the same."""
    from slurm_ext.fileio import atomic_write
    from .auth import hashed_lines
    path = _token_file(args)
    if path is None:
        return 1
    try:
        fd = _open_token_file(path, os.O_RDONLY)
    except OSError as err:
        print(f"slurm-ext: error: web.token_file {path}: {err.strerror or err}", file=sys.stderr)
        return 1
    try:
        with os.fdopen(fd, "rb", closefd=False) as file:
            text = file.read().decode(errors="replace")
    finally:
        os.close(fd)
    hashed, count = hashed_lines(text)
    if count:
        group = _page_group(args)
        atomic_write(path, hashed, mode=0o600)
        _share_with_page(path, None, group)
    print(f"{path}: {count} token(s) in plain text replaced by their hash" if count else
          f"{path}: no token in plain text", file=sys.stderr)
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `web` to the core CLI."""
    web = commands.add_parser(
        "web", help="the cluster page: node states, GPU usage, one timeline, health checks, repairs",
        description="Serves the page on web.listen (127.0.0.1:9820 by default). Viewing needs nothing; running a "
                    "node's checks and approving or rejecting its repair need an operator: a token of "
                    "web.token_file, or a user named by a trusted reverse proxy (web.proxy_user_header).")
    web.add_argument("--listen", metavar="HOST:PORT", help="instead of web.listen")
    web.set_defaults(func=_serve)
    actions = web.add_subparsers(dest="verb", metavar="ACTION")
    add = actions.add_parser("add-token", help="make a random token for an operator, append its hash to "
                                               "web.token_file and print it (once: only its hash is kept); the "
                                               "file is made root:<web.user's group> 0640, which the page reads "
                                               "as that user (root's alone, 0600, with web.user root)")
    add.add_argument("user", help="the operator's user name, as the repair history records it")
    add.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    add.set_defaults(func=_add_token)
    hashing = actions.add_parser("hash-tokens", help="replace each token kept in plain text in web.token_file by "
                                                     "its hash (a file written before tokens were hashed): the "
                                                     "tokens stay valid")
    hashing.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    hashing.set_defaults(func=_hash_tokens)

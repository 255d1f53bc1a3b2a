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
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.close(fd)
        raise OSError(f"owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}: it must be a file of "
                      f"root's that no one else may read (chown root:root {path}; chmod 600 {path}); nothing written")
    return fd


def _add_token(args: argparse.Namespace) -> int:
    """A new random token for USER, its hash appended to web.token_file (made root's, 0600, if new); the token
    printed once: the file never holds it."""
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
    finally:
        os.close(fd)
    print(token)
    print(f"added the hash of a token for {args.user} to {path}; give the token to them now: it is not kept "
          "anywhere (the page keeps it in the tab only)", file=sys.stderr)
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
        atomic_write(path, hashed, mode=0o600)
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
                                               "web.token_file and print it (once: only its hash is kept)")
    add.add_argument("user", help="the operator's user name, as the repair history records it")
    add.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    add.set_defaults(func=_add_token)
    hashing = actions.add_parser("hash-tokens", help="replace each token kept in plain text in web.token_file by "
                                                     "its hash (a file written before tokens were hashed): the "
                                                     "tokens stay valid")
    hashing.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    hashing.set_defaults(func=_hash_tokens)

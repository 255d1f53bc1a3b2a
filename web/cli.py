"""`slurm-ext web ...`: serve the cluster page; add an operator's token.

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


def _add_token(args: argparse.Namespace) -> int:
    """A new random token for USER, appended to web.token_file (made root's, 0600, if new); printed once."""
    import secrets
    import stat
    from .auth import _USER
    if os.geteuid() != 0:
        print("slurm-ext: error: run it as root: the page takes tokens only from a file of root's", file=sys.stderr)
        return 1
    loaded = config.load(args.config)
    path = args.file or loaded.web.token_file
    if not path:
        print("slurm-ext: error: web.token_file is empty: set it, or give --file", file=sys.stderr)
        return 2
    if not _USER.match(args.user):
        print(f"slurm-ext: error: {args.user!r} is not a user name (letters, digits, . _ @ + -)", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(32)
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        info = os.fstat(fd)
        if info.st_uid != 0 or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"slurm-ext: error: {path} is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}:"
                  " it must be root's and readable by no one else; nothing written", file=sys.stderr)
            return 1
        ends_open = info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n"  # a line edited by hand
        os.write(fd, (("\n" if ends_open else "") + f"{args.user} {token}\n").encode())
    finally:
        os.close(fd)
    print(token)
    print(f"added a token for {args.user} to {path}; give it to them once (the page keeps it in the tab only)",
          file=sys.stderr)
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
    add = actions.add_parser("add-token", help="make a random token for an operator, append it to web.token_file "
                                               "and print it")
    add.add_argument("user", help="the operator's user name, as the repair history records it")
    add.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    add.set_defaults(func=_add_token)

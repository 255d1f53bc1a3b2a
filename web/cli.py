"""`slurm-ext web ...`: serve the cluster page; add, list and revoke operators' tokens; hash the plain tokens of a
token file.

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


def _one_at_a_time(command):
    """`command` (add-token, revoke-token, hash-tokens: a read, then a write of the whole file) holding an exclusive
    lock on `<token file>.lock`: two at once each wrote what it read, and one's token or revocation was lost."""
    import fcntl
    import functools

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        path = _token_file(args)
        if path is None:
            return 1
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        try:
            lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as err:
            print(f"slurm-ext: error: web.token_file's lock {path}.lock: {err.strerror or err}", file=sys.stderr)
            return 1
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return command(args)
        finally:
            os.close(lock)
    return run


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


def _user_named(args: argparse.Namespace) -> str | None:
    """The operator's user name the command was given, or None after saying what to pass (`web add-token $USER`
    where USER is unset gives none)."""
    from .auth import _USER
    user = (args.user or "").strip()
    if not user:
        print(f"slurm-ext: error: web {args.verb} needs the operator's user name, as the repair history records it: "
              f"`slurm-ext web {args.verb} alice` (an unset or empty $USER gives none: write the name itself)",
              file=sys.stderr)
        return None
    if not _USER.match(user):
        print(f"slurm-ext: error: {user!r} is not a user name (letters, digits, . _ @ + -)", file=sys.stderr)
        return None
    return user


def _read(fd: int) -> str:
    """The text of the opened token file."""
    with os.fdopen(fd, "rb", closefd=False) as file:
        file.seek(0)
        return file.read().decode(errors="replace")


def _rewrite(path: str, text: str, group: int | None) -> None:
    """Replace the token file by `text`, atomically, root's and shared with the page's group (`_page_group`) as
    add-token makes it."""
    from slurm_ext.fileio import atomic_write
    atomic_write(path, text, mode=0o600)
    _share_with_page(path, None, group)


def _emitter(args: argparse.Namespace):
    """The journal's `emit` for the web component: who made or revoked which token is on record."""
    from slurm_ext import events
    return events.emitter(config.load(args.config).node.state_dir, "web")


def _prints(lines) -> str:
    return ", ".join(line.fingerprint for line in lines)


def _add_token(args: argparse.Namespace) -> int:
    """A new random token for USER, its hash appended to web.token_file (root's, readable by web.user's group:
    root:slurm-ext-web 0640; root's alone, 0600, when the page runs as root); the token printed once: the file
    never holds it. A user who has a token already gets another only when asked: --another keeps theirs,
    --replace revokes them (an operator who asks again has most often lost the first)."""
    import secrets
    from datetime import datetime, timezone
    from .tokenfile import new_line, token_lines, without
    user = _user_named(args)
    if user is None:
        return 2
    path = _token_file(args)
    if path is None:
        return 1
    token = secrets.token_urlsafe(32)
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    try:
        fd = _open_token_file(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    except OSError as err:
        print(f"slurm-ext: error: web.token_file {path}: {err.strerror or err}", file=sys.stderr)
        return 1
    line = new_line(user, token, datetime.now(timezone.utc), args.role)
    try:
        text = _read(fd)
        theirs = [found for found in token_lines(text) if found.user == user]
        if theirs and not (args.another or args.replace):
            print(f"slurm-ext: error: {user} already has {len(theirs)} token(s) (fingerprint {_prints(theirs)}; "
                  "`slurm-ext web list-tokens`): pass --replace to revoke them and make a new one, or --another to "
                  "keep them and add one more; nothing written", file=sys.stderr)
            return 1
        group = _page_group(args)
        if args.replace and theirs:
            kept, _ = without(text, lambda found: found.user == user)
            _rewrite(path, kept + line, group)
        else:
            ends_open = text and not text.endswith("\n")  # a line edited by hand
            os.write(fd, (("\n" if ends_open else "") + line).encode())
            _share_with_page(path, fd, group)
    finally:
        os.close(fd)
    [made] = token_lines(line)
    emit = _emitter(args)
    if args.replace and theirs:
        emit("web-token-revoked", f"revoked {len(theirs)} token(s) of {user} (fingerprint {_prints(theirs)}), "
                                  "replaced by a new one", user=user, fingerprints=[t.fingerprint for t in theirs])
    emit("web-token-added", f"added a token for {user}, role {made.role} (fingerprint {made.fingerprint})",
         user=user, fingerprint=made.fingerprint, role=made.role)
    print(token)
    print((f"revoked {len(theirs)} token(s) of {user} ({_prints(theirs)}); " if args.replace and theirs else "")
          + f"added the hash of a token for {user}, role {made.role} (fingerprint {made.fingerprint}) to {path}; give the token to "
          "them now: it is not kept anywhere (the page keeps it in the tab only)" + ("" if group is None else
          f"; the file holds hashes only and is readable by the page's group (gid {group}, web.user), "
          f"root:{group} 0640"), file=sys.stderr)
    return 0


def _opened_text(path: str) -> str | None:
    """The token file's text (opened as add-token checks it), or None after saying why not."""
    try:
        fd = _open_token_file(path, os.O_RDONLY)
    except OSError as err:
        print(f"slurm-ext: error: web.token_file {path}: {err.strerror or err}", file=sys.stderr)
        return None
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _list_tokens(args: argparse.Namespace) -> int:
    """Each token of the file: its user, when it was made, its fingerprint; never the token nor its hash."""
    from .tokenfile import token_lines
    path = _token_file(args)
    if path is None:
        return 1
    text = "" if not os.path.lexists(path) else _opened_text(path)
    if text is None:
        return 1
    lines = token_lines(text)
    width = max([4, *(len(line.user) for line in lines)])
    print(f"{'USER':<{width}}  {'ROLE':<8}  {'ADDED':<25}  FINGERPRINT")
    for line in lines:
        print(f"{line.user:<{width}}  {line.role:<8}  {line.added or '-':<25}  {line.fingerprint}")
    if not lines:
        print(f"{path}: no token (`slurm-ext web add-token USER` makes one)", file=sys.stderr)
    return 0


def _revoke_token(args: argparse.Namespace) -> int:
    """Remove USER's tokens (or the one of --fingerprint) from the file: the page refuses them from its next
    request on."""
    from .tokenfile import without
    user = _user_named(args)
    if user is None:
        return 2
    path = _token_file(args)
    if path is None:
        return 1
    text = _opened_text(path)
    if text is None:
        return 1
    fingerprint = (args.fingerprint or "").strip().lower()
    if args.fingerprint is not None and not re.fullmatch(r"[0-9a-f]{4,64}", fingerprint):
        print(f"slurm-ext: error: --fingerprint {args.fingerprint!r}: expected at least 4 of a fingerprint's hex "
              "digits, as `slurm-ext web list-tokens` shows it; nothing written", file=sys.stderr)
        return 2
    kept, revoked = without(text, lambda found: found.user == user and found.fingerprint.startswith(fingerprint))
    if not revoked:
        which = f" with fingerprint {fingerprint}" if fingerprint else ""
        print(f"slurm-ext: error: {user} has no token{which} in {path} (`slurm-ext web list-tokens` lists them); "
              "nothing written", file=sys.stderr)
        return 1
    _rewrite(path, kept, _page_group(args))
    emit = _emitter(args)
    emit("web-token-revoked", f"revoked {len(revoked)} token(s) of {user} (fingerprint {_prints(revoked)})",
         user=user, fingerprints=[t.fingerprint for t in revoked])
    print(f"revoked {len(revoked)} token(s) of {user} (fingerprint {_prints(revoked)}) in {path}: the page refuses "
          "them from its next request", file=sys.stderr)
    return 0


def _hash_tokens(args: argparse.Namespace) -> int:
    """Replace every plain `USER TOKEN` line of the token file by `USER sha256:HASH`: the tokens stay the same."""
    from .auth import hashed_lines
    path = _token_file(args)
    if path is None:
        return 1
    text = _opened_text(path)
    if text is None:
        return 1
    hashed, count = hashed_lines(text)
    if count:
        _rewrite(path, hashed, _page_group(args))
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
                                               "as that user (root's alone, 0600, with web.user root); for a user "
                                               "who has a token already, only with --another or --replace")
    add.add_argument("user", nargs="?", help="the operator's user name, as the repair history records it "
                                             "(required: there is no default)")
    add.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    add.add_argument("--role", choices=("viewer", "operator", "admin"), default="operator",
                     help="what the token may do on the page (default: operator: run checks, approve, reject)")
    again = add.add_mutually_exclusive_group()
    again.add_argument("--another", action="store_true", help="the user has a token already: keep it and add one "
                                                               "more (without this or --replace, refused)")
    again.add_argument("--replace", action="store_true", help="the user has a token already: revoke it and make "
                                                               "a new one")
    add.set_defaults(func=_one_at_a_time(_add_token))
    listing = actions.add_parser("list-tokens", help="each token of web.token_file: its user, when it was made, "
                                                     "its fingerprint (the first 12 hex digits of its SHA-256); "
                                                     "never the token")
    listing.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    listing.set_defaults(func=_list_tokens)
    revoke = actions.add_parser("revoke-token", help="remove a user's tokens (or the one of --fingerprint) from "
                                                     "web.token_file: the page refuses them from its next request; "
                                                     "recorded in the journal (web-token-revoked)")
    revoke.add_argument("user", nargs="?", help="the operator whose tokens to revoke")
    revoke.add_argument("--fingerprint", metavar="HEX", help="only the token of this fingerprint (as "
                                                             "list-tokens shows it, or its start)")
    revoke.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    revoke.set_defaults(func=_one_at_a_time(_revoke_token))
    hashing = actions.add_parser("hash-tokens", help="replace each token kept in plain text in web.token_file by "
                                                     "its hash (a file written before tokens were hashed): the "
                                                     "tokens stay valid")
    hashing.add_argument("--file", metavar="PATH", help="instead of web.token_file")
    hashing.set_defaults(func=_one_at_a_time(_hash_tokens))

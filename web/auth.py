"""Who may act on the cluster page, and the CSRF tokens its POSTs carry.

Viewing needs nothing. An operation (run a node's health checks, approve or
reject its repair) needs an operator, named in the repair history:
- `Authorization: Bearer TOKEN`, matching a line `USER TOKEN` of
  web.token_file. The file must be root's and readable by no one else; a
  file that is not is refused as a whole, with the reason, rather than
  trusted half. It is read again when it changes, so a revoked token stops
  working at the next request, without a restart.
- or the user a trusted reverse proxy names in web.proxy_user_header
  (oauth2-proxy, mod_auth_openidc: the usual way to put OIDC in front),
  believed only when that header is configured and only from an address in
  web.trusted_proxies. The same header from any other address refuses the
  request: a forged name is never taken for a missing one.
and a CSRF token this server issued (`Csrf`), younger than its maximum age:
a page of another site that makes the browser POST here (with a proxy's
session cookie) cannot read one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.errors import SlurmExtError

__all__ = ["RequestRefused", "Operator", "Tokens", "Csrf", "operator_of", "MIN_TOKEN"]

#: shortest token accepted: a guessable token is a shared password
MIN_TOKEN = 20
#: a user name as the history keeps it (a proxy may pass an email address)
_USER = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")


class RequestRefused(SlurmExtError):
    """An operation the page will not do for this request; `status` is the HTTP answer (401, 403)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Operator:
    user: str
    #: token or proxy
    via: str


class Tokens:
    """The operators' token file, read again whenever it changes on disk."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._users: dict[str, str] = {}
        #: why the file gives no operator (missing, not root's, readable by others, no valid line), else ""
        self.problem = "" if path else "web.token_file is empty: no tokens"

    def check(self) -> str:
        """Why the file gives no operator now ("" when it gives some): read again if it changed."""
        if not self.path:
            return self.problem
        with self._lock:
            self._load()
            return self.problem

    def user_of(self, token: str) -> str | None:
        """The operator whose token this is, or None."""
        if not self.path:
            return None
        with self._lock:
            self._load()
            users = dict(self._users)
        found = None
        for known, user in users.items():  # every entry compared, in constant time each
            if hmac.compare_digest(known.encode(), token.encode(errors="replace")):
                found = user
        return found

    def _load(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError as err:
            self._seen, self._users = None, {}
            self.problem = f"web.token_file {self.path}: {err.strerror}"
            return
        identity = (info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode, info.st_uid)
        if identity == self._seen:
            return
        self._seen, self._users = identity, {}
        if info.st_uid != 0 or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            self.problem = (f"web.token_file {self.path}: owned by uid {info.st_uid} with mode "
                            f"{stat.S_IMODE(info.st_mode):04o}; it must be root's and readable by no one else "
                            f"(chown root:root {self.path}; chmod 600 {self.path}): its tokens are not used")
            return
        try:
            lines = Path(self.path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            self.problem = f"web.token_file {self.path}: {err}"
            return
        bad = []
        for number, line in enumerate(lines, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2 or not _USER.match(words[0]) or len(words[1]) < MIN_TOKEN:
                bad.append(number)
                continue
            self._users[words[1]] = words[0]
        self.problem = "" if self._users else f"web.token_file {self.path}: no `USER TOKEN` line"
        if bad:
            self.problem = (f"web.token_file {self.path}: line(s) {', '.join(map(str, bad))} ignored: expected "
                            f"`USER TOKEN`, a token of at least {MIN_TOKEN} characters")


def operator_of(headers, remote_addr: str, settings, tokens: Tokens) -> Operator:
    """The operator a request comes from.

    Raises:
        RequestRefused: no credentials (401), a token no one has (401), or a proxy header from an address that is not a
            trusted proxy (403); the message says which and what to do.
    """
    header = settings.proxy_user_header
    if header and headers.get(header) is not None:
        if remote_addr not in settings.trusted_proxies:
            raise RequestRefused(403, f"the {header} header came from {remote_addr}, which is not in "
                                      "web.trusted_proxies: refused (sign in through the proxy, or use an operator "
                                      "token)")
        user = headers.get(header, "").strip()
        if not _USER.match(user):
            raise RequestRefused(403, f"the proxy's {header} names no valid user ({user[:40]!r})")
        return Operator(user, "proxy")
    authorization = headers.get("Authorization", "")
    if authorization.startswith("Bearer "):
        user = tokens.user_of(authorization.removeprefix("Bearer ").strip())
        if user is None:
            raise RequestRefused(401, "this operator token is not known (revoked, or mistyped)"
                                      + (f"; {tokens.problem}" if tokens.problem else ""))
        return Operator(user, "token")
    how = ["an operator token (Authorization: Bearer, from web.token_file)"]
    if header:
        how.append(f"sign-in through the trusted proxy ({header})")
    raise RequestRefused(401, "an operation needs an authenticated operator: " + " or ".join(how)
                              + (f"; {tokens.problem}" if tokens.problem and not header else ""))


class Csrf:
    """Tokens `ISSUED.MAC`: the time it was issued and an HMAC of it under a secret of this server process, so
    a token outlives neither `max_age` nor a restart of the server (the page then fetches a new one)."""

    def __init__(self, max_age: float = 12 * 3600.0, secret: bytes | None = None, clock=time.time):
        self._secret = secret or secrets.token_bytes(32)
        self.max_age = max_age
        self._clock = clock

    def _mac(self, issued: str) -> str:
        return hmac.new(self._secret, issued.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        issued = str(int(self._clock()))
        return f"{issued}.{self._mac(issued)}"

    def check(self, token: str | None) -> None:
        """Raises RequestRefused (403): missing, not issued by this server (forged, or from before a restart), or
        stale; the message says to reload the page."""
        if not token:
            raise RequestRefused(403, "the request carries no CSRF token (X-CSRF-Token): reload the page")
        issued, _, mac = token.partition(".")
        if not (issued.isascii() and issued.isdigit()) or not hmac.compare_digest(self._mac(issued).encode(),
                                                                                  mac.encode(errors="replace")):
            raise RequestRefused(403, "the CSRF token was not issued by this server (forged, or the server restarted "
                                      "since): reload the page")
        if self._clock() - int(issued) > self.max_age:
            raise RequestRefused(403, f"the CSRF token is stale (older than {self.max_age / 3600:g} h): "
                                      "reload the page")

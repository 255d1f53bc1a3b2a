"""Who may act on the cluster page, and the CSRF tokens its POSTs carry.

Viewing needs nothing (unless web.viewing is signed-in: app.py). An operation
(run a node's health checks, approve or reject its repair) needs an operator
or an admin, named in the repair history: a person signed in with the page's
own OIDC sign-in (signin.py, session.py) with that role, or, for automation
and behind a proxy:
- `Authorization: Bearer TOKEN`, where a line `USER sha256:HASH [ROLE]` of
  web.token_file holds the token's SHA-256: the file keeps no token itself,
  so reading it (a backup, a copy) gives no operator's power. The file is a
  `secretfile.SecretFile` (root's, readable by no one else, never through a
  link); one that is not is refused as a whole, with the reason, rather than
  trusted half. It is read again when it changes, so a revoked token stops
  working at the next request, without a restart. A line with a token in
  plain text (the file's format before hashes) is not used: the log names
  the file and the command that hashes it in place (`slurm-ext web
  hash-tokens`).
- or the user a trusted reverse proxy names in web.proxy_user_header
  (oauth2-proxy, mod_auth_openidc: the usual way to put OIDC in front),
  believed only when that header is configured and only from an address in
  web.trusted_proxies, and, with web.proxy_secret_file, only beside the
  proxy's shared secret (`PROXY_SECRET_HEADER`). The same header from any
  other address, or without the secret, refuses the request: a forged name
  is never taken for a missing one.
and a CSRF token this server issued (`Csrf`), younger than its maximum age:
a page of another site that makes the browser POST here (with a proxy's
session cookie) cannot read one.

What is wrong with a file of secrets (its path, owner, mode, the lines it
ignores) goes to the log only: an anonymous caller learns that operations
need an operator, never how the server keeps them.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass

from slurm_ext.errors import SlurmExtError

from .secretfile import SecretFile, SecretFileError

__all__ = ["RequestRefused", "Operator", "TOKEN_ROLES", "Tokens", "ProxySecret", "Csrf", "operator_of", "token_hash",
           "hashed_lines", "MIN_TOKEN", "PROXY_SECRET_HEADER"]

log = logging.getLogger("web")

#: shortest token accepted: a guessable token is a shared password
MIN_TOKEN = 20
#: shortest shared secret of the proxy
MIN_PROXY_SECRET = 32
#: the header a trusted proxy sends its shared secret in (web.proxy_secret_file)
PROXY_SECRET_HEADER = "X-Slurm-Ext-Proxy-Secret"
#: how a token file names a token's hash
HASH_PREFIX = "sha256:"
#: a user name as the history keeps it (a proxy may pass an email address)
_USER = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
#: the roles a token line may name after its hash (the page's roles: web/session.py ROLES)
TOKEN_ROLES = ("viewer", "operator", "admin")
#: the migration of a file of plain tokens, named in its error
HASH_COMMAND = "slurm-ext web hash-tokens"


class RequestRefused(SlurmExtError):
    """An operation the page will not do for this request; `status` is the HTTP answer (401, 403). Its message is
    the caller's: it names no file of the server's."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Operator:
    """Who a request comes from: a person or an automation, named in the repair history by `user`."""

    user: str
    #: token, proxy or oidc
    via: str
    #: the page's role: viewer, operator or admin ("" for a person signed in whom no group maps: viewing only);
    #: a proxy's user is an operator (as before roles), a token's is its line's (operator when it names none)
    role: str = "operator"


def token_hash(token: str) -> str:
    """How the token file keeps `token`: `sha256:` and its SHA-256 in hex (a token is 32 random bytes: no salt nor
    slow hash is needed against guessing it back)."""
    return HASH_PREFIX + hashlib.sha256(token.encode(errors="replace")).hexdigest()


def hashed_lines(text: str) -> tuple[str, int]:
    """`text` of a token file with every `USER TOKEN` line in plain text made `USER sha256:HASH` (comments and
    other lines as they are), and how many were."""
    lines, count = [], 0
    for line in text.splitlines():
        content, sep, comment = line.partition("#")
        words = content.split()
        if len(words) == 2 and _USER.match(words[0]) and not words[1].startswith(HASH_PREFIX) \
                and len(words[1]) >= MIN_TOKEN:
            line = f"{words[0]} {token_hash(words[1])}" + (f" {sep}{comment}" if sep else "")
            count += 1
        lines.append(line)
    return "".join(f"{line}\n" for line in lines), count


class Tokens:
    """The operators' token file (`USER sha256:HASH [ROLE]` lines), read again whenever it changes on disk. Each
    token is tied to its line's USER, the identity the repair history names; ROLE (viewer, operator, admin) is
    operator when left out, so files of before roles keep working."""

    def __init__(self, path: str):
        self.path = path
        # the page as its own user reads the file of hashes through its group (root:slurm-ext-web 0640)
        self._file = SecretFile(path, "web.token_file", reader_group=os.getegid() if os.geteuid() else None) \
            if path else None
        self._lock = threading.Lock()
        self._content: bytes | None = None
        self._hashes: dict[bytes, str] = {}
        self._roles: dict[bytes, str] = {}
        #: why the file gives no operator, or ignores some of its lines ("" when all is well): for the log only
        self.problem = "" if path else "web.token_file is empty: no tokens"
        #: no token was made yet (the file is missing, or holds no line but comments): a fresh cluster, not a fault
        self.none_yet = not path
        self._logged = ""

    def usable(self) -> bool:
        """Whether the file gives some operator now (read again if it changed); what is wrong with it is `problem`,
        and in the log."""
        if self._file is None:
            return False
        with self._lock:
            self._load()
            return bool(self._hashes)

    def user_of(self, token: str) -> str | None:
        """The operator whose token this is, or None."""
        found = self.holder_of(token)
        return found[0] if found else None

    def holder_of(self, token: str) -> tuple[str, str] | None:
        """(user, role) of the token, or None."""
        if self._file is None:
            return None
        with self._lock:
            self._load()
            hashes, roles = dict(self._hashes), dict(self._roles)
        digest = hashlib.sha256(token.encode(errors="replace")).digest()
        found = None
        for known, user in hashes.items():  # every entry compared, in constant time each
            if hmac.compare_digest(known, digest):
                found = (user, roles.get(known, "operator"))
        return found

    def _load(self) -> None:
        try:
            content = self._file.read()
        except SecretFileError as err:
            self._content, self._hashes, self._roles, self.none_yet = None, {}, {}, err.kind == "missing"
            self._said(f"{err}: its tokens are not used")
            return
        if content is self._content:
            return  # unchanged: SecretFile gives the very same bytes
        self._content, self._hashes, self._roles = content, {}, {}
        self.none_yet = not any(line.split("#", 1)[0].strip() for line in content.decode(errors="replace").splitlines())
        bad, plain = [], []
        for number, line in enumerate(content.decode(errors="replace").splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) in (2, 3) and _USER.match(words[0]) and _HASH.match(words[1]) \
                    and (len(words) == 2 or words[2] in TOKEN_ROLES):
                digest = bytes.fromhex(words[1].removeprefix(HASH_PREFIX))
                self._hashes[digest] = words[0]
                self._roles[digest] = words[2] if len(words) == 3 else "operator"
            elif len(words) == 2 and _USER.match(words[0]) and len(words[1]) >= MIN_TOKEN:
                plain.append(number)
            else:
                bad.append(number)
        said = [] if self._hashes else [f"web.token_file {self.path}: no `USER sha256:HASH` line"]
        if plain:
            said.append(f"web.token_file {self.path}: line(s) {', '.join(map(str, plain))} hold a token in plain "
                        f"text, not used: run `{HASH_COMMAND}` to keep only their hashes (the tokens stay the same)")
        if bad:
            said.append(f"web.token_file {self.path}: line(s) {', '.join(map(str, bad))} ignored: expected `USER "
                        "sha256:HASH` (`slurm-ext web add-token USER` writes one)")
        self._said("; ".join(said))

    def _said(self, problem: str) -> None:
        """Keep `problem`, and log it once when it changes (the log is where an operator reads it)."""
        self.problem = problem
        if problem and problem != self._logged:
            log.warning("web: %s", problem)
        self._logged = problem


class ProxySecret:
    """The reverse proxy's shared secret (web.proxy_secret_file): what it sends in `PROXY_SECRET_HEADER`."""

    def __init__(self, path: str):
        self._file = SecretFile(path, "web.proxy_secret_file")
        self._logged = ""

    def matches(self, sent: str | None) -> bool:
        """Whether `sent` is the secret; False too when the file cannot be used (its problem logged)."""
        try:
            secret = self._file.read().strip()
            if len(secret) < MIN_PROXY_SECRET:
                raise SecretFileError(self._file.key, self._file.path, f"{len(secret)} bytes (expected at least "
                                      f"{MIN_PROXY_SECRET}: `openssl rand -hex 32`)")
        except SecretFileError as err:
            if str(err) != self._logged:
                log.warning("web: %s: no proxy user is believed", err)
            self._logged = str(err)
            return False
        self._logged = ""
        return sent is not None and hmac.compare_digest(secret, sent.strip().encode(errors="replace"))


def operator_of(headers, remote_addr: str, settings, tokens: Tokens, proxy_secret: ProxySecret | None = None
                ) -> Operator:
    """The operator a request comes from.

    Raises:
        RequestRefused: no credentials (401), a token no one has (401), or a proxy header from an address that is not a
            trusted proxy or without the proxy's secret (403); the message says which and what to do.
    """
    header = settings.proxy_user_header
    if header and headers.get(header) is not None:
        if remote_addr not in settings.trusted_proxies:
            raise RequestRefused(403, f"the {header} header came from {remote_addr}, which is not in "
                                      "web.trusted_proxies: refused (sign in through the proxy, or use an operator "
                                      "token)")
        if proxy_secret is not None and not proxy_secret.matches(headers.get(PROXY_SECRET_HEADER)):
            raise RequestRefused(403, f"the {header} header is not believed without the proxy's secret beside it "
                                      f"({PROXY_SECRET_HEADER}): missing, wrong, or not to be checked now (the page's "
                                      "log says why); sign in through the proxy, or use an operator token")
        user = headers.get(header, "").strip()
        if not _USER.match(user):
            raise RequestRefused(403, f"the proxy's {header} names no valid user ({user[:40]!r})")
        return Operator(user, "proxy")
    authorization = headers.get("Authorization", "")
    if authorization.startswith("Bearer "):
        found = tokens.holder_of(authorization.removeprefix("Bearer ").strip())
        if found is None:
            raise RequestRefused(401, "this operator token is not known (revoked, or mistyped)")
        return Operator(found[0], "token", found[1])
    how = ["an operator token (Authorization: Bearer, from web.token_file)"]
    if getattr(settings, "oidc_client_id", ""):
        how.insert(0, "sign-in (/auth/login)")
    if header:
        how.append(f"sign-in through the trusted proxy ({header})")
    raise RequestRefused(401, "an operation needs an authenticated operator: " + " or ".join(how))


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

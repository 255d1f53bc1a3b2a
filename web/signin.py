"""The page's own OpenID Connect sign-in: the authorization code flow with PKCE (S256) against [oidc]'s issuer.

`SignIn.start(redirect_uri)` makes a sign-in (state, nonce, PKCE verifier) and the IdP's authorization URL, and the
value of the state cookie that carries them; `SignIn.finish(args, state_cookie)` checks the IdP's answer, exchanges
the code at the token endpoint with the verifier, verifies the ID token (`oidc.provider.verify_token`: signature by
the JWKS with its rotation, iss, aud, exp, iat, nonce) and maps its groups claim to a role (web.roles);
`logout_url` is the IdP's end_session_endpoint, where it has one (with the session's ID token as id_token_hint,
which Okta requires: kept here by session id, never in a cookie).

Each refusal is a `SignInRefused` with its HTTP status (400, 401, 403; 502 where the IdP does not answer) and a
message for the person and the operator, never a session. A sign-in begun is kept in the browser that began it:
a short cookie signed with the sessions' key (HMAC-SHA256) holding the state, nonce, verifier and start time, so
/auth/login, which needs no login, keeps nothing here per request (no flood of sign-ins begun can push out real
ones). A callback carried into another browser (a forged sign-in) has no such cookie; a state is taken once (a
replayed callback is refused: the states used in the last SIGN_IN_WAIT are kept, and state cookies made before this
process started are refused, since its set of used states began empty). That set is bounded: when it is full of
states younger than SIGN_IN_WAIT, callbacks are refused (503) rather than a used state forgotten, which would leave
replay protection to the IdP alone; app.py limits /auth/login and /auth/callback per address (RATE), so one
client cannot fill it, nor hold the server's threads on the token endpoint.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from itsdangerous import BadSignature

from slurm_ext.errors import SlurmExtError
from slurm_ext.oidc import provider

from .secretfile import SecretFile, SecretFileError
from .session import ROLES, Person, SessionRefused, Sessions

__all__ = ["SignIn", "SignInRefused", "Pending", "role_of", "STATE_COOKIE", "SIGN_IN_WAIT", "RATE"]

log = logging.getLogger("web")

#: the cookie that binds a sign-in to the browser that began it
STATE_COOKIE = "slurm_ext_signin"
#: how long a sign-in begun may take at the IdP before its callback is refused
SIGN_IN_WAIT = 600.0
#: states taken by a callback that are remembered (those older than SIGN_IN_WAIT are dropped: refused anyway); when
#: it is full of younger ones, callbacks are refused (503) until some age out
_USED_MAX = 10000
#: sign-ins (/auth/login, /auth/callback) one address may ask a minute (app.py's token bucket); behind a reverse
#: proxy the address is the proxy's, shared by everyone behind it
RATE = 20
#: how long a discovery document is kept before it is read again
_DISCOVERY_MAX_AGE = 3600.0
#: after a discovery that failed, how long before it is tried again (the last good document serves meanwhile)
_DISCOVERY_RETRY = 10.0
#: ID tokens kept for the IdP's logout (id_token_hint), by session id; the oldest are dropped beyond it
_HINTS_MAX = 2000
#: the salt of the state cookie's signature (apart from the sessions')
_STATE_SALT = "slurm-ext web sign-in state"
#: the largest token endpoint answer read
_MAX_ANSWER = 256 * 1024


class SignInRefused(SlurmExtError):
    """A sign-in that gives no session; `status` is the HTTP answer, the message says why and what to do."""

    def __init__(self, status: int, message: str, retry_after: int = 0):
        super().__init__(message)
        self.status = status
        #: seconds to say in Retry-After (429, 503), 0: none
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Pending:
    """A sign-in begun: what its callback must match."""

    nonce: str
    #: the PKCE code verifier (its S256 challenge went to the IdP)
    verifier: str
    redirect_uri: str
    #: when it began (Unix time)
    began: float


def role_of(groups, roles: dict, claim: str) -> str:
    """The highest role whose groups (web.roles) `groups` shares, "" for none.

    Raises:
        SignInRefused (403): the claim is present but not a list of strings.
    """
    if groups is None:
        groups = []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise SignInRefused(403, f"the groups claim is not a list of strings (the ID token's {claim!r}, which "
                                 "web.oidc_groups_claim names)")
    found = ""
    for role in ROLES:
        if set(groups) & set(roles.get(role, ())):
            found = role
    return found


def _challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class SignIn:
    """The sign-in of one page process: the IdP's discovery and keys, the states used."""

    def __init__(self, oidc, web, sessions: Sessions, clock=time.time, keys_clock=time.monotonic):
        self.issuer, self.client_id = oidc.issuer, web.oidc_client_id
        self._oidc, self._web, self.sessions, self._clock = oidc, web, sessions, clock
        self._keys_clock = keys_clock
        self._secret = SecretFile(web.oidc_client_secret_file, "web.oidc_client_secret_file") \
            if web.oidc_client_secret_file else None
        self._lock = threading.Lock()
        self._fetching = threading.Lock()
        self._used: dict[str, float] = {}
        self._hints: dict[str, str] = {}
        self._discovery: provider.Discovery | None = None
        self._discovered = 0.0
        self._failed, self._failure = None, ""
        self._keys: provider.KeySet | None = None
        #: when this process began: a state cookie of before is refused (its state may have been used before the
        #: restart, and the set of used states starts empty)
        self.started = clock()

    def discovery(self) -> provider.Discovery:
        """The IdP's discovery document (read again after an hour). Raises SignInRefused (502) naming what is
        wrong with it.

        Read by one request at a time, outside the lock the others take: while it is read, or for
        _DISCOVERY_RETRY after a read failed, the last good document serves (an IdP down for a moment stops no
        sign-in), and without one the failure is answered at once (no request waits a whole timeout behind
        another)."""
        known = self._usable()
        if known is not None:
            return known
        if not self._fetching.acquire(blocking=self._discovery is None):
            return self._discovery  # another request is reading it: the last good one meanwhile
        try:
            known = self._usable()
            if known is not None:
                return known
            try:
                found = provider.discover(self.issuer, self._oidc.timeout, self._oidc.ca_file)
            except provider.OidcError as err:
                failure = f"the IdP cannot be used for sign-in: {err}"
                with self._lock:
                    self._failed, self._failure, last = self._clock(), failure, self._discovery
                if last is None:
                    raise SignInRefused(502, failure) from None
                log.warning("web: %s; the discovery document read before serves, tried again in %gs", failure,
                            _DISCOVERY_RETRY)
                return last
            with self._lock:
                if self._keys is None or self._keys.jwks_uri != found.jwks_uri:
                    self._keys = provider.KeySet(found.jwks_uri, self._oidc.timeout, self._oidc.ca_file,
                                                 clock=self._keys_clock)
                self._discovery, self._discovered, self._failed = found, self._clock(), None
            return found
        finally:
            self._fetching.release()

    def _usable(self) -> provider.Discovery | None:
        """The document to use without reading it (fresh, or the last good one while a failed read backs off);
        None: read it. Raises SignInRefused (502): none, and the last read failed less than _DISCOVERY_RETRY ago."""
        with self._lock:
            now = self._clock()
            if self._discovery is not None and now - self._discovered < _DISCOVERY_MAX_AGE:
                return self._discovery
            if self._failed is not None and 0 <= now - self._failed < _DISCOVERY_RETRY:
                if self._discovery is not None:
                    return self._discovery
                raise SignInRefused(502, f"{self._failure} (tried again {_DISCOVERY_RETRY:g}s after)")
            return None

    def start(self, redirect_uri: str) -> tuple[str, str]:
        """A new sign-in: (the IdP's authorization URL to send the browser to, the state cookie's value).

        Raises:
            SignInRefused: the IdP cannot be used (502), the sessions' key cannot (503).
        """
        found = self.discovery()
        if found.code_challenge_methods and "S256" not in found.code_challenge_methods:
            raise SignInRefused(502, f"the IdP {self.issuer} does not take PKCE S256 (its discovery document offers "
                                     f"{', '.join(found.code_challenge_methods)}): the page signs in only with it")
        state, nonce, verifier = (secrets.token_urlsafe(24) for _ in range(3))
        try:
            cookie = self.sessions.serializer(_STATE_SALT).dumps(
                {"state": state, "nonce": nonce, "verifier": verifier, "redirect_uri": redirect_uri,
                 "began": self._clock()})
        except SessionRefused as err:
            raise SignInRefused(503, str(err)) from None
        query = urllib.parse.urlencode({"response_type": "code", "client_id": self.client_id,
                                        "redirect_uri": redirect_uri, "scope": " ".join(self._scopes()),
                                        "state": state, "nonce": nonce, "code_challenge": _challenge(verifier),
                                        "code_challenge_method": "S256"})
        separator = "&" if "?" in found.authorization_endpoint else "?"
        return f"{found.authorization_endpoint}{separator}{query}", cookie

    def _pending(self, state: str, state_cookie: str | None) -> Pending:
        """The sign-in this browser began, if `state` is its and not used yet (taken now: a second callback with
        it is refused). Raises SignInRefused (403, 503)."""
        mismatch = SignInRefused(403, "state mismatch: this callback is not of the sign-in this browser began (a "
                                      "forged or foreign sign-in, or a cookie from before a restart): begin again at "
                                      "/auth/login")
        if not state_cookie:
            raise mismatch
        try:
            data = self.sessions.serializer(_STATE_SALT).loads(state_cookie)
            pending = Pending(str(data["nonce"]), str(data["verifier"]), str(data["redirect_uri"]),
                              float(data["began"]))
            began_state = str(data["state"])
        except SessionRefused as err:
            raise SignInRefused(503, str(err)) from None
        except (BadSignature, KeyError, TypeError, ValueError):
            raise mismatch from None
        if not secrets.compare_digest(state.encode(), began_state.encode()):
            raise mismatch
        now = self._clock()
        if pending.began < self.started:
            raise SignInRefused(403, "this sign-in was begun before the page restarted: begin again at /auth/login")
        if not 0 <= now - pending.began <= SIGN_IN_WAIT:
            raise SignInRefused(403, f"this sign-in took longer than {SIGN_IN_WAIT / 60:g} min at the IdP: begin "
                                     "again at /auth/login")
        with self._lock:
            for old in [s for s, began in self._used.items() if now - began > SIGN_IN_WAIT]:
                del self._used[old]
            if state in self._used:
                raise SignInRefused(403, "this sign-in's state was used already (a replayed callback): begin again "
                                         "at /auth/login")
            if len(self._used) >= _USED_MAX:  # forgetting a used state would let its callback be replayed
                log.warning("web: %d sign-ins finished in the last %g min: callbacks refused until some age out",
                            len(self._used), SIGN_IN_WAIT / 60)
                raise SignInRefused(503, f"too many sign-ins in the last {SIGN_IN_WAIT / 60:g} min ({_USED_MAX}): "
                                         "the page takes no more for now; try again in a few minutes",
                                    retry_after=60)
            self._used[state] = pending.began
        return pending

    def _scopes(self) -> list[str]:
        scopes = list(self._web.oidc_scopes)
        return scopes if "openid" in scopes else ["openid", *scopes]

    def finish(self, args, state_cookie: str | None) -> tuple[str, Person]:
        """The IdP's callback (`args`: its query): (the session cookie's value, the person).

        Raises:
            SignInRefused: the IdP's error, a state missing, not this browser's, unknown or used already (403), the
                code refused by the token endpoint, an ID token not believed (401), a groups claim that is not a
                list, no role where viewing needs one (403), the IdP away (502).
        """
        if args.get("error"):
            raise SignInRefused(401, f"the IdP refused the sign-in: {str(args.get('error'))[:80]}"
                                     + (f" ({str(args.get('error_description'))[:200]})"
                                        if args.get("error_description") else ""))
        state, code = args.get("state") or "", args.get("code") or ""
        if not state or not code:
            raise SignInRefused(400, "the callback carries no state or no code: begin the sign-in at /auth/login")
        pending = self._pending(state, state_cookie)
        found = self.discovery()
        id_token = self._exchange(found, code, pending)
        try:
            claims = provider.verify_token(id_token, self._keys, found.issuer, self.client_id,
                                           self._oidc.clock_skew, nonce=pending.nonce)
        except provider.TokenRefused as err:
            raise SignInRefused(401, f"the IdP's ID token is not believed: {err}") from None
        except provider.OidcError as err:
            raise SignInRefused(502, f"the IdP's keys cannot be read: {err}") from None
        claim = self._web.oidc_groups_claim
        role = role_of(claims.get(claim), self._web.roles, claim)
        if not role and self._web.viewing == "signed-in":
            raise SignInRefused(403, f"you are not in any group the page maps (web.roles; your {claim}: "
                                     f"{', '.join(map(str, claims.get(claim) or []))[:200] or 'none'}): ask an "
                                     "administrator for a role")
        name = claims.get("name") or claims.get("preferred_username") or ""
        email = claims.get("email") or ""
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise SignInRefused(401, "the IdP's ID token names no subject (sub)")
        try:
            value, person = self.sessions.issue(subject, name if isinstance(name, str) else "",
                                                email if isinstance(email, str) else "", role)
        except SessionRefused as err:
            raise SignInRefused(503, str(err)) from None
        if found.end_session_endpoint:
            with self._lock:
                while len(self._hints) >= _HINTS_MAX:
                    del self._hints[next(iter(self._hints))]
                self._hints[person.sid] = id_token
        return value, person

    def _exchange(self, found: provider.Discovery, code: str, pending: Pending) -> str:
        """The ID token the token endpoint gives for `code` (with the PKCE verifier, and the client's secret where
        there is one)."""
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": pending.redirect_uri,
                "code_verifier": pending.verifier, "client_id": self.client_id}
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json",
                   "User-Agent": "slurm-ext"}
        if self._secret is not None:
            try:
                secret = self._secret.read().strip().decode(errors="replace")
            except SecretFileError as err:
                raise SignInRefused(503, f"sign-in is off: {err}") from None
            pair = f"{urllib.parse.quote(self.client_id, safe='')}:{urllib.parse.quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        request = urllib.request.Request(found.token_endpoint, data=urllib.parse.urlencode(form).encode(),
                                         headers=headers, method="POST")
        try:
            body = provider.open_url(request, "the IdP's token endpoint", self._oidc.timeout, self._oidc.ca_file,
                                     _MAX_ANSWER + 1)
        except urllib.error.HTTPError as err:
            try:
                detail = _error_of(err.read(4096))
            except (OSError, http.client.HTTPException, ValueError):
                detail = "(its answer could not be read)"
            status = 401 if err.code in (400, 401) else 502
            raise SignInRefused(status, f"the IdP's token endpoint refused the code: {err.code} {detail}") from None
        except provider.OidcError as err:  # unreachable, not HTTP, not a URL the issuer's rules allow
            raise SignInRefused(502, str(err)) from None
        try:
            data = json.loads(body[:_MAX_ANSWER])
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("id_token"), str):
            raise SignInRefused(502, f"the IdP's token endpoint {found.token_endpoint} gave no ID token")
        return data["id_token"]

    def logout_url(self, after: str, sid: str = "") -> tuple[str | None, str]:
        """Where to send the browser after the page's own logout, and what to tell the person: the IdP's
        end_session_endpoint (back to `after`, with the ID token of session `sid` as id_token_hint), where it has
        one and the hint is kept; else (None, a note). Without the hint (a session of before a restart, or beyond
        _HINTS_MAX) the browser stays at the page: some IdPs (Okta) answer a logout without one with an error page
        and leave their session open, so the person is told that the IdP's session may still be open."""
        with self._lock:
            hint = self._hints.pop(sid, None)
        try:
            found = self.discovery()
        except SignInRefused:
            return None, ""
        if not found.end_session_endpoint:
            return None, ""
        if not hint:
            return None, ("signed out of the page; your session at the IdP may still be open (sign out there too, "
                          "or close the browser)")
        query = urllib.parse.urlencode({"client_id": self.client_id, "post_logout_redirect_uri": after,
                                        "id_token_hint": hint})
        separator = "&" if "?" in found.end_session_endpoint else "?"
        return f"{found.end_session_endpoint}{separator}{query}", ""


def _error_of(body: bytes) -> str:
    """An OAuth error answer's `error (description)`, or its first bytes."""
    try:
        data = json.loads(body)
        return f"{data.get('error', '?')}" + (f" ({data['error_description']})" if data.get("error_description") else "")
    except (ValueError, AttributeError, TypeError):
        return body[:200].decode(errors="replace")

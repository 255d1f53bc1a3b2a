"""The organisation's identity provider as slurm-ext reads it: its discovery document, its signing keys
(JWKS, with their rotation) and the tokens it signs.

One reader for every part that trusts the IdP (the page's sign-in, `oidc slurm`), so an issuer is judged
the same way everywhere: https (plain http only to a loopback address, for a test IdP on the same host),
every answer bounded in size and time, the discovery document's `issuer` equal to the configured one
(OpenID Connect Discovery 1.0 §4.3: a document served for another issuer is an attack or a
misconfiguration, never a detail), and a token believed only with its signature, `iss`, `aud`, `exp`
and `iat` checked. PyJWT does the JOSE; this module says what to ask of it and words its refusals for an
operator.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import jwt

from slurm_ext.errors import SlurmExtError

__all__ = ["OidcError", "TokenRefused", "Discovery", "discover", "fetch_json", "open_url", "check_issuer_url",
           "KeySet", "verify_token", "ASYMMETRIC_ALGORITHMS", "MIN_RSA_BITS"]

#: the largest discovery document or JWKS read (real ones are a few KiB)
MAX_ANSWER = 512 * 1024
#: what a token may be signed with: never "none", never a shared secret (HS*), which would make the
#: client's own secret, or a public key taken for one, a way to sign
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
#: the smallest RSA modulus a signing key may have, in bits: RFC 7518 §3.3 asks 2048 or more for RS256, and a
#: smaller key is one whoever factors it signs with, for any user (Slurm's, the page's admins)
MIN_RSA_BITS = 2048
#: the fields of a discovery document that a sign-in needs (OpenID Connect Discovery 1.0 §3)
REQUIRED_FIELDS = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")
#: shortest wait between two fetches of a JWKS for a key id it did not have: a token with a made-up kid must not
#: make the IdP a target, and a key the IdP just rotated in waits at most this long
REFETCH_EVERY = 10.0
#: how long fetched keys are kept before they are fetched again anyway (a key the IdP retired stops verifying)
KEYS_MAX_AGE = 3600.0


class OidcError(SlurmExtError):
    """The identity provider cannot be used: unreachable, or its answer is not what OpenID Connect says."""


class TokenRefused(SlurmExtError):
    """A token that is not believed; the message says which check it failed (for the log and the 401)."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """What slurm-ext uses of an IdP's /.well-known/openid-configuration."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str = ""
    code_challenge_methods: tuple[str, ...] = ()


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def check_issuer_url(url: str, what: str = "issuer") -> str:
    """`url` without a trailing slash, or OidcError: not https (http only to a loopback host), with
    user info, a query or a fragment, or not a URL at all."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port
    except (ValueError, TypeError, AttributeError):
        raise OidcError(f"{what} {str(url)[:200]!r}: not a URL") from None
    if parts.scheme not in ("https", "http") or not host:
        raise OidcError(f"{what} {url!r}: expected an https:// URL")
    if parts.scheme == "http" and not _loopback(host):
        raise OidcError(f"{what} {url!r}: plain http is taken only for a test IdP on this host (127.0.0.1, "
                        "localhost); an IdP elsewhere needs https")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise OidcError(f"{what} {url!r}: expected no user, query or fragment")
    return url.rstrip("/")


def _context(ca_file: str) -> ssl.SSLContext:
    """The TLS context for the IdP: made once per CA file as it is now (loading the system's CAs takes about
    25 ms, paid at every sign-in before), again when the file changes."""
    try:
        changed = os.stat(ca_file).st_mtime_ns if ca_file else 0
    except OSError as err:
        raise OidcError(f"the IdP's CA file {ca_file}: {err.strerror or err}") from None
    return _made_context(ca_file, changed)


@functools.lru_cache(maxsize=8)
def _made_context(ca_file: str, changed: int) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as err:
        raise OidcError(f"the IdP's CA file {ca_file}: {err}") from None


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL the issuer's own rules allow: an https answer sent on to plain http would
    let whoever sits on that leg hand out the keys."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_issuer_url(newurl, "a redirect")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(request: urllib.request.Request, what: str, timeout: float, ca_file: str, read: int) -> bytes:
    """The first `read` bytes of the answer to `request` (its URL checked, and every redirect's). Raises
    OidcError naming `what` and the URL: unreachable, a broken answer; urllib.error.HTTPError for a status
    other than 2xx, for the caller to word (a token endpoint's error is not a discovery document's)."""
    url = request.full_url
    check_issuer_url(url, what)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=_context(ca_file)),
                                         _CheckedRedirects())
    try:
        with opener.open(request, timeout=timeout) as answer:
            return answer.read(read)
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as err:
        raise OidcError(f"{what} {url}: unreachable ({getattr(err, 'reason', err)})") from None
    except (http.client.HTTPException, ValueError) as err:  # a broken status line, a cut chunked answer
        raise OidcError(f"{what} {url}: a broken answer ({type(err).__name__}: {str(err)[:120]})") from None


def fetch_json(url: str, what: str, timeout: float = 10.0, ca_file: str = "") -> dict:
    """The JSON object at `url`. Raises OidcError naming `what` and the URL: unreachable, not 200, too
    large, not a JSON object."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "slurm-ext"})
    try:
        body = open_url(request, what, timeout, ca_file, MAX_ANSWER + 1)
    except urllib.error.HTTPError as err:
        raise OidcError(f"{what} {url}: the IdP answered {err.code} {err.reason}") from None
    if len(body) > MAX_ANSWER:
        raise OidcError(f"{what} {url}: larger than {MAX_ANSWER // 1024} KiB, not read")
    try:
        data = json.loads(body)
    except ValueError:
        raise OidcError(f"{what} {url}: not JSON") from None
    if not isinstance(data, dict):
        raise OidcError(f"{what} {url}: not a JSON object")
    return data


def discover(issuer: str, timeout: float = 10.0, ca_file: str = "") -> Discovery:
    """The IdP's discovery document, checked. Raises OidcError: unreachable, a required field missing or
    not a URL, or an `issuer` other than the one asked for."""
    issuer = check_issuer_url(issuer)
    url = f"{issuer}/.well-known/openid-configuration"
    data = fetch_json(url, "the IdP's discovery document", timeout, ca_file)
    missing = [name for name in REQUIRED_FIELDS if not isinstance(data.get(name), str) or not data[name]]
    if missing:
        raise OidcError(f"the IdP's discovery document {url} lacks {', '.join(missing)}: is {issuer} an OpenID "
                        "Connect issuer?")
    if data["issuer"].rstrip("/") != issuer:
        raise OidcError(f"the IdP's discovery document {url} names issuer {data['issuer']!r}, not {issuer!r}: "
                        "configure the issuer exactly as the IdP names itself")
    for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        check_issuer_url(data[name], f"the discovery document's {name}")
    end_session = data.get("end_session_endpoint")
    try:  # optional: one the issuer's rules refuse is left out (the page's own logout still ends its session)
        check_issuer_url(end_session if isinstance(end_session, str) else "", "end_session_endpoint")
    except OidcError:
        end_session = ""
    methods = data.get("code_challenge_methods_supported")
    return Discovery(issuer=data["issuer"], authorization_endpoint=data["authorization_endpoint"],
                     token_endpoint=data["token_endpoint"], jwks_uri=data["jwks_uri"],
                     end_session_endpoint=end_session if isinstance(end_session, str) else "",
                     code_challenge_methods=tuple(m for m in methods if isinstance(m, str))
                     if isinstance(methods, list) else ())


class KeySet:
    """An IdP's signing keys, fetched when first needed, again when a token names a key id they lack (the IdP
    rotated) at most once every REFETCH_EVERY seconds, and after KEYS_MAX_AGE anyway (a retired key)."""

    def __init__(self, jwks_uri: str, timeout: float = 10.0, ca_file: str = "", clock=time.monotonic):
        self.jwks_uri = jwks_uri
        self._timeout, self._ca_file, self._clock = timeout, ca_file, clock
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched = None

    def _fetch(self) -> None:
        data = fetch_json(self.jwks_uri, "the IdP's JWKS", self._timeout, self._ca_file)
        keys = data.get("keys")
        if not isinstance(keys, list):
            raise OidcError(f"the IdP's JWKS {self.jwks_uri}: no `keys` list")
        found = {}
        for entry in keys:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or not isinstance(entry.get("kid"), str):
                continue
            try:
                key = jwt.PyJWK(entry)
            except (jwt.PyJWTError, ValueError, TypeError, KeyError):
                continue  # a key of a kind PyJWT cannot use (or a broken one) signs nothing we take
            if getattr(key.key, "key_size", MIN_RSA_BITS) < MIN_RSA_BITS and entry.get("kty") == "RSA":
                continue  # one that can be factored would sign for anyone, the page's admins included
            found[entry["kid"]] = key
        self._keys, self._fetched = found, self._clock()

    def key(self, kid: str) -> jwt.PyJWK:
        """The signing key `kid`. Raises TokenRefused when the IdP does not have it (after one refetch),
        OidcError when the JWKS cannot be read."""
        with self._lock:
            age = None if self._fetched is None else self._clock() - self._fetched
            if age is None or age >= KEYS_MAX_AGE or (kid not in self._keys and age >= REFETCH_EVERY):
                self._fetch()
            found = self._keys.get(kid)
        if found is None:
            raise TokenRefused(f"signed with key {kid[:40]!r}, which the IdP's JWKS {self.jwks_uri} does not hold")
        return found


def verify_token(token: str, keys: KeySet, issuer: str, audience: str, leeway: float = 60.0,
                 nonce: str | None = None) -> dict:
    """The claims of `token` once its signature, issuer, audience, expiry and issue time hold (and its
    nonce, when one is given). Raises TokenRefused naming the check it failed, OidcError when the keys
    cannot be read."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as err:
        raise TokenRefused(f"not a signed JWT ({err})") from None
    algorithm, kid = header.get("alg"), header.get("kid")
    if algorithm not in ASYMMETRIC_ALGORITHMS:
        raise TokenRefused(f"signed with {str(algorithm)[:20]!r}: only the IdP's public-key algorithms are taken")
    if not isinstance(kid, str) or not kid:
        raise TokenRefused("its header names no key id (kid)")
    key = keys.key(kid)
    try:
        claims = jwt.decode(token, key, algorithms=[algorithm], audience=audience, issuer=issuer, leeway=leeway,
                            options={"require": ["exp", "iat", "iss", "aud", "sub"]})
    except jwt.ExpiredSignatureError:
        raise TokenRefused("expired (exp is past, beyond the allowed clock skew)") from None
    except jwt.InvalidAudienceError:
        raise TokenRefused(f"issued for another audience, not {audience!r}") from None
    except jwt.InvalidIssuerError:
        raise TokenRefused(f"issued by another issuer, not {issuer!r}") from None
    except jwt.ImmatureSignatureError:
        raise TokenRefused("issued in the future (iat or nbf beyond the allowed clock skew)") from None
    except jwt.InvalidSignatureError:
        raise TokenRefused(f"its signature does not verify with the IdP's key {kid[:40]!r}") from None
    except jwt.MissingRequiredClaimError as err:
        raise TokenRefused(f"lacks the {err.claim!r} claim") from None
    except jwt.PyJWTError as err:
        raise TokenRefused(f"not valid ({err})") from None
    if nonce is not None and claims.get("nonce") != nonce:
        raise TokenRefused("its nonce is not the one this sign-in sent (a replayed or foreign token)")
    return claims

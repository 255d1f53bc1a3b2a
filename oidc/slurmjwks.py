"""The IdP's signing keys as Slurm's auth/jwt can take them: `fetch_slurm_jwks`, `clean_jwks`, `write_jwks`.

Slurm reads a JWKS file once, when its auth/jwt plug-in starts, and verifies RS256 only, from a key's `n` and
`e`. Before 26.05.3 (and in every 25.11) a key without `alg` made verification fail ("could not find matching
kid"), and a key that is not RSA (an EC key, which most IdPs publish beside their RSA ones) made slurmctld
fatal() at start (Slurm commits 2b90c11bee and 5f695b8279). So the IdP's JWKS is never handed to Slurm as it
comes: only RSA signing keys are kept, each with `alg: RS256` and only the fields Slurm reads, and every key left
out is named with the reason, for the operator. A set with no key left is refused: Slurm would take no token,
and the file it has keeps working.

The file is written atomically (a reader sees the old set or the new one), mode 0400, owned by SlurmUser (Slurm
refuses a JWKS it does not own), and never through a symbolic link.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from slurm_ext.fileio import atomic_write

from .provider import MIN_RSA_BITS, OidcError, discover, fetch_json

__all__ = ["DroppedKey", "SlurmJwks", "JwksChange", "NoSlurmKey", "clean_jwks", "fetch_slurm_jwks", "read_kids",
           "write_jwks", "SLURM_FIELDS"]

#: the fields of a JWK that Slurm reads (src/plugins/auth/jwt): nothing else reaches its file
SLURM_FIELDS = ("kty", "kid", "use", "alg", "n", "e")
#: the one algorithm Slurm's auth/jwt verifies with a JWKS key
SLURM_ALGORITHM = "RS256"
#: base64url without padding, what RFC 7518 §6.3.1 says `n` and `e` are (used with fullmatch: `$` would let a
#: trailing newline through, which Slurm's base64 decoder does not take)
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
#: a key id as Slurm matches it against a token's header (printable, bounded; fullmatch, as above)
_KID = re.compile(r"[\x21-\x7e]{1,256}")


class NoSlurmKey(OidcError):
    """The IdP's JWKS holds no key Slurm can use: nothing is written, the old file stays."""


@dataclass(frozen=True, slots=True)
class DroppedKey:
    """A key of the IdP's JWKS that the file for Slurm leaves out."""

    #: its key id ("" when it has none)
    kid: str
    #: why, for the operator: what the key is and what Slurm would do with it
    reason: str


@dataclass(frozen=True, slots=True)
class SlurmJwks:
    """A JWKS cleaned for Slurm, and what was left out of the IdP's."""

    #: the keys, each with only SLURM_FIELDS, in the IdP's order
    keys: tuple[dict, ...]
    #: the IdP's keys that are not here, with the reason
    dropped: tuple[DroppedKey, ...]
    #: where the keys came from (the IdP's jwks_uri)
    source: str = ""

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(key["kid"] for key in self.keys)

    def text(self) -> str:
        """The file's content: {"keys": [...]}, one stable form (the same keys give the same bytes)."""
        return json.dumps({"keys": list(self.keys)}, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class JwksChange:
    """What a new set changes in the file Slurm reads."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    #: the file's bytes differ (a key with the same kid but new numbers counts too)
    changed: bool
    #: there was no readable file before
    first: bool


def _drop_reason(entry, seen: set[str]) -> str:
    """Why `entry` cannot be in Slurm's file, or "" when it can."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    kty = entry.get("kty")
    if kty != "RSA":
        return (f"kty {str(kty)[:20]!r}: Slurm verifies RSA keys only (before 26.05.3 a key that is not RSA makes "
                "slurmctld abort at start)")
    kid = entry.get("kid")
    if not isinstance(kid, str) or not _KID.fullmatch(kid):
        return "no usable kid: Slurm finds a token's key by the kid in its header"
    if entry.get("use", "sig") != "sig":
        return f"use {str(entry.get('use'))[:20]!r}: not a signing key"
    if entry.get("alg", SLURM_ALGORITHM) != SLURM_ALGORITHM:
        return f"alg {str(entry.get('alg'))[:20]!r}: Slurm verifies {SLURM_ALGORITHM} only"
    for name in ("n", "e"):
        if not isinstance(entry.get(name), str) or not _BASE64URL.fullmatch(entry[name]):
            return f"no RSA {name!r} (base64url): Slurm builds the key from n and e alone"
    bits = _modulus_bits(entry["n"])
    if bits < MIN_RSA_BITS:
        return (f"an RSA modulus of {bits} bits: fewer than {MIN_RSA_BITS}, a key that can be factored and then "
                "sign tokens for any user")
    if kid in seen:
        return "a second key with the same kid: Slurm would try only one of them"
    return ""


def _modulus_bits(n: str) -> int:
    """The bit length of the base64url modulus `n` (0 when it does not decode)."""
    try:
        return int.from_bytes(base64.urlsafe_b64decode(n + "=" * (-len(n) % 4)), "big").bit_length()
    except (ValueError, binascii.Error):
        return 0


def clean_jwks(data: dict, source: str = "") -> SlurmJwks:
    """The RSA signing keys of the JWKS `data`, as Slurm takes them (`alg` RS256, `use` sig, SLURM_FIELDS only),
    and the others with the reason they are left out.

    Raises:
        OidcError: `data` has no `keys` list (naming `source`).
        NoSlurmKey: no key is left.
    """
    keys = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(keys, list):
        raise OidcError(f"the IdP's JWKS {source}: no `keys` list")
    kept, dropped, seen = [], [], set()
    for entry in keys:
        reason = _drop_reason(entry, seen)
        if reason:
            kid = entry.get("kid") if isinstance(entry, dict) else None
            dropped.append(DroppedKey(kid if isinstance(kid, str) else "", reason))
            continue
        seen.add(entry["kid"])
        kept.append({"kty": "RSA", "kid": entry["kid"], "use": "sig", "alg": SLURM_ALGORITHM, "n": entry["n"],
                     "e": entry["e"]})
    result = SlurmJwks(tuple(kept), tuple(dropped), source)
    if not kept:
        why = "; ".join(f"{d.kid or '(no kid)'}: {d.reason}" for d in dropped) or "it lists no key"
        raise NoSlurmKey(f"the IdP's JWKS {source} holds no RSA signing key Slurm can use ({why}): nothing written, "
                         "the JWKS file Slurm has is kept")
    return result


def fetch_slurm_jwks(issuer: str, timeout: float = 10.0, ca_file: str = "") -> SlurmJwks:
    """The IdP's JWKS (found by its discovery document), cleaned for Slurm.

    Raises:
        OidcError: the IdP is unreachable, its discovery document or JWKS is not what OpenID Connect says (the
            message names the URL), or NoSlurmKey.
    """
    found = discover(issuer, timeout, ca_file)
    return clean_jwks(fetch_json(found.jwks_uri, "the IdP's JWKS", timeout, ca_file), found.jwks_uri)


def read_kids(path: str | os.PathLike) -> tuple[str, ...] | None:
    """The key ids in the JWKS file at `path`, or None when there is none (or it is not a JWKS)."""
    try:
        data = json.loads(Path(path).read_text())
        return tuple(str(key.get("kid", "")) for key in data["keys"] if isinstance(key, dict))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def change(jwks: SlurmJwks, path: str | os.PathLike) -> JwksChange:
    """What writing `jwks` to `path` would change."""
    before = read_kids(path)
    try:
        same = Path(path).read_text() == jwks.text()
    except (OSError, UnicodeDecodeError):
        same = False
    old = before or ()
    return JwksChange(added=tuple(k for k in jwks.kids if k not in old),
                      removed=tuple(k for k in old if k not in jwks.kids), changed=not same, first=before is None)


def write_jwks(jwks: SlurmJwks, path: str | os.PathLike, uid: int, gid: int) -> Path:
    """Write `jwks` to `path` atomically, mode 0400, owned by uid:gid (SlurmUser: Slurm refuses a JWKS owned by
    another user but root).

    Raises:
        OidcError: `path` is a symbolic link or not a regular file (refused: the link's target is not ours to
            write), its directory is missing, or the write failed; the old file is then as it was.
    """
    path = Path(path)
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise OidcError(f"the JWKS file {path}: {err.strerror}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise OidcError(f"the JWKS file {path} is {what}: refused, nothing written (put the file itself there)")
    # between the rename and the chown the file is root's 0400, which Slurm takes too: it is never anyone else's
    try:
        written = atomic_write(path, jwks.text(), mode=0o400)
        os.chown(written, uid, gid, follow_symlinks=False)
    except OSError as err:
        raise OidcError(f"the JWKS file {path}: cannot write it ({err.strerror or err})") from None
    return written

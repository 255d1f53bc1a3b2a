"""The IdP as slurm-ext reads it (oidc/provider.py), against a real OpenID Connect provider on 127.0.0.1
(tests/helpers/idp.py): discovery, JWKS with rotation, and every way a token is refused."""

from __future__ import annotations

import socket
import time

import pytest

from helpers.idp import TestIdP, ec_key, not_http, public_jwk, rsa_key
from slurm_ext.oidc import provider
from slurm_ext.oidc.provider import KeySet, OidcError, TokenRefused, discover, verify_token


@pytest.fixture(scope="module")
def idp():
    with TestIdP(users={"ada": {}}, tls=True) as running:
        yield running


@pytest.fixture
def keys(idp):
    return KeySet(f"{idp.issuer}/jwks", ca_file=idp.ca_file)


def test_discovery_over_tls_with_the_ca_file(idp):
    found = discover(idp.issuer + "/", ca_file=idp.ca_file)
    assert found.issuer == idp.issuer and found.token_endpoint == f"{idp.issuer}/token"
    assert found.end_session_endpoint == f"{idp.issuer}/logout" and found.code_challenge_methods == ("S256",)


def test_an_idp_certificate_no_ca_vouches_for_is_refused(idp):
    with pytest.raises(OidcError, match="unreachable.*CERTIFICATE_VERIFY_FAILED"):
        discover(idp.issuer)


@pytest.mark.parametrize("url, said", [
    ("http://idp.example.org/realm", "plain http is taken only for a test IdP on this host"),
    ("ftp://127.0.0.1/realm", "expected an https:// URL"),
    ("https://user:pw@idp.example.org/", "expected no user, query or fragment"),
    ("https://idp.example.org/?tenant=1", "expected no user, query or fragment"),
    ("idp.example.org", "expected an https:// URL"),
])
def test_an_issuer_url_that_is_not_https_or_carries_more_is_refused_before_any_request(url, said):
    with pytest.raises(OidcError, match=said):
        discover(url)


def test_a_discovery_document_without_the_required_fields_names_them(idp):
    idp.discovery_changes = {"jwks_uri": None, "token_endpoint": None}
    try:
        with pytest.raises(OidcError, match="lacks token_endpoint, jwks_uri: is .* an OpenID Connect issuer"):
            discover(idp.issuer, ca_file=idp.ca_file)
    finally:
        idp.discovery_changes = {}


def test_a_discovery_document_for_another_issuer_is_refused(idp):
    idp.discovery_changes = {"issuer": "https://evil.example.org/realm"}
    try:
        with pytest.raises(OidcError, match="names issuer 'https://evil.example.org/realm', not"):
            discover(idp.issuer, ca_file=idp.ca_file)
    finally:
        idp.discovery_changes = {}


def test_an_unreachable_issuer_names_the_url():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OidcError, match=rf"discovery document http://127.0.0.1:{port}/x/.well-known/"
                                        r"openid-configuration: unreachable"):
        discover(f"http://127.0.0.1:{port}/x", timeout=2)


def test_a_token_of_the_idp_is_believed_with_its_claims(idp, keys):
    claims = verify_token(idp.mint(sub="ada", nonce="n-1", groups=["ops"]), keys, idp.issuer, idp.client_id,
                          nonce="n-1")
    assert claims["sub"] == "ada" and claims["groups"] == ["ops"]


def _refused(idp, keys, token, said, **options):
    with pytest.raises(TokenRefused, match=said):
        verify_token(token, keys, idp.issuer, idp.client_id, **options)


def test_each_forged_or_stale_token_is_refused_naming_the_check(idp, keys):
    _refused(idp, keys, idp.mint(aud="another-client"), "issued for another audience")
    _refused(idp, keys, idp.mint(iss="https://other.example.org"), "issued by another issuer")
    _refused(idp, keys, idp.mint(lifetime=-120), "expired")
    _refused(idp, keys, idp.mint(iat=int(time.time()) + 600), "issued in the future")
    _refused(idp, keys, idp.mint(algorithm="HS256", key="a shared secret of 32 bytes!!!!!"), "'HS256'")
    _refused(idp, keys, idp.mint(nonce="other"), "nonce is not the one", nonce="mine")
    _refused(idp, keys, idp.mint(nonce=None), "nonce is not the one", nonce="mine")
    _refused(idp, keys, "not.a.jwt", "not a signed JWT")
    # signed by a key the IdP does not publish, under a kid it does: the signature fails
    _refused(idp, keys, idp.mint(key=rsa_key(), kid=idp.signing_kid), "signature does not verify")
    _refused(idp, keys, idp.mint(key=rsa_key(), kid="made-up"), "which the IdP's JWKS .* does not hold")
    # alg none: no signature at all
    import jwt
    _refused(idp, keys, jwt.encode({"sub": "ada"}, None, algorithm="none", headers={"kid": idp.signing_kid}),
             "'none'")


def test_a_token_a_little_off_the_clock_is_taken_within_the_skew_and_refused_beyond(idp, keys):
    skewed = idp.mint(iat=int(time.time()) + 30)
    assert verify_token(skewed, keys, idp.issuer, idp.client_id, leeway=60)["sub"] == "ada"
    _refused(idp, keys, skewed, "issued in the future", leeway=5)


def test_a_rotated_key_is_fetched_at_its_first_token_and_a_retired_one_stops_verifying(idp):
    clock = [1000.0]
    keys = KeySet(f"{idp.issuer}/jwks", ca_file=idp.ca_file, clock=lambda: clock[0])
    old = idp.signing_kid
    assert verify_token(idp.mint(), keys, idp.issuer, idp.client_id)["sub"] == "ada"
    new = idp.rotate()
    clock[0] += provider.REFETCH_EVERY
    assert verify_token(idp.mint(), keys, idp.issuer, idp.client_id)["sub"] == "ada"
    # a made-up kid right after does not fetch again: the IdP is not a target for every forged token
    fetches = idp.requests.count("GET /realm/jwks")
    _refused(idp, keys, idp.mint(kid="made-up"), "does not hold")
    assert idp.requests.count("GET /realm/jwks") == fetches
    idp.retire(old)
    clock[0] += provider.KEYS_MAX_AGE
    _refused(idp, keys, idp.mint(key=rsa_key(), kid=old), "does not hold")
    assert verify_token(idp.mint(), keys, idp.issuer, idp.client_id)["sub"] == "ada" and idp.signing_kid == new


def test_keys_of_kinds_that_cannot_sign_here_are_skipped_not_fatal(idp):
    idp.jwks_extra = [{"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"}, {"kid": "keyless"},
                      public_jwk(ec_key(), "ec-1", alg="ES256"), {**public_jwk(rsa_key(), "enc-1"), "use": "enc"}]
    try:
        keys = KeySet(f"{idp.issuer}/jwks", ca_file=idp.ca_file)
        assert verify_token(idp.mint(), keys, idp.issuer, idp.client_id)["sub"] == "ada"
        _refused(idp, keys, idp.mint(kid="enc-1"), "does not hold")
    finally:
        idp.jwks_extra = []


def test_an_endpoint_that_is_not_a_url_is_refused_not_a_crash(idp):
    idp.discovery_changes = {"token_endpoint": "https://[bad"}
    try:
        with pytest.raises(OidcError, match=r"token_endpoint 'https://\[bad': not a URL"):
            discover(idp.issuer, ca_file=idp.ca_file)
    finally:
        idp.discovery_changes = {}


def test_an_end_session_endpoint_in_plain_http_elsewhere_is_left_out(idp):
    idp.discovery_changes = {"end_session_endpoint": "http://idp.example.org/logout"}
    try:
        assert discover(idp.issuer, ca_file=idp.ca_file).end_session_endpoint == ""
    finally:
        idp.discovery_changes = {}


def test_a_redirect_from_https_to_plain_http_elsewhere_is_not_followed(idp):
    idp.redirects = {"/jwks-moved": "http://idp.example.org/keys"}
    try:
        with pytest.raises(OidcError, match="a redirect 'http://idp.example.org/keys': plain http is taken only"):
            KeySet(f"{idp.issuer}/jwks-moved", ca_file=idp.ca_file).key("any")
        idp.redirects = {"/jwks-moved": f"{idp.issuer}/jwks"}  # within the issuer's rules: followed
        assert KeySet(f"{idp.issuer}/jwks-moved", ca_file=idp.ca_file).key(idp.signing_kid)
    finally:
        idp.redirects = {}


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_a_broken_answer_is_an_error_naming_the_url(answer):
    with not_http(answer) as port:
        with pytest.raises(OidcError, match=rf"JWKS http://127.0.0.1:{port}/jwks: (a broken answer|unreachable)"):
            provider.fetch_json(f"http://127.0.0.1:{port}/jwks", "the IdP's JWKS", timeout=5)


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")  # the forger's, minting with it
def test_an_rsa_key_under_2048_bits_signs_nothing(idp):
    from cryptography.hazmat.primitives.asymmetric import rsa
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    idp.jwks_extra = [public_jwk(weak, "weak-1")]
    try:
        keys = KeySet(f"{idp.issuer}/jwks", ca_file=idp.ca_file)
        _refused(idp, keys, idp.mint(key=weak, kid="weak-1"), "does not hold")
        assert verify_token(idp.mint(), keys, idp.issuer, idp.client_id)["sub"] == "ada"
    finally:
        idp.jwks_extra = []

"""A real OpenID Connect provider on 127.0.0.1 for the tests, written on PyJWT and `cryptography`.

It serves what an IdP serves (discovery, JWKS, the authorization code flow with PKCE S256, the token
endpoint, logout) over HTTP or, with `tls=True`, HTTPS under a CA of its own (`ca_file`), and mints
tokens a test asks for (`mint`), so that every refusal can be tried: another audience or issuer, an
expired token, an unknown key, HS256, a key the JWKS does not publish. Its sign-in page is a form with
one field, the user's name, that a test's browser fills: `users` gives each name its claims.

    with TestIdP(users={"ada": {"groups": ["slurm-operators"], "name": "Ada L."}}) as idp:
        idp.issuer, idp.mint(sub="ada", aud="slurm"), idp.rotate(), idp.jwks_extra.append({...})
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import html
import json
import secrets
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

__all__ = ["TestIdP", "rsa_key", "ec_key", "public_jwk", "not_http"]


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_jwk(key, kid: str, alg: str | None = "RS256", use: str | None = "sig") -> dict:
    """The JWK of `key`'s public half, as an IdP's JWKS lists it (`alg`/`use` None: left out, as some IdPs do)."""
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else jwt.algorithms.ECAlgorithm
    jwk = json.loads(algorithm.to_jwk(key.public_key()))
    jwk["kid"] = kid
    if alg:
        jwk["alg"] = alg
    if use:
        jwk["use"] = use
    return jwk


@contextlib.contextmanager
def not_http(answer: bytes):
    """A server on 127.0.0.1 that answers every connection with `answer` (a status line of garbage, an answer cut
    short), as a broken IdP or a proxy in its place might: yields its port; closed after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)
    threading.Thread(target=serve, name="not-http", daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A CA-less certificate for 127.0.0.1 and localhost (it is its own CA): (cert, key) files."""
    key = ec_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "slurm-ext test IdP")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "idp.crt", directory / "idp.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class TestIdP:
    """The provider; a context manager that starts and stops its server (a thread of the test process)."""

    __test__ = False  # not a pytest class

    def __init__(self, users: dict[str, dict] | None = None, client_id: str = "slurm-ext",
                 client_secret: str = "", tls: bool = False, lifetime: float = 300.0, port: int = 0):
        self.users = users if users is not None else {}
        self.client_id, self.client_secret = client_id, client_secret
        self.lifetime = lifetime
        self.keys: dict[str, object] = {}
        self.signing_kid = ""
        self.rotate()
        #: more JWKS entries served after the signing keys (an EC key, a keyless entry): what an IdP may publish
        self.jwks_extra: list[dict] = []
        #: fields replaced in (value None: removed from) the discovery document
        self.discovery_changes: dict = {}
        #: claims replaced in the next ID tokens the token endpoint issues (aud, iss, exp...)
        self.id_token_changes: dict = {}
        #: every code the token endpoint took (a replayed one is refused: invalid_grant)
        self.codes: dict[str, dict] = {}
        #: paths under the realm answered with a redirect to the URL given (a JWKS moved elsewhere)
        self.redirects: dict[str, str] = {}
        self.requests: list[str] = []
        self._scratch = tempfile.TemporaryDirectory(prefix="slurm-ext-idp-")
        self.ca_file = ""
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        scheme = "http"
        if tls:
            cert, key = _self_signed(Path(self._scratch.name))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.ca_file, scheme = str(cert), "https"
        self.port = self._server.server_address[1]
        self.issuer = f"{scheme}://127.0.0.1:{self.port}/realm"
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-idp", daemon=True)

    def __enter__(self) -> "TestIdP":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._scratch.cleanup()

    # -- keys and tokens -------------------------------------------------------------------------

    def rotate(self) -> str:
        """A new RSA key that signs from now on; the old ones stay published. Its kid."""
        kid = f"key-{len(self.keys) + 1}-{secrets.token_hex(4)}"
        self.keys[kid] = rsa_key()
        self.signing_kid = kid
        return kid

    def retire(self, kid: str) -> None:
        """Stop publishing key `kid` (tokens it signed no longer verify)."""
        del self.keys[kid]

    def jwks(self) -> dict:
        return {"keys": [public_jwk(key, kid) for kid, key in self.keys.items()] + list(self.jwks_extra)}

    def mint(self, sub: str = "ada", aud: str | list | None = None, lifetime: float | None = None,
             key=None, kid: str | None = None, algorithm: str = "RS256", **claims) -> str:
        """A token for `sub` signed by the current key (or `key`, named `kid`), `aud` the client by default."""
        now = int(time.time())
        body = {"iss": self.issuer, "sub": sub, "aud": aud if aud is not None else self.client_id, "iat": now,
                "exp": now + int(self.lifetime if lifetime is None else lifetime), **claims}
        body = {name: value for name, value in body.items() if value is not None}
        if algorithm.startswith("HS"):
            return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid or "shared"})
        return jwt.encode(body, key if key is not None else self.keys[self.signing_kid], algorithm=algorithm,
                          headers={"kid": kid or self.signing_kid})

    def discovery(self) -> dict:
        document = {"issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                    "token_endpoint": f"{self.issuer}/token", "jwks_uri": f"{self.issuer}/jwks",
                    "end_session_endpoint": f"{self.issuer}/logout", "response_types_supported": ["code"],
                    "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": ["RS256"],
                    "code_challenge_methods_supported": ["S256"]}
        for name, value in self.discovery_changes.items():
            if value is None:
                document.pop(name, None)
            else:
                document[name] = value
        return document

    def _id_token(self, user: str, nonce: str) -> str:
        claims = {"name": user, "preferred_username": user, **self.users.get(user, {}), "nonce": nonce or None}
        claims.update(self.id_token_changes)
        return self.mint(sub=claims.pop("sub", user), **{k: v for k, v in claims.items() if k not in ("aud",)},
                         aud=self.id_token_changes.get("aud"))


def _handler(idp: TestIdP):
    realm = "/realm"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes | str, kind: str = "application/json", headers=()) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _json(self, status: int, data: dict) -> None:
            self._send(status, json.dumps(data))

        def _redirect(self, url: str) -> None:
            self._send(302, "", "text/plain", (("Location", url),))

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            idp.requests.append(f"GET {url.path}")
            if url.path.removeprefix(realm) in idp.redirects:
                return self._redirect(idp.redirects[url.path.removeprefix(realm)])
            if url.path == f"{realm}/.well-known/openid-configuration":
                return self._json(200, idp.discovery())
            if url.path == f"{realm}/jwks":
                return self._json(200, idp.jwks())
            if url.path == f"{realm}/authorize":
                return self._authorize_form(query)
            if url.path == f"{realm}/logout":
                target = query.get("post_logout_redirect_uri")
                return self._redirect(target) if target else self._send(200, "signed out", "text/plain")
            return self._json(404, {"error": "not_found"})

        def _authorize_form(self, query: dict) -> None:
            problems = [name for name in ("client_id", "redirect_uri", "state", "code_challenge")
                        if not query.get(name)]
            if query.get("client_id") and query["client_id"] != idp.client_id:
                problems.append("unknown client_id")
            if query.get("code_challenge_method") != "S256":
                problems.append("code_challenge_method must be S256")
            if query.get("response_type") != "code":
                problems.append("response_type must be code")
            if problems:
                return self._send(400, "bad authorization request: " + ", ".join(problems), "text/plain")
            hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                             for k, v in query.items())
            page = (f"<!doctype html><title>Test IdP sign-in</title><form method=post action=\"{realm}/authorize\">"
                    f"{hidden}<label>user <input id=user name=user autofocus></label>"
                    "<button id=signin type=submit>Sign in</button></form>")
            self._send(200, page, "text/html; charset=utf-8")

        def _form(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            idp.requests.append(f"POST {url.path}")
            form = self._form()
            if url.path == f"{realm}/authorize":
                user = form.get("user", "")
                if user not in idp.users:
                    return self._send(403, f"no user {user!r} at this IdP", "text/plain")
                code = secrets.token_urlsafe(24)
                idp.codes[code] = {"user": user, "nonce": form.get("nonce", ""), "challenge": form["code_challenge"],
                                   "redirect_uri": form["redirect_uri"], "used": False}
                separator = "&" if "?" in form["redirect_uri"] else "?"
                return self._redirect(form["redirect_uri"] + separator
                                      + urllib.parse.urlencode({"code": code, "state": form["state"]}))
            if url.path == f"{realm}/token":
                return self._token(form)
            return self._json(404, {"error": "not_found"})

        def _token(self, form: dict) -> None:
            client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
            basic = self.headers.get("Authorization", "")
            if basic.startswith("Basic "):
                client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
                client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
            if client_id != idp.client_id or (idp.client_secret and secret != idp.client_secret):
                return self._json(401, {"error": "invalid_client"})
            if form.get("grant_type") != "authorization_code":
                return self._json(400, {"error": "unsupported_grant_type"})
            grant = idp.codes.get(form.get("code", ""))
            if grant is None or grant["used"]:
                return self._json(400, {"error": "invalid_grant", "error_description": "unknown or used code"})
            grant["used"] = True
            if form.get("redirect_uri") != grant["redirect_uri"]:
                return self._json(400, {"error": "invalid_grant", "error_description": "redirect_uri differs"})
            verifier = form.get("code_verifier", "")
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            if not verifier or challenge != grant["challenge"]:
                return self._json(400, {"error": "invalid_grant", "error_description": "PKCE verifier mismatch"})
            self._json(200, {"access_token": secrets.token_urlsafe(24), "token_type": "Bearer",
                             "expires_in": int(idp.lifetime),
                             "id_token": idp._id_token(grant["user"], grant["nonce"])})

    return Handler

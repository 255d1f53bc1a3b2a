"""What the page's OpenID Connect sign-in costs (no cluster: the page's app over stand-ins, as tests/test_web_oidc.py
builds it, and the tests' own IdP on 127.0.0.1):

- a read of /api/cluster with a sign-in session cookie (its HMAC-SHA256 checked, its session not ended), and with an
  operator's bearer token (its SHA-256 compared with the token file's), against the same read with no credential, in
  the same run: what every poll of a signed-in page pays (target: well under a millisecond, against a poll every
  5 s);
- one whole sign-in (/auth/login, the IdP's form, /auth/callback: the code exchanged, the ID token verified against
  the cached JWKS), against one GET of the IdP's discovery document from the same process: what a person waits for
  on the page's side, in round trips of the IdP (target: a few);
- /auth/login: sign-ins begun per second from many addresses, which keep nothing on the server (the state rides
  in a signed cookie), and a flood from one address, answered 429 after its 20 a minute.

    python tests/benchmarks/bench_signin.py [--reads 3000] [--sign-ins 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: its helpers and tests

from helpers.idp import TestIdP  # noqa: E402
from test_web import TOKEN  # noqa: E402
from test_web_oidc import USERS, _page, sign_in  # noqa: E402

from slurm_ext.web.session import COOKIE  # noqa: E402


def _per_call(call, count: int) -> float:
    """Median seconds of `call()` over `count` calls, in 10 batches (one batch's mean each)."""
    batch = max(1, count // 10)
    means = []
    for _ in range(10):
        started = time.perf_counter()
        for _ in range(batch):
            call()
        means.append((time.perf_counter() - started) / batch)
    return statistics.median(means)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=3000)
    parser.add_argument("--sign-ins", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-signin-") as scratch, \
            TestIdP(users={name: dict(claims) for name, claims in USERS.items()}, client_id="slurm-ext-page") as idp:
        page = _page(Path(scratch), idp)
        # no cookie jar: each read sends its credential as a browser does, and the test client's own cookie handling
        # (a jar matched against every URL) is not what is measured
        anonymous = page.application.test_client(use_cookies=False)
        assert anonymous.get("/api/cluster").status_code == 200
        assert sign_in(page, "ada").status_code == 302 and page.get("/api/session").get_json()["via"] == "oidc"
        session = {"Cookie": f"{COOKIE}={page.get_cookie(COOKIE).value}"}
        assert anonymous.get("/api/session", headers=session).get_json()["via"] == "oidc"
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert anonymous.get("/api/session", headers=bearer).get_json()["user"] == "alice"

        plain = _per_call(lambda: anonymous.get("/api/cluster"), args.reads)
        signed_in = _per_call(lambda: anonymous.get("/api/cluster", headers=session), args.reads)
        token = _per_call(lambda: anonymous.get("/api/cluster", headers=bearer), args.reads)
        print(f"/api/cluster read: anonymous {plain * 1e6:.0f} us, signed in {signed_in * 1e6:.0f} us "
              f"(x{signed_in / plain:.2f}), bearer token {token * 1e6:.0f} us (x{token / plain:.2f})")

        discovery = f"{idp.issuer}/.well-known/openid-configuration"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def fetch():
            with opener.open(discovery, timeout=10) as answer:
                answer.read()
        round_trip = _per_call(fetch, args.sign_ins)
        addresses = iter(f"127.1.{n // 250}.{n % 250 + 1}" for n in range(10 ** 6))

        def client(use_cookies: bool = True):
            """A browser of its own address: the page takes 20 sign-ins a minute from one address."""
            made = page.application.test_client(use_cookies=use_cookies)
            made.environ_base["REMOTE_ADDR"] = next(addresses)
            return made
        whole = _per_call(lambda: sign_in(client(), "ada"), args.sign_ins)
        print(f"one sign-in (login, the IdP's form, callback, token exchange, ID token verified): "
              f"{whole * 1e3:.1f} ms = {whole / round_trip:.1f} x one GET of the IdP's discovery document "
              f"({round_trip * 1e3:.2f} ms)")

        begun = _per_call(lambda: client(False).get("/auth/login"), args.reads)
        flood = client(False)
        refused = _per_call(lambda: flood.get("/auth/login"), args.reads)
        assert flood.get("/auth/login").status_code == 429
        print(f"/auth/login: {1 / begun:.0f} sign-ins begun a second from many addresses, none of them kept on the "
              f"server; a flood from one address answered 429 at {1 / refused:.0f} a second")
    return 0


if __name__ == "__main__":
    sys.exit(main())

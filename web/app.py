"""The page's HTTP side: Flask routes over the shared view (`watch.Watcher`) and the operators' operations.

GET routes only read the view the watcher keeps (one Slurm query per table
per refresh, whatever the number of browsers): the page itself (its assets
are package data: nothing is fetched from elsewhere, it works air-gapped),
/api/cluster (whole; with since= as the page asks it, the rows without their GPUs'
readings and what changed since the browser's version: changes.py), /api/nodes
(a page of whole rows, filtered and sorted: the Nodes list),
/api/timeline, /api/health, /api/acceptance (each node's last acceptance run
with its results), /api/repairs and /api/session (the CSRF token, and who the
token sent, the proxy says or the sign-in session is, with the role).
/auth/login, /auth/callback and /auth/logout are the page's own OIDC sign-in (signin.py; the session
cookie: session.py), checked on every request. POST routes are the operations: run a node's health
checks, approve or reject its repair. Each needs an operator or admin and a CSRF token (`auth`), and is
recorded with the user in the repair history and the journal. With web.viewing = "signed-in" the GET
routes answer only a signed-in person with a role, a token or the proxy's user (401 otherwise): everything but
an allow-list (the page's shell and assets, /api/session, /auth/*) is closed, so a route added later is too.

Bad input is a 4xx whose JSON says what was wrong (an unknown node, a query
key the route does not take, a limit out of range); a bug is a 500 that
says where the log is, never a traceback.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from flask import Flask, Response, jsonify, redirect, request, send_from_directory
from werkzeug.exceptions import HTTPException

from slurm_ext import events
from slurm_ext.agentapi import CLEAR_SUBJECT, AgentAnswerError, AgentClient, Readings
from slurm_ext.errors import ConfigError, SlurmExtError
from slurm_ext.health.settings import CHECKS, SEVERITIES
from slurm_ext.repair.settings import ACTIONS
from slurm_ext.repair.status import STATES

from .auth import Csrf, Operator, ProxySecret, RequestRefused, Tokens, operator_of
from .changes import VERSION, Changes, json_bytes
from .session import COOKIE, SessionRefused, Sessions
from .signin import RATE, STATE_COOKIE, SIGN_IN_WAIT, SignIn, SignInRefused
from .healthview import history_rows
from .nodelist import SORTS, ordered
from .watch import Watcher

__all__ = ["create_app", "STATIC", "MAX_BODY", "MAX_HEADERS"]

log = logging.getLogger("web")

STATIC = Path(__file__).with_name("static")
#: the largest request body taken (its POSTs are small JSON: a rejection's reason is cut at 1,000 characters);
#: waitress refuses a larger one from its Content-Length, before reading it (server.py)
MAX_BODY = 16 * 1024
#: the most bytes of a request's line and headers (a proxy's session cookies included)
MAX_HEADERS = 64 * 1024
#: what /api/session says of a token file that cannot be used (the reason, which names the file, is in the log)
_TOKENS_UNUSABLE = "the operators' tokens cannot be used now: the page's log says why"
#: what /api/session says before the first operator's token is made (a fresh cluster: nothing is wrong)
_NO_TOKEN_YET = ("viewing needs no token; to approve repairs or run checks from the page, make an operator's token "
                 "on the controller: slurm-ext web add-token USER")
#: longest limit= a list route takes
_MAX_LIMIT = 5000
#: rows of the Nodes list a request gets, unless it asks for another count, and at most
_NODES_PAGE = 100
_NODES_PAGE_MAX = 500
#: the Nodes lists' orders kept for the current view (a question each: filters and sort)
_LISTS_KEPT = 64
#: sources of the timeline
_SOURCES = ("slurm", "repair", "agent")
#: the timeline's severities (the journal's ladder)
_TIMELINE_SEVERITIES = ("info", "warning", "error", "critical")
#: newest health events a /api/health request reads (its filters and the rows of findings ended by a reboot are
#: worked out over them)
_HEALTH_SCAN = 20000
#: longest wait for a node's fresh health reading after "run the health checks"
_CHECK_WAIT = 20.0
#: "run the health checks" at once (each holds a server thread while its node reads itself)
_CHECKS_AT_ONCE = 3
#: a GPU as a clear's gpu names it: its index, UUID or PCI bus id
_GPU_NAME = re.compile(r"^[A-Za-z0-9:._-]{1,64}\Z")
#: longest wait for a node's agent to answer a clear (it waits up to 5 s for its health monitor)
_CLEAR_TIMEOUT = 15.0
#: seconds between two web-refused events of one address (a client refused in a loop must not rotate the journal)
_REFUSED_EVERY = 60.0
#: what each operation is, in a refusal of a role that may not do it
_OPERATIONS = {"approve": "approve repairs", "reject": "reject repairs", "reopen": "reopen repairs",
               "clear": "clear health findings", "check": "run health checks"}
#: the roles that may operate
_OPERATOR_ROLES = ("operator", "admin")
#: routes anyone may reach where viewing needs sign-in: the page's shell (it shows the sign-in prompt), its assets,
#: the session (what the prompt says) and the sign-in itself
_OPEN_PATHS = ("/", "/api/session")
_OPEN_PREFIXES = ("/static/", "/auth/")
#: headers of every answer: no other site may frame the page or run scripts in it
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}


class BadRequest(Exception):
    """A request the page answers with `status` and `message` (JSON)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _limit_of(most: int) -> Callable[[str], int]:
    def check(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= most:
            raise ValueError(f"a count from 1 to {most}")
        return int(text)
    return check


_limit = _limit_of(_MAX_LIMIT)


def _offset(text: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise ValueError("a count from 0")
    return int(text)


def _name_filter(text: str) -> str:
    """A part of a node's name, or =NAME for that node alone."""
    return "=" + _name(text[1:]) if text.startswith("=") else _name(text)


def _choice(choices) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return text
    return check


def _name(text: str) -> str:
    if not text or len(text) > 128 or not all(c.isalnum() or c in "._-" for c in text):
        raise ValueError("a node name (letters, digits, . _ -)")
    return text


def _version(text: str) -> str:
    if text and not VERSION.match(text):
        raise ValueError("a version /api/cluster gave (its \"version\")")
    return text


def _query(allowed: dict[str, Callable[[str], object]]) -> dict[str, object]:
    """The request's query, each key checked; an unknown key, a repeated one or a bad value is a 400 naming it."""
    found = {}
    for key in request.args:
        if key not in allowed:
            raise BadRequest(400, f"unknown query key {key[:40]!r}: this route takes "
                                  + (", ".join(sorted(allowed)) or "none"))
        values = request.args.getlist(key)
        if len(values) != 1:
            raise BadRequest(400, f"query key {key!r} given {len(values)} times")
        try:
            found[key] = allowed[key](values[0])
        except ValueError as err:
            raise BadRequest(400, f"{key}={values[0][:40]!r}: expected {err}") from None
    return found


def create_app(config, watcher: Watcher | None = None, store_opener=None, clock=time.time,
               keys_clock=time.monotonic) -> Flask:
    """The page's Flask app over `watcher` (made from `config` when not given; the caller starts it); `clock` is
    the sign-in sessions' (wall time: their expiry is in the cookie), `keys_clock` the IdP's keys' cache's (tests
    move both).

    Raises:
        ConfigError: sign-in behind a reverse proxy (web.trusted_proxies) without web.oidc_redirect_url: the
            page's URL would come from the request's Host header, which the client chooses.
    """
    settings = config.web
    watcher = watcher or Watcher(config)
    tokens = Tokens(settings.token_file)
    proxy_secret = ProxySecret(settings.proxy_secret_file) if settings.proxy_secret_file else None
    tokens.usable()  # what is wrong with the file is logged at the start, not first at an operator's request
    csrf = Csrf()
    # the page's own folder (the agent makes it web.user's: credentials.state_folder), not root's state_dir
    sessions = Sessions(settings.session_lifetime, settings.session_key_file, clock=clock,
                        folder=f"{config.node.state_dir}/web" if config.node.state_dir else "")
    oidc = getattr(config, "oidc", None)
    signin = SignIn(oidc, settings, sessions, clock=clock, keys_clock=keys_clock) \
        if settings.oidc_client_id and oidc is not None and oidc.issuer else None
    # config.load refuses it already (WebSection.check_together): this is for a config made otherwise
    if signin is not None and settings.trusted_proxies and not settings.oidc_redirect_url:
        raise ConfigError(getattr(config, "source", "") or "config", "sign-in behind a reverse proxy "
                          "(web.trusted_proxies) needs the page's public URL + /auth/callback, as registered at the "
                          "IdP (https://HOST/auth/callback)", key="web.oidc_redirect_url")
    # the sign-in's state cookie goes where the callback is, the session cookie where the page is: under a sub-path
    # of the proxy too (not sent to the proxy's other sites)
    redirect_path = urllib.parse.urlsplit(settings.oidc_redirect_url).path
    auth_path = redirect_path.removesuffix("callback") if settings.oidc_redirect_url else "/auth/"
    cookie_path = redirect_path.removesuffix("auth/callback") if settings.oidc_redirect_url else "/"
    if settings.oidc_client_id and signin is None:
        log.warning("web: web.oidc_client_id is set but [oidc] issuer is empty: no sign-in")
    emit = events.emitter(config.node.state_dir, "web")
    if sessions.unkept:  # said once here (and in the log), not at every logout
        emit("web-sessions-unkept", sessions.unkept, "warning")
    checks_running = threading.BoundedSemaphore(_CHECKS_AT_ONCE)
    refused_last: dict[str, float] = {}
    signin_refused_last: dict[str, float] = {}
    signin_rate = _Rate(RATE, 60.0)
    app = Flask(__name__, static_folder=None)
    app.config.update(PROPAGATE_EXCEPTIONS=False, JSON_SORT_KEYS=False, MAX_CONTENT_LENGTH=MAX_BODY)
    app.extensions["slurm_ext_watcher"] = watcher
    # the watcher's own, whose refresh thread takes each view; else the app's, fed by the first request of each view
    own_changes = getattr(watcher, "changes", None) is None
    changes = Changes() if own_changes else watcher.changes
    lists: dict = {}
    lists_lock = threading.Lock()

    def open_store():
        if store_opener is not None:
            return store_opener()
        from slurm_ext.repair.store import open_store as opener
        return opener(config, create=False, role="page")

    def current():
        view = watcher.current()
        if view is None:
            raise BadRequest(503, "the page has not read the cluster yet: try again in a few seconds")
        return view

    def _journal(limit: int, **asked) -> list:
        """The stored journal events (Watcher.journal); a database that cannot be read is a 503 that names it."""
        try:
            return watcher.journal(limit, **asked)
        except SlurmExtError as err:
            raise BadRequest(503, f"the nodes' journals cannot be read: {err}") from None

    def known_node(name: str):
        view = current()
        found = next((n for n in view.data["nodes"] if n["name"] == name), None)
        if found is None:
            raise BadRequest(404, f"no node {name[:60]!r} in this cluster (as slurmctld listed it "
                                  f"{time.time() - view.data['refreshed']:.0f}s ago)")
        return found

    def secure() -> bool:
        """Whether the cookies get Secure: the page is reached over https, directly or (web.oidc_redirect_url
        https://...) through a TLS proxy. Not from X-Forwarded-Proto: waitress drops it (the proxy it would trust
        is web.trusted_proxies, a list, where waitress trusts one address), and the configured URL says it for
        every request."""
        return request.scheme == "https" or settings.oidc_redirect_url.startswith("https://")

    def signed_in() -> Operator | None:
        """The person of the request's session cookie, or None without one.

        Raises:
            RequestRefused (401): a cookie that gives no session (expired, ended, not this page's): sign in again.
        """
        value = request.cookies.get(COOKIE)
        if not value:
            return None
        try:
            person = sessions.read(value)
        except SessionRefused as err:
            refusal = RequestRefused(401, str(err))
            refusal.clear_session = True
            raise refusal from None
        return Operator(person.user, "oidc", person.role)

    def who_asks() -> Operator | None:
        """Who the request's credentials name (a proxy's header, a token, a session), or None without any."""
        header = settings.proxy_user_header
        if (header and request.headers.get(header) is not None) or \
                request.headers.get("Authorization", "").startswith("Bearer "):
            return operator_of(request.headers, request.remote_addr, settings, tokens, proxy_secret)
        return signed_in()

    # -- answers ---------------------------------------------------------------------------------

    @app.before_request
    def viewing():
        """Every request's session is checked (an expired one: 401, sign in again); where viewing needs sign-in,
        everything but the allow-list (_OPEN_PATHS, _OPEN_PREFIXES) answers only a viewer: a route added later is
        closed unless it is listed. A sign-in without a role (issued while anyone could view) is no viewer."""
        if request.path in _OPEN_PATHS or request.path.startswith(_OPEN_PREFIXES):
            return None
        if settings.viewing == "anyone" and not request.path.startswith("/api/"):
            return None
        # viewing open: only a session cookie is checked (an expired one says so); a token or proxy header means
        # something only to an operation, as before sign-in
        who = signed_in() if settings.viewing == "anyone" else who_asks()
        if settings.viewing != "signed-in":
            return None
        if who is None:
            raise RequestRefused(401, "viewing this page needs sign-in: sign in (/auth/login)"
                                 + (" or send an operator token" if settings.token_file else ""))
        if who.via == "oidc" and not who.role:
            raise RequestRefused(403, f"viewing this page needs a role, and your sign-in has none ({who.user}: in "
                                      "no group web.roles maps): ask an administrator for a role, then sign in again")
        return None

    @app.after_request
    def headers(answer: Response) -> Response:
        answer.headers.update(_HEADERS)
        if request.path.startswith("/api/"):
            answer.headers["Cache-Control"] = "no-store"
        return answer

    @app.errorhandler(BadRequest)
    def bad_request(err: BadRequest):
        return jsonify(error=err.message), err.status

    def first_this_minute(last: dict[str, float]) -> bool:
        """Whether this request's address had no such event in the last minute (a client refused in a loop must not
        rotate the journal); counts it."""
        now, address = time.monotonic(), request.remote_addr or "?"
        if now - last.get(address, -_REFUSED_EVERY) < _REFUSED_EVERY:
            return False
        if len(last) > 10000:
            last.clear()
        last[address] = now
        return True

    def on_record(err: RequestRefused) -> None:
        if first_this_minute(refused_last):
            address = request.remote_addr or "?"
            emit("web-refused", f"{request.method} {request.path} from {address} refused: {err} (at most one such "
                                "event a minute for an address)", "warning", address=address)

    @app.errorhandler(RequestRefused)
    def refused(err: RequestRefused):
        on_record(err)
        answer = jsonify(error=str(err), signin=signin is not None)
        if getattr(err, "clear_session", False):  # the browser forgets it: the page goes on as anyone's, or asks
            answer.delete_cookie(COOKIE, path=cookie_path)
        return answer, err.status

    def on_signin_refused(err: SignInRefused) -> None:
        if first_this_minute(signin_refused_last):
            address = request.remote_addr or "?"
            emit("web-signin-refused", f"sign-in from {address} refused: {err} (at most one such event a minute for "
                                       "an address)", "warning", address=address)

    @app.errorhandler(SignInRefused)
    def signin_refused(err: SignInRefused):
        on_signin_refused(err)
        text = f"Sign-in refused: {err}\n\nBegin again: /auth/login\n"
        answer = Response(text, err.status, mimetype="text/plain")
        if err.retry_after:
            answer.headers["Retry-After"] = str(err.retry_after)
        answer.delete_cookie(STATE_COOKIE, path=auth_path)
        return answer

    def rate_limited() -> None:
        """Raises SignInRefused (429) where this address asked /auth/login or /auth/callback more than RATE times in
        the last minute: each callback may cost a POST to the IdP's token endpoint, held in a server thread."""
        wait = signin_rate.take(request.remote_addr or "?", time.monotonic())
        if wait:
            raise SignInRefused(429, f"too many sign-ins from {request.remote_addr} (at most {RATE} a minute): try "
                                     f"again in {wait}s", retry_after=wait)

    # -- sign-in (web.oidc_client_id, [oidc] issuer) ---------------------------------------------------

    def redirect_uri() -> str:
        """The callback URL the IdP is given: web.oidc_redirect_url, else the request's own (the IdP takes only a
        registered one, so a Host header of another site gets nowhere; behind a proxy the setting is required)."""
        return settings.oidc_redirect_url or request.host_url.rstrip("/") + "/auth/callback"

    def page_url() -> str:
        """Where the page's own redirects send the browser: the page under web.oidc_redirect_url, else "/" (never
        the request's Host header)."""
        url = settings.oidc_redirect_url
        return url.removesuffix("auth/callback") if url else "/"

    def public_page_url() -> str:
        """The page's absolute URL for the IdP's post_logout_redirect_uri (which the IdP checks is registered)."""
        url = settings.oidc_redirect_url
        return url.removesuffix("auth/callback") if url else request.host_url

    @app.get("/auth/login")
    def login():
        _query({})
        if signin is None:
            raise BadRequest(404, "sign-in is not configured (web.oidc_client_id and [oidc] issuer)")
        rate_limited()
        url, state = signin.start(redirect_uri())
        answer = redirect(url, 302)
        answer.set_cookie(STATE_COOKIE, state, max_age=int(SIGN_IN_WAIT), path=auth_path, httponly=True,
                          samesite="Lax", secure=secure())
        return answer

    @app.get("/auth/callback")
    def callback():
        if signin is None:
            raise BadRequest(404, "sign-in is not configured (web.oidc_client_id and [oidc] issuer)")
        rate_limited()
        value, person = signin.finish(request.args, request.cookies.get(STATE_COOKIE))
        emit("web-signin", f"{person.user} signed in as {person.role or 'no role (viewing only)'} from "
                           f"{request.remote_addr}, until {time.strftime('%H:%M:%S %Z', time.localtime(person.expires))}",
             user=person.user, role=person.role or "none", address=request.remote_addr)
        answer = redirect(page_url(), 302)
        # no Max-Age: the browser keeps it until it closes, the expiry signed inside decides; a cookie the browser
        # dropped by itself would leave the page showing a person it no longer sends, where this one says "sign in
        # again" at its first request after its time
        answer.set_cookie(COOKIE, value, path=cookie_path, httponly=True, samesite="Lax", secure=secure())
        answer.delete_cookie(STATE_COOKIE, path=auth_path)
        return answer

    @app.post("/auth/logout")
    def logout():
        """The page's sign-out button (POST with the CSRF token: another site cannot sign a person out); the
        answer's `redirect` is where the browser goes next (the IdP's logout where it has one)."""
        csrf.check(request.headers.get("X-CSRF-Token"))
        value = request.cookies.get(COOKIE)
        person = sessions.end(value) if value else None
        if person is not None:
            emit("web-signout", f"{person.user} signed out from {request.remote_addr}", user=person.user,
                 address=request.remote_addr)
        target, note = (signin.logout_url(public_page_url(), person.sid) if signin is not None and person is not None
                        else (None, ""))
        answer = jsonify(message=note or "signed out", redirect=target or page_url(), idp_session_open=bool(note))
        answer.delete_cookie(COOKIE, path=cookie_path)
        return answer

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException):
        if request.path.startswith("/api/"):
            return jsonify(error=f"{err.code} {err.name}: {err.description}"), err.code
        return Response(f"{err.code} {err.name}: {err.description}\n", err.code, mimetype="text/plain")

    @app.errorhandler(Exception)
    def bug(err: Exception):
        log.exception("web: %s %s failed", request.method, request.path)
        return jsonify(error="internal error of the page: see its log (slurm-ext's log, component web)"), 500

    # -- the page ------------------------------------------------------------------------------------

    @app.get("/")
    def index():
        _query({})
        return send_from_directory(STATIC, "index.html", max_age=0)

    @app.get("/static/<path:name>")
    def static_file(name: str):
        return send_from_directory(STATIC, name, max_age=300)

    # -- what the page reads ---------------------------------------------------------------------------

    @app.get("/api/cluster")
    def cluster():
        """The whole view, each node's GPU readings in its row (a script's); or the page's: with since= (empty, or
        the "version" of its last answer) the rows without their GPU readings and each node's figures apart, all of
        them ("full": true) or what changed since that version (changes.Changes.body). Bytes made once per refresh
        and shared by every browser."""
        asked = _query({"since": _version})
        view = current()
        if "since" not in asked:  # a script's: the whole view, each GPU's readings in its node's row
            return Response(view.body, mimetype="application/json")
        if own_changes:  # a watcher without its own (a test's): the first request of each view takes it
            changes.take(view)
        zipped = "gzip" in request.headers.get("Accept-Encoding", "")
        answer = Response(changes.body(asked["since"] or None, zipped), mimetype="application/json")
        answer.headers["Vary"] = "Accept-Encoding"
        if zipped:
            answer.headers["Content-Encoding"] = "gzip"
        return answer

    @app.get("/api/nodes")
    def node_list():
        """A page of whole rows (each GPU's readings), filtered and sorted here: what the Nodes list draws."""
        asked = _query({"state": _choice(STATES), "name": _name_filter, "sort": _choice(SORTS),
                        "desc": _choice(("0", "1")), "offset": _offset, "limit": _limit_of(_NODES_PAGE_MAX)})
        view = current()
        question = tuple(str(asked.get(key, default)) for key, default in (("state", ""), ("name", ""),
                                                                            ("sort", "name"), ("desc", "0")))
        with lists_lock:  # each browser with its list open asks it every refresh: sorted once a view
            if lists.get("view") is not view:
                lists.clear()
                lists["view"] = view
            found = lists.get(question)
        if found is None:
            found = ordered(view.data["nodes"], *question[:3], question[3] == "1")
            with lists_lock:
                if lists.get("view") is view and len(lists) <= _LISTS_KEPT:
                    lists[question] = found
        offset = int(asked.get("offset", 0))
        # an agent's figure that JSON has not (an infinity) made null, as in /api/cluster: a browser refuses it all
        return Response(json_bytes({"total": len(found), "offset": offset,
                                    "rows": found[offset:offset + int(asked.get("limit", _NODES_PAGE))]}),
                        mimetype="application/json")

    @app.get("/api/timeline")
    def timeline():
        asked = _query({"node": _name, "source": _choice(_SOURCES), "severity": _choice(_TIMELINE_SEVERITIES),
                        "event": _event_text, "limit": _limit})
        view = current()
        node, source, limit = asked.get("node"), asked.get("source"), int(asked.get("limit", 300))
        severity, event_text = asked.get("severity"), asked.get("event")
        if node is not None:
            known_node(node)
        from slurm_ext.repair.history import Entry, in_causal_order, result_lines
        entries, severities = [], {}

        def add(entry: Entry, level: str) -> None:
            if severity in (None, level) and (event_text is None or event_text in entry.event):
                entries.append(entry)
                severities[_same(entry)] = level
        if source in (None, "slurm"):
            for event in view.slurm_events:
                if node in (None, event.node):
                    who = f" (by {event.user})" if event.user else ""
                    add(Entry(event.start.timestamp(), event.node, "slurm", event.state.lower(),
                              f"{event.state}: {event.reason}{who}", event.user), _slurm_severity(event.state))
        if source in (None, "repair"):
            for e in view.repair_events:
                if node in (None, e.node):
                    add(Entry(e.time, e.node or "-", "repair", e.event, e.message, e.user, e.acts),
                        _repair_severity(e.event))

        if source in (None, "agent"):
            # the collector's own rows (component repair: a journal that lost lines) are said per node elsewhere;
            # oldest first, as the other sources: in_causal_order keeps the order of one second's entries
            for when, name, data in reversed(_journal(limit, node=node, but=("repair",), severity=severity or "",
                                                      text=event_text or "")):
                add(Entry(when, name, "agent", f"{data.get('component', '?')}/{data.get('event', '?')}",
                          str(data.get("message", "")), lines=result_lines(data)), str(data.get("severity", "info")))
        # as `slurm-ext history` orders them: what a repair step caused after it, where clocks are whole seconds
        # in_causal_order moves an entry after its cause as a copy (another time): its severity is found by the rest
        entries = [{**asdict(e), "severity": severities.get(_same(e), "info")}
                   for e in reversed(in_causal_order(entries))]
        return jsonify(entries=entries[:limit])

    @app.get("/api/health")
    def health_events():
        asked = _query({"node": _name, "check": _choice(tuple(CHECKS)), "severity": _choice(SEVERITIES),
                        "state": _choice(("open", "cleared")), "limit": _limit})
        node, check, severity, state = asked.get("node"), asked.get("check"), asked.get("severity"), asked.get("state")
        if node is not None:
            known_node(node)
        rows = [row for row in current().data["nodes"] if node in (None, row["name"])]

        def wanted(item: dict) -> bool:
            return check in (None, item.get("check")) and severity in (None, item.get("severity"))
        # what each node's agent holds open now (its last answer): the Health checks tab's "open findings"
        open_findings = [{"node": row["name"], **found} for row in rows for found in row["agent_findings"]
                         if isinstance(found, dict) and wanted(found)]
        open_now = {row["name"]: {(f.get("check"), f.get("subject")) for f in row["agent_findings"]
                                  if isinstance(f, dict)}
                    # only where the agent served its monitor's readings: without them it says nothing of what is open
                    for row in rows if row["agent"]["answered"] and not row["agent"]["error"]
                    and row["agent"]["readings_time"] is not None}
        found = _journal(_HEALTH_SCAN, node=node, components=("health",))
        entries = [e for e in history_rows(found, open_now) if wanted(e) and state in (None, e["state"])]
        return jsonify(open=open_findings, entries=entries[:int(asked.get("limit", 300))])

    @app.get("/api/acceptance")
    def acceptance():
        """Each node's last acceptance run, with every result and its figures against their limits (the Health checks
        tab's Acceptance table), and whether acceptance is on for the cluster."""
        asked = _query({"node": _name})
        node = asked.get("node")
        if node is not None:
            known_node(node)
        view = current()
        return jsonify(acceptance=view.data["acceptance"], nodes=watcher.acceptance_runs(node))

    @app.get("/api/repairs")
    def repairs():
        _query({})
        view = current()
        steps: dict[int, list] = {}
        for event in view.repair_events:
            if event.record is not None:
                steps.setdefault(event.record, []).append({"time": event.time, "event": event.event,
                                                           "message": event.message, "user": event.user})
        def row(r) -> dict:
            return {**{k: getattr(r, k) for k in ("id", "node", "signature", "action", "evidence", "jobs", "state",
                                                  "step", "opened", "updated", "closed", "decided_by", "decided_at",
                                                  "note")}, "steps": steps.get(r.id, [])}
        repaired = {r.id: r for r in view.records if r.state not in ("recommended", "gone")}
        repaired.update({r.id: r for r in view.open_records if r.state in ("approved", "running")})
        return jsonify(open=[row(r) for r in view.open_records],
                       history=[row(r) for r in sorted(repaired.values(), key=lambda r: r.updated, reverse=True)],
                       paused=view.data.get("paused"), actions=list(ACTIONS))

    @app.get("/api/session")
    def session():
        _query({})
        user, via, role, problem, hint, expired = None, None, None, "", "", False
        if settings.token_file and not tokens.usable():
            hint, problem = (_NO_TOKEN_YET, "") if tokens.none_yet else ("", _TOKENS_UNUSABLE)
            if signin is not None and tokens.none_yet:
                hint = ""  # people sign in: no token is missing
        try:  # who the credentials sent are: the header names the operator, a wrong token says so
            found = who_asks()
            if found is not None:
                user, via, role = found.user, found.via, found.role
        except RequestRefused as err:  # recorded as a refused operation is: guessing here is seen as there
            problem, expired = str(err), getattr(err, "clear_session", False)
            on_record(err)
        answer = jsonify(csrf=csrf.issue(), user=user, via=via, role=role, tokens=bool(settings.token_file),
                         proxy=settings.proxy_user_header or None, problem=problem, hint=hint, checks=list(CHECKS),
                         signin=signin is not None, viewing=settings.viewing,
                         signin_needed=settings.viewing == "signed-in" and user is None)
        if expired:
            answer.delete_cookie(COOKIE, path=cookie_path)
        return answer

    # -- operations -------------------------------------------------------------------------------------
    # The CSRF token travels in a header of its own: another site's page cannot read one, and cannot send that
    # header here without a CORS preflight, which this server never grants (so no Origin check, which a reverse
    # proxy that rewrites Host would break).

    def operation(node_name: str) -> tuple[Operator, dict]:
        """Who asks (an operator or admin, with a CSRF token from this server), about which node.

        Raises:
            RequestRefused: no CSRF token (403), no credentials (401), a role that may not operate (403).
        """
        csrf.check(request.headers.get("X-CSRF-Token"))
        who = who_asks()
        if who is None:
            who = operator_of(request.headers, request.remote_addr, settings, tokens, proxy_secret)  # says how
        if who.role not in _OPERATOR_ROLES:
            what = _OPERATIONS.get(request.path.rstrip("/").rsplit("/", 1)[-1], "do this")
            raise RequestRefused(403, f"your role {who.role or 'none'} cannot {what}: operator or admin needed "
                                      f"({who.user})")
        return who, known_node(_checked_name(node_name))

    def body() -> dict:
        if not request.data:
            return {}
        try:
            data = json.loads(request.data)
        except (ValueError, RecursionError):
            raise BadRequest(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise BadRequest(400, "the body is not a JSON object")
        return data

    def record(who: Operator, node: str, event: str, message: str) -> None:
        emit("web-operation", f"{message} (by {who.user}, {who.via}, from {request.remote_addr})", node=node,
             user=who.user, operation=event)

    def decision(decide_it: Callable) -> object:
        """`decide_it(store)` on the repair database: a refusal is 409 with its reason, a database away 503."""
        from slurm_ext.repair import decide
        store = _opened(open_store)
        try:
            return decide_it(store)
        except decide.DecisionRefused as err:
            raise BadRequest(409, str(err)) from None
        except SlurmExtError as err:
            raise BadRequest(503, f"the repair database does not answer: {err}") from None
        finally:
            store.close()

    @app.post("/api/nodes/<node>/approve")
    def approve(node: str):
        from slurm_ext.repair import decide
        who, row = operation(node)
        action = body().get("action") or None
        if action is not None and action not in ACTIONS:
            raise BadRequest(400, f"action {str(action)[:40]!r}: expected one of {', '.join(ACTIONS)}")
        cluster_nodes = len(current().data["nodes"])
        _, said = decision(lambda store: decide.approve(store, row["name"], who.user, config.repair, cluster_nodes,
                                                        action=action))
        record(who, row["name"], "approve", said)
        return jsonify(message=f"{said}: the repair service takes it up within {config.repair.interval:g}s",
                       user=who.user)

    @app.post("/api/nodes/<node>/reject")
    def reject(node: str):
        from slurm_ext.repair import decide
        who, row = operation(node)
        why = str(body().get("why") or "").strip()
        if not why:
            raise BadRequest(400, "a rejection needs its reason: {\"why\": \"...\"}")
        done = decision(lambda store: decide.reject(store, row["name"], who.user, why[:1000]))
        record(who, row["name"], "reject", f"rejected {done.action} of node {row['name']}: {why[:200]}")
        return jsonify(message=f"rejected {done.action} of node {row['name']}: recorded; the node stays drained",
                       user=who.user)

    @app.post("/api/nodes/<node>/reopen")
    def reopen(node: str):
        from slurm_ext.repair import decide
        who, row = operation(node)
        body()
        done = decision(lambda store: decide.reopen(store, row["name"], who.user))
        record(who, row["name"], "reopen", f"reopened {done.action} of node {row['name']}")
        return jsonify(message=f"reopened {done.action} of node {row['name']}: it awaits approval again",
                       user=who.user)

    @app.post("/api/nodes/<node>/clear")
    def clear(node: str):
        """An operator's `health clear` of the node's open findings (of a check, about a GPU), asked of its agent
        with the agent credential and recorded with the operator: the page's button, and `slurm-ext health clear
        NODE` on the controller, which comes here with the operator's token."""
        who, row = operation(node)
        asked = body()
        # gpu: the command line's --gpu (every finding about that GPU); subject: the one finding of a row of the
        # Health checks tab, as its monitor names it (an xid 48 beside the same GPU's xid 79, one mount point)
        check, gpu, subject = (str(asked.get(key) or "") for key in ("check", "gpu", "subject"))
        if check and check not in CHECKS:
            raise BadRequest(400, f"check {check[:40]!r}: expected one of {', '.join(CHECKS)}")
        if gpu and not _GPU_NAME.match(gpu):
            raise BadRequest(400, f"gpu {gpu[:40]!r}: expected a GPU's index, UUID or PCI bus id")
        if subject and (gpu or not CLEAR_SUBJECT.match(subject)):
            raise BadRequest(400, f"subject {subject[:40]!r}: expected one finding's subject (printable, at most 256 "
                                  "characters), and no gpu beside it")
        what = " ".join(part for part in (f"check {check}" if check else "", f"gpu {gpu}" if gpu else "",
                                          f"subject {subject!r}" if subject else "") if part)
        what = f" ({what})" if what else ""
        record(who, row["name"], "clear", f"asked node {row['name']}'s health monitor to clear its findings{what}")
        try:
            answer = watcher.agent_client.clear_findings(row["name"], who.user, check, gpu or subject, row["addr"],
                                                         _CLEAR_TIMEOUT)
        except AgentAnswerError as err:
            raise BadRequest(409 if err.status in (400, 409) else 502, str(err)) from None
        if not answer.taken:
            return jsonify(message=f"node {row['name']}'s health monitor did not take the clear up within "
                                   f"{answer.waited:g}s: it is taken up when the monitor comes to it", taken=False,
                           user=who.user)
        return jsonify(message=f"node {row['name']}'s health monitor cleared its open findings{what} for {who.user}: "
                               "its health-cleared events name each (`slurm-ext history --node "
                               f"{row['name']}`)", taken=True, user=who.user)

    @app.post("/api/nodes/<node>/check")
    def check(node: str):
        who, row = operation(node)
        body()
        if not checks_running.acquire(blocking=False):  # each waits on an agent: the polls keep their threads
            raise BadRequest(429, f"{_CHECKS_AT_ONCE} health checks are running already: ask again in a few seconds")
        try:
            return run_check(who, row)
        finally:
            checks_running.release()

    def run_check(who: Operator, row: dict):
        agents, name, addr = watcher.agent_client, row["name"], row["addr"]
        try:
            before = agents.health(name, addr, settings.agent_timeout)
        except AgentAnswerError as err:
            raise BadRequest(502, str(err)) from None
        baseline = before.monitor.readings_time if before.monitor else 0.0
        # recorded before anything is asked of the node: no operation without its user
        decision(lambda store: _event(store, name, "health-check-run", f"health checks asked from the page "
                                                                       f"by {who.user}", who.user))
        try:
            agents.check_now(name, addr, settings.agent_timeout)  # asked within the second: that reading is ours too
        except AgentAnswerError as err:
            raise BadRequest(409 if err.status == 409 else 502, str(err)) from None
        monitor = _fresh_reading(agents, name, addr, before.boot, baseline, settings.agent_timeout)
        if monitor is None:
            raise BadRequest(504, f"node {row['name']}: no new reading of its health monitor within "
                                  f"{_CHECK_WAIT:g}s (NVML hanging, or no GPU readings on this node? see "
                                  "`slurm-ext health show` there)")
        findings = list(monitor.findings)
        verdict = ("healthy" if not findings else
                   "; ".join(f"{f.get('severity')}: {f.get('check')} {f.get('evidence')}" for f in findings[:5]))
        record(who, row["name"], "check", f"ran the health checks of node {row['name']}: {verdict}")
        return jsonify(node=row["name"], verdict=verdict, findings=findings, checks=monitor.checks,
                       readings_time=monitor.readings_time, user=who.user)

    return app


class _Rate:
    """A token bucket per address: `rate` a `period`, as a burst too; the addresses kept are bounded (those whose
    bucket is full again are forgotten first)."""

    _MAX_ADDRESSES = 10000

    def __init__(self, rate: int, period: float):
        self.rate, self.period = rate, period
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, address: str, now: float) -> int:
        """0 when `address` may go on (one token taken), else the seconds until it may."""
        every = self.period / self.rate
        with self._lock:
            tokens, last = self._buckets.get(address, (float(self.rate), now))
            tokens = min(float(self.rate), tokens + (now - last) / every)
            if tokens < 1:
                self._buckets[address] = (tokens, now)
                return max(1, int((1 - tokens) * every + 0.999))
            if len(self._buckets) >= self._MAX_ADDRESSES and address not in self._buckets:
                full = [a for a, (t, at) in self._buckets.items() if t + (now - at) / every >= self.rate]
                for gone in full or list(self._buckets):
                    del self._buckets[gone]
            self._buckets[address] = (tokens - 1, now)
            return 0


def _event_text(text: str) -> str:
    if not text or len(text) > 64 or not all(c.isalnum() or c in "-_/." for c in text):
        raise ValueError("part of an event's name (letters, digits, - _ / .)")
    return text


def _same(entry) -> tuple:
    """A timeline entry but its time: what a copy that in_causal_order moved keeps of it."""
    return (entry.node, entry.source, entry.event, entry.message, entry.user, entry.acts, entry.record, entry.lines)


def _slurm_severity(state: str) -> str:
    """A Slurm node event's severity on the timeline: a node taken from work (down, drained, failing) warns."""
    return "warning" if any(word in state.upper() for word in ("DOWN", "DRAIN", "FAIL")) else "info"


def _repair_severity(event: str) -> str:
    """A repair event's severity on the timeline: a step that failed or was refused is an error."""
    return "error" if any(word in event for word in ("fail", "refused", "timeout")) else "info"


def _checked_name(name: str) -> str:
    try:
        return _name(name)
    except ValueError as err:
        raise BadRequest(404, f"no node {name[:60]!r}: expected {err}") from None


def _event(store, node: str, event: str, message: str, user: str) -> None:
    with store.locked():
        store.event(node, event, message, user)


def _opened(opener):
    try:
        return opener()
    except SlurmExtError as err:
        raise BadRequest(503, f"the repair database does not answer: {err}") from None


def _fresh_reading(agents: AgentClient, node: str, addr: str, boot: str, baseline: float, timeout: float
                   ) -> Readings | None:
    """The node's health monitor's readings once newer than `baseline` (both on the node's clock, in boot `boot`),
    or None."""
    deadline = time.monotonic() + _CHECK_WAIT
    while time.monotonic() < deadline:
        try:
            answer = agents.health(node, addr, timeout)
        except AgentAnswerError:
            answer = None
        if answer is not None and answer.boot == boot and answer.monitor and answer.monitor.readings_time > baseline:
            return answer.monitor
        time.sleep(0.2)
    return None

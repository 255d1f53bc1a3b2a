"""The page's sign-in session: a signed, short-lived cookie naming the person the IdP signed in.

`Sessions.issue(person)` makes the cookie's value, `Sessions.read(value)` gives the `Person` back or raises
`SessionRefused`; `Sessions.end(value)` ends it before its time (logout). The cookie carries the IdP's subject,
the person's name and email, the page's role and the expiry, signed with HMAC-SHA256 (itsdangerous) under a key
of this process or web.session_key_file: it keeps no secret of the IdP (no ID or access token), so reading it
gives nothing but what the page shows. Its expiry is inside the signed value, not only the cookie's Max-Age: a
browser that keeps it longer gains nothing. A session ended by logout is remembered (its id, until its expiry)
so a copy of the cookie stops working too; with web.session_key_file (sessions that outlive a restart) the ended
ids are kept in the page's own folder, <[node] state_dir>/web/ (web-sessions-ended.json, pruned at their expiry),
else a restart would bring every signed-out cookie back. That folder is web.user's (the agent makes it, 0700, as
it makes the page's credentials folder: state_dir itself is root's); a file that cannot be written there is said
once, at the start (`unkept`), not at every logout.

Without web.session_key_file the key is random per process: a restart of the page signs everyone out (the
IdP's own session usually makes signing in again one click).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass

from itsdangerous import BadSignature, URLSafeSerializer

from slurm_ext.errors import SlurmExtError

from slurm_ext.fileio import atomic_write

from .secretfile import SecretFile, SecretFileError

__all__ = ["Person", "Sessions", "SessionRefused", "COOKIE", "ROLES", "person_text", "MIN_KEY", "ENDED_FILE"]

log = logging.getLogger("web")

#: the sign-in session's cookie (the __Host- prefix is not used: the page is also served on plain http on loopback)
COOKIE = "slurm_ext_session"
#: the page's roles, lowest first: each can do what the ones before it can
ROLES = ("viewer", "operator", "admin")
#: shortest key of web.session_key_file
MIN_KEY = 32
#: the longest the history's user column holds (repair_events.user VARCHAR(255))
_USER_MAX = 255
#: the file of the page's own folder (<[node] state_dir>/web/) that keeps the sessions ended by a logout (with
#: web.session_key_file only)
ENDED_FILE = "web-sessions-ended.json"
#: most ended sessions kept (the ones nearest their expiry are forgotten first: they would end soon anyway)
_ENDED_MAX = 20000
_CONTROL = re.compile(r"[\x00-\x1f\x7f<>()]+")


class SessionRefused(SlurmExtError):
    """A cookie that gives no session: expired, ended, or not signed by this page (the message says which)."""


@dataclass(frozen=True, slots=True)
class Person:
    """Who a sign-in session is."""

    #: the IdP's subject (`sub`): the one name of the person that never changes
    subject: str
    #: the name the IdP gives (`name`, else `preferred_username`), "" when none
    name: str
    #: the email the IdP gives, "" when none
    email: str
    #: viewer, operator or admin; "" when the person is in no group the page maps (viewing only, where anyone may)
    role: str
    #: when the session ends (Unix time)
    expires: float
    #: the session's own id (a logout ends that one)
    sid: str = ""

    @property
    def user(self) -> str:
        """The person as the repair history and the journal name them: `person_text`."""
        return person_text(self.subject, self.name, self.email)


def _clean(text: str, most: int) -> str:
    return " ".join(_CONTROL.sub(" ", text).split())[:most]


def person_text(subject: str, name: str = "", email: str = "") -> str:
    """`Ada Lovelace <ada@example.org> (oidc:SUBJECT)`: the name and email the IdP gives (either may be missing),
    and its subject, which alone never changes; at most 255 characters (the history's user column), the subject
    kept whole."""
    subject_part = f"(oidc:{_clean(subject, 160)})"
    room = _USER_MAX - len(subject_part) - 1
    name, email = _clean(name, 80), _clean(email, 120)
    said = " ".join(part for part in (name, f"<{email}>" if email else "") if part)[:max(room, 0)].strip()
    return f"{said} {subject_part}" if said else subject_part


class Sessions:
    """Issues and reads the session cookies of one page process."""

    def __init__(self, lifetime: float, key_file: str = "", clock=time.time, folder: str = ""):
        """`folder`: the page's own folder (web.user's), where the ended sessions are kept."""
        self.lifetime = lifetime
        self._clock = clock
        self._key_file = SecretFile(key_file, "web.session_key_file") if key_file else None
        self._random_key = secrets.token_bytes(32)
        #: salt -> (the key it was made with, the serializer): a key file that changes makes a new one
        self._serializers: dict[str, tuple[bytes, URLSafeSerializer]] = {}
        self._lock = threading.Lock()
        # the file is written outside _lock (every request's read() takes it), one writer at a time
        self._write_lock = threading.Lock()
        #: why web.session_key_file is not used ("" when it is, or none is set): for the log
        self.problem = ""
        #: why the ended sessions cannot be kept across a restart ("" when they can): said once (log, the start event)
        self.unkept = ""
        # with a random key no session outlives the process: nothing to keep
        self._folder = folder.rstrip("/") if key_file and folder else ""
        self._ended_path = f"{self._folder}/{ENDED_FILE}" if self._folder else ""
        self._ended: dict[str, float] = self._load_ended()
        if self._ended_path:  # written now: a folder the page cannot write is found at the start, not at a logout
            try:
                os.makedirs(self._folder, mode=0o700, exist_ok=True)  # run by hand as root; the agent makes it
            except OSError:
                pass  # said by the write
            self._save_ended()

    def _load_ended(self) -> dict[str, float]:
        """The sessions ended before a restart (those not expired yet); {} without the file, or a file that cannot
        be read (logged: those sessions would come back)."""
        if not self._ended_path:
            return {}
        try:
            with open(self._ended_path, encoding="utf-8") as found:
                data = json.load(found)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("web: the sessions ended by logout cannot be read from %s (%s): signed-out cookies of "
                        "before the restart work again until they expire", self._ended_path, err)
            return {}
        now = self._clock()
        found = {str(sid): float(until) for sid, until in data.items()
                 if isinstance(until, (int, float)) and until > now} if isinstance(data, dict) else {}
        return _latest(found)

    def _save_ended(self) -> None:
        """Write the ended sessions where the next process finds them: a copy taken under the lock, written outside
        it (requests go on meanwhile), one writer at a time (the last copy written is the newest). A failure is
        logged once (`unkept`), and again only after the file could be written in between."""
        if not self._ended_path:
            return
        with self._write_lock:
            with self._lock:
                ended = dict(self._ended)
            try:
                atomic_write(self._ended_path, json.dumps(ended), mode=0o600, fsync="file")
            except OSError as err:
                if not self.unkept:
                    self.unkept = (f"the sessions ended by logout cannot be kept in {self._ended_path} "
                                   f"({err.strerror or err}): after a restart a signed-out cookie works again until "
                                   f"it expires (the folder must be writable by the page's user, uid {os.geteuid()})")
                    log.warning("web: %s", self.unkept)
                return
            self.unkept = ""

    def serializer(self, salt: str) -> URLSafeSerializer:
        """A signer under the sessions' key for another short-lived value of the page (the sign-in's state
        cookie); raises SessionRefused as `issue` does. Made once per key and salt: every request reads its
        cookie with it (a new one each time was a quarter of the session check)."""
        key = self._key()
        made = self._serializers.get(salt)
        if made is None or made[0] != key:
            made = key, URLSafeSerializer(key, salt=salt, signer_kwargs={"digest_method": hashlib.sha256})
            self._serializers[salt] = made
        return made[1]

    def _key(self) -> bytes:
        """The signing key: web.session_key_file's, read again when it changes; the process's random one when none
        is set. A file that cannot be used is refused (SessionRefused): a session is never signed with a key the
        operator did not mean."""
        if self._key_file is None:
            return self._random_key
        try:
            key = self._key_file.read().strip()
        except SecretFileError as err:
            self.problem = str(err)
            raise SessionRefused(f"sign-in is off: web.session_key_file cannot be used ({err})") from None
        if len(key) < MIN_KEY:
            self.problem = f"web.session_key_file {self._key_file.path}: {len(key)} bytes (expected at least {MIN_KEY})"
            raise SessionRefused(f"sign-in is off: {self.problem}")
        self.problem = ""
        return key

    def _serializer(self) -> URLSafeSerializer:
        return self.serializer("slurm-ext web session")

    def issue(self, subject: str, name: str, email: str, role: str) -> tuple[str, Person]:
        """The cookie's value of a new session, and its person."""
        person = Person(subject, _clean(name, 200), _clean(email, 200), role, self._clock() + self.lifetime,
                        secrets.token_urlsafe(12))
        return self._serializer().dumps(asdict(person)), person

    def read(self, value: str) -> Person:
        """The session's person. Raises SessionRefused: not signed by this page (forged, or from before a restart
        with a random key), expired, or ended by a logout."""
        try:
            data = self._serializer().loads(value)
            person = Person(**data)
        except (BadSignature, TypeError, ValueError):
            raise SessionRefused("your sign-in is not valid here (the page restarted, or its key changed): sign in "
                                 "again") from None
        now = self._clock()
        if now >= person.expires:
            raise SessionRefused(f"your sign-in expired {now - person.expires:.0f}s ago (sessions last "
                                 f"{self.lifetime / 60:g} min): sign in again")
        with self._lock:
            if person.sid in self._ended:
                raise SessionRefused("this sign-in was ended (signed out): sign in again")
        return person

    def end(self, value: str) -> Person | None:
        """End the session of `value` (remembered until its expiry); its person, or None when it gave none."""
        try:
            person = self.read(value)
        except SessionRefused:
            return None
        now = self._clock()
        with self._lock:
            self._ended[person.sid] = person.expires
            self._ended = _latest({sid: until for sid, until in self._ended.items() if until > now})
        self._save_ended()
        return person


def _latest(ended: dict[str, float]) -> dict[str, float]:
    """`ended` cut to the _ENDED_MAX latest expiries (one sort: a large or tampered file costs no more)."""
    if len(ended) <= _ENDED_MAX:
        return ended
    return dict(sorted(ended.items(), key=lambda item: item[1])[-_ENDED_MAX:])

"""The one boundary between the node agents and the controller: what crosses it, who may cross it, and how much.

The controller's readers (the repair service after a repair, `slurm-ext
history`, the cluster page) ask a node's agent for its health (`HealthAnswer`:
the health monitor's `Readings`, a `GpuReading` per GPU, and the node's
`FactsReading`), for a page of its journal (`EventsPage`: the newest events; `JournalPage`: the events after a
cursor, which the controller's collector takes each once), to read the node
now (`AgentClient.check_now`) and to clear its findings for an operator
(`AgentClient.clear_findings`), for its last acceptance run and to start one
(`AcceptanceAnswer`, `AgentClient.acceptance`, `AgentClient.run_acceptance`:
the repair flow's proof before a resume). Every one of them goes through `AgentClient`,
which:

- proves it holds the cluster's agent credential (a secret in a root-only
  file, `node.agent_credential`): without it the agent answers 401, so a job's
  user cannot read other users' job details from an agent's journal. The proof
  is bound to the request, the node meant and the asker's clock
  (`request_signature`); the agent takes it once, on that node, within
  REQUEST_WINDOW of its own clock (`request_refusal`, `NonceMemory`), so a
  captured request is good neither later nor elsewhere;
- believes an answer only when the agent proved the same: the agent signs its
  answer with the credential over the node it is, its boot id, the nonce the
  asker sent, the status and the body (`answer_signature`), so a process that
  binds the agent's port before the agent starts, or a replay of an older
  answer, is not believed, and neither is the agent of another node;
- reads every answer with a size cap and a time cap (every read, the answer's
  head included, ends by one deadline), in one place (`_exchange`), whatever
  the other side sends;
- turns anything odd (no answer, too big, too slow, unsigned, not the record it
  should be) into one `AgentAnswerError` that says which node, where, and why;
  in an answer of the right shape, one GPU's or interface's odd figure is None
  for that field alone.

The agent's side (supervisor/http.py) checks a request with `request_refusal`
and signs its answer with `answer_signature`; both read the credential through
`CredentialFile`, which rereads the file when it changes (a rotation needs no
restart).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import threading
import time
from collections import OrderedDict
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .errors import SlurmExtError
from .journal import CURSOR
from .secretfile import SecretFileError, read_secret

__all__ = ["DEFAULT_CREDENTIAL", "Credential", "CredentialError", "CredentialFile", "create_credential",
           "AgentAnswerError", "GpuReading", "InterfaceReading", "FactsReading", "Readings", "HealthAnswer",
           "GpuResetAnswer", "ClearAnswer", "AcceptanceAnswer", "ACCEPTANCE_LEVELS", "ACCEPTANCE_TRIGGERS",
           "ACCEPTANCE_ASKED",
           "MAX_ACCEPTANCE", "JournalLine", "EventsPage", "JournalPage", "journal_query", "journal_body", "AgentClient",
           "request_signature", "answer_signature", "answer_headers", "request_refusal", "NonceMemory", "FetchError",
           "fetch",
           "get_text", "NONCE_HEADER", "TIME_HEADER", "SIGNATURE_HEADER", "BOOT_HEADER", "NODE_HEADER", "AUTH_SCHEME",
           "REQUEST_WINDOW", "REFUSED", "BUSY", "BUSY_RETRY", "MAX_HEALTH", "MAX_EVENTS", "EVENTS_SENT", "CUT_KEY",
           "JOURNAL_PAGE", "MAX_JOURNAL_PAGE",
           "OPERATOR_NAME", "CLEAR_SUBJECT"]

#: where the agent credential lives unless node.agent_credential says otherwise
DEFAULT_CREDENTIAL = "/etc/slurm-ext/agent-credential"
#: the shortest secret taken (bytes of the file's text): a guessable one is worse than none
_MIN_SECRET = 16
#: most bytes of a credential file read
_MAX_SECRET = 4096

#: the request's proof: "Authorization: SlurmExt <hex HMAC>"
AUTH_SCHEME = "SlurmExt"
NONCE_HEADER = "X-Slurm-Ext-Nonce"
#: the request's time (the asker's clock, epoch seconds), signed into its proof
TIME_HEADER = "X-Slurm-Ext-Time"
#: the answer's proof, and the node and boot it is bound to
SIGNATURE_HEADER = "X-Slurm-Ext-Signature"
#: in a request: the node the asker means (signed into its proof); in an answer: the node that answers
NODE_HEADER = "X-Slurm-Ext-Node"
BOOT_HEADER = "X-Slurm-Ext-Boot"
#: seconds a request's time may be off the agent's clock, either way; the agent remembers the nonces it took
#: for as long, so a request is taken once
REQUEST_WINDOW = 60.0
#: most nonces an agent remembers; past it, the oldest is forgotten and no request older than it is taken
_MAX_NONCES = 65536

#: most bytes of a /health answer (a node of 8 GPUs answers about 20 KiB)
MAX_HEALTH = 4 * 2**20
#: most bytes of an /events page the client takes (20,000 journal lines of about 400 bytes; a Prolog/Epilog
#: script's event carries up to 8 KiB of its output, so the agent cuts its answer at EVENTS_SENT)
MAX_EVENTS = 32 * 2**20
#: most bytes of journal lines an agent sends in one /events answer: the newest that fit, under MAX_EVENTS with
#: room for the line that says where it cut
EVENTS_SENT = MAX_EVENTS - 2**16
#: the key of an /events answer's first line when the agent cut it: {"cut": <older events not sent>,
#: "from": <the time of the first event sent>}; a journal event has no such key
CUT_KEY = "cut"
#: journal bytes a GET /journal sends unless asked for fewer, and the most it may be asked for; one event longer than
#: the page is still sent, alone (journal._LONGEST_LINE: 4 MiB), and the client's cap allows for it
JOURNAL_PAGE = 2**20
MAX_JOURNAL_PAGE = 8 * 2**20
_MAX_JOURNAL = MAX_JOURNAL_PAGE + 5 * 2**20
#: most bytes of an /acceptance answer (a run of 8 GPUs' tests, each with its figures, is about 30 KiB)
MAX_ACCEPTANCE = 2 * 2**20
#: most bytes of the answer to a POST or of any other GET through `get_text`
MAX_OTHER = 4 * 2**20
_CHUNK = 65536


# -- the credential ----------------------------------------------------------------------------------

class CredentialError(SlurmExtError):
    """The agent credential cannot be used: missing, unreadable, too short, or readable by others."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"agent credential {self.path}: {problem}")


@dataclass(frozen=True, slots=True)
class Credential:
    #: the file it was read from (named in every error)
    path: str
    secret: bytes = field(repr=False)


def _read_credential(path: str) -> tuple[Credential, tuple]:
    """The credential of `path` and the file's identity (device, inode, size, mtime) it was read at."""
    try:
        found = read_secret(path, max_bytes=_MAX_SECRET, check_folders=True, follow_link=True)
    except SecretFileError as err:
        raise CredentialError(path, _credential_problem(err)) from None
    secret = found.content.strip()
    if len(secret) < _MIN_SECRET:
        raise CredentialError(path, f"{len(secret)} bytes (expected at least {_MIN_SECRET}: "
                                    "`openssl rand -hex 32`)")
    info = found.info
    return Credential(path, secret), (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _credential_problem(err: SecretFileError) -> str:
    """read_secret's refusal in the credential's words, with what to do."""
    path, info = err.path, err.info
    if err.kind == "missing":
        return ("no such file: create it on every node and on the controller (`slurm-ext dev up` does for the dev "
                "cluster; in Slinky, the agent-credential Secret mounted into every pod), see "
                "docs/operator/agent-credential.md")
    if err.kind == "unreadable":
        return f"cannot be read: {err.problem} (it is root's: read it as root)"
    if err.kind == "mode":
        return (f"mode {stat.S_IMODE(info.st_mode):04o} lets others read it (expected 0600 or 0400, owned by root: "
                "chmod 600)")
    if err.kind == "owner":
        return (f"owned by uid {info.st_uid} (expected root, uid 0: chown root:root {path}): whoever owns it can "
                "change it, and pass for an agent")
    if err.kind == "size":
        return f"longer than {_MAX_SECRET} bytes: not a credential"
    if err.kind == "folder":
        if "cannot be read" in err.problem:
            return err.problem
        return (f"{err.problem}, who could put their own file in its place (expected a folder of root's that only "
                f"root writes: chown root {err.folder}; chmod go-w {err.folder})")
    return err.problem


class CredentialFile:
    """The credential of one file, read again whenever the file changed (a rotation takes effect at once).

    `get()` raises CredentialError for the file as it is now; a file that later becomes usable is taken then."""

    def __init__(self, path: str, fresh: float = 0.0, clock=time.monotonic):
        """`fresh`: seconds the folders' check holds while the file itself is unchanged (one stat). The collector's
        client asks hundreds of agents a second, and the whole check is four stat calls and a realpath; the agent's
        side checks all of it at every request."""
        self.path = str(path)
        self.fresh = fresh
        self._seen: tuple | None = None
        self._credential: Credential | None = None
        self._checked = -1e18
        self._clock = clock
        #: the page asks its agents on many threads at once
        self._lock = threading.Lock()

    def get(self) -> Credential:
        if self.fresh:
            now = self._clock()
            try:
                info = os.stat(self.path)
            except OSError:
                info = None
            with self._lock:
                if (info is not None and self._credential is not None and self._seen is not None
                        and now - self._checked < self.fresh and _file_identity(info) == self._seen[:5]):
                    return self._credential
        try:
            identity = _identity(self.path)
        except OSError:
            identity = None
        with self._lock:
            if identity is None or identity != self._seen or self._credential is None:
                self._credential = self._seen = None
                self._credential, _ = _read_credential(self.path)
                self._seen = identity
            self._checked = self._clock()
            return self._credential


def _identity(path: str) -> tuple:
    """What must stay the same for a credential read before to be taken again: the file (its content, and its mode
    and owner: a chmod or chown changes its ctime) and the mode and owner of its folders."""
    info = os.stat(path)
    folders = tuple((folder.st_mode, folder.st_uid) for folder in (
        os.stat(os.path.dirname(os.path.abspath(path))), os.stat(os.path.dirname(os.path.realpath(path)))))
    return _file_identity(info) + (info.st_mode, info.st_uid) + folders


def _file_identity(info: os.stat_result) -> tuple:
    """The file itself: which one, and whether its content, mode or owner changed (a chmod or chown changes its
    ctime)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def create_credential(path: str | os.PathLike) -> bool:
    """Write a new random credential to `path` (mode 0600) unless the file exists; True when written.

    For the dev cluster and the container cluster; a real cluster's comes from its secret store."""
    path = Path(path)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    import secrets
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32) + "\n")
    return True


def request_signature(secret: bytes, method: str, target: str, nonce: str, node: str = "", when: str = "") -> str:
    """The asker's proof that it holds the credential, bound to this one request: its method and target, its nonce,
    the node it is meant for and its time (`when`, as sent in TIME_HEADER)."""
    message = f"slurm-ext agent request\n{method}\n{target}\n{nonce}\n{node}\n{when}".encode()
    return _hmac_sha256(secret, message)


def answer_signature(secret: bytes, node: str, boot: str, nonce: str, status: int, body: bytes) -> str:
    """The agent's proof that it holds the credential, bound to the node it is, its boot, the asker's nonce and
    the answer itself."""
    head = f"slurm-ext agent answer\n{node}\n{boot}\n{nonce}\n{status}\n".encode()
    return _hmac_sha256(secret, head + body)


def answer_headers(secret: bytes, node: str, boot: str, nonce: str, status: int, body: bytes) -> dict[str, str]:
    """The headers that bind an agent's answer to it (the node, its boot, `answer_signature`): what the client checks
    before it believes the answer."""
    return {NODE_HEADER: node, BOOT_HEADER: boot,
            SIGNATURE_HEADER: answer_signature(secret, node, boot, nonce, status, body)}


def _hmac_sha256(secret: bytes, message: bytes) -> str:
    # hmac and hashlib imported at the first proof, not with the module: they load OpenSSL (4 MB) into every node
    # agent, most of which are asked nothing for hours
    import hashlib
    import hmac
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _same_proof(given: str, expected: str) -> bool:
    """Whether a proof read from a header (latin-1 text, anything a peer sent) is the expected hex digest.

    Compared as bytes: compare_digest refuses a str with a character beyond ASCII (TypeError), and any header is
    a refusal, never an error."""
    if not isinstance(given, str) or not given.isascii():
        return False
    import hmac
    return hmac.compare_digest(given.encode("ascii"), expected.encode("ascii"))


class NonceMemory:
    """The nonces an agent took within REQUEST_WINDOW, so that a request is taken once.

    Bounded: at most `limit` nonces; past it the oldest is forgotten and from then on no request at least as old
    as the forgotten one is taken (a request is refused rather than possibly taken twice)."""

    def __init__(self, window: float = REQUEST_WINDOW, limit: int = _MAX_NONCES):
        self.window = window
        self.limit = limit
        #: nonce -> the request's time, in the order taken
        self._seen: OrderedDict[str, float] = OrderedDict()
        #: requests at or before this time are refused: a nonce of theirs may have been forgotten
        self._floor = 0.0
        self._lock = threading.Lock()

    def take(self, nonce: str, when: float, now: float) -> str:
        """"" when `nonce` of a request at `when` is new (it is remembered), else why it is refused."""
        with self._lock:
            while self._seen:
                oldest, at = next(iter(self._seen.items()))
                if at >= now - self.window:
                    break
                del self._seen[oldest]
            if nonce in self._seen:
                return "its nonce was taken before: a replayed request"
            if when <= self._floor:
                return "older than the nonces this agent still remembers (more than " \
                       f"{self.limit} requests within {self.window:g}s): ask again"
            if len(self._seen) >= self.limit:
                _, at = self._seen.popitem(last=False)
                self._floor = max(self._floor, at)
            self._seen[nonce] = when
            return ""


def request_refusal(secret: bytes, method: str, target: str, headers: dict[str, str], node: str,
                    nonces: NonceMemory, now: float | None = None) -> tuple[str, bool]:
    """Why the agent of `node` refuses a request whose headers (names in lower case) are these: ("", True) when
    it is taken.

    The second value says whether the asker proved the credential: only then is the reason told (the node asked, the
    time, a replay); without the proof it is just "no proof". A taken request's nonce is remembered in `nonces`."""
    now = time.time() if now is None else now
    nonce = headers.get(NONCE_HEADER.lower(), "")
    when = headers.get(TIME_HEADER.lower(), "")
    asked = headers.get(NODE_HEADER.lower(), "")
    scheme, _, proof = headers.get("authorization", "").partition(" ")
    if scheme != AUTH_SCHEME or not 16 <= len(nonce) <= 128 or not nonce.isascii() or not nonce.isalnum():
        return "no proof of the agent credential", False
    if not _same_proof(proof.strip(), request_signature(secret, method, target, nonce, asked, when)):
        return "no proof of the agent credential", False
    try:
        moment = float(when)
        if not math.isfinite(moment):
            raise ValueError
    except ValueError:
        return f"its time {when[:40]!r} is not epoch seconds", True
    if asked != node:
        return f"it was meant for node {asked[:60]!r}, and this is node {node!r}", True
    if abs(moment - now) > nonces.window:
        return (f"its time is {moment - now:+.0f}s off this agent's clock (expected within {nonces.window:g}s: "
                "a replayed request, or a clock not synchronized)"), True
    replayed = nonces.take(nonce, moment, now)
    return (replayed, True) if replayed else ("", True)


# -- the records -------------------------------------------------------------------------------------

class AgentAnswerError(SlurmExtError):
    """A node's agent gave no answer that can be believed: it did not answer, answered too much or too slowly,
    refused the credential, did not prove its own, or answered something that is not the record asked for."""

    def __init__(self, node: str, address: str, problem: str, status: int = 0):
        self.node = node
        self.address = address
        self.problem = problem
        #: the HTTP status of the answer, 0 when there was none
        self.status = status
        super().__init__(f"node {node}'s agent at {address}: {problem}")


#: how an agent's 401 begins when the asker proved the credential and the request is refused all the same
REFUSED = "request refused: "
#: how an agent's 503 begins when its journal is being read for another /events request (one at a time, off its
#: probe thread); it says Retry-After: BUSY_RETRY seconds, and `AgentClient.events` asks once more after them
BUSY = "busy, ask again: "
BUSY_RETRY = 1.0


class _Odd(ValueError):
    """An answer's field is not what it should be (turned into AgentAnswerError by the client)."""


#: most characters kept of a text an agent sends for the page to show (a GPU's name, the OS image, the driver)
_MAX_TEXT = 200
#: most characters kept of an interface's name (Linux allows 15)
_MAX_INTERFACE = 64


#: the whole numbers a float holds exactly (2**53): one beyond may change passing through float, as `_figure`'s do
_FLOAT_WHOLE = 2 ** 53


def _figure(value) -> float | None:
    """A finite number of an answer, else None: NaN, infinity, an integer past float's range, text, and JSON's true
    and false (bool is an int to Python, not a figure to the page) are none."""
    if type(value) is float:  # most figures, first: 260,000 of them a page refresh at 10,000 nodes
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        figure = float(value)
    except OverflowError:
        return None
    return figure if math.isfinite(figure) else None


def _whole(value) -> int | None:
    """`_figure` as a whole number (cut toward zero, as int() does), else None."""
    if type(value) is int and -_FLOAT_WHOLE < value < _FLOAT_WHOLE:  # most, first: a float holds it exactly
        return value
    figure = _figure(value)
    return None if figure is None else int(figure)


def _words(value, most: int = _MAX_TEXT) -> str | None:
    """A text of an answer cut to `most` characters, else None."""
    return value[:most] if isinstance(value, str) else None


def _number(data: dict, key: str, default: float | None = None) -> float:
    value = _figure(data.get(key, default))
    if value is None:
        raise _Odd(f"{key}: expected a number, got {str(data.get(key))[:40]!r}")
    return value


def _text(data: dict, key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise _Odd(f"{key}: expected text, got {str(value)[:40]!r}")
    return value


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _Odd(f"{key}: expected an object, got {str(value)[:40]!r}")
    return value


def _objects(data: dict, key: str) -> tuple:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _Odd(f"{key}: expected a list of objects")
    return tuple(value)


# An answer is refused whole (AgentAnswerError) when its shape is wrong: not an object, a monitor or facts that are
# not objects, findings, gpus or interfaces that are not lists of objects, a node, boot or time that is not one.
# Such an answer is not a health answer, and nothing in it can be placed. Within one GPU row or one interface, a
# figure or a name that is missing, of the wrong type or not finite is None for that field alone: the page shows
# "-" for it, and one odd figure costs neither the GPU's other figures nor the node.

@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as the node's health monitor last read it: a row of "gpus" in its readings, which the monitor writes
    from health.records.GpuSample (with its Gpu under "gpu") and the jobs that hold the GPU; named as there.

    Only what the page shows is read; each field is None when the row's is missing, of the wrong type or not a
    finite number (see above), and texts are cut to _MAX_TEXT characters."""

    #: NVML's index of the GPU on its node
    index: int | None
    name: str | None
    uuid: str | None
    #: percent of the last sample period the GPU was busy
    utilization: int | None
    #: memory in use without the driver's reserve, free memory, and the driver's reserve (MiB, NVML memory v2)
    fb_used_mib: float | None
    fb_free_mib: float | None
    fb_reserved_mib: float | None
    #: degrees Celsius
    temperature: int | None
    #: NVML's error for a GPU that does not answer (lost, reset required), "" when it answered
    error_text: str | None
    #: the jobs recorded on the node that hold the GPU (job ids; anything else in the list is left out)
    jobs: tuple[int, ...] = ()

    @classmethod
    def of(cls, row: dict) -> GpuReading:
        gpu = row.get("gpu") if isinstance(row.get("gpu"), dict) else {}
        jobs = row.get("jobs")
        return cls(_whole(gpu.get("index")), _words(gpu.get("name")), _words(gpu.get("uuid")),
                   _whole(row.get("utilization")), _figure(row.get("fb_used_mib")), _figure(row.get("fb_free_mib")),
                   _figure(row.get("fb_reserved_mib")), _whole(row.get("temperature")), _words(row.get("error_text")),
                   tuple(job for job in jobs if type(job) is int) if isinstance(jobs, list) else ())

    def wire(self) -> dict:
        """The row as an agent's answer holds it, only what `of` reads: `of(wire())` is this reading."""
        return {"gpu": {"index": self.index, "name": self.name, "uuid": self.uuid}, "utilization": self.utilization,
                "fb_used_mib": self.fb_used_mib, "fb_free_mib": self.fb_free_mib,
                "fb_reserved_mib": self.fb_reserved_mib, "temperature": self.temperature,
                "error_text": self.error_text, "jobs": list(self.jobs)}


@dataclass(frozen=True, slots=True)
class InterfaceReading:
    """One network interface of a node's facts, as its agent read it (slurm_ext.nodefacts.Interface); a field is
    None when the answer's is missing or odd (see above)."""

    #: the interface's name, cut to _MAX_INTERFACE characters
    name: str | None
    #: link speed in Mbit/s, a positive whole number; None when unknown (a virtual link, a link that is down)
    speed_mbps: int | None
    #: bytes received and sent since the interface came up (the page's bandwidth is their rate)
    rx_bytes: float | None
    tx_bytes: float | None

    @classmethod
    def of(cls, item: dict) -> InterfaceReading:
        speed = item.get("speed_mbps")
        return cls(_words(item.get("name"), _MAX_INTERFACE), speed if type(speed) is int and speed > 0 else None,
                   _figure(item.get("rx_bytes")), _figure(item.get("tx_bytes")))

    def wire(self) -> dict:
        return {"name": self.name, "speed_mbps": self.speed_mbps, "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes}


@dataclass(frozen=True, slots=True)
class FactsReading:
    """What a node is, as its agent tells it (the answer's "facts": slurm_ext.nodefacts.NodeFacts as the agent read
    them); a text is None when the answer's is missing or not text, and is cut to _MAX_TEXT characters."""

    #: /etc/os-release's PRETTY_NAME (the image), "" when the agent does not know it
    os: str | None = None
    #: the running kernel's release
    kernel: str | None = None
    interfaces: tuple[InterfaceReading, ...] = ()

    @classmethod
    def of(cls, data: dict) -> FactsReading:
        """Raises _Odd: its interfaces are not a list of objects."""
        return cls(_words(data.get("os")), _words(data.get("kernel")),
                   tuple(InterfaceReading.of(item) for item in _objects(data, "interfaces")))

    def wire(self) -> dict:
        return {"os": self.os, "kernel": self.kernel, "interfaces": [i.wire() for i in self.interfaces]}


@dataclass(frozen=True, slots=True)
class Readings:
    """The health monitor's latest readings, as the node's agent answers them."""

    #: when the monitor last read the GPUs (the node's clock, epoch seconds; 0: never)
    readings_time: float
    #: the open findings, each as health.findings.Finding writes it
    findings: tuple
    #: check -> ok, failing, disabled, ...
    checks: dict
    #: the NVIDIA driver's version, empty when unknown (cut to _MAX_TEXT characters)
    driver: str
    gpus: tuple[GpuReading, ...]
    #: seconds between the monitor's polls (health.interval on the node; 0: not said)
    interval: float = 0.0

    @classmethod
    def of(cls, data: dict) -> Readings:
        """Raises _Odd: a field of the wrong shape (see above)."""
        return cls(_number(data, "readings_time", 0.0), _objects(data, "findings"), _table(data, "checks"),
                   _text(data, "driver", "")[:_MAX_TEXT], tuple(GpuReading.of(row) for row in _objects(data, "gpus")),
                   _number(data, "interval", 0.0))

    def wire(self) -> dict:
        return {"readings_time": self.readings_time, "findings": list(self.findings), "checks": self.checks,
                "driver": self.driver, "gpus": [gpu.wire() for gpu in self.gpus], "interval": self.interval}

    def critical(self) -> list[dict]:
        return [f for f in self.findings if f.get("severity") == "critical"]


@dataclass(frozen=True, slots=True)
class HealthAnswer:
    """A node agent's /health: who answers, and what its health monitor last saw."""

    node: str
    #: the node's boot id (the content of node.boot_id_file)
    boot: str
    #: the agent's clock when it answered (epoch seconds)
    time: float
    #: None when no health monitor has written readings on the node
    monitor: Readings | None
    #: the node's OS image, kernel, interfaces and their byte counters
    facts: FactsReading

    @classmethod
    def of(cls, data) -> HealthAnswer:
        """Raises _Odd: not a health answer (see above)."""
        if not isinstance(data, dict):
            raise _Odd("expected a JSON object")
        monitor = data.get("monitor")
        if monitor is not None and not isinstance(monitor, dict):
            raise _Odd("monitor: expected an object or null")
        return cls(_text(data, "node"), _text(data, "boot", ""), _number(data, "time"),
                   Readings.of(monitor) if monitor is not None else None, FactsReading.of(_table(data, "facts")))

    def wire(self) -> dict:
        """The answer as its agent sent it, only what `of` reads (a GPU's clocks, power and ECC counters left out):
        what the collector stores of it, a few hundred bytes a GPU, and `of(wire())` gives this answer back."""
        return {"node": self.node, "boot": self.boot, "time": self.time,
                "monitor": self.monitor.wire() if self.monitor is not None else None, "facts": self.facts.wire()}


@dataclass(frozen=True, slots=True)
class GpuResetAnswer:
    """A node agent's answer to POST /health/reset-gpu: whether the reset ran and worked, or which jobs hold the
    GPU (then nothing ran)."""

    gpu: int
    ran: bool
    ok: bool
    #: the command as the agent ran it, and its output's tail (control characters escaped), cut to _MAX_OUTPUT
    command: str
    output: str
    held_by: tuple[int, ...] = ()

    @classmethod
    def of(cls, data) -> GpuResetAnswer:
        """Raises _Odd: not a reset answer."""
        if not isinstance(data, dict):
            raise _Odd("expected a JSON object")
        gpu, ran, ok, held = data.get("gpu"), data.get("ran"), data.get("ok"), data.get("held_by")
        if type(gpu) is not int or type(ran) is not bool or type(ok) is not bool or not isinstance(held, list):
            raise _Odd("gpu, ran, ok and held_by: expected a number, two booleans and a list")
        return cls(gpu, ran, ok, _text(data, "command", "")[:_MAX_OUTPUT], _text(data, "output", "")[-_MAX_OUTPUT:],
                   tuple(job for job in held if type(job) is int))


#: characters of a reset's command and output kept from an answer
_MAX_OUTPUT = 4000

#: an operator's name as it crosses the boundary (a clear's `by`): the page's user names (a proxy may pass an email)
OPERATOR_NAME = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")
#: what a clear names its findings by: a GPU's index, UUID or PCI bus id, or one finding's subject as its monitor
#: names it (`<uuid>/xid48`, a mount point, an interface): any printable text, bounded (\Z: `$` takes a last "\n")
CLEAR_SUBJECT = re.compile(r"^[^\x00-\x1f\x7f]{1,256}\Z")


@dataclass(frozen=True, slots=True)
class ClearAnswer:
    """A node agent's answer to POST /health/clear: whether its health monitor took the clear up within the wait
    (what it cleared is in the node's journal, health-cleared events naming `by`)."""

    taken: bool
    #: seconds the agent waited for the monitor
    waited: float

    @classmethod
    def of(cls, data) -> ClearAnswer:
        """Raises _Odd: not a clear answer."""
        if not isinstance(data, dict) or type(data.get("taken")) is not bool:
            raise _Odd("expected a JSON object with taken: a boolean")
        return cls(data["taken"], _figure(data.get("waited")) or 0.0)


#: acceptance's levels, least first (acceptance.records.LEVELS, which a test holds to this): the controller compares
#: a run's level with the one a repair needs without importing acceptance, a floor above this one
ACCEPTANCE_LEVELS = ("quick", "standard", "extended")
#: why a run ran (acceptance.runner.TRIGGERS), and those a run may be asked for from the controller (start and idle
#: runs are the node's own)
ACCEPTANCE_TRIGGERS = ("start", "cluster", "repair", "idle", "manual")
ACCEPTANCE_ASKED = ("repair", "cluster", "manual")
_OUTCOMES = ("pass", "fail", "error")
#: most results one run may hold (8 GPUs' and a few interfaces' and paths' tests are far fewer)
_MAX_RESULTS = 1000
#: characters kept of a result's message (a fail's address ranges, an error's last lines)
_MAX_MESSAGE = 2000


def _acceptance_run(data) -> dict:
    """A run as acceptance.records.Run.to_json writes it, checked field by field and rebuilt: texts cut, an odd
    figure's value None, and a verdict that is the one its results give (a run that says pass with a failed test, or
    with no test at all, is no answer: a repair must never resume a node on it).

    Raises _Odd: not a run."""
    if not isinstance(data, dict):
        raise _Odd("expected an object or null")
    level = _text(data, "level")
    if level not in ACCEPTANCE_LEVELS:
        raise _Odd(f"level {level[:40]!r} is none of {', '.join(ACCEPTANCE_LEVELS)}")
    results = []
    for item in _objects(data, "results")[:_MAX_RESULTS + 1]:
        outcome = _text(item, "outcome")
        if outcome not in _OUTCOMES:
            raise _Odd(f"a result's outcome {outcome[:40]!r} is none of {', '.join(_OUTCOMES)}")
        figures = [{"name": _text(f, "name")[:_MAX_TEXT], "value": _figure(f.get("value")),
                    "unit": _words(f.get("unit")) or "", "limit": _figure(f.get("limit")),
                    "at_least": f.get("at_least") is not False} for f in _objects(item, "figures")]
        results.append({"test": _text(item, "test")[:_MAX_TEXT], "area": _text(item, "area", "")[:_MAX_TEXT],
                        "target": _text(item, "target", "")[:_MAX_TEXT], "outcome": outcome,
                        "message": _text(item, "message", "")[:_MAX_MESSAGE], "figures": figures,
                        "seconds": _number(item, "seconds", 0.0), "action": _text(item, "action", "none")[:_MAX_TEXT]})
    if len(results) > _MAX_RESULTS:
        raise _Odd(f"more than {_MAX_RESULTS} results")
    outcomes = {r["outcome"] for r in results}
    verdict = "fail" if "fail" in outcomes else "error" if "error" in outcomes or not results else "pass"
    if _text(data, "verdict") != verdict:
        raise _Odd(f"its verdict {str(data.get('verdict'))[:40]!r} is not its results' ({verdict})")
    skipped = _table(data, "not_applicable")
    return {"node": _text(data, "node")[:_MAX_TEXT], "level": level, "trigger": _text(data, "trigger")[:_MAX_TEXT],
            "started": _number(data, "started"), "finished": _number(data, "finished", 0.0),
            "profile": _text(data, "profile", "")[:_MAX_TEXT], "verdict": verdict,
            "boot_id": _text(data, "boot_id", "")[:_MAX_TEXT], "results": results,
            "not_applicable": {str(k)[:_MAX_TEXT]: str(v)[:_MAX_MESSAGE] for k, v in list(skipped.items())[:_MAX_RESULTS]}}


@dataclass(frozen=True, slots=True)
class AcceptanceAnswer:
    """A node agent's /acceptance: who answers, whether its acceptance is on, whether it runs tests now, and its last
    run (of the trigger asked) as acceptance.records.Run.to_json writes it, checked (`_acceptance_run`)."""

    node: str
    #: the node's boot id (node.boot_id_file): a run of another boot proves nothing of this one
    boot: str
    #: the agent runs tests now (a run it was asked for); a run started by hand is not seen until POST is refused
    running: bool
    #: [acceptance] enabled on the node: False, and it runs nothing asked of it
    enabled: bool
    #: None when the node has kept no run (of that trigger)
    run: dict | None

    @classmethod
    def of(cls, data) -> AcceptanceAnswer:
        """Raises _Odd: not an acceptance answer."""
        if not isinstance(data, dict):
            raise _Odd("expected a JSON object")
        running, enabled = data.get("running"), data.get("enabled")
        if type(running) is not bool or type(enabled) is not bool:
            raise _Odd("running and enabled: expected booleans")
        run = data.get("run")
        try:
            checked = None if run is None else _acceptance_run(run)
        except _Odd as err:
            raise _Odd(f"run: {err}") from None
        return cls(_text(data, "node"), _text(data, "boot", ""), running, enabled, checked)

    @property
    def verdict(self) -> str:
        """The run's verdict (pass, fail, error), "" when there is no run."""
        return self.run["verdict"] if self.run else ""


@dataclass(frozen=True, slots=True)
class JournalLine:
    #: epoch seconds
    time: float
    #: the line as the journal holds it (tells two events of one second apart)
    line: str
    data: dict


@dataclass(frozen=True, slots=True)
class EventsPage:
    """A node agent's /events: its journal's events since the time asked, oldest first."""

    node: str
    boot: str
    events: tuple
    #: lines that are not journal events, skipped (one odd line does not cost the node its timeline)
    skipped: int = 0
    #: older events the agent did not send, to keep its answer under MAX_EVENTS (0: none cut)
    cut: int = 0
    #: when cut: the time of the first event it sent (epoch seconds; the page holds nothing older)
    cut_from: float = 0.0

    @classmethod
    def of(cls, node: str, boot: str, body: str) -> EventsPage:
        found, skipped, cut, cut_from = [], 0, 0, 0.0
        for number, line in enumerate(body.splitlines(), 1):
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise TypeError
                if number == 1 and CUT_KEY in data and "time" not in data:
                    cut = int(_number(data, CUT_KEY))
                    cut_from = datetime.fromisoformat(_text(data, "from")).timestamp()
                    continue
                when = datetime.fromisoformat(data["time"]).timestamp()
            except (ValueError, KeyError, TypeError, RecursionError, OverflowError, OSError):
                skipped += 1
                continue
            found.append(JournalLine(when, line, data))
        return cls(node, boot, tuple(found), skipped, cut, cut_from)

    def shortfall(self) -> str:
        """What the page lacks, in words ("" when nothing): events cut by the agent, lines skipped."""
        said = []
        if self.cut:
            since = datetime.fromtimestamp(self.cut_from).astimezone().isoformat(timespec="seconds")
            said.append(f"{self.cut} older event(s) not sent by the agent (its answer's byte cap): its journal "
                        f"from {since} only")
        if self.skipped:
            said.append(f"{self.skipped} line(s) that are not journal events skipped")
        return "; ".join(said)


def journal_query(query: str) -> tuple[str, int]:
    """(cursor, bytes) of a GET /journal's query: after=<cursor> (empty or absent: from the journal's oldest file
    kept), max=<bytes> (1 to MAX_JOURNAL_PAGE, JOURNAL_PAGE when absent).

    Raises:
        ValueError: either is not one (the message says what is taken)."""
    asked = urllib.parse.parse_qs(query, keep_blank_values=True)
    cursor = asked.get("after", [""])[0]
    if not CURSOR.match(cursor):
        raise ValueError("after: expected a cursor as the last answer gave it (<16 hex digits>:<offset>), or "
                         "nothing for the start")
    try:
        size = int(asked.get("max", [str(JOURNAL_PAGE)])[0])
        if not 1 <= size <= MAX_JOURNAL_PAGE:
            raise ValueError
    except ValueError:
        raise ValueError(f"max: expected a count of bytes from 1 to {MAX_JOURNAL_PAGE}") from None
    return cursor, size


def journal_body(chunk) -> bytes:
    """The answer to GET /journal: a first line of JSON saying where the next page begins ("cursor"), whether more is
    written after it ("more"), whether the cursor's file was gone ("lost") and how many overlong lines were left out
    ("skipped"); then `chunk`'s lines (a journal.JournalChunk), one a line, as the journal holds them."""
    head = json.dumps({"cursor": chunk.cursor, "more": chunk.more, "lost": chunk.lost, "skipped": chunk.skipped})
    return b"\n".join((head.encode(), *chunk.lines, b""))


@dataclass(frozen=True, slots=True)
class JournalPage:
    """A node agent's GET /journal: its journal's lines after the cursor asked, and the cursor after them."""

    node: str
    boot: str
    cursor: str
    #: more is written after `cursor`: ask again now
    more: bool
    #: the cursor's file was no longer kept: the lines begin at the oldest file kept, and what was between is gone
    lost: bool
    #: lines longer than any event, which the agent left out
    skipped: int
    #: the lines, as the journal holds them (not parsed: the collector parses each once)
    lines: tuple[bytes, ...]

    @classmethod
    def of(cls, node: str, boot: str, body: bytes) -> JournalPage:
        """Raises ValueError: the first line is not the head journal_body writes."""
        head, _, rest = body.partition(b"\n")
        data = json.loads(head)
        if not isinstance(data, dict):
            raise ValueError("its first line is not a JSON object")
        cursor = data.get("cursor")
        if not isinstance(cursor, str) or not CURSOR.match(cursor):
            raise ValueError(f"its cursor {str(cursor)[:40]!r} is not one")
        skipped = data.get("skipped", 0)
        return cls(node, boot, cursor, data.get("more") is True, data.get("lost") is True,
                   max(skipped, 0) if isinstance(skipped, int) and not isinstance(skipped, bool) else 0,
                   tuple(line for line in rest.split(b"\n") if line))


# -- the client ----------------------------------------------------------------------------------------

class _Failed(Exception):
    def __init__(self, problem: str, status: int = 0):
        super().__init__(problem)
        self.problem, self.status = problem, status


class _DeadlineSocket:
    """A connected socket whose every send and receive ends by one deadline: http.client reads the status line and
    each header with a recv of its own, and a socket timeout would give each of them the whole time again."""

    def __init__(self, sock, deadline: float, timeout: float):
        self._sock, self._deadline, self._timeout = sock, deadline, timeout

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {self._timeout:g}s")
        self._sock.settimeout(left)
        return left

    def sendall(self, data) -> None:
        self._left()
        self._sock.sendall(data)

    def recv_into(self, buffer, size: int = 0) -> int:
        self._left()
        return self._sock.recv_into(buffer, size)

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_DeadlineReader(self))

    def settimeout(self, value) -> None:
        pass  # the deadline decides

    def close(self) -> None:
        pass  # http.client closes the connection as it passes the socket to the answer: _exchange closes it


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


def _exchange(address: str, method: str, target: str, headers: dict[str, str], timeout: float,
              limit: int, scheme: str = "http") -> tuple[int, dict[str, str], bytes]:
    """One HTTP request and its whole answer, within `timeout` seconds in all (connecting, sending, the answer's
    head and its body: every read ends by the one deadline) and `limit` bytes of body.

    Raises _Failed: no answer, an answer larger than `limit` (refused from its Content-Length, or once `limit` bytes
    came), one still coming at the deadline, or one that is not HTTP."""
    import http.client  # here, not at the top: with its email and ssl it is 6 MB the node agent, which only
    # checks requests, never pays
    host, _, port = address.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise _Failed(f"{address!r} is not host:port") from None
    deadline = time.monotonic() + timeout
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    connection = kind(host.strip("[]"), port_number, timeout=timeout)
    status = 0
    sock = None
    try:
        connection.connect()
        sock = connection.sock
        connection.sock = _DeadlineSocket(sock, deadline, timeout)
        connection.request(method, target, body=b"" if method == "POST" else None,
                           headers={**headers, "Connection": "close"})
        answer = connection.getresponse()
        status = answer.status
        length = answer.getheader("Content-Length")
        if length is not None and length.strip().isascii() and length.strip().isdigit() and int(length) > limit:
            raise _Failed(f"answer of {int(length)} bytes refused (at most {limit})", status)
        body = bytearray()
        while not answer.isclosed():  # closed: its whole length came (and its socket is gone, Python 3.13)
            chunk = answer.read1(_CHUNK)
            if not chunk:
                break
            body += chunk
            if len(body) > limit:
                raise _Failed(f"answer longer than {limit} bytes refused", status)
        return status, {k.lower(): v for k, v in answer.getheaders()}, bytes(body)
    except _Failed:
        raise
    except TimeoutError:
        raise _Failed(f"no complete answer within {timeout:g}s", status) from None
    except (OSError, http.client.HTTPException) as err:
        raise _Failed(str(getattr(err, "strerror", None) or err) or type(err).__name__, status) from None
    except (ValueError, LookupError) as err:  # http.client's own parsing of a hostile answer (a chunk size, ...)
        raise _Failed(f"not an HTTP answer ({type(err).__name__}: {str(err)[:80]})", status) from None
    finally:
        connection.close()
        if sock is not None:
            sock.close()


class FetchError(SlurmExtError):
    """A plain GET (not of an agent) gave no answer: why, and the URL asked."""

    def __init__(self, url: str, problem: str, status: int = 0):
        self.url, self.problem, self.status = url, problem, status
        super().__init__(f"{url}: {problem}")


#: most redirects a plain GET follows
_REDIRECTS = 3


def fetch(url: str, timeout: float, limit: int = MAX_OTHER, redirects: int = _REDIRECTS) -> tuple[int, bytes]:
    """(status, body) of a plain GET of `url` (http or https), following up to `redirects` redirects to http or
    https URLs, all within one `timeout` and `limit` bytes of each body: for what is not an agent (a Prometheus,
    the agent's own /livez for the kubelet's exec probe).

    Raises:
        FetchError: no answer, one over a cap, a redirect too many or to elsewhere than http(s)."""
    deadline = time.monotonic() + timeout
    for hop in range(redirects + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(url, "not an http or https URL")
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise FetchError(url, "its port is not a number") from None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        left = deadline - time.monotonic()
        if left <= 0:
            raise FetchError(url, f"no complete answer within {timeout:g}s")
        try:
            status, headers, body = _exchange(f"{host}:{port}", "GET", target, {"Host": parts.netloc}, left, limit,
                                              parts.scheme)
        except _Failed as err:
            problem = f"no complete answer within {timeout:g}s" if err.problem.startswith("no complete") else \
                err.problem
            raise FetchError(url, problem, err.status) from None
        if status not in (301, 302, 303, 307, 308) or "location" not in headers:
            return status, body
        if hop == redirects:
            raise FetchError(url, f"more than {redirects} redirects", status)
        url = urllib.parse.urljoin(url, headers["location"].strip())
    raise AssertionError("unreachable")


def get_text(url: str, timeout: float, limit: int = MAX_OTHER) -> tuple[str | None, str]:
    """(the body, "") of a plain GET of `url` (`fetch`: redirects followed, the same caps), or (None, why)."""
    try:
        status, body = fetch(url, timeout, limit)
    except FetchError as err:
        return None, err.problem
    if status != 200:
        return None, f"HTTP {status}: {body[:200].decode('utf-8', 'replace').strip()}"
    return body.decode("utf-8", "replace"), ""


class AgentClient:
    """The controller's side of the boundary: every question to a node's agent.

    `port` and `addresses` say where an agent listens (repair.agent_port, and repair.agents for a node whose
    agent is not at its NodeAddr); `credential` is the agent credential's file (node.agent_credential)."""

    def __init__(self, credential: str, port: int, addresses: dict | None = None, timeout: float = 5.0):
        self.credential = CredentialFile(credential, fresh=1.0)
        self.port = port
        self.addresses = dict(addresses or {})
        self.timeout = timeout

    @classmethod
    def of(cls, config, timeout: float = 5.0) -> AgentClient:
        """The client a loaded config describes."""
        return cls(config.node.agent_credential, config.repair.agent_port, config.repair.agents, timeout)

    def address(self, node: str, addr: str = "") -> str:
        """host:port of a node's worker agent: repair.agents' entry, else its NodeAddr (else its name) and the
        agents' port."""
        return self.addresses.get(node) or f"{addr or node}:{self.port}"

    def health(self, node: str, addr: str = "", timeout: float | None = None) -> HealthAnswer:
        """The node's agent's health answer.

        Raises:
            AgentAnswerError: no answer that can be believed, or one that names another node."""
        address = self.address(node, addr)
        boot, body = self._ask(node, address, "GET", "/health", MAX_HEALTH, timeout)
        try:
            answer = HealthAnswer.of(json.loads(body))
        except (ValueError, RecursionError) as err:
            raise AgentAnswerError(node, address, f"its /health is not a health answer: {err}") from None
        if answer.node != node or answer.boot != boot:
            raise AgentAnswerError(node, address, f"its /health names node {answer.node[:60]!r} boot "
                                                  f"{answer.boot[:40]!r}, not the {node!r} boot {boot[:40]!r} "
                                                  "it signed")
        return answer

    def events(self, node: str, addr: str = "", since: float = 0.0, limit: int | None = None,
               timeout: float | None = None) -> EventsPage:
        """The node's journal events since `since` (epoch seconds), at most `limit` (the newest).

        Raises:
            AgentAnswerError: as `health`; status 503 when the agent was busy reading its journal for others,
            asked twice a second apart (BUSY). A line that is not a journal event is skipped and counted (`skipped`);
            an agent that cut its answer to fit says so (`cut`)."""
        address = self.address(node, addr)
        target = f"/events?since={since:.0f}" + (f"&limit={limit}" if limit else "")
        try:
            boot, body = self._ask(node, address, "GET", target, MAX_EVENTS, timeout)
        except AgentAnswerError as err:
            if err.status != 503 or f"HTTP 503: {BUSY}" not in err.problem:
                raise
            time.sleep(BUSY_RETRY)  # its journal was being read for another asker (the page, `history`): once more
            boot, body = self._ask(node, address, "GET", target, MAX_EVENTS, timeout)
        return EventsPage.of(node, boot, body.decode("utf-8", "replace"))

    def journal(self, node: str, addr: str = "", cursor: str = "", size: int = JOURNAL_PAGE,
                timeout: float | None = None) -> JournalPage:
        """The node's journal lines after `cursor` ("": from its oldest file kept), about `size` bytes of them.

        Raises:
            AgentAnswerError: as `health`; also for an answer that is not a journal page; status 404 from an agent
            older than GET /journal."""
        address = self.address(node, addr)
        target = f"/journal?after={cursor}&max={int(size)}"
        try:
            boot, body = self._ask(node, address, "GET", target, _MAX_JOURNAL, timeout)
        except AgentAnswerError as err:
            if err.status != 503 or f"HTTP 503: {BUSY}" not in err.problem:
                raise
            time.sleep(BUSY_RETRY)
            boot, body = self._ask(node, address, "GET", target, _MAX_JOURNAL, timeout)
        try:
            return JournalPage.of(node, boot, body)
        except (ValueError, RecursionError) as err:
            raise AgentAnswerError(node, address, f"its /journal is not a journal page: {err}") from None

    def check_now(self, node: str, addr: str = "", timeout: float | None = None) -> bool:
        """Ask the node's health monitor to read the node now. True when asked, False when it was asked less than a
        second ago (that reading comes within the second: it is as good).

        Raises:
            AgentAnswerError: as `health`; status 409 when no health monitor runs there."""
        address = self.address(node, addr)
        try:
            self._ask(node, address, "POST", "/health/check", MAX_OTHER, timeout, expect=(202,))
        except AgentAnswerError as err:
            if err.status == 429:
                return False
            raise
        return True

    def reset_gpu(self, node: str, gpu: int, addr: str = "", timeout: float | None = None) -> GpuResetAnswer:
        """Have the node's agent reset GPU `gpu` (an approved reset-gpu repair); its answer says whether it ran and
        worked, or which jobs hold the GPU (nothing ran).

        Raises:
            AgentAnswerError: as `health`; status 404 when the node has no such GPU, 409 while another reset runs
            there."""
        address = self.address(node, addr)
        _, body = self._ask(node, address, "POST", f"/health/reset-gpu?gpu={int(gpu)}", MAX_OTHER, timeout)
        try:
            answer = GpuResetAnswer.of(json.loads(body))
        except (ValueError, RecursionError) as err:
            raise AgentAnswerError(node, address, f"its reset answer is not one: {err}") from None
        if answer.gpu != gpu:
            raise AgentAnswerError(node, address, f"it answered for GPU {answer.gpu}, not {gpu}")
        return answer

    def clear_findings(self, node: str, by: str, check: str = "", subject: str = "", addr: str = "",
                       timeout: float | None = None) -> ClearAnswer:
        """Have the node's health monitor clear its open findings (of `check`, about GPU `subject`; all when both are
        empty) and their drains, as operator `by` (named in its health-cleared events).

        Raises:
            AgentAnswerError: as `health`; status 400 for a check, GPU or name it does not take, 409 when no health
            monitor runs there or another clear is being taken up."""
        address = self.address(node, addr)
        if not OPERATOR_NAME.match(by) or (subject and not CLEAR_SUBJECT.match(subject)):
            raise AgentAnswerError(node, address, f"not asked: operator {by[:60]!r} or GPU {subject[:60]!r} is not "
                                                  "a name the agent takes")
        query = urllib.parse.urlencode({"by": by, "check": check, "gpu": subject})
        _, body = self._ask(node, address, "POST", f"/health/clear?{query}", MAX_OTHER, timeout)
        try:
            return ClearAnswer.of(json.loads(body))
        except (ValueError, RecursionError) as err:
            raise AgentAnswerError(node, address, f"its clear answer is not one: {err}") from None

    def acceptance(self, node: str, addr: str = "", trigger: str = "", timeout: float | None = None) -> AcceptanceAnswer:
        """The node's agent's acceptance answer: its last run (of `trigger`, when given), and whether one runs now.

        Raises:
            AgentAnswerError: as `health`; also when the run it sends is of another trigger than asked; status 500
            when the node's kept run is unreadable (its text says the file)."""
        address = self.address(node, addr)
        if trigger and trigger not in ACCEPTANCE_TRIGGERS:
            raise AgentAnswerError(node, address, f"not asked: trigger {trigger[:40]!r} is none of "
                                                  f"{', '.join(ACCEPTANCE_TRIGGERS)}")
        target = "/acceptance" + (f"?trigger={trigger}" if trigger else "")
        boot, body = self._ask(node, address, "GET", target, MAX_ACCEPTANCE, timeout)
        try:
            answer = AcceptanceAnswer.of(json.loads(body))
        except (ValueError, RecursionError) as err:
            raise AgentAnswerError(node, address, f"its /acceptance is not an acceptance answer: {err}") from None
        if answer.node != node or answer.boot != boot:
            raise AgentAnswerError(node, address, f"its /acceptance names node {answer.node[:60]!r} boot "
                                                  f"{answer.boot[:40]!r}, not the {node!r} boot {boot[:40]!r} "
                                                  "it signed")
        if trigger and answer.run is not None and answer.run["trigger"] != trigger:
            raise AgentAnswerError(node, address, f"asked for its last {trigger} run, it sent a "
                                                  f"{answer.run['trigger'][:40]} run")
        return answer

    def run_acceptance(self, node: str, level: str, trigger: str, addr: str = "", timeout: float | None = None) -> bool:
        """Have the node's agent run its acceptance tests of `level` now, for `trigger` (repair, cluster, manual),
        and apply the verdict through its node-state owner (a fail drains the node, a pass lifts acceptance's drain,
        a test that could not run does neither). True once the agent holds the node for the run (202: the run goes
        on there; `acceptance` says when it has ended and what it found); False when the agent refused (409):
        [acceptance] enabled is false on the node, or another run holds it (`acceptance` tells which).

        Raises:
            AgentAnswerError: as `health`; status 400 for a level or trigger the agent does not take."""
        address = self.address(node, addr)
        if level not in ACCEPTANCE_LEVELS or trigger not in ACCEPTANCE_ASKED:
            raise AgentAnswerError(node, address, f"not asked: level {level[:40]!r} or trigger {trigger[:40]!r} is "
                                                  f"none of {', '.join(ACCEPTANCE_LEVELS)} or "
                                                  f"{', '.join(ACCEPTANCE_ASKED)}")
        try:
            self._ask(node, address, "POST", f"/acceptance/run?level={level}&trigger={trigger}", MAX_OTHER, timeout,
                      expect=(202,))
        except AgentAnswerError as err:
            if err.status == 409:
                return False
            raise
        return True

    def _ask(self, node: str, address: str, method: str, target: str, limit: int, timeout: float | None,
             expect: tuple[int, ...] = (200,)) -> tuple[str, bytes]:
        """(the boot id the answer is bound to, its body) once the answer is proven the node's agent's."""
        try:
            credential = self.credential.get()
        except CredentialError as err:
            raise AgentAnswerError(node, address, str(err)) from None
        import secrets
        nonce = secrets.token_hex(16)
        when = f"{time.time():.3f}"
        proof = request_signature(credential.secret, method, target, nonce, node, when)
        headers = {NONCE_HEADER: nonce, TIME_HEADER: when, NODE_HEADER: node, "Authorization": f"{AUTH_SCHEME} {proof}"}
        try:
            status, answer_headers, body = _exchange(address, method, target, headers, timeout or self.timeout,
                                                     limit)
        except _Failed as err:
            raise AgentAnswerError(node, address, f"no answer taken: {err.problem}", err.status) from None
        said = body[:300].decode("utf-8", "replace").strip()
        if status == 401 and said.startswith(REFUSED):
            raise AgentAnswerError(node, address, said, status)  # it took our proof: it says what else it refused
        if status == 401:
            raise AgentAnswerError(node, address, f"refused our agent credential ({credential.path}): {said} (is "
                                                  "the same credential installed on the node?)", status)
        boot = answer_headers.get(BOOT_HEADER.lower(), "")
        proof = answer_headers.get(SIGNATURE_HEADER.lower(), "")
        expected = answer_signature(credential.secret, node, boot, nonce, status, body)
        if not _same_proof(proof, expected):
            named = answer_headers.get(NODE_HEADER.lower(), "")
            why = (f"it says it is node {named[:60]!r}" if named and named != node else
                   f"not signed with the agent credential (it said HTTP {status}: {said[:120]!r})" if not proof else
                   f"its signature does not match the agent credential {credential.path} (another credential there?)")
            raise AgentAnswerError(node, address, f"answer not believed: {why}; not slurm-ext's agent of "
                                                  f"{node}, or its credential differs", status)
        if status not in expect:
            raise AgentAnswerError(node, address, f"HTTP {status}: {said or '(no text)'}", status)
        return boot, body

"""One notice, one webhook post: the URL from its root-only file, the body in the chosen format, one try.

`read_url(path)` reads repair.notify_url_file (a webhook URL holds its own secret: whoever reads it can post to
the channel), `body_of(notice, format)` makes Slack's `{"text": ...}` or Alertmanager's list of alerts, and
`post(url, body, timeout)` sends it once, raising `WebhookFailed` for anything but a 2xx answer. Retries, the
queue and the thread are the notifier's (notify.py).
"""

from __future__ import annotations

import http.client
import json
import stat
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone

from slurm_ext.errors import SlurmExtError
from slurm_ext.secretfile import SecretFileError, read_secret

__all__ = ["Notice", "WebhookFailed", "NotifyUrlError", "read_url", "body_of", "post", "FORMATS"]

FORMATS = ("slack", "alertmanager")
#: a URL file larger than this is not a URL
_MAX_URL_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Notice:
    """What happened, as posted: one repair event of the store or one critical finding of a node's journal."""

    #: what tells it apart from every other notice (repair:<event id>, health:<node>:<journal time>:<digest>)
    key: str
    #: the event's name: repair-recommended, repair-escalated, repair-approved, repair-failed, health-finding
    event: str
    node: str
    message: str
    #: info, warning or critical (a failed repair and a critical finding are critical)
    severity: str
    #: when it happened (epoch seconds)
    time: float
    #: more to say: action, signature, user, check, gpu
    fields: dict = field(default_factory=dict)


class NotifyUrlError(SlurmExtError):
    """repair.notify_url_file cannot be used; the message names the file and what to do."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path} (repair.notify_url_file): {problem}")


class WebhookFailed(SlurmExtError):
    """One post did not reach the webhook or was refused (status 0: no answer at all)."""

    def __init__(self, problem: str, status: int = 0):
        self.problem, self.status = problem, status
        super().__init__(problem)


def read_url(path: str) -> str:
    """The webhook URL in `path`: a regular file of root's (or this user's) that no one else may read or write,
    holding one http(s) URL.

    Raises:
        NotifyUrlError: missing, a link, not a regular file, another user's, readable or writable by others, too
            large, or not an http(s) URL with a host (a control character or a space in it is refused here: later,
            http.client would refuse it with the URL, its secret, in the message).
    """
    try:
        data = read_secret(path, max_bytes=_MAX_URL_BYTES).content
    except SecretFileError as err:
        raise NotifyUrlError(path, _url_file_problem(err)) from None
    url = data.decode("utf-8", "replace").strip()
    if not _is_http_url(url):
        raise NotifyUrlError(path, "does not hold one http:// or https:// URL (and nothing else)")
    return url


def _is_http_url(url: str) -> bool:
    """One http(s) URL naming a host, with no control character, space or DEL anywhere in it."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- a port that is not a number raises ValueError
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _url_file_problem(err: SecretFileError) -> str:
    """read_secret's refusal in the URL file's words, with what to do."""
    if err.kind == "owner":
        return f"owned by uid {err.info.st_uid} (expected root: chown root:root {err.path})"
    if err.kind == "mode":
        return (f"mode {stat.S_IMODE(err.info.st_mode):04o} lets others read or change it (expected 0600 or 0400: "
                f"chmod 600 {err.path}): whoever reads the URL can post to the channel")
    return {"not-regular": "not a regular file",
            "size": "does not hold one http:// or https:// URL (and nothing else)"}.get(
        err.kind, f"cannot read it: {err.problem} (put the webhook URL there, root's, mode 0600)")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _slack_escaped(text: str) -> str:
    """Slack reads <...> as a link or a mention (<!channel> pings everyone): a journal message's &, < and > are
    escaped as Slack asks, so it is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack(notice: Notice) -> list | dict:
    return {"text": _slack_escaped(f"slurm-ext {notice.severity}: node {notice.node}: {notice.event}: "
                                   f"{notice.message}")}


def _alertmanager(notice: Notice) -> list | dict:
    """One alert, as Alertmanager's POST /api/v2/alerts takes a list of them: its labels tell it apart (its key)
    from every other notice, so none is grouped away as a repeat of another."""
    labels = {"alertname": "SlurmExt" + "".join(w.capitalize() for w in notice.event.split("-")),
              "severity": notice.severity, "node": notice.node, "event": notice.event, "slurm_ext_key": notice.key}
    labels.update({k: str(v) for k, v in notice.fields.items() if v not in ("", None) and k not in labels})
    return [{"labels": labels,
             "annotations": {"summary": f"node {notice.node}: {notice.event}", "description": notice.message},
             "startsAt": _iso(notice.time)}]


_BODIES = {"slack": _slack, "alertmanager": _alertmanager}


def body_of(notice: Notice, form: str) -> bytes:
    """The JSON body of `notice` in `form` (one of FORMATS)."""
    return json.dumps(_BODIES[form](notice)).encode()


class _RedirectRefused(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: urllib would turn the POST into a GET on 301/302/303, and the GET's 2xx would
    count as posted while the notice was lost."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the answer stays an HTTPError of its 3xx


_OPENER = urllib.request.build_opener(_RedirectRefused)


def post(url: str, body: bytes, timeout: float) -> int:
    """POST `body` (JSON) to `url` once; returns the status of a 2xx answer.

    Raises:
        WebhookFailed: no answer within `timeout`, no connection, an answer that is not HTTP, a redirect, or a
            status other than 2xx (the URL is never in the message: it holds the webhook's secret).
    """
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            answer.read(65536)
            return answer.status
    except urllib.error.HTTPError as err:
        if 300 <= err.code < 400:
            raise WebhookFailed(f"the webhook answered HTTP {err.code}: a redirect, not followed (fix the URL)",
                                err.code) from None
        raise WebhookFailed(f"the webhook answered HTTP {err.code}", err.code) from None
    except urllib.error.URLError as err:
        raise WebhookFailed(f"the webhook did not answer: {_without_url(err.reason)}") from None
    except http.client.HTTPException as err:  # BadStatusLine, LineTooLong, InvalidURL, too many headers ...
        raise WebhookFailed(f"the webhook's answer is not HTTP ({type(err).__name__})") from None
    except (OSError, ValueError) as err:
        raise WebhookFailed(f"the webhook did not answer: {_without_url(err)}") from None


def _without_url(err) -> str:
    """What went wrong, in words that cannot hold the URL: an OS error's own text (timed out, refused), else only
    the exception's class."""
    if isinstance(err, OSError) and not isinstance(err, urllib.error.URLError) and err.strerror:
        return err.strerror
    if isinstance(err, TimeoutError):
        return "timed out"
    return type(err).__name__ if isinstance(err, BaseException) else "no answer"

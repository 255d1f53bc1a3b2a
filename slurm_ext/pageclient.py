"""The command line's way to an operation of the cluster page, as an operator: `PageClient(url, token).operate(...)`.

An operation from the controller's shell that must be recorded with an operator's name (`slurm-ext health clear
NODE`) goes through the page, which checks the operator's token as it does for a browser (web.auth: one check, in
one place) and asks the node's agent with the cluster's agent credential. The client takes a CSRF token from
/api/session, as the page's own script does, and POSTs the operation with both; the page's answer, or its refusal
(the status and the page's words), comes back as it is. Every exchange is bounded in time and size.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from dataclasses import dataclass

from .errors import SlurmExtError

__all__ = ["PageClient", "PageRefused", "page_url", "TOKEN_VARIABLE"]

#: the environment variable that holds the operator's token (as `slurm-ext web add-token` printed it): never an
#: argument, which every user of the host sees in `ps`
TOKEN_VARIABLE = "SLURM_EXT_TOKEN"
#: most bytes of an answer taken
_MAX_ANSWER = 2**20


class PageRefused(SlurmExtError):
    """The page refused the operation or did not answer; `status` is its HTTP status (0: no answer)."""

    exit_code = 1

    def __init__(self, url: str, status: int, message: str):
        self.url, self.status = url, status
        super().__init__(f"the page at {url}: " + (f"HTTP {status}: {message}" if status else message))


def page_url(listen: str) -> str:
    """The page's address from web.listen (host:port): a wildcard host is reached on this host's loopback."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


@dataclass(frozen=True, slots=True)
class PageClient:
    #: http://host:port of the page
    url: str
    token: str
    timeout: float = 30.0

    def operate(self, node: str, operation: str, body: dict) -> dict:
        """POST /api/nodes/NODE/OPERATION with `body`, as the token's operator; the page's JSON answer.

        Raises:
            PageRefused: no answer, or a refusal (401 for a token the page does not know, 404 for a node it does
            not list, 409 for an operation it will not do now; the page's message says which)."""
        session = self._exchange("GET", "/api/session", None, {})
        csrf = session.get("csrf")
        if not isinstance(csrf, str) or not csrf:
            raise PageRefused(self.url, 0, "its /api/session gave no CSRF token: is this slurm-ext's page?")
        target = f"/api/nodes/{urllib.parse.quote(node, safe='')}/{operation}"
        return self._exchange("POST", target, json.dumps(body).encode(), {"X-CSRF-Token": csrf,
                                                                         "Content-Type": "application/json"})

    def _exchange(self, method: str, target: str, body: bytes | None, headers: dict) -> dict:
        parsed = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
        connection = kind(parsed.hostname or "127.0.0.1", parsed.port, timeout=self.timeout)
        try:
            connection.request(method, target, body=body, headers={**headers, "Authorization": f"Bearer {self.token}",
                                                                   "Connection": "close"})
            answer = connection.getresponse()
            text = answer.read(_MAX_ANSWER + 1)
            status = answer.status
        except (OSError, http.client.HTTPException) as err:
            raise PageRefused(self.url, 0, f"no answer ({getattr(err, 'strerror', None) or err}): is web.enabled "
                                           "set and the controller agent's page running?") from None
        finally:
            connection.close()
        if len(text) > _MAX_ANSWER:
            raise PageRefused(self.url, status, f"an answer over {_MAX_ANSWER} bytes, refused")
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {"error": text[:200].decode("utf-8", "replace")}
        if not isinstance(data, dict):
            data = {}
        if status != 200:
            raise PageRefused(self.url, status, str(data.get("error") or data.get("message") or "(no text)")[:500])
        return data

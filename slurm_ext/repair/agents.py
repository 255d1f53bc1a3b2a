"""The node agents as the controller reads them: where each listens, a bounded GET of its JSON, and its one POST.

The repair service asks a node's agent for /health after a repair, `history` and the cluster page ask every agent
for its journal (/events) and health; the page's "run the health checks" POSTs /health/check.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

__all__ = ["address", "get", "get_json", "post"]


def address(settings, name: str, addr: str = "") -> str:
    """host:port of a node's worker agent: repair.agents' entry, else its NodeAddr (else its name) and
    repair.agent_port."""
    return settings.agents.get(name) or f"{addr or name}:{settings.agent_port}"


#: never through a proxy of the environment (http_proxy): the agents are on the cluster's own network
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float) -> tuple[str | None, str]:
    """(the body, "") or (None, why) when the agent does not answer: down, rebooting, not an agent."""
    try:
        with _DIRECT.open(url, timeout=timeout) as answer:
            return answer.read().decode("utf-8", "replace"), ""
    except (OSError, urllib.error.URLError, http.client.HTTPException) as err:
        return None, str(getattr(err, "reason", err)) or type(err).__name__


def get_json(url: str, timeout: float) -> dict | None:
    """The agent's JSON object, or None (no answer, or not an object)."""
    body, _ = get(url, timeout)
    try:
        data = json.loads(body) if body is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def post(url: str, timeout: float) -> tuple[int, str]:
    """(HTTP status, body) of a POST without a body, or (0, why) when the agent does not answer."""
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with _DIRECT.open(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as err:
        return 0, str(getattr(err, "reason", err)) or type(err).__name__

"""The node agents as the controller reads them: where each listens, a bounded GET of its JSON, and its one POST.

The repair service asks a node's agent for /health after a repair, `history` and the cluster page ask every agent
for its journal (/events) and health; the page's "run the health checks" POSTs /health/check.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

__all__ = ["address", "get", "health", "post"]


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


def health(address: str, node: str, timeout: float) -> tuple[dict | None, str]:
    """(the /health answer of `node`'s agent at `address`, "") or (None, why): no answer, not a JSON object, or the
    agent of another node (an address that moved, a port another cluster's agent holds)."""
    body, problem = get(f"http://{address}/health", timeout)
    if body is None:
        return None, f"agent at {address} does not answer: {problem}"
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, f"agent at {address}: its /health is not a JSON object"
    if data.get("node", node) != node:
        return None, f"the agent at {address} is node {str(data.get('node'))[:60]!r}'s, not {node!r}'s"
    return data, ""


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

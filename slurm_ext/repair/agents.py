"""The node agents as the controller reads them: where each listens, and a bounded GET of its JSON.

The repair service asks a node's agent for /health after a repair, `history` asks every agent for its
journal (/events); both are read-only routes of the agent's HTTP listener.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

__all__ = ["address", "get", "get_json"]


def address(settings, name: str, addr: str = "") -> str:
    """host:port of a node's worker agent: repair.agents' entry, else its NodeAddr (else its name) and
    repair.agent_port."""
    return settings.agents.get(name) or f"{addr or name}:{settings.agent_port}"


def get(url: str, timeout: float) -> tuple[str | None, str]:
    """(the body, "") or (None, why) when the agent does not answer: down, rebooting, not an agent."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
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

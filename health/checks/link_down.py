"""A watched network interface down (or gone): multi-node jobs on this node stall on it."""

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    found = []
    for name in view.interfaces:
        state = view.links.get(name)
        if state is None or not state.exists:
            evidence = f"{name} missing (expected up)"
        elif not state.up:
            evidence = f"{name} down (expected up)"
        else:
            continue
        found.append(Observation(params.id, name, params.severity, params.action, evidence,
                                 fields={"interface": name}))
    return found


CHECK = Check("link-down", "netlink", polled=judge)

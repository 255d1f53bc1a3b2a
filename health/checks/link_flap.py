"""A watched interface flapping: down `threshold` times within `window`, even if it is up now."""

from slurm_ext.config import format_duration

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    downs: dict[str, int] = {}
    last_up: dict[str, bool] = {}
    for change in view.link_changes:
        if view.now - change.time > params.window:
            last_up[change.ifname] = change.up
            continue
        if last_up.get(change.ifname, True) and not change.up:
            downs[change.ifname] = downs.get(change.ifname, 0) + 1
        last_up[change.ifname] = change.up
    return [Observation(params.id, name, params.severity, params.action,
                        f"{name} went down {count} times in {format_duration(params.window)} "
                        f"(limit {params.threshold - 1:g})", fields={"interface": name})
            for name, count in sorted(downs.items()) if count >= params.threshold]


CHECK = Check("link-flap", "netlink", polled=judge)

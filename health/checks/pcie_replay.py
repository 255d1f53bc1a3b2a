"""PCIe replays, as a rate: a link retrying its packets is a link (riser, slot, cable) going bad."""

from ..check import Check, View
from ..settings import Params
from .rates import counter_rate


def judge(view: View, params: Params) -> list:
    return counter_rate(view, params, "pcie_replay", "PCIe replays")


CHECK = Check("pcie-replay", "nvml", polled=judge)

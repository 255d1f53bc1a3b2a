"""NVLink CRC and replay errors, as a rate."""

from ..check import Check, View
from ..settings import Params
from .rates import counter_rate


def judge(view: View, params: Params) -> list:
    return counter_rate(view, params, "nvlink_errors", "NVLink errors")


CHECK = Check("nvlink-errors", "nvml", polled=judge)

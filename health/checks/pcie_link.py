"""PCIe link trained below the GPU's maximum: a GPU at x8 or gen3 feeds its job at half speed or less.

No other tool checks this while jobs run. Width below the maximum is always
wrong; generation is judged only while the GPU works (clock event reasons
without the idle bit), since an idle GPU lowers its link generation to save power.
"""

from ..check import Check, View, gpu_observation
from ..settings import Params

_IDLE = 0x1


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.pcie_width is not None and sample.pcie_max_width and sample.pcie_width < sample.pcie_max_width:
            found.append(gpu_observation(params, sample.gpu, f"PCIe link x{sample.pcie_width} of "
                                         f"x{sample.pcie_max_width}", f"x{sample.pcie_max_width}"))
        elif sample.pcie_gen is not None and sample.pcie_max_gen and sample.pcie_gen < sample.pcie_max_gen \
                and sample.clocks_event_reasons is not None and not sample.clocks_event_reasons & _IDLE:
            found.append(gpu_observation(params, sample.gpu, f"PCIe link gen{sample.pcie_gen} of "
                                         f"gen{sample.pcie_max_gen} while busy", f"gen{sample.pcie_max_gen}"))
    return found


CHECK = Check("pcie-link", "nvml", polled=judge)

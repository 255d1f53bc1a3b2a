"""NVML's return codes and what an operator does about each: one table for every component.

pynvml raises NVMLError with the driver's numeric code in `.value`; the codes
are part of the driver's ABI (nvml.h), so they are stable.
"""

__all__ = ["INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION", "NOT_FOUND", "DRIVER_NOT_LOADED",
           "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "RESET_REQUIRED", "LIB_RM_VERSION_MISMATCH",
           "advice", "describe"]

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18

_ADVICE = {
    NO_PERMISSION: "run slurm-ext as root",
    DRIVER_NOT_LOADED: "load the NVIDIA kernel driver (nvidia-smi should list the GPUs)",
    LIBRARY_NOT_FOUND: "install the NVIDIA driver's libnvidia-ml.so.1 or put it on the library path",
    FUNCTION_NOT_FOUND: "the NVIDIA driver is older than pynvml expects: upgrade the driver",
    GPU_IS_LOST: "the GPU fell off the bus (Xid 79): drain the node, then reset the GPU or reboot",
    RESET_REQUIRED: "drain the node and reset the GPU (nvidia-smi -r) or reboot",
    LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot: reboot the node",
}


def advice(code: int | None) -> str | None:
    """What an operator should do about NVML error `code`, or None when there is nothing specific."""
    return _ADVICE.get(code)


def describe(problem: str, code: int | None) -> str:
    """`problem`, with NVML's code and what to do about it when there is one."""
    if code is None:
        return problem
    action = advice(code)
    return f"{problem} (NVML error {code})" + (f"; {action}" if action else "")

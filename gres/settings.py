"""gres.conf generation's config: [gres].

Declared by the component and registered with the core
(`slurm_ext.config.register_section`), which imports this module by name
when a config needs the section.
"""

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["GresSection"]


@dataclass(frozen=True, slots=True)
class GresSection:
    """gres.conf and Gres= from NVML, regenerated before every slurmd start."""

    output: str = setting("", "the generated gres.conf; empty means gres.conf beside slurm.conf (Slurm reads it only "
                          "there); keep it node-local, never a file shared by several nodes", "path", empty_ok=True)
    dev_dir: str = setting("/dev", "where the GPUs' device files (nvidia<minor>) are", "path")
    types: dict = setting({}, "Slurm GRES type by NVML name, e.g. { \"NVIDIA H200\" = \"h200\" }; a name left out "
                          "gets Slurm's rule: lower-cased, spaces to _", "table",
                          item={"kind": "str", "pattern": r"^[A-Za-z0-9_.-]+$"})
    expected: int = setting(0, "GPUs this node must have: with NVML failing, or fewer GPUs, the node is drained "
                            "(owned reason) instead of registering the wrong count; 0: whatever NVML reports",
                            "int", minimum=0, maximum=1024)


register_section("gres", GresSection)

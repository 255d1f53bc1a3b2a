"""A package's public names imported on first use: `__getattr__ = lazy_names(__name__, {name: module})`.

Loading a config imports each component's package for its settings, and the Python hooks load the
config once per job, so a component's `__init__` names its public functions without importing the
modules that hold them; the first use of a name imports its module (PEP 562). This module imports
nothing at load.
"""

__all__ = ["lazy_names"]


def lazy_names(package: str, table: dict, renamed: dict | None = None):
    """A module `__getattr__` for `package`: `table` maps a public name to the submodule that defines it,
    `renamed` a public name to the submodule's own name for it."""
    def __getattr__(name: str):
        if name in table:
            import importlib
            module = importlib.import_module(f".{table[name]}", package)
            return getattr(module, (renamed or {}).get(name, name))
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__

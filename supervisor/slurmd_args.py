"""slurmd's command line as the agent needs to know it: which node, which layout, and the GPUs in `--conf`.

A Slinky NodeSet starts slurmd as a dynamic, configless node
(`-Z --conf-server HOST:6817 --conf 'Features=...'`); bare metal runs it
static, with slurm.conf and gres.conf on the node. The two layouts get
their GPUs differently:

- static: slurm.conf's `Gres=` and gres.conf beside slurm.conf (what
  `slurm-ext gres` writes); slurmd's arguments are left alone.
- dynamic (`-Z`): the node's `Gres=` is in `--conf`, so the agent puts the
  GPUs NVML found there before every start (replacing any gpu item already
  in it; other GRES stay).
- configless (`--conf-server`): slurmd
  reads gres.conf only from what slurmctld pushes, and a GPU without
  `File=` is unusable. The controller's gres.conf says
  `Include /etc/slurm-local/gres.conf` (CONFIGLESS_GRES; the file must
  exist there too, even empty), which each node resolves to its own file:
  the one the agent writes from NVML before slurmd starts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WORKER", "CONFIGLESS_GRES", "SlurmdLayout", "layout_of", "with_gpus", "runs_slurmd", "argv_of"]

#: the worker these are the arguments of
WORKER = "slurmd"
#: the node-local gres.conf a configless controller's gres.conf includes
CONFIGLESS_GRES = "/etc/slurm-local/gres.conf"


@dataclass(frozen=True, slots=True)
class SlurmdLayout:
    #: -N: the node's name in Slurm (None: the host name)
    node: str | None
    #: -Z: a dynamic node, whose resources come from --conf
    dynamic: bool
    #: --conf-server: slurm.conf (and gres.conf) come from slurmctld
    configless: bool


def _options(args: tuple[str, ...]) -> dict[str, str | None]:
    """The options slurm-ext looks at: -N, -Z, --conf, --conf-server (in `-N x`, `-Nx` or `--opt=x` form)."""
    found: dict[str, str | None] = {}
    takes_value = {"-N", "--conf", "--conf-server"}
    i = 0
    while i < len(args):
        arg = args[i]
        name, sep, value = arg.partition("=")
        if arg == "-Z":
            found["-Z"] = None
        elif arg in takes_value and i + 1 < len(args):
            found[arg] = args[i + 1]
            i += 1
        elif sep and name in ("--conf", "--conf-server"):
            found[name] = value
        elif arg.startswith("-N") and len(arg) > 2:
            found["-N"] = arg[2:]
        i += 1
    return found


def layout_of(args: tuple[str, ...]) -> SlurmdLayout:
    found = _options(args)
    return SlurmdLayout(node=found.get("-N"), dynamic="-Z" in found, configless="--conf-server" in found)


def with_gpus(args: tuple[str, ...], gres: str) -> tuple[str, ...]:
    """`args` with the node's gpu GRES in `--conf` set to `gres` ("gpu:h200:2"; "" for none).

    Only for a dynamic node (-Z): a static node's Gres= is slurm.conf's. Other
    GRES in the --conf's Gres= (shard:8) are kept; its gpu items are replaced,
    since NVML, not the NodeSet's text, says what this node has now.
    """
    if "-Z" not in args:
        return args
    out = list(args)
    for i in reversed(range(len(out))):  # slurmd takes the last --conf
        if out[i] == "--conf" and i + 1 < len(out):
            out[i + 1] = _set_gpus(out[i + 1], gres)
            return tuple(out)
        if out[i].startswith("--conf="):
            out[i] = "--conf=" + _set_gpus(out[i][len("--conf="):], gres)
            return tuple(out)
    return tuple(out + ["--conf", _set_gpus("", gres)]) if gres else args


def _set_gpus(conf: str, gres: str) -> str:
    """A `--conf` string ("Features=x Gres=shard:8") with its Gres= gpu items set to `gres`."""
    words, others = [], []
    for word in conf.split():
        key, sep, value = word.partition("=")
        if sep and key.lower() == "gres":
            others += [item for item in value.split(",") if item and item.split(":")[0] != "gpu"]
        else:
            words.append(word)
    items = ([gres] if gres else []) + others
    if items:
        words.append("Gres=" + ",".join(items))
    return " ".join(words)


def runs_slurmd(role: str) -> bool:
    """The role's Slurm daemon is slurmd (the worker role): the one slurm-ext fits to its node and GPUs."""
    from .workers import ROLE_DAEMON
    return ROLE_DAEMON.get(role) == WORKER


def argv_of(name: str, command: tuple[str, ...], gpus: str | None) -> tuple[str, ...]:
    """The command worker `name` is started with: slurmd's with the GPUs NVML found last (a dynamic node's
    Gres= in --conf; None: not read), every other worker's as it is."""
    return with_gpus(command, gpus) if name == WORKER and gpus is not None else command

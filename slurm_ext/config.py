"""The one config file, /etc/slurm-ext/slurm-ext.toml, loaded and validated.

`load()` returns a frozen `Config` with one typed section per component. Every
key has a safe default, so a node without the file runs with defaults. A bad
file is rejected as a whole with a `ConfigError` naming the file, the line
where it can be found, the key, the bad value and what is allowed: a config
that is half applied is worse than one that is refused.

Keys are declared once, in the section dataclasses below, with their doc
text; `render()` (``slurm-ext config show``) and the README reference are both
made from these declarations.
"""

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["Config", "ROLES", "DEFAULT_PATH", "ENV_VAR", "load", "from_dict", "render", "parse_duration", "sections"]

DEFAULT_PATH = Path("/etc/slurm-ext/slurm-ext.toml")
ENV_VAR = "SLURM_EXT_CONFIG"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as '500ms', '10s', '5m', '1h'.

    Raises:
        ValueError: the text has no number or no known unit.
    """
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def _key(default: Any, doc: str, kind: str, **rules: Any) -> Any:
    """Declare a config key: its default, its doc line, its kind and rules.

    Kinds: str, int, bool, duration (stored as seconds), path (absolute, or
    empty where allowed), choice (one of `choices`), list (a tuple of `item`
    values), table (a dict of name -> `item` value), sections (a dict of
    name -> `section` dataclass, written as [parent.key.name] tables).
    Rules: choices, minimum, maximum, empty_ok (path), pattern (str),
    item (the rules of a list's or table's values), min_items (list),
    section (the dataclass of a sections kind).
    A default of None means "not set" (used where another layer fills it in).
    """
    metadata = {"doc": doc, "kind": kind, **rules}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class NodeSection:
    """This host as slurm-ext sees it."""

    name: str = _key("", "Slurm node name of this host; empty means the short host name", "str",
                     pattern=r"^[A-Za-z0-9._-]*$")
    state_dir: str = _key("/var/lib/slurm-ext", "node-local state: job records, the node journal", "path")

    @property
    def slurm_name(self) -> str:
        """The node's name in Slurm: `name`, else the short host name (what slurmd itself uses)."""
        return self.name or os.uname().nodename.split(".")[0]


@dataclass(frozen=True, slots=True)
class LogSection:
    """Where slurm-ext's own log lines go."""

    level: str = _key("info", "least severe level logged", "choice",
                      choices=("debug", "info", "warning", "error"))
    file: str = _key("", "append log lines to this file; empty means standard error", "path", empty_ok=True)


@dataclass(frozen=True, slots=True)
class SlurmSection:
    """How slurm-ext talks to Slurm (through its command-line tools)."""

    bin_dir: str = _key("", "directory holding scontrol, sinfo, squeue, sacct, sacctmgr; empty means PATH",
                        "path", empty_ok=True, must_exist=True)
    conf: str = _key("", "slurm.conf passed to the tools as SLURM_CONF; empty means Slurm's own default",
                     "path", empty_ok=True)
    timeout: float = _key(10.0, "longest wait for one Slurm command before Slurm counts as unreachable",
                          "duration", minimum=0.1, maximum=600.0)
    json: str = _key("auto", "use the tools' --json output: auto (when the installed Slurm has it), always, never",
                     "choice", choices=("auto", "always", "never"))


ROLES = ("worker", "controller", "accounting", "login")
_DEFAULT_PORTS = {"worker": 9810, "controller": 9811, "accounting": 9812, "login": 9813}
_SIGNALS = ("TERM", "INT", "QUIT", "HUP", "USR1", "USR2", "KILL")


@dataclass(frozen=True, slots=True)
class WorkerSection:
    """One program the node agent runs, [supervisor.workers.<name>].

    Every key is optional: a key left out keeps the built-in default of a
    worker of that name (slurmd, slurmctld, slurmdbd, mariadbd, munged, sshd),
    or the generic default below for a new name.
    """

    roles: tuple | None = _key(None, "roles that run this worker", "list",
                               item={"kind": "choice", "choices": ROLES})
    command: tuple | None = _key(None, "program and arguments, run in the foreground; the program is looked up "
                                 "in PATH", "list", item={"kind": "str"}, min_items=1)
    environment: dict | None = _key(None, "extra environment variables", "table", item={"kind": "str"})
    restart: str | None = _key(None, "when to restart it after it exits: always, on-failure, never", "choice",
                               choices=("always", "on-failure", "never"))
    stop_signal: str | None = _key(None, "signal that asks it to stop", "choice", choices=_SIGNALS)
    stop_grace: float | None = _key(None, "wait this long after stop_signal before SIGKILL", "duration",
                                    minimum=0.0, maximum=3600.0)
    notify: bool | None = _key(None, "serve it a NOTIFY_SOCKET (sd_notify: READY=1, MAINPID=, STATUS=)", "bool")
    ready: str | None = _key(None, "when it counts as ready: running, notify (READY=1), slurm-node (this node "
                             "registered and responding in Slurm)", "choice",
                             choices=("running", "notify", "slurm-node"))
    drain_on_crash_loop: bool | None = _key(None, "drain this node (owned reason) while it crash-loops", "bool")


@dataclass(frozen=True, slots=True)
class SupervisorSection:
    """The node agent, `slurm-ext supervise --role ROLE`."""

    listen: str = _key("127.0.0.1", "address of the HTTP listener for /livez, /readyz, /metrics", "str",
                       pattern=r"^[0-9A-Za-z.:-]+$")
    ports: dict = _key(_DEFAULT_PORTS,
                       "HTTP port of each role's agent (0: no listener); a role left out keeps its default",
                       "table", keys=ROLES, item={"kind": "int", "minimum": 0, "maximum": 65535})
    runtime_dir: str = _key("/run/slurm-ext", "notify sockets and boot markers", "path")
    backoff_initial: float = _key(0.01, "delay before the first restart of a worker that died", "duration",
                                  minimum=0.0, maximum=60.0)
    backoff_max: float = _key(30.0, "cap of the doubling restart delay, and the delay while crash-looping", "duration",
                              minimum=0.01, maximum=3600.0)
    stable_after: float = _key(2.0, "a worker up this long started fine: its next restart delay starts over "
                               "from backoff_initial (like supervisord's startsecs)", "duration",
                               minimum=0.1, maximum=86400.0)
    crash_loop_count: int = _key(5, "this many exits within crash_loop_window is a crash loop", "int",
                                 minimum=2, maximum=1000)
    crash_loop_window: float = _key(10.0, "window for crash_loop_count (5 in 10s is also systemd's start limit); "
                                    "a crash loop is over once the worker has run this long", "duration",
                                    minimum=1.0, maximum=86400.0)
    ready_interval: float = _key(30.0, "how often readiness is asked of Slurm once ready (every node asks "
                                 "slurmctld: keep it long on large clusters)", "duration", minimum=0.1, maximum=600.0)
    stale_drain_reasons: tuple = _key(("slurm-ext: slurmd crash loop",),
                                      "at start, resume this node when its reason starts with one of these "
                                      "(drains a previous life of this node left behind)", "list",
                                      item={"kind": "str"})
    step_failure: dict = _key({}, "per start step: block (do not start workers until it succeeds) or continue",
                              "table", item={"kind": "choice", "choices": ("block", "continue")})
    leave_root_cgroup: bool = _key(True, "as PID 1 in a cgroup v2 container, move out of the root cgroup so "
                                   "slurmd can enable controllers", "bool")
    workers: dict = _key({}, "per-worker settings, [supervisor.workers.<name>]", "sections", section=WorkerSection)

    def port(self, role: str) -> int:
        """The HTTP port of `role`'s agent (a role missing from `ports` keeps its default)."""
        return self.ports.get(role, _DEFAULT_PORTS[role])


_HOOK_PHASES = ("job-start", "job-end")


@dataclass(frozen=True, slots=True)
class PrologEpilogSection:
    """The Prolog and Epilog: job cleanup, GPU release checks, lifecycle scripts."""

    scripts_dir: str = _key("", "holds <role>/<phase>.d/ lifecycle script directories (node-boot.d, job-start.d, "
                            "job-end.d); empty means the config file's directory", "path", empty_ok=True)
    script_timeout: float = _key(60.0, "longest run of one lifecycle script or user hook; then its process group "
                                 "is killed and it counts as failed", "duration", minimum=0.1, maximum=86400.0)
    script_timeouts: dict = _key({}, "per-script timeout by file name, e.g. { \"10-mounts\" = \"5m\" }",
                                 "table", item={"kind": "duration", "minimum": 0.1, "maximum": 86400.0})
    on_failure: dict = _key({"job-start": "drain", "job-end": "ignore"},
                            "per phase: drain (non-zero exit to Slurm, which drains the node and requeues a "
                            "starting job) or ignore (event only); a phase left out keeps its default",
                            "table", keys=_HOOK_PHASES, item={"kind": "choice", "choices": ("drain", "ignore")})
    allow_user_hooks: bool = _key(False, "run the job user's ~/.config/slurm-ext/{job-start,job-end}/ executables, "
                                  "as that user", "bool")
    min_uid: int = _key(1000, "the Epilog kills every process of a job's user who has no other job on the node "
                        "only when the uid is at least this (never root)", "int", minimum=1, maximum=2**32 - 2)
    kill_timeout: float = _key(10.0, "longest wait for killed job processes to be gone; one still there (state D) "
                               "drains the node", "duration", minimum=0.1, maximum=600.0)
    gpu_memory_threshold: int = _key(1024, "MiB of memory a GPU may still show in use after its job's processes "
                                     "are gone before the node is drained", "int", minimum=0, maximum=10**7)

    def failure_policy(self, phase: str) -> str:
        """drain or ignore: what a failed `phase` script does (a phase left out keeps its default)."""
        return self.on_failure.get(phase, {"job-start": "drain"}.get(phase, "ignore"))


@dataclass(frozen=True, slots=True)
class GresSection:
    """gres.conf and Gres= from NVML, regenerated before every slurmd start."""

    output: str = _key("", "the generated gres.conf; empty means gres.conf beside slurm.conf (Slurm reads it only "
                       "there); keep it node-local, never a file shared by several nodes", "path", empty_ok=True)
    dev_dir: str = _key("/dev", "where the GPUs' device files (nvidia<minor>) are", "path")
    types: dict = _key({}, "Slurm GRES type by NVML name, e.g. { \"NVIDIA H200\" = \"h200\" }; a name left out "
                       "gets Slurm's rule: lower-cased, spaces to _", "table",
                       item={"kind": "str", "pattern": r"^[A-Za-z0-9_.-]+$"})
    expected: int = _key(0, "GPUs this node must have: with NVML failing, or fewer GPUs, the node is drained "
                         "(owned reason) instead of registering the wrong count; 0: whatever NVML reports",
                         "int", minimum=0, maximum=1024)


@dataclass(frozen=True, slots=True)
class DevSection:
    """The local development cluster (`slurm-ext dev ...`): one host, loopback only."""

    state_dir: str = _key("/var/lib/slurm-ext/dev", "everything of the dev cluster: configs, logs, database, state",
                          "path")
    cluster_name: str = _key("dev", "Slurm ClusterName", "str", pattern=r"^[a-z][a-z0-9_]*$")
    node_name: str = _key("node1", "the one node's NodeName (slurmd -N)", "str", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")
    gpu_count: int = _key(4, "fake GPUs on the node", "int", minimum=0, maximum=64)
    gpu_name: str = _key("NVIDIA H200", "the fake GPUs' NVML name", "str", pattern=r"^[A-Za-z0-9 ._-]+$")
    gpu_type: str = _key("h200", "the fake GPUs' Slurm GRES type", "str", pattern=r"^[a-z0-9_]+$")
    slurmctld_port: int = _key(6817, "slurmctld's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    slurmd_port: int = _key(6818, "slurmd's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    slurmdbd_port: int = _key(6819, "slurmdbd's TCP port on 127.0.0.1", "int", minimum=1, maximum=65535)
    controller_probe_port: int = _key(9811, "HTTP port of slurmctld's agent (probes, metrics) on 127.0.0.1",
                                      "int", minimum=1, maximum=65535)
    worker_probe_port: int = _key(9810, "HTTP port of slurmd's agent (probes, metrics) on 127.0.0.1", "int",
                                  minimum=1, maximum=65535)
    mariadb_port: int = _key(3307, "MariaDB's TCP port on 127.0.0.1 (not 3306: leaves a system MariaDB alone)",
                             "int", minimum=1, maximum=65535)
    proctrack: str = _key("cgroup", "Slurm's ProctrackType: cgroup, or linuxproc to watch the Epilog clean up "
                          "where Slurm's own cgroup tracking is unavailable (as in pods)", "choice",
                          choices=("cgroup", "linuxproc"))
    up_timeout: float = _key(60.0, "longest wait in `dev up` for each daemon and for the node to be idle",
                             "duration", minimum=1.0, maximum=3600.0)


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration: one section per component."""

    node: NodeSection = field(default_factory=NodeSection)
    log: LogSection = field(default_factory=LogSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    supervisor: SupervisorSection = field(default_factory=SupervisorSection)
    prolog_epilog: PrologEpilogSection = field(default_factory=PrologEpilogSection)
    gres: GresSection = field(default_factory=GresSection)
    dev: DevSection = field(default_factory=DevSection)
    #: the file it was read from; None when every value is a default
    source: str | None = None


def sections() -> dict[str, type]:
    """Section name -> section dataclass, in file order."""
    return {f.name: f.default_factory for f in dataclasses.fields(Config) if f.name != "source"}


def load(path: str | os.PathLike | None = None) -> Config:
    """Read and validate the config file.

    The file is `path`, else $SLURM_EXT_CONFIG, else /etc/slurm-ext/slurm-ext.toml.
    Only the last may be missing (then every value is its default): a file
    someone named explicitly and that is not there is an error.

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown section or
            key, wrong type, or a value outside what the key allows.
    """
    explicit = path is not None or bool(os.environ.get(ENV_VAR))
    path = Path(path if path is not None else os.environ.get(ENV_VAR) or DEFAULT_PATH)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(path, "no such file") from None
        return Config()
    except OSError as err:
        raise ConfigError(path, f"cannot read: {err.strerror}") from err
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as err:
        raise ConfigError(path, f"not UTF-8 text (byte {err.start})") from err
    except tomllib.TOMLDecodeError as err:
        message = str(err)
        line = re.search(r"line (\d+)", message)
        raise ConfigError(path, f"TOML syntax error: {message}",
                          line=int(line.group(1)) if line else None) from err
    return from_dict(data, path, text)


def from_dict(data: dict, source: str | os.PathLike = "<config>", text: str = "") -> Config:
    """Validate already parsed TOML data; `text` is used only to find line numbers.

    Raises:
        ConfigError: as for `load`.
    """
    known = sections()
    built = {}
    for name, table in data.items():
        if name not in known:
            raise ConfigError(source, f"unknown section [{name}]; allowed: {', '.join(known)}",
                              line=_line_of(text, name, None))
        if not isinstance(table, dict):
            raise ConfigError(source, f"[{name}] must be a table of keys, got {_describe(table)}",
                              key=name, line=_line_of(text, None, name))
        built[name] = _build_section(name, known[name], table, source, text)
    return Config(**built, source=str(source))


def _build_section(name: str, cls: type, table: dict, source, text: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        dotted = f"{name}.{key}"
        line = _line_of(text, name, key)
        if key not in fields:
            allowed = ", ".join(fields) or "(none yet)"
            raise ConfigError(source, f"unknown key; allowed keys in [{name}]: {allowed}", key=dotted, line=line)
        rules = fields[key].metadata
        if rules["kind"] == "sections":
            values[key] = _build_subsections(dotted, rules["section"], value, source, text)
            continue
        try:
            values[key] = _check(rules, value)
        except ValueError as err:
            raise ConfigError(source, f"{_show(value)}: {err}", key=dotted, line=line) from None
    return cls(**values)


def _build_subsections(name: str, cls: type, value: Any, source, text: str) -> dict:
    """[name.<sub>] tables, each a `cls` section."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(source, f"expected [{name}.<name>] tables, got {_describe(value)}", key=name,
                          line=_line_of(text, name.rsplit(".", 1)[0], name.rsplit(".", 1)[1]))
    built = {}
    for sub, table in value.items():
        if not re.match(r"^[A-Za-z0-9_-]+$", sub):
            raise ConfigError(source, "names are letters, digits, '-' and '_'", key=f"{name}.{sub}",
                              line=_line_of(text, f"{name}.{sub}", None))
        built[sub] = _build_section(f"{name}.{sub}", cls, table, source, text)
    return built


def _check(rules: dict, value: Any) -> Any:
    """The validated value for one key. Raises ValueError saying what is allowed."""
    kind = rules["kind"]
    if kind == "list":
        if not isinstance(value, list):
            raise ValueError(f"expected an array, got {_describe(value)}")
        if len(value) < rules.get("min_items", 0):
            raise ValueError(f"expected at least {rules['min_items']} item(s)")
        return tuple(_check_item(rules["item"], f"item {i + 1}", v) for i, v in enumerate(value))
    if kind == "table":
        if not isinstance(value, dict):
            raise ValueError(f"expected a table such as {{ NAME = ... }}, got {_describe(value)}")
        unknown = [k for k in value if "keys" in rules and k not in rules["keys"]]
        if unknown:
            raise ValueError(f"unknown name {unknown[0]!r}; allowed: {', '.join(rules['keys'])}")
        return {k: _check_item(rules["item"], f"{k!r}", v) for k, v in value.items()}
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_describe(value)}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_describe(value)}")
        _check_range(rules, value)
        return value
    if not isinstance(value, str):
        expected = {"duration": "a duration string such as '10s' or '500ms'",
                    "path": "an absolute path string",
                    "choice": "one of " + ", ".join(map(repr, rules.get("choices", ())))}.get(kind, "a string")
        raise ValueError(f"expected {expected}, got {_describe(value)}")
    if kind == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise ValueError("expected a duration with a unit: ms, s, m or h (e.g. '10s')") from None
        _check_range(rules, seconds, unit="s")
        return seconds
    if kind == "choice":
        if value not in rules["choices"]:
            raise ValueError(f"expected one of {', '.join(map(repr, rules['choices']))}")
        return value
    if kind == "path":
        if value == "" and rules.get("empty_ok"):
            return value
        if not value.startswith("/"):
            raise ValueError("expected an absolute path (starting with /)"
                             + (", or empty" if rules.get("empty_ok") else ""))
        if rules.get("must_exist") and not os.path.isdir(value):
            raise ValueError("no such directory")
        return os.path.normpath(value)
    pattern = rules.get("pattern")
    if pattern and not re.match(pattern, value):
        raise ValueError(f"expected text matching {pattern}")
    return value


def _check_item(rules: dict, where: str, value: Any) -> Any:
    try:
        return _check(rules, value)
    except ValueError as err:
        raise ValueError(f"{where}: {_show(value)}: {err}") from None


def _check_range(rules: dict, value: float, unit: str = "") -> None:
    low, high = rules.get("minimum"), rules.get("maximum")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"expected between {low:g}{unit} and {high:g}{unit}")


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string",
            list: "array", dict: "table"}.get(type(value), type(value).__name__)
    return f"{_show(value)} ({kind})"


def _show(value: Any) -> str:
    return repr(value) if not isinstance(value, bool) else str(value).lower()


def _line_of(text: str, section: str | None, key: str | None) -> int | None:
    """Best-effort line number of `key` in `[section]` (or of the header)."""
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([^\]]+?)\s*\]", stripped)
        if header:
            current = header.group(1).strip('"')
            if key is None and current == section:
                return number
            continue
        if key is not None and current == section and re.match(rf'^"?{re.escape(key)}"?\s*=', stripped):
            return number
    return None


def render(config: Config) -> str:
    """The effective config as TOML, each key with its doc line (`config show`)."""
    out = [f"# effective slurm-ext config; source: {config.source or 'defaults (no file)'}"]
    for name in sections():
        _render_section(out, name, getattr(config, name))
    return "\n".join(out) + "\n"


def _render_section(out: list[str], name: str, section: Any) -> None:
    out += ["", f"[{name}]"]
    later = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.metadata["kind"] == "sections":
            later += [(f"{name}.{f.name}.{sub}", sub_section) for sub, sub_section in value.items()]
            continue
        if value is None:
            continue
        out.append(f"# {f.metadata['doc']}")
        out.append(f"{f.name} = {_toml_value(value, f.metadata)}")
    for sub_name, sub_section in later:
        _render_section(out, sub_name, sub_section)


def _toml_value(value: Any, rules: dict) -> str:
    kind = rules["kind"]
    if kind == "duration":
        return f'"{_format_duration(value)}"'
    if kind == "list":
        return "[" + ", ".join(_toml_value(v, rules["item"]) for v in value) + "]"
    if kind == "table":
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v, rules['item'])}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"

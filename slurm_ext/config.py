"""The one config file, /etc/slurm-ext/slurm-ext.toml, loaded and validated.

`load()` returns a frozen `Config` with one typed section per component. Every
key has a safe default, so a node without the file runs with defaults. A bad
file is rejected as a whole with a `ConfigError` naming the file, the line
where it can be found, the key, the bad value and what is allowed: a config
that is half applied is worse than one that is refused.

Keys are declared once, with `setting()`, in the section dataclasses with
their doc text: the core's sections ([node], [log], [slurm]) below, each
component's in its own `settings` module, which registers it here
(`register_section`). `render()` (``slurm-ext config show``), the
configuration reference docs/reference/configuration.md and the commented
example slurm-ext.toml.example are all made from these declarations (the
last two by `python -m slurm_ext.configdoc`; a test fails when either is
not what the declarations make now).

The core knows its components' sections by name only (`_SECTION_OWNERS`, a
fixed table) and imports a component's `settings` on demand: when a file has
the section, when code first reads it, or for `sections()` / `render()`. Not
entry points or importing every component up front, because the Python hook
fallback loads the config for every job: an entry-point scan costs
milliseconds each time and the component packages tens of milliseconds.
For the same reason `load(parsed_cache=...)` can keep the parsed file for
the next process: tomllib costs a Python hook about a sixth of its run.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

TYPE_CHECKING = False  # typing costs a Python hook ~3 ms to import; annotations here are never evaluated
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Config", "ROLES", "DEFAULT_PATH", "ENV_VAR", "load", "from_dict", "render", "render_section", "parse_duration",
           "format_duration", "toml_value", "sections",
           "section_names", "section_class", "register_section", "setting", "NodeSection", "LogSection",
           "SlurmSection"]

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


def setting(default: Any, doc: str, kind: str, **rules: Any) -> Any:
    """Declare a config key (a field of a section dataclass): its default, its doc line, its kind and rules.

    Kinds: str, int, bool, duration (stored as seconds), path (absolute, or
    empty where allowed), choice (one of `choices`), list (a tuple of `item`
    values), table (a dict of name -> `item` value), sections (a dict of
    name -> `section` dataclass, written as [parent.key.name] tables),
    quantity (a string with a unit, or an integer: its section's `validate` judges it).
    Rules: choices, minimum, maximum, empty_ok (path), pattern (str),
    item (the rules of a list's or table's values), min_items (list),
    section (the dataclass of a sections kind), validate (of a sections kind:
    `validate(name, section)` raises ValueError(key, message)).
    A default of None means "not set" (used where another layer fills it in).
    """
    metadata = {"doc": doc, "kind": kind, **rules}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class NodeSection:
    """This host as slurm-ext sees it."""

    name: str = setting("", "Slurm node name of this host; empty means the short host name", "str",
                        pattern=r"^[A-Za-z0-9._-]*$")
    state_dir: str = setting("/var/lib/slurm-ext", "node-local state: job records, the node journal", "path")
    runtime_dir: str = setting("/run/slurm-ext", "node-local run files: the node agent's notify sockets, the hook "
                               "and node-state sockets, the health monitor's readings, drain marks, boot markers, "
                               "accounting's run files", "path")
    boot_id_file: str = setting("/proc/sys/kernel/random/boot_id", "a file whose content changes at every boot: what "
                                "is done once per boot, and what a reboot clears, go by it", "path")
    environment: dict = setting({}, "environment variables every slurm-ext command run with this config gets, as "
                                "the node's daemons have them (the dev cluster's fake NVML: LD_LIBRARY_PATH and its "
                                "spec), so an operator's command sees the GPUs the agents see; a command started "
                                "without them runs itself again with them", "table",
                                item={"kind": "str"})
    agent_credential: str = setting("/etc/slurm-ext/agent-credential", "the cluster's agent credential: a secret in a "
                                    "root-only file (mode 0600), the same on every node and the controller; the "
                                    "agents' /events, /health and POST /health/check answer only who proves it, and "
                                    "the controller believes only answers signed with it (in Slinky: the "
                                    "agent-credential Secret)", "path")

    @property
    def slurm_name(self) -> str:
        """The node's name in Slurm: `name`, else the short host name (what slurmd itself uses)."""
        return self.name or os.uname().nodename.split(".")[0]


@dataclass(frozen=True, slots=True)
class LogSection:
    """Where slurm-ext's own log lines go."""

    level: str = setting("info", "least severe level logged", "choice",
                         choices=("debug", "info", "warning", "error"))
    file: str = setting("", "append log lines to this file; empty means standard error", "path", empty_ok=True)


@dataclass(frozen=True, slots=True)
class SlurmSection:
    """How slurm-ext talks to Slurm (through its command-line tools)."""

    bin_dir: str = setting("", "directory holding scontrol, sinfo, squeue, sacct, sacctmgr; empty means PATH",
                           "path", empty_ok=True, must_exist=True)
    conf: str = setting("", "slurm.conf passed to the tools as SLURM_CONF; empty means Slurm's own default",
                        "path", empty_ok=True)
    timeout: float = setting(10.0, "longest wait for one Slurm command before Slurm counts as unreachable",
                             "duration", minimum=0.1, maximum=600.0)
    json: str = setting("auto", "use the tools' --json output: auto (when the installed Slurm has it; the node "
                        "table from scontrol's, which has it from 23.02: before, its text, twice as quick at 10,000 "
                        "nodes as 22.05's sinfo --json), always, never", "choice", choices=("auto", "always", "never"))

    def conf_path(self, environ: dict[str, str] | None = None) -> Path:
        """slurm.conf as Slurm's tools find it: `conf`, else $SLURM_CONF, else /etc/slurm/slurm.conf."""
        env = os.environ if environ is None else environ
        return Path(self.conf or env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


#: the roles a node agent can run (`slurm-ext supervise --role`); a core word, shared by the
#: components (the supervisor's ports and workers, the lifecycle scripts' directories)
ROLES = ("worker", "controller", "accounting", "login")


# -- the components' sections -------------------------------------------------------------

#: Each component's section, in file order after the core's own: [section] -> the component
#: that declares it in `slurm_ext.<component>.settings` and registers it there. A fixed table
#: (see the module docstring for why): a new component with a section adds itself here.
_SECTION_OWNERS = {
    "supervisor": "supervisor",
    "prolog_epilog": "prolog_epilog",
    "gres": "gres",
    "accounting": "accounting",
    "health": "health",
    "repair": "repair",
    "history": "repair",
    "acceptance": "acceptance",
    "oidc": "oidc",
    "web": "web",
    "dev": "devcluster",
}
_CORE_SECTIONS = {"node": NodeSection, "log": LogSection, "slurm": SlurmSection}
_registered: dict[str, type] = {}

#: Keys that moved to another section: [section] key -> where it is now and why, for the error
#: that refuses the old place (a key renamed in silence would be a default in silence)
_MOVED_KEYS = {
    ("supervisor", "runtime_dir"): "moved to [node] runtime_dir (the same value; read by every component, "
                                   "not only the agent)",
}


def register_section(name: str, cls: type) -> None:
    """Called by a component's settings module: `cls` is the dataclass of its [`name`] section.

    Raises:
        ValueError: `name` is not a section the core names in its table of
            components (add it there), or a core section.
    """
    if name not in _SECTION_OWNERS:
        raise ValueError(f"[{name}] is not a component section of slurm_ext.config; add it to _SECTION_OWNERS")
    _registered[name] = cls


def section_class(name: str) -> type:
    """The dataclass of section [`name`], importing the component that declares it if need be.

    Raises:
        KeyError: no such section.
    """
    if name in _CORE_SECTIONS:
        return _CORE_SECTIONS[name]
    cls = _registered.get(name)
    if cls is None:
        module = f"slurm_ext.{_SECTION_OWNERS[name]}.settings"
        importlib.import_module(module)
        cls = _registered.get(name)
        if cls is None:
            raise RuntimeError(f"{module} did not register the [{name}] section")
    return cls


def section_names() -> tuple[str, ...]:
    """Every section's name, in file order, without importing any component."""
    return (*_CORE_SECTIONS, *_SECTION_OWNERS)


def sections() -> dict[str, type]:
    """Section name -> section dataclass, in file order (imports every component's settings)."""
    return {name: section_class(name) for name in section_names()}


@dataclass(frozen=True, init=False, eq=False)
class Config:
    """The effective configuration: the core's sections and one per component.

    `config.supervisor`, `config.gres`, ... read like fields; a component's
    section that the file does not have is made with its defaults when first
    read, so loading a config imports no component it does not need.
    `dataclasses.replace(config, gres=...)` works as for any dataclass.
    """

    node: NodeSection
    log: LogSection
    slurm: SlurmSection
    #: the file it was read from; None when every value is a default
    source: str | None
    #: the components' sections by name: those given, and those read so far (defaults)
    components: dict

    def __init__(self, node: NodeSection | None = None, log: LogSection | None = None,
                 slurm: SlurmSection | None = None, source: str | None = None, components: dict | None = None,
                 **sections: Any) -> None:
        unknown = [name for name in sections if name not in _SECTION_OWNERS]
        if unknown:
            raise TypeError(f"Config() got an unknown section {unknown[0]!r}; sections: {', '.join(section_names())}")
        object.__setattr__(self, "node", node if node is not None else NodeSection())
        object.__setattr__(self, "log", log if log is not None else LogSection())
        object.__setattr__(self, "slurm", slurm if slurm is not None else SlurmSection())
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "components", {**(components or {}), **sections})

    @property
    def origin(self) -> str:
        """Where this config came from, as commands tell an operator: the file, or that every value is a default."""
        return f"config {self.source}" if self.source else f"no config file ({DEFAULT_PATH}): defaults"

    def __getattr__(self, name: str) -> Any:
        # reached only for names that are not fields: a component's section
        if name not in _SECTION_OWNERS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        components = object.__getattribute__(self, "components")
        section = components.get(name)
        if section is None:
            section = components[name] = section_class(name)()
        return section

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self.source == other.source and all(
            getattr(self, name) == getattr(other, name) for name in section_names())

    __hash__ = None  # type: ignore[assignment]  # sections hold dicts


def load(path: str | os.PathLike | None = None, *, parsed_cache: str | os.PathLike | None = None) -> Config:
    """Read and validate the config file.

    The file is `path`, else $SLURM_EXT_CONFIG, else /etc/slurm-ext/slurm-ext.toml.
    Only the last may be missing (then every value is its default): a file
    someone named explicitly and that is not there is an error.

    `parsed_cache`: a file that keeps the parsed TOML, with the text it came
    from, for the next process that loads the same file (the Python hooks,
    one process per job). Used only when it holds this very text of this
    very path, and is a plain file of this user that no one else can write;
    otherwise the file is parsed and the cache rewritten. A cache that cannot
    be written only costs the parse. Without one, a second load of the same
    text in this process takes the first's parse. The values are validated
    every time.

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
    except UnicodeDecodeError as err:
        raise ConfigError(path, f"not UTF-8 text (byte {err.start})") from err
    global _last_parsed
    last = _last_parsed  # once: another thread may load another file meanwhile
    if parsed_cache:
        data = _from_cache(parsed_cache, str(path), text)
    elif last is not None and last[:2] == (str(path), text):
        data = copy.deepcopy(last[2])
    else:
        data = None
    if data is None:
        data = _parse(path, text)
        _last_parsed = (str(path), text, copy.deepcopy(data))
        if parsed_cache:
            _to_cache(parsed_cache, str(path), text, data)
    return from_dict(data, path, text)


#: the file this process parsed last, its text and what it parsed to: a command reads its config twice (the CLI
#: first for [node] environment), and a dev cluster's, with its 10,000 nodes' agents, takes 0.15 s to parse. Validated
#: again at every load, as the parsed cache's data is.
_last_parsed: tuple[str, str, dict] | None = None


def _parse(path: Path, text: str) -> dict:
    import tomllib  # here: a load served by the parsed cache never imports it
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        message = str(err)
        line = re.search(r"line (\d+)", message)
        raise ConfigError(path, f"TOML syntax error: {message}",
                          line=int(line.group(1)) if line else None) from err


def _from_cache(cache: str | os.PathLike, source: str, text: str) -> dict | None:
    """The parsed data `cache` keeps for `text` of `source`; None when it keeps anything else or cannot be trusted."""
    import json
    import stat
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        # whoever else can write it could make this process run with a config of their choosing
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None
        try:
            entry = json.loads(file.read())
        except (OSError, ValueError):
            return None
    if not isinstance(entry, dict) or entry.get("source") != source or entry.get("text") != text:
        return None
    return entry["data"] if isinstance(entry.get("data"), dict) else None


def _to_cache(cache: str | os.PathLike, source: str, text: str, data: dict) -> None:
    import json

    from .fileio import atomic_write
    try:
        payload = json.dumps({"source": source, "text": text, "data": data})
    except (TypeError, ValueError):  # TOML dates and times have no JSON form: such a file is parsed every time
        return
    try:
        atomic_write(cache, payload, mode=0o600, fsync="none")
    except OSError:  # a read-only or full disk: the next process parses the file again
        pass


def from_dict(data: dict, source: str | os.PathLike = "<config>", text: str = "") -> Config:
    """Validate already parsed TOML data; `text` is used only to find line numbers.

    Raises:
        ConfigError: as for `load`.
    """
    known = section_names()
    built = {}
    for name, table in data.items():
        if name not in known:
            raise ConfigError(source, f"unknown section [{name}]; allowed: {', '.join(known)}",
                              line=_line_of(text, name, None))
        if not isinstance(table, dict):
            raise ConfigError(source, f"[{name}] must be a table of keys, got {_describe(table)}",
                              key=name, line=_line_of(text, None, name))
        built[name] = _build_section(name, section_class(name), table, source, text)
    return Config(**built, source=str(source))


def _build_section(name: str, cls: type, table: dict, source, text: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        dotted = f"{name}.{key}"
        line = _line_of(text, name, key)
        if key not in fields:
            if (name, key) in _MOVED_KEYS:
                raise ConfigError(source, _MOVED_KEYS[name, key], key=dotted, line=line)
            allowed = ", ".join(fields) or "(none yet)"
            raise ConfigError(source, f"unknown key; allowed keys in [{name}]: {allowed}", key=dotted, line=line)
        rules = fields[key].metadata
        if rules["kind"] == "sections":
            values[key] = _build_subsections(dotted, rules["section"], value, source, text, rules.get("validate"))
            continue
        try:
            values[key] = _check(rules, value)
        except ValueError as err:
            raise ConfigError(source, f"{_show(value)}: {err}", key=dotted, line=line) from None
    section = cls(**values)
    together = getattr(cls, "check_together", None)  # keys that are wrong only beside each other
    if together is not None:
        try:
            together(section)
        except ValueError as err:
            key, message = err.args
            raise ConfigError(source, message, key=f"{name}.{key}",
                              line=_line_of(text, name, key) or _line_of(text, name, None)) from None
    return section


def _build_subsections(name: str, cls: type, value: Any, source, text: str, validate=None) -> dict:
    """[name.<sub>] tables, each a `cls` section; `validate(sub, section)` raises ValueError(key, message)
    for what the section's own keys cannot say (a name outside a closed list, a value its owner must judge)."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(source, f"expected [{name}.<name>] tables, got {_describe(value)}", key=name,
                          line=_line_of(text, name.rsplit(".", 1)[0], name.rsplit(".", 1)[1]))
    built = {}
    for sub, table in value.items():
        if not re.match(r"^[A-Za-z0-9_-]+$", sub):
            raise ConfigError(source, "names are letters, digits, '-' and '_'", key=f"{name}.{sub}",
                              line=_line_of(text, f"{name}.{sub}", None))
        built[sub] = _build_section(f"{name}.{sub}", cls, table, source, text)
        if validate is not None:
            try:
                validate(sub, built[sub])
            except ValueError as err:
                key, message = err.args
                dotted = f"{name}.{sub}" + (f".{key}" if key else "")
                raise ConfigError(source, message, key=dotted,
                                  line=_line_of(text, f"{name}.{sub}", key or None)) from None
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
    if kind == "quantity":  # a number with its unit, or a plain count: the section's validate judges it
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"expected a string with a unit, such as '60%', or an integer, got {_describe(value)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_describe(value)}")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_describe(value)}")
        _check_range(rules, value)
        return float(value)
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
    if pattern and not re.fullmatch(pattern, value):
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
    for name in section_names():
        _render_section(out, name, getattr(config, name))
    return "\n".join(out) + "\n"


def render_section(name: str, section: Any) -> str:
    """One section as TOML, each key with its doc line: a config of its own for a process that needs only it."""
    out: list[str] = []
    _render_section(out, name, section)
    return "\n".join(out).lstrip() + "\n"


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
        out.append(f"{f.name} = {toml_value(value, f.metadata)}")
    for sub_name, sub_section in later:
        _render_section(out, sub_name, sub_section)


def toml_value(value: Any, rules: dict) -> str:
    """A value as the config file writes it, by its key's rules (`config show`, the example config)."""
    kind = rules["kind"]
    if kind == "duration":
        return f'"{format_duration(value)}"'
    if kind == "list":
        return "[" + ", ".join(toml_value(v, rules["item"]) for v in value) + "]"
    if kind == "table":
        return "{" + ", ".join(f"{_toml_string(k)} = {toml_value(v, rules['item'])}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}" if "e" not in f"{value:g}" else repr(value)
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_duration(seconds: float) -> str:
    """Seconds as the config writes a duration: '500ms', '10s', '5m', '1h' (what parse_duration reads back)."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"

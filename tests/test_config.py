"""Config loading and `slurm-ext config check|show`: every bad input is exit 2 naming the key."""

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers.cli import cli, cli_as_nobody
from slurm_ext import config, configdoc
from slurm_ext.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="slurm-ext.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "absent.toml")
    loaded = config.load()
    assert loaded == config.Config()
    assert loaded.slurm.timeout == 10.0
    assert loaded.source is None


def test_env_var_names_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, '[slurm]\ntimeout = "3s"\n[log]\nlevel = "debug"\n')
    monkeypatch.setenv(config.ENV_VAR, str(path))
    loaded = config.load()
    assert loaded.slurm.timeout == 3.0
    assert loaded.log.level == "debug"
    assert loaded.source == str(path)


def test_a_named_file_that_is_missing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(config.ENV_VAR, str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="no such file"):
        config.load()


@pytest.mark.parametrize("duration, seconds", [("500ms", 0.5), ("10s", 10.0), ("2m", 120.0), ("1h", 3600.0),
                                               ("1.5s", 1.5)])
def test_durations(duration, seconds):
    assert config.parse_duration(duration) == seconds


# Each bad input: the file's text, the key the message must name, and words it must hold.
BAD = {
    "unknown key": ('[slurm]\ntimeout = "5s"\ntimout = "5s"\n', "slurm.timout", ["unknown key", "timeout", "line 3"]),
    "unknown section": ('[slurmm]\ntimeout = "5s"\n', "[slurmm]", ["unknown section", "slurm", "line 1"]),
    "wrong type": ('[dev]\ngpu_count = "four"\n', "dev.gpu_count", ["'four'", "expected an integer", "string"]),
    "bool for int": ("[dev]\ngpu_count = true\n", "dev.gpu_count", ["expected an integer", "boolean"]),
    "duration without unit": ("[slurm]\ntimeout = 10\n", "slurm.timeout", ["10", "duration"]),
    "duration bad unit": ('[slurm]\ntimeout = "10 parsecs"\n', "slurm.timeout", ["'10 parsecs'", "ms, s, m or h"]),
    "out of range": ("[dev]\nslurmd_port = 70000\n", "dev.slurmd_port", ["70000", "between 1 and 65535"]),
    "bad choice": ('[log]\nlevel = "loud"\n', "log.level", ["'loud'", "'debug'", "'error'"]),
    "relative path": ('[node]\nstate_dir = "var/lib"\n', "node.state_dir", ["'var/lib'", "absolute path"]),
    "missing directory": ('[slurm]\nbin_dir = "/no/such/dir"\n', "slurm.bin_dir", ["'/no/such/dir'",
                                                                                 "no such directory"]),
    "bad name": ('[dev]\nnode_name = "node 1"\n', "dev.node_name", ["'node 1'", "matching"]),
    "section not a table": ('node = "x"\n', "node", ["must be a table"]),
    "syntax error": ('[slurm]\ntimeout = "5s"\nbroken = = 1\n', "TOML syntax error", ["line 3"]),
    "moved key": ('[supervisor]\nlisten = "127.0.0.1"\nruntime_dir = "/run/x"\n', "supervisor.runtime_dir",
                  ["moved to [node] runtime_dir", "line 3"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_rejected_by_config_check(tmp_path, case):
    text, key, words = BAD[case]
    path = write(tmp_path, text)
    result = cli("config", "check", str(path))
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    message = result.stderr
    assert str(path) in message and key in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_raises_config_error(tmp_path, case):
    text, key, _ = BAD[case]
    with pytest.raises(ConfigError) as caught:
        config.load(write(tmp_path, text))
    assert key in str(caught.value)


def test_a_key_that_moved_is_refused_with_its_new_place_and_read_there(tmp_path):
    old = write(tmp_path, '[node]\nname = "n1"\n\n[supervisor]\nruntime_dir = "/run/x"\n', name="old.toml")
    with pytest.raises(ConfigError) as caught:
        config.load(old)
    assert str(caught.value) == (f"{old}, line 5: supervisor.runtime_dir: moved to [node] runtime_dir "
                                 "(the same value; read by every component, not only the agent)")
    new = write(tmp_path, '[node]\nname = "n1"\nruntime_dir = "/run/x"\n', name="new.toml")
    assert config.load(new).node.runtime_dir == "/run/x"


def test_unreadable_file_as_a_plain_user(tmp_path):
    path = write(tmp_path, "[log]\n")
    path.chmod(0o000)
    tmp_path.chmod(0o755)
    code, stderr = cli_as_nobody("config", "check", str(path))
    assert code == 2, stderr
    assert f"{path}: cannot read: Permission denied" in stderr


def test_a_directory_is_not_a_config_file(tmp_path):
    result = cli("config", "check", str(tmp_path))
    assert result.returncode == 2
    assert f"{tmp_path}: cannot read: Is a directory" in result.stderr


def test_not_utf8(tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(b"[log]\nlevel = \"\xff\"\n")
    result = cli("config", "check", str(path))
    assert result.returncode == 2 and "not UTF-8" in result.stderr


def test_good_file_passes_check(tmp_path):
    path = write(tmp_path, '[slurm]\ntimeout = "3s"\njson = "never"\n[dev]\ngpu_count = 8\n')
    result = cli("config", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert f"{path}: OK" in result.stdout


def test_show_prints_the_effective_config_which_loads_back(tmp_path):
    path = write(tmp_path, '[slurm]\ntimeout = "1500ms"\n[dev]\ngpu_count = 8\ngpu_type = "h100"\n')
    result = cli("config", "show", env={config.ENV_VAR: str(path)})
    assert result.returncode == 0, result.stderr
    shown = tomllib.loads(result.stdout)
    assert shown["slurm"]["timeout"] == "1.5s"
    assert shown["dev"]["gpu_count"] == 8
    assert shown["log"]["level"] == "info"  # defaults are filled in
    assert config.from_dict(shown, path) == config.load(path)


def test_render_round_trips_every_default():
    text = config.render(config.Config())
    assert config.from_dict(tomllib.loads(text)) == dataclasses.replace(config.Config(), source="<config>")


def every_key() -> list[tuple[str, tuple[str, ...]]]:
    """Every declared key as the reference names it, with the lines of the example that may show it."""
    keys = []
    for name, section in config.sections().items():
        for field in dataclasses.fields(section):
            if field.metadata["kind"] != "sections":
                keys.append((f"{name}.{field.name}", (f"\n# {field.name} = ",)))
                continue
            keys.append((f"{name}.{field.name}", (f"\n# [{name}.{field.name}.NAME]\n",)))
            keys += [(f"{name}.{field.name}.<name>.{sub.name}", (f"\n# {sub.name} = ", f"\n### {sub.name}: "))
                     for sub in dataclasses.fields(field.metadata["section"])]
    return keys


def test_the_configuration_reference_and_the_example_config_are_made_from_the_declarations():
    """A key added, renamed or re-documented without running the generator fails here."""
    for relative, text in configdoc.outputs().items():
        committed = (REPO / relative).read_text() if (REPO / relative).exists() else ""
        assert committed == text, f"{relative} is not what the config declarations make: run `{configdoc.REGENERATE}`"


def test_the_reference_and_the_example_name_every_key_with_its_doc():
    reference = (REPO / configdoc.REFERENCE).read_text()
    example = (REPO / configdoc.EXAMPLE).read_text()
    for dotted, shown in every_key():
        assert f"| `{dotted}` |" in reference, f"{configdoc.REFERENCE} lacks {dotted}"
        assert any(line in example for line in shown), f"{configdoc.EXAMPLE} lacks {dotted}"
    for name in config.section_names():
        assert f"\n# [{name}]\n" in example, f"{configdoc.EXAMPLE} lacks the header of [{name}]"


def test_the_example_config_with_every_setting_uncommented_is_the_defaults(tmp_path):
    """The example's values are the defaults, as the file would write them: uncommenting one changes nothing."""
    settings, in_table = [], False
    for line in (REPO / configdoc.EXAMPLE).read_text().splitlines():
        if line.startswith("# ["):
            in_table = line.endswith(".NAME]")  # [x.y.NAME]: an example of a table, none by default
            if not in_table:
                settings.append(line[2:])
        elif line.startswith("# "):
            assert not in_table, f"a key of a table that no default has: {line}"
            settings.append(line[2:])
    path = write(tmp_path, "\n".join(settings) + "\n")
    loaded = config.load(path)
    assert set(tomllib.loads(path.read_text())) == set(config.section_names())
    assert dataclasses.replace(loaded, source=None) == config.Config()


def test_a_key_declared_without_running_the_generator_leaves_both_files_stale(monkeypatch):
    dev = config.section_class("dev")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Grown(dev):
        __doc__ = dev.__doc__
        brand_new: int = config.setting(1, "a key no file documents yet", "int")

    monkeypatch.setitem(config._registered, "dev", Grown)
    stale = [relative for relative, text in configdoc.outputs().items() if (REPO / relative).read_text() != text]
    assert stale == list(configdoc.outputs())
    assert "`dev.brand_new`" in configdoc.reference() and "# brand_new = 1" in configdoc.example()


def test_the_generator_check_mode_names_a_stale_file(tmp_path):
    for relative in configdoc.outputs():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
    assert configdoc.main([str(tmp_path)]) == 0
    assert configdoc.main(["--check", str(tmp_path)]) == 0
    stale = tmp_path / configdoc.EXAMPLE
    stale.write_text(stale.read_text().replace("# timeout = ", "# timeout_old = ", 1))
    result = subprocess.run([sys.executable, "-m", "slurm_ext.configdoc", "--check", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"{configdoc.EXAMPLE}: out of date; run `{configdoc.REGENERATE}`" in result.stderr


def test_every_section_in_file_order_each_declared_by_its_owner():
    owners = {name: cls.__module__ for name, cls in config.sections().items()}
    assert owners == {"node": "slurm_ext.config", "log": "slurm_ext.config", "slurm": "slurm_ext.config",
                      "supervisor": "slurm_ext.supervisor.settings",
                      "prolog_epilog": "slurm_ext.prolog_epilog.settings",
                      "gres": "slurm_ext.gres.settings", "accounting": "slurm_ext.accounting.settings",
                      "health": "slurm_ext.health.settings",
                      "repair": "slurm_ext.repair.settings", "history": "slurm_ext.repair.settings",
                      "acceptance": "slurm_ext.acceptance.settings",
                      "oidc": "slurm_ext.oidc.settings", "web": "slurm_ext.web.settings",
                      "dev": "slurm_ext.devcluster.settings"}
    assert list(owners) == list(config.section_names())


def test_a_component_section_reads_and_replaces_like_a_field():
    loaded = config.from_dict({"gres": {"expected": 8}})
    assert loaded.gres.expected == 8
    assert loaded.supervisor.port("worker") == 9810  # not in the file: its defaults, made when read
    changed = dataclasses.replace(loaded, gres=dataclasses.replace(loaded.gres, output="/x/gres.conf"))
    assert (changed.gres.output, changed.gres.expected, loaded.gres.output) == ("/x/gres.conf", 8, "")
    assert changed != loaded and changed.source == loaded.source == "<config>"
    assert config.Config() == config.Config(dev=config.section_class("dev")())
    assert config.Config() != config.Config(dev=config.section_class("dev")(gpu_count=8))


def test_a_section_nobody_declares_is_refused():
    with pytest.raises(TypeError, match="unknown section 'bogus'"):
        config.Config(bogus={})
    with pytest.raises(AttributeError, match="bogus"):
        config.Config().bogus
    with pytest.raises(ValueError, match="_SECTION_OWNERS"):
        config.register_section("bogus", dict)


# -- the parsed cache (the Python hooks: one process per job) -----------------------------------------


def _load_in_a_fresh_python(path: Path, cache: Path) -> tuple[str, bool]:
    """(log.level, whether tomllib was imported) of `config.load(path, parsed_cache=cache)` in a new process."""
    code = (f"import json, sys\nfrom slurm_ext import config\n"
            f"loaded = config.load({str(path)!r}, parsed_cache={str(cache)!r})\n"
            f"print(json.dumps([loaded.log.level, 'tomllib' in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    level, parsed = json.loads(done.stdout)
    return level, parsed


def test_a_parsed_cache_spares_the_next_load_the_toml_parse_and_follows_every_change(tmp_path):
    path, cache = write(tmp_path, '[log]\nlevel = "debug"\n'), tmp_path / "cache.json"
    assert _load_in_a_fresh_python(path, cache) == ("debug", True)
    assert cache.stat().st_mode & 0o777 == 0o600
    assert _load_in_a_fresh_python(path, cache) == ("debug", False)  # served by the cache
    path.write_text('[log]\nlevel = "error"\n')  # the same size, one word changed
    assert _load_in_a_fresh_python(path, cache) == ("error", True)
    assert _load_in_a_fresh_python(path, cache) == ("error", False)
    other = write(tmp_path, '[log]\nlevel = "error"\n', name="other.toml")  # the same text, another file
    assert _load_in_a_fresh_python(other, cache) == ("error", True)
    # the cached values are validated as the file's are
    path.write_text('[log]\nlevel = "loud"\n')
    for _ in range(2):
        with pytest.raises(ConfigError, match="log.level"):
            config.load(path, parsed_cache=cache)


def _forge(cache: Path, path: Path, level: str) -> None:
    """A cache entry that says the file sets log.level = `level`."""
    cache.write_text(json.dumps({"source": str(path), "text": path.read_text(), "data": {"log": {"level": level}}}))


def test_a_parsed_cache_someone_else_could_have_written_is_not_used(tmp_path):
    path, cache = write(tmp_path, '[log]\nlevel = "info"\n'), tmp_path / "cache.json"
    _forge(cache, path, "error")
    cache.chmod(0o600)
    assert config.load(path, parsed_cache=cache).log.level == "error"  # a cache of ours: used, as the test of _forge
    for case in ("group-writable", "another owner", "a link"):
        _forge(cache, path, "error")
        if case == "group-writable":
            cache.chmod(0o620)
        elif case == "another owner":
            os.chown(cache, 65534, 65534)
        else:
            forged = tmp_path / "forged.json"
            cache.rename(forged)
            cache.symlink_to(forged)
        assert config.load(path, parsed_cache=cache).log.level == "info", case
        cache.unlink()


def test_a_parsed_cache_that_cannot_be_kept_costs_only_the_parse(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "warning"\n[node]\nname = "n1"\n')
    assert config.load(path, parsed_cache=tmp_path / "missing-dir" / "cache.json").log.level == "warning"
    assert not (tmp_path / "missing-dir").exists()
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    garbage.chmod(0o600)
    assert config.load(path, parsed_cache=garbage).node.name == "n1"
    assert json.loads(garbage.read_text())["source"] == str(path)  # rewritten with the parse
    # a TOML date has no JSON form: nothing is kept, and the file is judged as ever
    dated, cache = write(tmp_path, "[node]\nname = 1979-05-27\n", name="dated.toml"), tmp_path / "dated.json"
    with pytest.raises(ConfigError, match="node.name"):
        config.load(dated, parsed_cache=cache)
    assert not cache.exists()


def test_a_value_with_a_trailing_newline_does_not_pass_for_one_without(tmp_path):
    """`$` matches before a final newline: a pattern is matched against the whole value."""
    path = tmp_path / "slurm-ext.toml"
    path.write_text('[oidc]\nissuer = "https://idp.example.org/realm\\n"\n')
    with pytest.raises(config.ConfigError, match="oidc.issuer"):
        config.load(str(path))


def test_a_file_loaded_twice_in_one_process_is_parsed_once_and_each_load_is_its_own(tmp_path, monkeypatch):
    """The CLI reads its config twice (first for [node] environment): the second load takes the first's parse (a
    dev cluster's config of 10,000 nodes' agents: 0.15 s), validated again, and what one load's caller changes is
    not the next one's."""
    path = write(tmp_path, '[log]\nlevel = "debug"\n[repair]\nagents = {n1 = "127.0.0.1:9000"}\n')
    parsed = []
    real = config._parse
    monkeypatch.setattr(config, "_parse", lambda *args: parsed.append(args) or real(*args))
    first = config.load(path)
    first.repair.agents["n2"] = "changed by its caller"
    second = config.load(path)
    assert len(parsed) == 1 and second.repair.agents == {"n1": "127.0.0.1:9000"} and second.log.level == "debug"
    path.write_text('[log]\nlevel = "error"\n')  # the same path, another text: parsed
    assert config.load(path).log.level == "error" and len(parsed) == 2
    path.write_text('[log]\nlevel = "loud"\n')
    for _ in range(2):  # validated at every load
        with pytest.raises(ConfigError, match="log.level"):
            config.load(path)

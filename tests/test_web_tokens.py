"""The operators' tokens from the real `slurm-ext web` command line (issue 29 item 7): a second token for a user is
never made without a word, tokens are listed (user, when made, a fingerprint: never the token) and revoked, each
change recorded in the journal, and a missing or empty user name says what to pass."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ext.web.auth import Tokens

from helpers.cli import cli

#: a fingerprint as list-tokens prints it
_FINGERPRINT = re.compile(r"^[0-9a-f]{12}$")


def _setup(tmp_path: Path) -> tuple[dict, Path]:
    """The environment of a CLI run with a config of its own (the page as root: the file is root's alone), and the
    token file it names."""
    path = tmp_path / "etc" / "web-tokens"
    conf = tmp_path / "cli.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\nuser = "root"\ntoken_file = "{path}"\n')
    return {"SLURM_EXT_CONFIG": str(conf)}, path


def _journal(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def _listed(env: dict) -> list[list[str]]:
    listed = cli("web", "list-tokens", env=env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["USER", "ROLE", "ADDED", "FINGERPRINT"], listed.stdout
    return [line.split() for line in lines[1:]]


def test_a_second_token_for_a_user_is_refused_unless_asked_for_and_replace_revokes_the_first(tmp_path):
    env, path = _setup(tmp_path)
    first = cli("web", "add-token", "alice", env=env)
    assert first.returncode == 0, first.stderr
    alice = first.stdout.strip()
    again = cli("web", "add-token", "alice", env=env)
    assert again.returncode == 1 and again.stdout == "", again
    assert "alice already has 1 token" in again.stderr and "--another" in again.stderr \
        and "--replace" in again.stderr and _fingerprint(alice) in again.stderr, again.stderr
    assert Tokens(str(path)).user_of(alice) == "alice" and len(path.read_text().splitlines()) == 1

    another = cli("web", "add-token", "alice", "--another", env=env)
    assert another.returncode == 0, another.stderr
    second = another.stdout.strip()
    tokens = Tokens(str(path))
    assert tokens.user_of(alice) == tokens.user_of(second) == "alice"

    replaced = cli("web", "add-token", "alice", "--replace", env=env)
    assert replaced.returncode == 0 and "revoked 2 token(s) of alice" in replaced.stderr, replaced.stderr
    third = replaced.stdout.strip()
    tokens = Tokens(str(path))
    assert (tokens.user_of(alice), tokens.user_of(second), tokens.user_of(third)) == (None, None, "alice")
    assert (os.stat(path).st_mode & 0o777, os.stat(path).st_uid) == (0o600, 0)
    both = cli("web", "add-token", "alice", "--another", "--replace", env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr, both.stderr

    added = [e for e in _journal(tmp_path) if e["event"] == "web-token-added"]
    assert [(e["user"], e["fingerprint"], e["component"]) for e in added] == \
        [("alice", _fingerprint(t), "web") for t in (alice, second, third)], added
    [revoked] = [e for e in _journal(tmp_path) if e["event"] == "web-token-revoked"]
    assert revoked["user"] == "alice" and revoked["fingerprints"] == [_fingerprint(alice), _fingerprint(second)]


def test_list_tokens_shows_user_when_made_and_a_fingerprint_never_the_token(tmp_path):
    env, path = _setup(tmp_path)
    tokens = {user: cli("web", "add-token", user, env=env).stdout.strip() for user in ("alice", "bob")}
    path.write_text(path.read_text() + f"carol sha256:{hashlib.sha256(b'c' * 30).hexdigest()}\n")  # by hand
    listed = cli("web", "list-tokens", env=env)
    for token in tokens.values():
        assert token not in listed.stdout
        assert hashlib.sha256(token.encode()).hexdigest() not in listed.stdout  # nor the whole hash
    rows = _listed(env)
    assert [row[:2] for row in rows] == [["alice", "operator"], ["bob", "operator"], ["carol", "operator"]], rows
    for row, token in zip(rows, tokens.values()):
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", row[2]) and row[3] == _fingerprint(token), row
    assert rows[2][2] == "-" and _FINGERPRINT.match(rows[2][3]), rows  # a line without its date
    assert Tokens(str(path)).user_of(tokens["alice"]) == "alice"  # the date, a comment, is not part of the hash


def test_revoke_token_by_user_or_fingerprint_and_the_journal_says_who_lost_which(tmp_path):
    env, path = _setup(tmp_path)
    alice = [cli("web", "add-token", "alice", *extra, env=env).stdout.strip() for extra in ((), ("--another",))]
    bob = cli("web", "add-token", "bob", env=env).stdout.strip()
    path.write_text("# operators of the cluster\n" + path.read_text())

    one = cli("web", "revoke-token", "alice", "--fingerprint", _fingerprint(alice[1]), env=env)
    assert one.returncode == 0 and "revoked 1 token(s) of alice" in one.stderr, one.stderr
    tokens = Tokens(str(path))
    assert (tokens.user_of(alice[0]), tokens.user_of(alice[1]), tokens.user_of(bob)) == ("alice", None, "bob")
    assert path.read_text().startswith("# operators of the cluster\n")  # the rest of the file as it was

    unknown = cli("web", "revoke-token", "bob", "--fingerprint", _fingerprint(alice[0]), env=env)
    assert unknown.returncode == 1 and "bob has no token with fingerprint" in unknown.stderr \
        and "slurm-ext web list-tokens" in unknown.stderr, unknown.stderr
    nobody = cli("web", "revoke-token", "carol", env=env)
    assert nobody.returncode == 1 and "carol has no token" in nobody.stderr, nobody.stderr

    every = cli("web", "revoke-token", "alice", env=env)
    assert every.returncode == 0, every.stderr
    assert [row[0] for row in _listed(env)] == ["bob"]
    assert Tokens(str(path)).user_of(alice[0]) is None
    revoked = [(e["user"], e["fingerprints"]) for e in _journal(tmp_path) if e["event"] == "web-token-revoked"]
    assert revoked == [("alice", [_fingerprint(alice[1])]), ("alice", [_fingerprint(alice[0])])], revoked


def test_a_token_with_a_role_is_made_listed_taken_with_its_role_and_revoked(tmp_path):
    env, path = _setup(tmp_path)
    made = cli("web", "add-token", "dana", "--role", "viewer", env=env)
    assert made.returncode == 0 and "role viewer" in made.stderr, made.stderr
    token = made.stdout.strip()
    assert path.read_text().split()[2] == "viewer"
    assert _listed(env)[0][:2] == ["dana", "viewer"]
    assert Tokens(str(path)).holder_of(token) == ("dana", "viewer")
    gone = cli("web", "revoke-token", "dana", env=env)
    assert gone.returncode == 0, gone.stderr
    assert Tokens(str(path)).holder_of(token) is None and _listed(env) == []


def test_add_token_without_a_user_or_with_an_empty_one_says_what_to_pass(tmp_path):
    """`web add-token $USER` where USER is unset: argparse's "the following arguments are required" said nothing of
    what the name is for, and an empty one was "'' is not a user name"."""
    env, path = _setup(tmp_path)
    for args in ((), ("",), ("  ",)):
        said = cli("web", "add-token", *args, env=env)
        assert said.returncode == 2 and said.stdout == "", said
        assert "needs the operator's user name" in said.stderr and "slurm-ext web add-token alice" in said.stderr \
            and "$USER" in said.stderr, said.stderr
    assert not path.exists()
    for command in ("revoke-token",):
        said = cli("web", command, "", env=env)
        assert said.returncode == 2 and "needs the operator's user name" in said.stderr, said.stderr


def test_a_blank_fingerprint_revokes_nothing_and_two_changes_at_once_both_hold(tmp_path):
    """--fingerprint " " matched every token of the user (the empty prefix); and revoke-token, add-token --replace
    rewrote the file from what each had read, so a token added meanwhile was lost (review of 29.7)."""
    env, path = _setup(tmp_path)
    token = cli("web", "add-token", "alice", env=env).stdout.strip()
    for blank in (" ", "", "xyz1"):
        refused = cli("web", "revoke-token", "alice", "--fingerprint", blank, env=env)
        assert refused.returncode == 2 and "nothing written" in refused.stderr, (blank, refused.stderr)
    assert Tokens(str(path)).user_of(token) == "alice"

    # while another change holds the file's lock, a revoke waits for it rather than writing what it read
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    waiting = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "web", "revoke-token", "alice"], env={
        **os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=2)
        path.write_text(path.read_text() + f"bob sha256:{hashlib.sha256(b'b' * 32).hexdigest()}\n")  # meanwhile
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    _, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert Tokens(str(path)).user_of("b" * 32) == "bob"  # the change made meanwhile is kept
    assert Tokens(str(path)).user_of(token) is None

"""`slurm-ext oidc slurm` on this host (issue 31, Build point 3): the IdP's JWKS cleaned for Slurm's auth/jwt,
written SlurmUser's 0400 and atomically, never through a link, rewritten (and Slurm reconfigured) only when the
IdP rotates; the slurm.conf lines, Slinky's ConfigMap checked against the operator's CRD and kubernetes-validate,
the warning; and every bad input refused with the URL named, exit 1, an event, and the old file kept.

The IdP is the tests' own (tests/helpers/idp.py) over TLS, its CA given as --ca-file. Slurm 26.05 taking the
file is tests/test_oidc_slurm_images.py; `scontrol` here is a stand-in that records its arguments (Slurm's own
reconfigure is exercised there).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
from cryptography.hazmat.primitives.asymmetric import rsa
import kubernetes_validate
import pytest
import yaml

from helpers.cli import cli
from helpers.idp import TestIdP, ec_key, public_jwk, rsa_key
from helpers.wait import wait_for
from slurm_ext import config
from slurm_ext.oidc import slurmsync
from slurm_ext.oidc.provider import OidcError
from slurm_ext.oidc.slurmcli import WARNING
from slurm_ext.oidc.slurmjwks import SLURM_FIELDS, NoSlurmKey, clean_jwks

REPO = Path(__file__).resolve().parents[1]
SLURM_UID = 64030  # the Debian package's slurm user


def _rsa(kid: str, **changes) -> dict:
    jwk = public_jwk(rsa_key(), kid, **{k: v for k, v in changes.items() if k in ("alg", "use")})
    jwk.update({k: v for k, v in changes.items() if k not in ("alg", "use")})
    return {k: v for k, v in jwk.items() if v is not None}


def test_clean_jwks_keeps_rsa_signing_keys_only_each_with_alg_rs256_and_the_fields_slurm_reads():
    plain = _rsa("plain", alg=None, use=None, x5c=["MIIB..."], x5t="abc", key_ops=["verify"])
    data = {"keys": [_rsa("good"), plain, public_jwk(ec_key(), "ec1", alg="ES256"),
                     {"kty": "OKP", "crv": "Ed25519", "kid": "ed1", "x": "abc"},
                     {"kty": "RSA", "kid": "keyless", "use": "sig"}, _rsa("enc", use="enc"),
                     _rsa("rs384", alg="RS384"), _rsa("good"), _rsa(None), "junk"]}
    jwks = clean_jwks(data, "https://idp/jwks")
    assert jwks.kids == ("good", "plain")
    for key in jwks.keys:
        assert tuple(key) == SLURM_FIELDS and key["alg"] == "RS256" and key["use"] == "sig"
    assert jwks.keys[1]["n"] == plain["n"] and jwks.keys[1]["e"] == plain["e"]
    reasons = {d.kid: d.reason for d in jwks.dropped[:-1]}
    assert "Slurm verifies RSA keys only" in reasons["ec1"] and "abort" in reasons["ec1"]
    assert "RSA keys only" in reasons["ed1"]
    assert "no RSA 'n'" in reasons["keyless"]
    assert "not a signing key" in reasons["enc"]
    assert "RS256 only" in reasons["rs384"]
    assert "same kid" in reasons["good"]
    assert "no usable kid" in reasons[""]
    assert jwks.dropped[-1].reason == "not a JSON object" and len(jwks.dropped) == 8
    assert json.loads(jwks.text()) == {"keys": list(jwks.keys)}


def test_clean_jwks_drops_a_trailing_newline_in_n_e_or_kid_and_a_modulus_under_2048_bits():
    good = _rsa("good")
    small = public_jwk(rsa.generate_private_key(public_exponent=65537, key_size=1024), "small")
    data = {"keys": [good, {**_rsa("nl-n"), "n": good["n"] + "\n"}, {**_rsa("nl-e"), "e": "AQAB\n"},
                     {**_rsa("x"), "kid": "a\n"}, {**_rsa("tiny"), "n": "AQAB"}, small]}
    jwks = clean_jwks(data, "https://idp/jwks")
    assert jwks.kids == ("good",)
    reasons = {d.kid: d.reason for d in jwks.dropped}
    assert "no RSA 'n'" in reasons["nl-n"] and "no RSA 'e'" in reasons["nl-e"]
    assert "no usable kid" in reasons["a\n"]
    assert reasons["tiny"].startswith("an RSA modulus of 17 bits: fewer than 2048")
    assert reasons["small"].startswith("an RSA modulus of 1024 bits: fewer than 2048")


def test_clean_jwks_refuses_a_set_without_a_usable_key_and_a_set_that_is_no_jwks():
    with pytest.raises(NoSlurmKey, match=r"https://idp/jwks holds no RSA signing key.*ec1: kty 'EC'"):
        clean_jwks({"keys": [public_jwk(ec_key(), "ec1", alg="ES256"), {"kty": "RSA", "kid": "x"}]},
                   "https://idp/jwks")
    with pytest.raises(OidcError, match="no `keys` list"):
        clean_jwks({"key": []}, "https://idp/jwks")


@pytest.fixture
def idp():
    with TestIdP(tls=True) as provider:
        provider.jwks_extra.append(public_jwk(ec_key(), "ec1", alg="ES256"))
        yield provider


@pytest.fixture
def site(tmp_path):
    """A config whose journal is here and whose `scontrol` is a stand-in that records each call (and answers
    `show config` with SlurmUser=slurm(64030)); its reconfigure fails while `reconfigure-fails` exists and
    SIGKILLs the `oidc slurm` that ran it while `reconfigure-kills` does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                        "[ \"$1\" = show ] && echo 'SlurmUser               = slurm(64030)'\n"
                        f"[ \"$1\" = reconfigure ] && [ -e {tmp_path}/reconfigure-kills ] && kill -9 $PPID\n"
                        f"[ -e {tmp_path}/reconfigure-fails ] && echo 'slurm_reconfigure error: Unable to contact "
                        "slurm controller' >&2 && exit 1\nexit 0\n")
    scontrol.chmod(0o755)
    conf = tmp_path / "slurm-ext.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[slurm]\nbin_dir = "{bin_dir}"\n')
    (tmp_path / "etc").mkdir()
    return tmp_path


def _run(site: Path, idp: TestIdP, *more: str):
    return cli("oidc", "slurm", "--config", str(site / "slurm-ext.toml"), "--issuer", idp.issuer, "--ca-file",
               idp.ca_file, "--jwks-file", str(site / "etc" / "jwks.json"), *more, timeout=60)


def _journal(site: Path) -> list[dict]:
    path = site / "state" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _calls(site: Path) -> list[str]:
    path = site / "scontrol-calls"
    return path.read_text().splitlines() if path.exists() else []


def test_writes_the_cleaned_jwks_slurm_users_0400_and_prints_the_lines_the_configmap_and_the_warning(site, idp):
    result = _run(site, idp)
    assert result.returncode == 0, result.stderr
    path = site / "etc" / "jwks.json"
    info = path.lstat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (SLURM_UID, SLURM_UID, 0o400)
    written = json.loads(path.read_text())
    assert [k["kid"] for k in written["keys"]] == [idp.signing_kid]
    assert written["keys"][0] == {"kty": "RSA", "kid": idp.signing_kid, "use": "sig", "alg": "RS256",
                                  "n": idp.jwks()["keys"][0]["n"], "e": "AQAB"}
    out = result.stdout
    assert f"wrote {path} (slurm, 0400): 1 keys {idp.signing_kid} from {idp.issuer}/jwks" in out
    assert "left out ec1: kty 'EC': Slurm verifies RSA keys only" in out
    assert "AuthAltTypes=auth/jwt\n" in out
    assert f"AuthAltParameters=jwks={path},userclaimfield=preferred_username\n" in out
    assert "not its issuer (iss), not its\n  audience (aud)" in out and "use_jwt_client_ids_only" in out
    # Slinky: the ConfigMap (checked in the next test) and the extraConf line its operator merges
    assert "#   AuthAltParameters=userclaimfield=preferred_username\n" in out and "kind: ConfigMap" in out
    assert _calls(site) == ["show config"]  # the owner from slurmctld; a first file: no reconfigure
    [event] = _journal(site)
    assert event["event"] == "oidc-slurm-jwks-written" and event["kids"] == [idp.signing_kid]
    assert event["dropped"] and event["dropped"][0].startswith("ec1: kty 'EC'")


def test_the_slinky_configmap_is_a_valid_configmap_and_its_keyref_fits_the_operators_crds(site, idp):
    result = _run(site, idp, "--conf-out", str(site), "--client-ids-only", "--configmap", "idp-keys",
                  "--namespace", "hpc")
    assert result.returncode == 0, result.stderr
    assert (site / "auth-jwt.conf").read_text() == (
        f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwks={site / 'etc' / 'jwks.json'},"
        "userclaimfield=preferred_username,use_jwt_client_ids_only\n")
    text = (site / "jwks-configmap.yaml").read_text()
    configmap = yaml.safe_load(text)
    kubernetes_validate.validate(configmap, "1.33.0", strict=True)
    assert configmap["metadata"] == {"name": "idp-keys", "namespace": "hpc",
                                     "labels": {"app.kubernetes.io/managed-by": "slurm-ext"}}
    assert json.loads(configmap["data"]["jwks.json"]) == json.loads((site / "etc" / "jwks.json").read_text())
    keyref = yaml.safe_load("\n".join(line[2:] for line in text.splitlines() if line.startswith("#   ")))
    for kind in ("controllers", "accountings"):
        crd = yaml.safe_load((REPO / "tests" / "data" / "slinky" / "crds" / f"slinky.slurm.net_{kind}.yaml")
                             .read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        jsonschema.validate(keyref["jwksKeyRef"], {**schema["jwksKeyRef"], "additionalProperties": False})
    assert keyref == {"jwksKeyRef": {"name": "idp-keys", "key": "jwks.json"}}


def test_an_unchanged_set_writes_nothing_and_a_rotation_rewrites_and_reconfigures(site, idp):
    assert _run(site, idp).returncode == 0
    path = site / "etc" / "jwks.json"
    first = path.stat()
    again = _run(site, idp)
    assert again.returncode == 0 and "unchanged:" in again.stdout
    assert path.stat().st_ino == first.st_ino and len(_journal(site)) == 1
    old = idp.signing_kid
    new = idp.rotate()
    idp.retire(old)
    rotated = _run(site, idp)
    assert rotated.returncode == 0, rotated.stderr
    assert f"added {new}; removed {old}" in rotated.stdout and "reconfigured Slurm" in rotated.stdout
    assert [k["kid"] for k in json.loads(path.read_text())["keys"]] == [new]
    assert _calls(site)[-1] == "reconfigure"
    event = _journal(site)[-1]
    assert (event["event"], event["added"], event["removed"], event["reconfigured"]) == (
        "oidc-slurm-jwks-written", [new], [old], True)
    # a reconfigure that fails is said and is an event: the file is right, Slurm has not read it yet
    (site / "reconfigure-fails").touch()
    idp.rotate()
    failed = _run(site, idp)
    assert failed.returncode == 0 and "`scontrol reconfigure` failed" in failed.stdout
    assert "retried at each refresh until it succeeds" in failed.stdout
    assert "oidc-slurm-reconfigure-failed" in [e["event"] for e in _journal(site)]


def test_a_failed_reconfigure_is_retried_by_the_next_refresh_until_one_succeeds(site, idp):
    assert _run(site, idp).returncode == 0
    idp.rotate()
    (site / "reconfigure-fails").touch()
    failed = _run(site, idp)
    assert failed.returncode == 0 and "`scontrol reconfigure` failed" in failed.stdout
    assert _calls(site).count("reconfigure") == 1
    # the file holds the IdP's keys now: without the marker this run would say "unchanged" and stop there
    still = _run(site, idp)
    assert "unchanged:" in still.stdout and "`scontrol reconfigure` failed" in still.stdout
    assert _calls(site).count("reconfigure") == 2
    (site / "reconfigure-fails").unlink()
    retried = _run(site, idp)
    assert retried.returncode == 0, retried.stderr
    assert "unchanged:" in retried.stdout and "reconfigured Slurm (scontrol reconfigure) (a retry" in retried.stdout
    assert _calls(site).count("reconfigure") == 3
    assert [e["event"] for e in _journal(site)][1:] == [
        "oidc-slurm-reconfigure-failed", "oidc-slurm-jwks-written", "oidc-slurm-reconfigure-failed",
        "oidc-slurm-reconfigured"]
    done = _run(site, idp)  # succeeded: nothing pending, no more reconfigures
    assert "unchanged:" in done.stdout and "reconfigured" not in done.stdout
    assert _calls(site).count("reconfigure") == 3


def _marker(site: Path) -> Path:
    return slurmsync._pending_marker(config.load(str(site / "slurm-ext.toml")), str(site / "etc" / "jwks.json"))


def test_a_run_killed_between_the_write_and_the_reconfigure_leaves_the_marker_and_the_next_run_reconfigures(
        site, idp):
    """A timer's TimeoutSec, the OOM killer or a crash after the file is written: the file holds the IdP's keys,
    so only the marker (written before the file) tells the next run that Slurm has not read them."""
    assert _run(site, idp).returncode == 0
    assert not _marker(site).exists()  # a first file owes no reconfigure
    new = idp.rotate()
    (site / "reconfigure-kills").touch()
    killed = _run(site, idp)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr)
    assert new in read_kids_of(site / "etc" / "jwks.json") and _marker(site).exists()
    assert _calls(site).count("reconfigure") == 1
    (site / "reconfigure-kills").unlink()
    retried = _run(site, idp)
    assert retried.returncode == 0, retried.stderr
    assert "unchanged:" in retried.stdout and "reconfigured Slurm (scontrol reconfigure) (a retry" in retried.stdout
    assert _calls(site).count("reconfigure") == 2 and not _marker(site).exists()
    assert _journal(site)[-1]["event"] == "oidc-slurm-reconfigured"
    done = _run(site, idp)
    assert "reconfigured" not in done.stdout and _calls(site).count("reconfigure") == 2
    idp.rotate()  # --no-reconfigure: the reconfigure is the operator's, nothing is remembered
    assert _run(site, idp, "--no-reconfigure").returncode == 0 and not _marker(site).exists()


def test_a_marker_that_cannot_be_removed_after_a_reconfigure_is_an_error_said_and_an_event(site, idp):
    """Left silently, it would make every later refresh reconfigure Slurm (slurmctld re-execs) again."""
    assert _run(site, idp).returncode == 0
    idp.rotate()
    marker = _marker(site)
    (marker / "in-the-way").mkdir(parents=True)  # a directory in the marker's place: unlink fails, even as root
    rotated = _run(site, idp)
    assert rotated.returncode == 0, rotated.stderr
    assert "reconfigured Slurm" in rotated.stdout
    assert (f"slurm-ext: error: `scontrol reconfigure` succeeded, but its marker {marker} cannot be removed (Is a "
            "directory): every refresh will reconfigure Slurm again") in rotated.stdout
    stuck = [e for e in _journal(site) if e["event"] == "oidc-slurm-marker-stuck"]
    assert len(stuck) == 1 and stuck[0]["marker"] == str(marker) and str(marker) in stuck[0]["message"]
    again = _run(site, idp)  # said at every refresh it costs a reconfigure
    assert "unchanged:" in again.stdout and "cannot be removed" in again.stdout
    assert len([e for e in _journal(site) if e["event"] == "oidc-slurm-marker-stuck"]) == 2


def test_a_rotation_says_slurmdbd_needs_a_restart_and_a_first_file_does_not(site, idp):
    first = _run(site, idp)
    assert "slurmdbd: " not in first.stdout
    idp.rotate()
    rotated = _run(site, idp, "--no-reconfigure")
    assert rotated.returncode == 0, rotated.stderr
    assert ("slurmdbd: slurmdbd reads the JWKS only when it starts (neither `scontrol reconfigure` nor `sacctmgr "
            "reconfigure` makes it reread the file): restart slurmdbd") in rotated.stdout
    event = _journal(site)[-1]
    assert event["event"] == "oidc-slurm-jwks-written" and event["slurmdbd_restart"] is True
    assert "restart slurmdbd" in event["message"]
    assert _journal(site)[0]["slurmdbd_restart"] is False


def _refused(site: Path, idp: TestIdP, want: str) -> None:
    path = site / "etc" / "jwks.json"
    before = path.read_bytes()
    events = len(_journal(site))
    result = _run(site, idp)
    assert result.returncode == 1, result.stdout
    assert want in result.stderr, result.stderr
    assert path.read_bytes() == before
    new = _journal(site)[events:]
    assert [e["event"] for e in new] == ["oidc-slurm-jwks-refused"] and want in new[0]["message"]


def test_bad_input_is_refused_naming_the_url_with_the_old_file_kept_and_an_event(site, idp):
    assert _run(site, idp).returncode == 0
    idp.discovery_changes = {"jwks_uri": None}
    _refused(site, idp, f"the IdP's discovery document {idp.issuer}/.well-known/openid-configuration lacks jwks_uri")
    idp.discovery_changes = {"jwks_uri": f"{idp.issuer}/logout"}  # answers 200 text/plain
    _refused(site, idp, f"the IdP's JWKS {idp.issuer}/logout: not JSON")
    idp.discovery_changes = {}
    for kid in list(idp.keys):
        idp.retire(kid)
    idp.jwks_extra.append({"kty": "RSA", "kid": "keyless", "use": "sig"})
    _refused(site, idp, f"the IdP's JWKS {idp.issuer}/jwks holds no RSA signing key Slurm can use (ec1: kty 'EC'")


def test_an_unreachable_issuer_is_refused_naming_it(site):
    with TestIdP() as gone:
        issuer = gone.issuer
    (site / "etc" / "jwks.json").write_text("{}")
    result = cli("oidc", "slurm", "--config", str(site / "slurm-ext.toml"), "--issuer", issuer, "--jwks-file",
                 str(site / "etc" / "jwks.json"), timeout=60)
    assert result.returncode == 1
    assert f"{issuer}/.well-known/openid-configuration: unreachable" in result.stderr
    assert (site / "etc" / "jwks.json").read_text() == "{}"
    assert [e["event"] for e in _journal(site)] == ["oidc-slurm-jwks-refused"]


def test_a_symbolic_link_in_the_files_place_is_refused_and_its_target_untouched(site, idp, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    os.symlink(target, site / "etc" / "jwks.json")
    result = _run(site, idp)
    assert result.returncode == 1 and "is a symbolic link: refused" in result.stderr
    assert target.read_text() == "precious" and (site / "etc" / "jwks.json").is_symlink()


def test_a_symbolic_link_to_a_copy_of_the_same_keys_is_refused_not_unchanged(site, idp, tmp_path):
    assert _run(site, idp).returncode == 0
    path = site / "etc" / "jwks.json"
    copy = tmp_path / "copy.json"
    copy.write_text(path.read_text())
    path.chmod(0o600)
    path.unlink()
    os.symlink(copy, path)
    result = _run(site, idp)
    assert result.returncode == 1 and "is a symbolic link: refused" in result.stderr, result.stdout
    assert "unchanged" not in result.stdout and path.is_symlink()
    assert _journal(site)[-1]["event"] == "oidc-slurm-jwks-refused"


def test_the_warning_does_not_count_use_jwt_client_ids_only_as_a_way_to_close_it():
    closing, _, after = WARNING.partition("To close it:")
    rest = after.split("use_jwt_client_ids_only")
    assert len(rest) == 2 and "closes nothing" in rest[1] and "widens" in rest[1]
    assert "use_jwt_client_ids_only" not in closing


def test_the_restapi_image_runs_as_a_fixed_numeric_uid_and_gid():
    """Kubernetes' runAsNonRoot refuses an image whose USER is a name; the uid is fixed in the useradd."""
    text = (REPO / "containers" / "Dockerfile").read_text()
    stage = text.split("FROM base AS restapi", 1)[1].split("\nFROM ", 1)[0]
    [user] = [line.split()[1] for line in stage.splitlines() if line.startswith("USER ")]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) > 0, user
    assert f"--uid {uid} --gid {gid}" in stage and f"groupadd --system --gid {gid} slurmrestd" in stage


def test_watch_goes_on_after_an_unexpected_error_with_its_traceback_and_an_event(monkeypatch, tmp_path):
    """A bug or an error that is not an OidcError (a ValueError, an OSError) is said and retried, never the end of
    the refresh process."""
    calls, emitted = [], []
    done = slurmsync.Refreshed(clean_jwks({"keys": [_rsa("k1")]}), False, (), (), False)

    def refresh(options, settings, emit):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("an answer nobody expected")
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        os.kill(os.getpid(), signal.SIGTERM)  # the third turn: stop
        return done
    monkeypatch.setattr(slurmsync, "refresh", refresh)
    monkeypatch.setattr(slurmsync, "_conf_out", lambda *a: None)
    options = slurmsync.Options(issuer="https://idp", ca_file="", timeout=1, jwks_file=str(tmp_path / "jwks.json"),
                                userclaimfield="preferred_username", owner="slurm", client_ids_only=False,
                                reconfigure=True, refresh_every=0.01)
    out = __import__("io").StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert slurmsync._watch(None, options, config.Config(), lambda *a, **f: emitted.append((a, f)), out) == 0
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert len(calls) == 3
    text = out.getvalue()
    assert f"unexpected ValueError in the refresh of {options.jwks_file}: an answer nobody expected" in text
    assert "Traceback (most recent call last)" in text and "unexpected OSError" in text
    assert [a[0] for a, _ in emitted] == ["oidc-slurm-refresh-failed"] * 2
    assert "ValueError: an answer nobody expected" in emitted[0][1]["traceback"]


def test_bad_flags_are_refused_before_the_idp_is_asked(site, idp):
    result = _run(site, idp, "--userclaimfield", "preferredUsername")
    assert result.returncode == 1 and "lower-case claim" in result.stderr
    assert not (site / "etc" / "jwks.json").exists() and idp.requests == []


def test_watch_rewrites_the_file_when_the_idp_rotates_and_stops_on_sigterm(site, idp):
    with (site / "slurm-ext.toml").open("a") as conf:
        conf.write('[oidc]\nslurm_refresh = "10s"\n')
    path = site / "etc" / "jwks.json"
    watch = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "oidc", "slurm", "--config",
                              str(site / "slurm-ext.toml"), "--issuer", idp.issuer, "--ca-file", idp.ca_file,
                              "--jwks-file", str(path), "--watch"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        wait_for("the first file", lambda: read_kids_of(path) == [idp.signing_kid], timeout=30, interval=0.2)
        new = idp.rotate()
        wait_for("the rotated key in the file", lambda: new in read_kids_of(path), timeout=30, interval=0.2)
        wait_for("the reconfigure", lambda: "reconfigure" in _calls(site), timeout=10, interval=0.1)
    finally:
        watch.send_signal(signal.SIGTERM)
        out, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0, out
    assert f"added {new}" in out and "reconfigured Slurm" in out and "not its issuer (iss)" in out
    assert [e["event"] for e in _journal(site)] == ["oidc-slurm-jwks-written"] * 2


def read_kids_of(path: Path) -> list[str]:
    try:
        return [key["kid"] for key in json.loads(path.read_text())["keys"]]
    except (OSError, ValueError):
        return []

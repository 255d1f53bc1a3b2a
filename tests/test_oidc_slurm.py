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
import kubernetes_validate
import pytest
import yaml

from helpers.cli import cli
from helpers.idp import TestIdP, ec_key, public_jwk, rsa_key
from helpers.wait import wait_for
from slurm_ext.oidc.provider import OidcError
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
    `show config` with SlurmUser=slurm(64030))."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                        "[ \"$1\" = show ] && echo 'SlurmUser               = slurm(64030)'\n"
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
    assert "oidc-slurm-reconfigure-failed" in [e["event"] for e in _journal(site)]


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

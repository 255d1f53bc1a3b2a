"""Slurm 26.05 (the sid images) taking the IdP's tokens through the JWKS `slurm-ext oidc slurm` writes (issue 31,
acceptance): slurmctld and slurmdbd on AuthAltTypes=auth/jwt with that file, slurmrestd (the restapi image, its own
unprivileged user, rest_auth/jwt) on 127.0.0.1. A token the tests' IdP minted for a user submits a job through
slurmrestd and `sacct` shows it as that user; an expired token, one with an unknown kid, an HS256 one and one of
another issuer signed by another key are refused; the IdP's JWKS holds an EC key, which the cleaned file leaves
out, and slurmctld stays up; a rotation reaches slurmctld by `oidc slurm` and its `scontrol reconfigure`, and
slurmdbd only by a restart (`sacctmgr reconfigure` leaves it on the keys it read at start), as `oidc slurm` says.
The restapi image's USER is a fixed uid:gid (Kubernetes' runAsNonRoot refuses a name).

The token's user (preferred_username, the file's userclaimfield) is a local user of the containers (ctuser, made
by ContainerCluster in every container that runs or submits jobs), as on a cluster with SSSD: slurmctld resolves
the name to a uid (Slinky #118/#129). use_jwt_client_ids_only, where the token carries uid and gid, is the way
without local users; it is printed by `oidc slurm --client-ids-only` and not exercised here.

Its own ports (Slurm 19517-19519, slurmrestd 19520, MariaDB 13347, the agents 19521-19524) and container prefix, so
that it runs beside tests/test_container_cluster.py's clusters.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.cli import cli
from helpers.idp import TestIdP, ec_key, public_jwk, rsa_key
from helpers.wait import wait_for
from slurm_ext.oidc.slurmsync import conf_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))
from cluster import USER, ContainerCluster, Ports  # noqa: E402 (containers/cluster.py, not a package)

pytestmark = pytest.mark.containers

PORTS = Ports(ctld=19517, slurmd=19517, dbd=19519, mariadb=13347, restapi=19520, controller_agent=19521,
              accounting_agent=19522, mariadb_agent=19523, worker_agent=19523)
PREFIX = "jwt"
#: the REST API version of Slurm 26.05 (data_parser/v0.0.45)
API = "v0.0.45"
LINES = conf_lines("/etc/slurm/jwks.json", "preferred_username", False)


def _restapi(request: urllib.request.Request) -> tuple[int, dict]:
    """slurmrestd's answer to `request`: (HTTP status, its JSON, or {"body": text} where it is not JSON)."""
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body or b"{}")
        except ValueError:
            return err.code, {"body": body.decode(errors="replace")}

class JwtCluster:
    def __init__(self, cluster: ContainerCluster, idp: TestIdP, config: Path, scontrol_dir: Path):
        self.cluster, self.idp, self.config, self.scontrol_dir = cluster, idp, config, scontrol_dir

    def oidc_slurm(self, where: str, *more: str):
        """`slurm-ext oidc slurm` on this host, writing the file the containers mount (etc: slurmctld's and
        slurmrestd's, dbd: slurmdbd's)."""
        result = cli("oidc", "slurm", "--config", str(self.config), "--issuer", self.idp.issuer, "--ca-file",
                     self.idp.ca_file, "--jwks-file", str(self.cluster.root / where / "jwks.json"), "--slurm-user",
                     "slurm", *more, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    def submit(self, token: str) -> tuple[int, dict]:
        """POST a job to slurmrestd with `token`: (HTTP status, its JSON answer)."""
        job = {"script": "#!/bin/sh\nid -un\n", "name": "jwt-test", "current_working_directory": "/tmp",
               "environment": ["PATH=/usr/bin:/bin"], "partition": "debug"}
        return _restapi(urllib.request.Request(
            f"http://127.0.0.1:{PORTS.restapi}/slurm/{API}/job/submit", data=json.dumps({"job": job}).encode(),
            method="POST", headers={"Content-Type": "application/json", "X-SLURM-USER-TOKEN": token}))

    def slurmdb_jobs(self, token: str) -> tuple[int, dict]:
        """GET slurmrestd's /slurmdb/ jobs with `token`, which slurmrestd passes to slurmdbd: (HTTP status, its
        JSON answer)."""
        return _restapi(urllib.request.Request(f"http://127.0.0.1:{PORTS.restapi}/slurmdb/{API}/jobs",
                                               headers={"X-SLURM-USER-TOKEN": token}))

    def slurmdb_takes(self, token: str) -> bool:
        status, answer = self.slurmdb_jobs(token)
        return status == 200 and not answer.get("errors") and isinstance(answer.get("jobs"), list)

    def jobs(self) -> list[str]:
        _, text = self.cluster.exec("controller", "squeue", "-h", "-a", "-t", "all", "-o", "%i")
        return text.split()


@pytest.fixture(scope="module")
def jwt(engine, images, tmp_path_factory):
    work = tmp_path_factory.mktemp("oidc-slurm-images")
    root = work / "cluster"
    for directory in (root / "etc", root / "dbd"):
        directory.mkdir(parents=True)
    # `scontrol` for `oidc slurm` on this host: the controller container's (Slurm 26.05), through the engine
    scontrol_dir = work / "bin"
    scontrol_dir.mkdir()
    (scontrol_dir / "scontrol").write_text(f"#!/bin/sh\nexec {shutil.which('docker') or '/usr/local/bin/docker'} "
                                           f"-H {engine.host} exec {PREFIX}-controller scontrol \"$@\"\n")
    (scontrol_dir / "scontrol").chmod(0o755)
    config = work / "slurm-ext.toml"
    config.write_text(f'[node]\nstate_dir = "{work / "state"}"\n[slurm]\nbin_dir = "{scontrol_dir}"\ntimeout = "60s"\n')
    with TestIdP(tls=True) as idp:
        idp.jwks_extra.append(public_jwk(ec_key(), "ec1", alg="ES256"))
        cluster = ContainerCluster(engine.client, images, "linuxproc", root=root, ports=PORTS, prefix=PREFIX,
                                   workers=((1, 1),), slurm_conf=LINES, slurmdbd_conf=LINES)
        jwt = JwtCluster(cluster, idp, config, scontrol_dir)
        first = jwt.oidc_slurm("etc")
        assert "left out ec1: kty 'EC'" in first.stdout, first.stdout
        jwt.oidc_slurm("dbd")
        try:
            cluster.start()
            cluster.add_user("accounting")  # slurmdbd, too, resolves the token's user (SSSD on a real cluster)
            cluster.start_restapi()
            yield jwt
        finally:
            cluster.stop()


def test_a_token_of_the_idp_submits_a_job_through_slurmrestd_and_sacct_shows_its_user(jwt):
    token = jwt.idp.mint(sub="0f3a-ada", aud="slurm", preferred_username=USER)
    status, answer = jwt.submit(token)
    assert status == 200 and answer.get("job_id"), answer
    job_id = int(answer["job_id"])
    jwt.cluster.wait_job(job_id)

    def accounted() -> str:
        _, text = jwt.cluster.exec("controller", "sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "user,state")
        return text.strip() if text.strip().endswith("COMPLETED") else ""
    assert wait_for(f"job {job_id} in sacct", accounted, timeout=60, interval=0.5) == f"{USER}|COMPLETED"


@pytest.mark.parametrize("case", ["expired", "unknown kid", "HS256", "another issuer and key"])
def test_tokens_slurm_must_not_take_are_refused(jwt, case):
    idp = jwt.idp
    claims = {"sub": "0f3a-ada", "aud": "slurm", "preferred_username": USER}
    token = {"expired": lambda: idp.mint(lifetime=-600, **claims),
             "unknown kid": lambda: idp.mint(key=rsa_key(), kid="not-in-the-jwks", **claims),
             "HS256": lambda: idp.mint(algorithm="HS256", key=b"a shared secret of 32 bytes or more!", **claims),
             "another issuer and key": lambda: idp.mint(key=rsa_key(), kid=idp.signing_kid,
                                                        iss="https://127.0.0.1:1/other", **claims)}[case]()
    why = {"expired": "token expired", "unknown kid": "could not find matching kid",
           "HS256": "cannot decode HS256", "another issuer and key": "failed to verify jwt"}[case]
    said = jwt.cluster.logs("controller").count(why)
    before = jwt.jobs()
    status, answer = jwt.submit(token)
    # slurmrestd passes slurmctld's refusal on (HTTP 511, "Protocol authentication error"); slurmctld says why
    assert status != 200 and not answer.get("job_id"), (status, answer)
    assert "Protocol authentication error" in [e.get("error") for e in answer.get("errors", ())], answer
    assert jwt.jobs() == before
    wait_for(f"slurmctld's log: {why}", lambda: jwt.cluster.logs("controller").count(why) > said, timeout=10,
             interval=0.2)


def test_the_idps_ec_key_is_left_out_and_slurmctld_stays_up(jwt):
    written = json.loads((jwt.cluster.root / "etc" / "jwks.json").read_text())
    assert {k["kty"] for k in written["keys"]} == {"RSA"} and "ec1" in [k["kid"] for k in jwt.idp.jwks()["keys"]]
    jwt.cluster.exec("controller", "scontrol", "ping")
    assert "fatal" not in jwt.cluster.logs("controller")


def test_slurmrestd_runs_as_its_own_unprivileged_user(jwt):
    _, text = jwt.cluster.exec("restapi", "ps", "-eo", "user:20,args", user="slurmrestd")
    assert [line.split()[0] for line in text.splitlines() if "slurmrestd -a rest_auth/jwt" in line] == ["slurmrestd"]
    # numbers, as Kubernetes' runAsNonRoot needs them, and the same in every build
    image = jwt.cluster.client.images.get(jwt.cluster.images["restapi"])
    assert image.attrs["Config"]["User"] == "64031:64031"
    _, ids = jwt.cluster.exec("restapi", "id", user="slurmrestd")
    assert ids.startswith("uid=64031(slurmrestd) gid=64031(slurmrestd)"), ids


def test_a_rotation_reaches_slurm_through_oidc_slurm_and_scontrol_reconfigure(jwt):
    """Last: the IdP signs with a new key; until `oidc slurm` writes it and reconfigures, Slurm refuses its
    tokens, then takes them."""
    old = jwt.idp.signing_kid
    before = jwt.idp.mint(sub="0f3a-ada", aud="slurm", preferred_username=USER)
    assert jwt.slurmdb_takes(before), jwt.slurmdb_jobs(before)  # slurmdbd takes the first key's tokens
    new = jwt.idp.rotate()
    token = jwt.idp.mint(sub="0f3a-ada", aud="slurm", preferred_username=USER)
    status, answer = jwt.submit(token)
    assert status != 200 or not answer.get("job_id"), answer
    dbd = jwt.oidc_slurm("dbd", "--no-reconfigure")  # slurmdbd's copy
    assert "slurmdbd: slurmdbd reads the JWKS only when it starts" in dbd.stdout, dbd.stdout
    done = jwt.oidc_slurm("etc")
    assert f"added {new}" in done.stdout and "reconfigured Slurm" in done.stdout, done.stdout
    assert "restart slurmdbd" in done.stdout, done.stdout
    assert old in json.loads((jwt.cluster.root / "etc" / "jwks.json").read_text())["keys"][0]["kid"]

    def taken():
        status, answer = jwt.submit(token)
        return answer if status == 200 and answer.get("job_id") else None
    answer = wait_for("slurmctld to take the new key's token", taken, timeout=60, interval=1)
    jwt.cluster.wait_job(int(answer["job_id"]))

    # slurmdbd: its file holds the new key, but it read the old one at start; `scontrol reconfigure` (above) and
    # `sacctmgr reconfigure` (slurmdbd's reconfig(): slurmdbd.conf, not the auth plug-in) leave it there
    assert not jwt.slurmdb_takes(token), jwt.slurmdb_jobs(token)
    jwt.cluster.exec("controller", "sacctmgr", "-i", "reconfigure")
    time.sleep(3)  # slurmdbd runs its reconfig() in a thread of its own
    assert not jwt.slurmdb_takes(token), ("sacctmgr reconfigure made slurmdbd take the new key: oidc slurm's "
                                          "'restart slurmdbd' is wrong", jwt.slurmdb_jobs(token))
    assert jwt.slurmdb_takes(before)  # the old key still works there
    # a restart reads the file: then it takes the new key's tokens
    jwt.cluster.restart("accounting")
    wait_for("slurmdbd to take the new key's token", lambda: jwt.slurmdb_takes(token), timeout=90, interval=1)

"""`slurm-ext oidc kubernetes` (issue 31, Build 2): what the API server, RBAC and kubectl need to take the IdP's people.

- Every rule of the API server's own validation of an AuthenticationConfiguration has a negative fixture in
  tests/data/oidc/kubernetes/ (`# refused: <message>` in its header) that `oidc/kuberules.py` and `oidc kubernetes
  --check` refuse with that message, and with nothing else; the `valid-*` fixtures pass.
- What the command writes passes those rules, and the RBAC objects pass kubernetes-validate, run for real and
  strictly; the roles cover Slinky's CRDs (read from the vendored CRDs) and the repair executor's own rights.
- The kubeconfig user works in a real kubectl: kubectl runs the exec stanza (kubelogin, here a stand-in plug-in on
  PATH that hands out a token the tests' own IdP minted) and sends its token to a TLS stand-in API server; that
  token verifies against the written AuthenticationConfiguration's issuer, CA and audience, and its claim and user
  validation rules (CEL, run by cel-python) take a verified email and refuse an unverified one.
- [oidc] supplies --issuer and --ca-file; --discover reads the real IdP's discovery document.
- Without PyYAML the command exits 2 naming the extra; without kubernetes-validate it says the RBAC objects were
  not checked.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml

from helpers.idp import TestIdP
from slurm_ext import cli
from slurm_ext.oidc import kubernetes, kuberules
from slurm_ext.oidc.provider import KeySet, discover, verify_token

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "data" / "oidc" / "kubernetes"
SLINKY_CRDS = REPO / "tests" / "data" / "slinky" / "crds"
NEGATIVE = sorted(path for path in FIXTURES.glob("*.yaml") if not path.name.startswith("valid-"))
POSITIVE = sorted(FIXTURES.glob("valid-*.yaml"))
#: the rules the issue and notes §2.1 name, each with its fixture
RULES_WITH_FIXTURES = (
    "too-many-issuers", "duplicate-issuer", "duplicate-discovery-url", "issuer-url-missing", "issuer-url-http",
    "issuer-url-userinfo", "issuer-url-query", "issuer-url-fragment", "discovery-url-same", "discovery-url-http",
    "certificate-authority", "audiences-missing", "audience-empty", "audience-duplicate", "audiences-need-matchany",
    "audience-policy-single", "egress-selector", "claim-rule-both", "claim-rule-neither",
    "claim-rule-message-with-claim", "claim-rule-required-value-with-expression", "claim-rule-duplicate-claim",
    "claim-rule-duplicate-expression", "username-missing", "username-prefix-missing", "username-both",
    "username-expression-with-prefix", "groups-prefix-missing", "groups-both", "uid-both", "extra-key-not-prefixed",
    "extra-key-uppercase", "extra-key-kubernetes", "extra-key-duplicate", "extra-value-missing", "email-verified",
    "user-rule-empty", "user-rule-duplicate", "anonymous-conditions", "api-version", "kind", "unknown-field",
    "cel-syntax")


def _refused_message(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# refused: "):
            return line[len("# refused: "):]
    raise AssertionError(f"{path.name} has no `# refused: <message>` header")


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def _no_config(monkeypatch, tmp_path):
    """Defaults only, unless a test writes a config: never the host's /etc/slurm-ext."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("SLURM_EXT_CONFIG", str(empty))


# -- the API server's rules -------------------------------------------------------------------------------------


def test_every_rule_has_its_negative_fixture():
    names = {path.stem for path in NEGATIVE}
    assert set(RULES_WITH_FIXTURES) <= names, set(RULES_WITH_FIXTURES) - names


@pytest.mark.parametrize("fixture", NEGATIVE, ids=lambda path: path.stem)
def test_each_negative_fixture_is_refused_with_the_rules_message(fixture, capsys):
    message = _refused_message(fixture)
    verdict = kuberules.check(yaml.safe_load(fixture.read_text()))
    assert [str(problem) for problem in verdict.problems] == [str(verdict.problems[0])]
    assert message in str(verdict.problems[0]), verdict.problems
    code, out, err = _run(["oidc", "kubernetes", "--check", str(fixture)], capsys)
    assert code == 2
    assert message in err and "would refuse" in err and str(fixture) in err
    assert "Traceback" not in err and "OK" not in out


@pytest.mark.parametrize("fixture", POSITIVE, ids=lambda path: path.stem)
def test_valid_fixtures_pass(fixture, capsys):
    assert kuberules.check(yaml.safe_load(fixture.read_text())).ok
    code, out, err = _run(["oidc", "kubernetes", "--check", str(fixture)], capsys)
    assert code == 0, err
    assert f"{fixture}: OK" in out


def test_notes_say_what_the_file_means_beyond_the_rules():
    minimal = kuberules.check(yaml.safe_load((FIXTURES / "valid-minimal.yaml").read_text()))
    assert any("email_verified" in note and "without" in note for note in minimal.notes)
    full = kuberules.check(yaml.safe_load((FIXTURES / "valid-full.yaml").read_text()))
    assert any("optional syntax" in note for note in full.notes)
    assert any("1.34" in note and "egressSelectorType" in note for note in full.notes)


def test_every_problem_is_listed_not_only_the_first(capsys):
    document = yaml.safe_load((FIXTURES / "valid-minimal.yaml").read_text())
    document["jwt"][0]["issuer"]["url"] = "http://idp.example.com?x=1"
    document["jwt"][0]["claimMappings"]["username"].pop("prefix")
    problems = [str(problem) for problem in kuberules.check(document).problems]
    assert problems == ["jwt[0].issuer.url: URL scheme must be https",
                        "jwt[0].issuer.url: URL must not contain a query",
                        "jwt[0].claimMappings.username.prefix: Required value: prefix is required when claim is set. "
                        "It can be set to an empty string to disable prefixing"]


def test_email_in_a_string_literal_is_not_the_email_claim():
    document = yaml.safe_load((FIXTURES / "valid-minimal.yaml").read_text())
    document["jwt"][0]["claimMappings"]["username"] = {"expression": "'claims.email:' + claims.sub"}
    assert kuberules.check(document).ok
    document["jwt"][0]["claimMappings"]["username"] = {"expression": "claims.?email.orValue(claims.sub)"}
    assert "claims.email_verified must be used" in str(kuberules.check(document).problems)
    document["jwt"][0]["claimValidationRules"] = [{"expression": "claims.?email_verified.orValue(false)"}]
    assert kuberules.check(document).ok


@pytest.mark.parametrize("key, problems", [
    # the domain as written: an upper-case domain is no RFC 1123 subdomain (and the key is not lower-case)
    ("Example.com/tenant", ["Invalid value: 'Example.com': a lowercase RFC 1123 subdomain", "key must be lowercase"]),
    # the domain's problem and the path's are both reported, as IsDomainPrefixedPath does
    ("exa_mple.com/ten ant", ["Invalid value: 'exa_mple.com': a lowercase RFC 1123 subdomain",
                              "Invalid value: 'ten ant': must be a valid HTTP path"]),
    # a trailing newline ends neither the domain nor the path (Go's `$` is the end of the text)
    ("example.com\n/tenant", ["Invalid value: 'example.com\\n': a lowercase RFC 1123 subdomain"]),
    ("example.com/tenant\n", ["Invalid value: 'tenant\\n': must be a valid HTTP path"]),
    (f"{'a' * 250}.com/tenant", ["must be no more than 253 characters"]),
    ("example.com/tenant", [])])
def test_extra_keys_by_is_domain_prefixed_path(key, problems):
    document = yaml.safe_load((FIXTURES / "valid-minimal.yaml").read_text())
    document["jwt"][0]["claimMappings"]["extra"] = [{"key": key, "valueExpression": "claims.sub"}]
    found = [str(problem) for problem in kuberules.check(document).problems]
    assert len(found) == len(problems), found
    for problem, expected in zip(found, problems):
        assert problem.startswith("jwt[0].claimMappings.extra[0].key: ") and expected in problem, found


def test_prefix_null_beside_an_expression_is_no_prefix():
    document = yaml.safe_load((FIXTURES / "valid-expression-prefix-null.yaml").read_text())
    assert document["jwt"][0]["claimMappings"]["username"] == {"expression": "'oidc:' + claims.sub", "prefix": None}
    assert kuberules.check(document).ok
    document["jwt"][0]["claimMappings"]["username"]["prefix"] = ""
    assert [str(problem) for problem in kuberules.check(document).problems] == [
        "jwt[0].claimMappings.username.prefix: prefix can't be set when expression is set"]


@pytest.mark.parametrize("text, problem", [
    ("a: [", "not YAML"), ("", "found 0"), ("kind: A\n---\nkind: B\n", "found 2")])
def test_check_of_a_file_that_is_not_one_configuration(tmp_path, capsys, text, problem):
    path = tmp_path / "auth.yaml"
    path.write_text(text)
    code, _, err = _run(["oidc", "kubernetes", "--check", str(path)], capsys)
    assert code == 2 and problem in err
    code, _, err = _run(["oidc", "kubernetes", "--check", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "missing.yaml" in err


# -- what the command writes ------------------------------------------------------------------------------------


def _generate(tmp_path, capsys, *more: str, issuer: str = "https://idp.example.com/realms/hpc",
              client_id: str = "kubernetes"):
    out_dir = tmp_path / "out"
    code, out, err = _run(["oidc", "kubernetes", "--issuer", issuer, "--client-id", client_id,
                           "--output", str(out_dir), *more], capsys)
    files = {name: out_dir / file for name, file in kubernetes.FILE_NAMES.items()}
    return code, out, err, files


def _load(files):
    return (yaml.safe_load(files["authentication"].read_text()), list(yaml.safe_load_all(files["rbac"].read_text())),
            yaml.safe_load(files["kubeconfig"].read_text()))


def test_writes_three_checked_files(tmp_path, capsys):
    code, out, err, files = _generate(tmp_path, capsys, "--viewer-group", "hpc-users", "--operator-group", "hpc-ops",
                                      "--admin-group", "hpc-admins", "--admin-group", "platform")
    assert code == 0, err
    authentication, rbac, kubeconfig = _load(files)
    assert kuberules.check(authentication).ok
    assert authentication["apiVersion"] == "apiserver.config.k8s.io/v1"
    (jwt,) = authentication["jwt"]
    assert jwt["issuer"] == {"url": "https://idp.example.com/realms/hpc", "audiences": ["kubernetes"]}
    assert jwt["claimMappings"] == {"username": {"claim": "email", "prefix": "oidc:"},
                                    "groups": {"claim": "groups", "prefix": "oidc:"}}
    assert [rule["expression"] for rule in jwt["claimValidationRules"]] == [
        "has(claims.email_verified) && claims.email_verified == true"]
    assert all("system:" in rule["expression"] for rule in jwt["userValidationRules"])
    for document in rbac:  # for real and strictly, on the oldest and newest Kubernetes that read the file
        for version in ("1.30", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(document, version, strict=True)
    bindings = {document["metadata"]["name"]: document for document in rbac if document["kind"] == "RoleBinding"}
    assert {name: [subject["name"] for subject in binding["subjects"]] for name, binding in bindings.items()} == {
        "slurm-ext-viewer": ["oidc:hpc-users"], "slurm-ext-operator": ["oidc:hpc-ops"],
        "slurm-ext-admin": ["oidc:hpc-admins", "oidc:platform"]}
    assert all(binding["metadata"]["namespace"] == "slurm" and binding["roleRef"]["kind"] == "Role"
               for binding in bindings.values())
    (nodes,) = [document for document in rbac if document["kind"] == "ClusterRoleBinding"]
    assert nodes["roleRef"]["name"] == "slurm-ext-node-reader"
    assert [subject["name"] for subject in nodes["subjects"]] == [
        "oidc:hpc-users", "oidc:hpc-ops", "oidc:hpc-admins", "oidc:platform"]
    assert all(subject["kind"] == "Group" for binding in [*bindings.values(), nodes] for subject in binding["subjects"])
    exec_stanza = kubeconfig["users"][0]["user"]["exec"]
    assert exec_stanza["apiVersion"] == "client.authentication.k8s.io/v1" and exec_stanza["interactiveMode"] == "Never"
    assert exec_stanza["args"] == ["oidc-login", "get-token", "--oidc-issuer-url=https://idp.example.com/realms/hpc",
                                   "--oidc-client-id=kubernetes", "--oidc-extra-scope=email",
                                   "--token-cache-storage=keyring"]
    assert oct(files["authentication"].stat().st_mode & 0o777) == "0o600"
    for said in ("--authentication-config=", "--oidc-*", f"kubectl apply -f {files['rbac']}", "--flatten",
                 "reloaded automatically", "pass kubernetes-validate", "no role patches nodes"):
        assert said in out
    # the flattened kubeconfig holds the person's other credentials too: written beside ~/.kube/config, owner-only,
    # never to a fixed path in /tmp (world-readable under the usual umask, and a symlink there redirects it)
    assert "> /tmp/kubeconfig" not in out and "mv /tmp/" not in out
    assert (f"(umask 077; KUBECONFIG=~/.kube/config:{files['kubeconfig']} kubectl config view --flatten > "
            "~/.kube/config.new) && \\\n         mv ~/.kube/config.new ~/.kube/config") in out


def _rules(rbac, role):
    (found,) = [document for document in rbac if document["kind"] == "Role" and document["metadata"]["name"] == role]
    return found["rules"]


def _allows(rules, group, resource, verb, name=None):
    return any(group in rule["apiGroups"] and (resource in rule["resources"] or "*" in rule["resources"])
               and (verb in rule["verbs"] or "*" in rule["verbs"])
               and (name is None or "resourceNames" not in rule or name in rule["resourceNames"]) for rule in rules)


def test_roles_cover_slinky_and_what_a_repair_does(tmp_path, capsys):
    code, _, err, files = _generate(tmp_path, capsys)
    assert code == 0, err
    _, rbac, _ = _load(files)
    assert [document["kind"] for document in rbac] == ["Role"] * 3 + ["ClusterRole"]  # no group given: nobody bound
    crds = [yaml.safe_load(path.read_text())["spec"] for path in sorted(SLINKY_CRDS.glob("*.yaml"))]
    assert {crd["group"] for crd in crds} == {kubernetes.SLINKY_GROUP}
    viewer, operator, admin = (_rules(rbac, role) for role in kubernetes.ROLE_NAMES)
    for crd in crds:
        plural = crd["names"]["plural"]
        assert _allows(viewer, kubernetes.SLINKY_GROUP, plural, "list")
        assert not _allows(viewer, kubernetes.SLINKY_GROUP, plural, "patch")
        assert _allows(admin, kubernetes.SLINKY_GROUP, plural, "delete")
        if "scale" in crd["versions"][0].get("subresources", {}):
            assert _allows(operator, kubernetes.SLINKY_GROUP, f"{plural}/scale", "update")
            assert not _allows(viewer, kubernetes.SLINKY_GROUP, f"{plural}/scale", "update")
    # an operator may do by hand what the repair executor does (containers/slinky/rbac.yaml), but for patching
    # nodes: RBAC cannot narrow that to a cordon (the executor's is narrowed by a ValidatingAdmissionPolicy)
    (nodes,) = [document["rules"] for document in rbac if document["kind"] == "ClusterRole"]
    executor = [document for document in yaml.safe_load_all((REPO / "containers/slinky/rbac.yaml").read_text())
                if document["kind"] in ("Role", "ClusterRole")]
    for role in executor:
        for rule in role["rules"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted = nodes if resource == "nodes" else operator
                    if (resource, verb) == ("nodes", "patch"):
                        assert not any(_allows(rules, "", "nodes", "patch") for rules in (nodes, operator, admin))
                        continue
                    assert _allows(granted, rule["apiGroups"][0], resource, verb), (resource, verb)
                    if resource != "nodes":
                        assert not _allows(viewer, rule["apiGroups"][0], resource, verb) or verb == "get"
    for rules in (viewer, operator, admin):  # nobody reads the Slurm and database keys
        assert not _allows(rules, "", "secrets", "get")
    assert _allows(viewer, "", "configmaps", "get", "slurm-ext-worker")
    assert not _allows(viewer, "", "configmaps", "get", "kube-root-ca.crt")
    assert _allows(admin, "", "configmaps", "patch", "slurm-ext-controller")
    assert not _allows(operator, "", "configmaps", "patch", "slurm-ext-controller")


@pytest.mark.parametrize("flags, api_version", [
    (["--kubernetes-version", "1.33"], "apiserver.config.k8s.io/v1beta1"),
    (["--kubernetes-version", "1.30.4"], "apiserver.config.k8s.io/v1beta1"),
    (["--kubernetes-version", "v1.34"], "apiserver.config.k8s.io/v1"),
    (["--kubernetes-version", "1.40"], "apiserver.config.k8s.io/v1"),
    (["--api-version", "v1beta1"], "apiserver.config.k8s.io/v1beta1"),
    ([], "apiserver.config.k8s.io/v1")])
def test_api_version_follows_the_cluster(tmp_path, capsys, flags, api_version):
    code, _, err, files = _generate(tmp_path, capsys, *flags)
    assert code == 0, err
    assert _load(files)[0]["apiVersion"] == api_version


@pytest.mark.parametrize("flags, message", [
    (["--kubernetes-version", "1.29"], "from 1.30 on"),
    (["--kubernetes-version", "latest"], "expected a version such as 1.33"),
    (["--issuer", "http://idp.example.com"], "jwt[0].issuer.url: URL scheme must be https"),
    (["--issuer", "https://idp.example.com?tenant=a"], "jwt[0].issuer.url: URL must not contain a query"),
    (["--discovery-url", "https://idp.example.com/realms/hpc/"], "discoveryURL must be different from URL"),
    (["--username-prefix", "x", "--username-claim", ""], "jwt[0].claimMappings.username: Required value"),
    (["--viewer-group", "oidc:hpc"], "the prefix 'oidc:' is added"),
    (["--groups-claim", "", "--admin-group", "hpc"], "need a groups claim"),
    (["--ca-file", "/nonexistent/ca.pem"], "the IdP's CA file /nonexistent/ca.pem"),
])
def test_refused_requests_write_nothing(tmp_path, capsys, flags, message):
    code, _, err, files = _generate(tmp_path, capsys, *flags)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not any(path.exists() for path in files.values())


def test_a_ca_file_that_is_not_pem_is_refused_by_the_rule(tmp_path, capsys):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    code, _, err, _ = _generate(tmp_path, capsys, "--ca-file", str(bad))
    assert code == 2 and "jwt[0].issuer.certificateAuthority: data does not contain any valid" in err


def test_no_client_id_and_no_issuer_are_refused(tmp_path, capsys):
    code, _, err = _run(["oidc", "kubernetes", "--issuer", "https://idp.example.com", "--output", str(tmp_path)],
                        capsys)
    assert code == 2 and "--client-id" in err
    code, _, err = _run(["oidc", "kubernetes", "--client-id", "k", "--output", str(tmp_path)], capsys)
    assert code == 2 and "[oidc] issuer is empty" in err


def test_several_client_ids_match_any_and_kubelogin_takes_the_first(tmp_path, capsys):
    code, _, err, files = _generate(tmp_path, capsys, "--client-id", "kubelogin", "--client-id", "kubernetes",
                                    "--username-claim", "sub", "--extra-scope", "groups",
                                    "--kubelogin-arg=--oidc-client-secret=public-desktop-secret")
    assert code == 0, err
    authentication, _, kubeconfig = _load(files)
    issuer = authentication["jwt"][0]["issuer"]
    assert issuer["audiences"] == ["kubernetes", "kubelogin"] and issuer["audienceMatchPolicy"] == "MatchAny"
    assert "claimValidationRules" not in authentication["jwt"][0]  # sub: no email to verify
    args = kubeconfig["users"][0]["user"]["exec"]["args"]
    assert "--oidc-client-id=kubernetes" in args and "--oidc-extra-scope=groups" in args
    assert "--oidc-extra-scope=email" not in args and args[-1] == "--oidc-client-secret=public-desktop-secret"


def test_required_claims_become_claim_rules(tmp_path, capsys):
    code, _, err, files = _generate(tmp_path, capsys, "--required-claim", "hd=example.com",
                                    issuer="https://accounts.google.com")
    assert code == 0, err
    rules = _load(files)[0]["jwt"][0]["claimValidationRules"]
    assert rules[0] == {"claim": "hd", "requiredValue": "example.com"} and "email_verified" in rules[1]["expression"]
    code, _, err, _ = _generate(tmp_path, capsys, "--required-claim", "hd")
    assert code == 2 and "expected CLAIM=VALUE" in err


#: what creates pods (and so may mount any Secret of the namespace and run as any of its service accounts), or
#: reaches into a running one
_POD_MAKERS = {("", "pods"), ("", "replicationcontrollers"), ("apps", "deployments"), ("apps", "statefulsets"),
               ("apps", "daemonsets"), ("apps", "replicasets"), ("batch", "jobs"), ("batch", "cronjobs")}
_INTO_PODS = ("pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "pods/ephemeralcontainers",
              "serviceaccounts/token")


@pytest.mark.parametrize("namespace", [None, "hpc-slurm"])
def test_roles_are_least_privilege(tmp_path, capsys, namespace):
    """Issue 31 review: ClusterRoleBindings gave every right in every namespace (kube-system too), the operator
    could create Jobs (any service account, any Secret mounted) and patch any node, the admin exec into any pod."""
    flags = ["--viewer-group", "hpc-users", "--operator-group", "hpc-ops", "--admin-group", "hpc-admins"]
    code, _, err, files = _generate(tmp_path, capsys, *flags, *(["--namespace", namespace] if namespace else []))
    assert code == 0, err
    rbac = _load(files)[1]
    expected = namespace or "slurm"
    for document in rbac:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
        where = (document["kind"], document["metadata"]["name"])
        if document["kind"] in ("Role", "RoleBinding"):
            assert document["metadata"]["namespace"] == expected, where
        else:  # nothing cluster-wide but reading nodes
            assert document["kind"] in ("ClusterRole", "ClusterRoleBinding"), where
            assert document["metadata"]["name"] == "slurm-ext-node-reader", where
            if document["kind"] == "ClusterRole":
                assert document["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                              "verbs": ["get", "list", "watch"]}]
            else:
                assert document["roleRef"]["kind"] == "ClusterRole"
        if document["kind"].endswith("Binding") and document["kind"] != "ClusterRoleBinding":
            assert document["roleRef"]["kind"] == "Role", where
    roles = [document for document in rbac if document["kind"] in ("Role", "ClusterRole")]
    assert len(roles) == 4
    for role in roles:
        for rule in role["rules"]:
            where = (role["metadata"]["name"], rule)
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], where
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), where
            assert "secrets" not in rule["resources"] and "serviceaccounts" not in rule["resources"], where
            assert not set(_INTO_PODS) & set(rule["resources"]), where
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    if (group, resource) in _POD_MAKERS:
                        assert not {"create", "update", "patch"} & set(rule["verbs"]), where
            assert not ("nodes" in rule["resources"] and set(rule["verbs"]) - {"get", "list", "watch"}), where


@pytest.mark.parametrize("namespace", ["", "Slurm", "slurm_ns", "-slurm", "a" * 64, "slurm\n"])
def test_a_namespace_that_is_no_name_is_refused(tmp_path, capsys, namespace):
    code, _, err, files = _generate(tmp_path, capsys, f"--namespace={namespace}", "--viewer-group", "hpc-users")
    assert code == 2 and f"--namespace {namespace!r}: expected the Slurm namespace's name" in err
    assert not any(path.exists() for path in files.values())


def test_namespace_binds_there_only(tmp_path, capsys):
    code, _, err, files = _generate(tmp_path, capsys, "--namespace", "hpc", "--operator-group", "hpc-ops")
    assert code == 0, err
    (binding,) = [document for document in _load(files)[1] if document["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == "hpc"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "slurm-ext-operator"}
    (role,) = [document for document in _load(files)[1] if document["kind"] == "Role"
               and document["metadata"]["name"] == "slurm-ext-operator"]
    assert role["metadata"]["namespace"] == "hpc"
    kubernetes_validate.validate(binding, kubernetes_validate.latest_version(), strict=True)


def test_an_output_that_cannot_be_written_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = _run(["oidc", "kubernetes", "--issuer", "https://idp.example.com", "--client-id", "k",
                         "--output", str(blocker / "sub")], capsys)
    assert code == 2 and f"cannot write into {blocker / 'sub'}" in err


# -- with the tests' own IdP --------------------------------------------------------------------------------------


def test_issuer_and_ca_from_the_config_and_discover(tmp_path, capsys, monkeypatch):
    with TestIdP(tls=True) as idp:
        config = tmp_path / "slurm-ext.toml"
        config.write_text(f'[oidc]\nissuer = "{idp.issuer}"\nca_file = "{idp.ca_file}"\n')
        monkeypatch.setenv("SLURM_EXT_CONFIG", str(config))
        code, out, err = _run(["oidc", "kubernetes", "--client-id", idp.client_id, "--discover", "--output",
                               str(tmp_path / "out")], capsys)
        assert code == 0, err
        authentication = yaml.safe_load((tmp_path / "out" / "authentication-config.yaml").read_text())
        issuer = authentication["jwt"][0]["issuer"]
        assert issuer["url"] == idp.issuer
        assert issuer["certificateAuthority"] == Path(idp.ca_file).read_text()
        # the API server compares the issuer character for character: a trailing slash is another issuer
        code, _, err = _run(["oidc", "kubernetes", "--issuer", idp.issuer + "/", "--client-id", idp.client_id,
                             "--discover", "--output", str(tmp_path / "again")], capsys)
        assert code == 2 and "character for character" in err
        assert not (tmp_path / "again").exists()
    code, _, err = _run(["oidc", "kubernetes", "--client-id", "k", "--ca-file", "", "--discover", "--output",
                         str(tmp_path / "down")], capsys)
    assert code == 2 and "unreachable" in err


class _StandInApiServer:
    """An HTTPS server on 127.0.0.1 that records the bearer tokens kubectl sends and answers 401 as the API server
    does for a token it does not take."""

    def __init__(self, cert: str, key: str):
        self.tokens: list[str] = []
        recorded = self.tokens

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                authorization = self.headers.get("Authorization", "")
                if authorization.startswith("Bearer "):
                    recorded.append(authorization[len("Bearer "):])
                body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "Unauthorized", "code": 401}).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _takes(authentication: dict, claims: dict) -> bool:
    """Whether the written rules take a token with `claims` (cel-python evaluates the CEL as the API server would)."""
    environment = celpy.Environment()

    def holds(expression: str, activation: dict) -> bool:
        program = environment.program(environment.compile(expression))
        try:
            result = program.evaluate({name: celpy.json_to_cel(value) for name, value in activation.items()})
        except celpy.CELEvalError:  # the API server refuses a token whose rule cannot be evaluated
            return False
        return not isinstance(result, celpy.CELEvalError) and result == celpy.celtypes.BoolType(True)

    jwt = authentication["jwt"][0]
    if not all(holds(rule["expression"], {"claims": claims}) for rule in jwt.get("claimValidationRules", ())):
        return False
    mapping = jwt["claimMappings"]
    user = {"username": mapping["username"]["prefix"] + claims[mapping["username"]["claim"]],
            "groups": [mapping["groups"]["prefix"] + group for group in claims.get(mapping["groups"]["claim"], [])]}
    return all(holds(rule["expression"], {"user": user}) for rule in jwt["userValidationRules"])


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl is not installed")
def test_kubectl_runs_the_exec_user_and_the_token_passes_the_written_rules(tmp_path, capsys):
    with TestIdP(tls=True) as idp:
        code, _, err, files = _generate(tmp_path, capsys, "--ca-file", idp.ca_file, "--admin-group", "hpc-admins",
                                        issuer=idp.issuer, client_id=idp.client_id)
        assert code == 0, err
        authentication = _load(files)[0]
        token = idp.mint("ada", email="ada@example.com", email_verified=True, groups=["hpc-admins"])
        # kubelogin's stand-in: kubectl finds `kubectl-oidc_login` on PATH, as it finds the real kubelogin
        plugins = tmp_path / "bin"
        plugins.mkdir()
        (tmp_path / "token").write_text(token)
        plugin = plugins / "kubectl-oidc_login"
        plugin.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'args'}\n"
                          f"printf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
                          f"\"status\":{{\"token\":\"%s\"}}}}' \"$(cat {tmp_path / 'token'})\"\n")
        plugin.chmod(0o755)
        key = str(Path(idp.ca_file).with_name("idp.key"))
        with _StandInApiServer(idp.ca_file, key) as server:
            cluster = tmp_path / "cluster.yaml"
            cluster.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "hpc",
                "clusters": [{"name": "hpc", "cluster": {"server": server.url, "certificate-authority": idp.ca_file}}],
                "contexts": [{"name": "hpc", "context": {"cluster": "hpc", "user": "oidc"}}]}))
            environment = {**os.environ, "PATH": f"{plugins}:{os.environ['PATH']}", "HOME": str(tmp_path),
                           "KUBECONFIG": f"{cluster}:{files['kubeconfig']}"}
            done = subprocess.run(["kubectl", "get", "--raw", "/version"], env=environment, capture_output=True,
                                  text=True, timeout=60)
        assert done.returncode != 0 and "must be logged in" in done.stderr  # the stand-in's 401
        assert server.tokens and set(server.tokens) == {token}
        args = (tmp_path / "args").read_text().split()
        assert args == ["get-token", f"--oidc-issuer-url={idp.issuer}", f"--oidc-client-id={idp.client_id}",
                        "--oidc-extra-scope=email", "--token-cache-storage=keyring"]
        # what the API server does with it: signature, issuer and audience from the written file, then its rules
        issuer = authentication["jwt"][0]["issuer"]
        keys = KeySet(discover(issuer["url"], ca_file=idp.ca_file).jwks_uri, ca_file=idp.ca_file)
        claims = verify_token(server.tokens[0], keys, issuer["url"], issuer["audiences"][0])
        assert _takes(authentication, claims)
        assert not _takes(authentication, {**claims, "email_verified": False})
        assert not _takes(authentication, {key: value for key, value in claims.items() if key != "email_verified"})
        # an IdP group named system:masters becomes oidc:system:masters; without a prefix the user rules refuse it
        assert _takes(authentication, {**claims, "groups": ["system:masters"]})
        unprefixed = copy.deepcopy(authentication)
        unprefixed["jwt"][0]["claimMappings"]["groups"]["prefix"] = ""
        assert not _takes(unprefixed, {**claims, "groups": ["system:masters"]})
        assert _takes(unprefixed, claims)


# -- without the optional packages ------------------------------------------------------------------------------


def _without(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter where `module` cannot be imported."""
    blocker = tmp_path / "blocked"
    blocker.mkdir(exist_ok=True)
    (blocker / f"{module}.py").write_text(f"raise ImportError('no {module} here')\n")
    environment = {**os.environ, "PYTHONPATH": str(blocker)}
    return subprocess.run([sys.executable, "-m", "slurm_ext.cli", "oidc", "kubernetes", *args], env=environment,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_without_pyyaml_it_names_the_extra(tmp_path):
    done = _without("yaml", tmp_path, "--issuer", "https://idp.example.com", "--client-id", "k", "--output",
                    str(tmp_path / "out"))
    assert done.returncode == 2
    assert "pip install 'slurm-ext[kubernetes]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_without_kubernetes_validate_it_says_rbac_was_not_checked(tmp_path):
    done = _without("kubernetes_validate", tmp_path, "--issuer", "https://idp.example.com", "--client-id", "k",
                    "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "the RBAC objects were not checked offline: kubernetes-validate is not installed" in done.stdout
    assert "passes the API server's rules" in done.stdout


def test_help_names_the_files_and_the_check(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        cli.main(["oidc", "kubernetes", "--help"])
    text = capsys.readouterr().out
    for said in ("authentication-config.yaml", "rbac.yaml", "kubeconfig-user.yaml", "--check", "--kubernetes-version",
                 "--viewer-group", "[oidc]", "exit 2"):
        assert said in text

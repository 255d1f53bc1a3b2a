"""What the Kubernetes API server, RBAC and kubectl need to take the people the organisation's IdP signs in.

`build(request)` returns the `KubeFiles` of one `KubeRequest`: the API server's AuthenticationConfiguration
(`--authentication-config`), the Roles `slurm-ext-viewer`, `slurm-ext-operator` and `slurm-ext-admin` in
Slinky's namespace over slurm-ext's objects and Slinky's custom resources, the ClusterRole
`slurm-ext-node-reader` (nodes, read only), the bindings of the IdP's groups to them, and the kubeconfig user
whose token kubelogin gets. `check(files)` judges them before anything is written: the
AuthenticationConfiguration by the API server's own rules (`kuberules`), the RBAC objects with
kubernetes-validate where it is installed (said otherwise); `write(files, directory)` writes them.

Why these roles: each person acts as themself (the audit log names them) with the least the job needs, in
the Slurm namespace only (Roles and RoleBindings: nothing in kube-system or any other namespace); the one
cluster-wide right is reading nodes. A viewer reads; an operator deletes a worker pod (reprovision, as the
repair executor does, containers/slinky/rbac.yaml) and scales NodeSets and LoginSets; an admin changes
Slinky's resources and slurm-ext's config. Neither the viewer nor the operator can read a Secret (the Slurm
and database keys), directly or through a pod: nobody gets secrets, pod or Job creation, exec, attach or
port-forward, and no node patch (RBAC cannot narrow it to a cordon). The admin's Slinky rights are that
much wider: a NodeSet's pod template may mount any Secret of the namespace and a Token mints Slurm JWTs,
so bind slurm-ext-admin only to those trusted with the namespace's keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from slurm_ext.errors import SlurmExtError

from . import kuberules

__all__ = ["KubeRequest", "KubeFiles", "KubeRefused", "SLINKY_GROUP", "ROLE_NAMES", "FILE_NAMES", "api_version_for",
           "build", "check", "write", "dump"]

#: Slinky's API group (the CRDs of SlinkyProject/slurm-operator, tests/data/slinky/crds)
SLINKY_GROUP = "slinky.slurm.net"
#: Slinky's kinds: the vendored CRDs (controllers, nodesets, loginsets, accountings) and restapis (slurmrestd) and
#: tokens (Slurm JWTs, Slinky 1.1); RBAC takes a resource that a cluster does not serve, so older operators lose
#: nothing
SLINKY_RESOURCES = ("controllers", "nodesets", "loginsets", "accountings", "restapis", "tokens")
#: slurm-ext's ConfigMaps in containers/slinky/
CONFIG_MAPS = ("slurm-ext-worker", "slurm-ext-controller", "slurm-ext-gres", "slurm-ext-mariadb",
               "slurm-ext-accounting-backup")
ROLE_NAMES = ("slurm-ext-viewer", "slurm-ext-operator", "slurm-ext-admin")
FILE_NAMES = {"authentication": "authentication-config.yaml", "rbac": "rbac.yaml", "kubeconfig": "kubeconfig-user.yaml"}
READ = ["get", "list", "watch"]
WRITE = ["create", "update", "patch", "delete", "deletecollection"]
#: the ClusterRole that reads nodes, the only cluster-wide right the roles need
NODE_READER = "slurm-ext-node-reader"
#: Slinky's namespace (its Helm chart's and containers/slinky's)
DEFAULT_NAMESPACE = "slurm"
#: a namespace's name: an RFC 1123 label
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: why no role patches nodes
NODE_PATCH_NOTE = ("no role patches nodes: RBAC cannot say which fields a patch changes, so `patch` on nodes would "
                   "let a person change any label or taint of every node; cordoning and the RMA label are done by "
                   "`slurm-ext repair approve` through the repair executor, whose node patch a "
                   "ValidatingAdmissionPolicy narrows (containers/slinky/rbac.yaml); uncordoning stays with the "
                   "cluster's administrators")
#: the kubeconfig's exec plugin API (kubectl 1.22 and later)
EXEC_API = "client.authentication.k8s.io/v1"
LABELS = {"app.kubernetes.io/part-of": "slurm-ext", "app.kubernetes.io/managed-by": "slurm-ext-oidc-kubernetes"}


class KubeRefused(SlurmExtError):
    """A request `oidc kubernetes` cannot turn into files the API server and RBAC take."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class KubeRequest:
    """What the operator asked for (the command's flags and the [oidc] defaults)."""

    #: the issuer URL exactly as the IdP's discovery document names it (the API server compares it with `iss`
    #: character for character: a trailing slash matters)
    issuer: str
    #: the audiences: the OAuth client ids whose ID tokens are taken (the first one is kubelogin's)
    client_ids: tuple[str, ...]
    username_claim: str = "email"
    #: prepended to every username, so that no IdP user can be taken for a Kubernetes one (`oidc:ada@example.com`)
    username_prefix: str = "oidc:"
    #: the claim with the user's groups (a list of strings); empty: no groups from the IdP
    groups_claim: str = "groups"
    groups_prefix: str = "oidc:"
    #: PEM of the CA that signed the IdP's certificate, where the API server's hosts do not trust it
    ca_pem: str = ""
    discovery_url: str = ""
    api_version: str = f"{kuberules.API_GROUP}/v1"
    #: the IdP's group names (without prefix) bound to each role
    viewer_groups: tuple[str, ...] = ()
    operator_groups: tuple[str, ...] = ()
    admin_groups: tuple[str, ...] = ()
    #: Slinky's namespace: the Roles and RoleBindings are there, and no role has a right in any other
    namespace: str = DEFAULT_NAMESPACE
    #: (claim, value) pairs every token must carry as strings (Google Workspace's hd: the organisation's domain)
    required_claims: tuple[tuple[str, str], ...] = ()
    #: OAuth scopes kubelogin asks for beyond openid (email, profile, groups...)
    extra_scopes: tuple[str, ...] = ()
    #: more arguments for kubelogin (--oidc-client-secret=..., --listen-address=...)
    kubelogin_args: tuple[str, ...] = ()
    user_name: str = "oidc"


@dataclass(frozen=True, slots=True)
class KubeFiles:
    """The objects `oidc kubernetes` writes, one file each."""

    authentication: dict
    rbac: tuple[dict, ...]
    kubeconfig: dict
    notes: tuple[str, ...] = field(default=())


def api_version_for(kubernetes_version: str) -> str:
    """The AuthenticationConfiguration apiVersion a Kubernetes `major.minor` reads. Raises KubeRefused."""
    found = re.fullmatch(r"v?(\d+)\.(\d+)(\.\d+)?", kubernetes_version.strip())
    if not found or int(found.group(1)) != 1:
        raise KubeRefused(f"--kubernetes-version {kubernetes_version!r}: expected a version such as 1.33")
    minor = int(found.group(2))
    if minor < 30:
        raise KubeRefused(f"--kubernetes-version {kubernetes_version}: the API server reads an "
                          "AuthenticationConfiguration file from 1.30 on (v1beta1); older ones take only the "
                          "--oidc-* flags, which slurm-ext does not write")
    return f"{kuberules.API_GROUP}/{'v1' if minor >= 34 else 'v1beta1'}"


def _authentication(request: KubeRequest) -> dict:
    issuer = {"url": request.issuer}
    if request.discovery_url:
        issuer["discoveryURL"] = request.discovery_url
    if request.ca_pem:
        issuer["certificateAuthority"] = request.ca_pem
    issuer["audiences"] = list(request.client_ids)
    if len(request.client_ids) > 1:
        issuer["audienceMatchPolicy"] = kuberules.MATCH_ANY
    mappings = {"username": {"claim": request.username_claim, "prefix": request.username_prefix}}
    if request.groups_claim:
        mappings["groups"] = {"claim": request.groups_claim, "prefix": request.groups_prefix}
    authenticator = {"issuer": issuer}
    rules = [{"claim": claim, "requiredValue": value} for claim, value in request.required_claims]
    if request.username_claim == "email":
        # the API server itself only refuses email_verified: false; an IdP that leaves the claim out would let
        # an address nobody proved be a username
        rules.append({"expression": "has(claims.email_verified) && claims.email_verified == true",
                      "message": "the IdP does not say this email address is verified (email_verified)"})
    if rules:
        authenticator["claimValidationRules"] = rules
    authenticator["claimMappings"] = mappings
    authenticator["userValidationRules"] = [
        {"expression": "!user.username.startsWith('system:')",
         "message": "usernames starting with system: are reserved for Kubernetes"},
        {"expression": "user.groups.all(group, !group.startsWith('system:'))",
         "message": "groups starting with system: are reserved for Kubernetes"}]
    return {"apiVersion": request.api_version, "kind": kuberules.KIND, "jwt": [authenticator]}


def _rules(role: str) -> list[dict]:
    """The namespaced rules of `role` (a Role in the Slurm namespace); each role holds the one before it.

    Left out on purpose, as each is as good as reading the namespace's Secrets (a pod or Job may mount any of
    them and run as any service account there): creating pods or Jobs (a backup now: `kubectl create job
    --from=cronjob/...` stays with the cluster's administrators), `pods/exec`, `pods/attach` and port-forward
    (a shell in slurmctld or MariaDB reads the keys they mount). Verbs are named, never `*`: no escalate, bind
    or impersonate can slip in."""
    slinky = list(SLINKY_RESOURCES)
    viewer = [
        {"apiGroups": [SLINKY_GROUP], "resources": slinky + [f"{name}/status" for name in slinky], "verbs": READ},
        {"apiGroups": [""], "resources": ["pods", "events", "services", "persistentvolumeclaims"], "verbs": READ},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": list(CONFIG_MAPS), "verbs": ["get", "watch"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": READ},
        {"apiGroups": ["batch"], "resources": ["cronjobs", "jobs"], "verbs": READ},
    ]
    operator = [
        # what a repair does by hand: reprovision (a new worker pod); cordoning and the RMA label are left to
        # the repair executor, whose node patch a ValidatingAdmissionPolicy narrows (NODE_PATCH_NOTE)
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        {"apiGroups": [SLINKY_GROUP], "resources": ["nodesets/scale", "loginsets/scale"],
         "verbs": ["get", "update", "patch"]},
    ]
    admin = [
        {"apiGroups": [SLINKY_GROUP], "resources": slinky + [f"{name}/status" for name in slinky]
         + ["nodesets/scale", "loginsets/scale"], "verbs": READ + WRITE},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": list(CONFIG_MAPS),
         "verbs": ["update", "patch"]},
    ]
    return {"slurm-ext-viewer": viewer, "slurm-ext-operator": viewer + operator,
            "slurm-ext-admin": viewer + operator + admin}[role]


def _binding(kind: str, name: str, role_kind: str, groups, prefix: str, namespace: str = "") -> dict:
    metadata = {"name": name, "namespace": namespace} if namespace else {"name": name}
    metadata["labels"] = dict(LABELS)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"{prefix}{group}"}
                         for group in groups]}


def _rbac(request: KubeRequest) -> tuple[dict, ...]:
    """Roles and RoleBindings in the Slurm namespace, so no right reaches kube-system or any other namespace; the
    one cluster-wide right is reading nodes (they have no namespace), for everyone bound to any role."""
    namespace = request.namespace
    objects = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": role, "namespace": namespace, "labels": dict(LABELS)}, "rules": _rules(role)}
               for role in ROLE_NAMES]
    objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": NODE_READER, "labels": dict(LABELS)},
                    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": READ}]})
    everyone = []
    for role, groups in zip(ROLE_NAMES, (request.viewer_groups, request.operator_groups, request.admin_groups)):
        if groups:
            objects.append(_binding("RoleBinding", role, "Role", groups, request.groups_prefix, namespace))
            everyone += groups
    if everyone:
        objects.append(_binding("ClusterRoleBinding", NODE_READER, "ClusterRole", dict.fromkeys(everyone),
                                request.groups_prefix))
    return tuple(objects)


def _kubeconfig(request: KubeRequest) -> dict:
    args = ["oidc-login", "get-token", f"--oidc-issuer-url={request.issuer}",
            f"--oidc-client-id={request.client_ids[0]}"]
    # the standard scope that puts the username claim into the ID token (OpenID Connect Core 1.0 §5.4)
    scopes = dict.fromkeys(({"email": ("email",), "preferred_username": ("profile",)}.get(request.username_claim, ())
                            + request.extra_scopes))
    args += [f"--oidc-extra-scope={scope}" for scope in scopes]
    # the token and refresh token in the desktop's keyring, not a file under ~/.kube/cache
    args += ["--token-cache-storage=keyring", *request.kubelogin_args]
    return {"apiVersion": "v1", "kind": "Config", "preferences": {}, "clusters": [], "contexts": [],
            "users": [{"name": request.user_name, "user": {"exec": {
                "apiVersion": EXEC_API, "command": "kubectl", "args": args,
                # kubelogin signs in through the browser; it reads nothing from the terminal
                "interactiveMode": "Never", "provideClusterInfo": False}}}]}


def build(request: KubeRequest) -> KubeFiles:
    """The files for `request`. Raises KubeRefused for what no file could fix (no client id, a group with the
    prefix already, bindings without a groups claim, no namespace)."""
    if not request.client_ids:
        raise KubeRefused("--client-id: at least one OAuth client id is needed (the audience of the ID tokens)")
    groups = request.viewer_groups + request.operator_groups + request.admin_groups
    if groups and not request.groups_claim:
        raise KubeRefused("--viewer-group/--operator-group/--admin-group need a groups claim: without "
                          "--groups-claim no IdP group reaches Kubernetes")
    for group in groups:
        if not group or (request.groups_prefix and group.startswith(request.groups_prefix)):
            raise KubeRefused(f"group {group!r}: give the IdP's group name; the prefix {request.groups_prefix!r} is "
                              "added (--groups-prefix)")
    notes = []
    if not _NAMESPACE.fullmatch(request.namespace) or len(request.namespace) > 63:
        raise KubeRefused(f"--namespace {request.namespace!r}: expected the Slurm namespace's name (a lower-case RFC "
                          "1123 label such as slurm); the roles hold rights in that namespace only")
    if request.username_prefix == "":
        notes.append("--username-prefix '': IdP users share the namespace of Kubernetes' own users and groups; "
                     "only the userValidationRules keep them out of system:")
    if not groups:
        notes.append("no --viewer-group, --operator-group or --admin-group: the roles are written but "
                     "nobody is bound to them")
    notes.append(NODE_PATCH_NOTE)
    return KubeFiles(authentication=_authentication(request), rbac=_rbac(request), kubeconfig=_kubeconfig(request),
                     notes=tuple(notes))


def _check_builtin(objects, kubernetes_version: str) -> str:
    """Validate the RBAC objects strictly with kubernetes-validate; what was done, for the output."""
    try:
        import kubernetes_validate
    except ImportError:
        return ("the RBAC objects were not checked offline: kubernetes-validate is not installed "
                "(pip install kubernetes-validate); kubectl apply --dry-run=server checks them against the cluster")
    latest = kubernetes_validate.latest_version()

    def minor(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.lstrip("v").split(".")[:2])

    # a cluster newer than the package's schemas is checked with its newest (RBAC v1 has not changed since 1.8)
    version = latest if not kubernetes_version or minor(kubernetes_version) > minor(latest) else kubernetes_version
    for document in objects:
        where = f"{document['kind']} {document['metadata']['name']}"
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(part) for part in err.absolute_path)
            raise KubeRefused(f"{FILE_NAMES['rbac']}: {where}: {path or '(top)'}: {err.message}") from None
        except kubernetes_validate.SchemaNotFoundError as err:
            raise KubeRefused(f"{FILE_NAMES['rbac']}: {where}: {err.message}") from None
    return f"the RBAC objects pass kubernetes-validate (strict, Kubernetes {version})"


def _check_kubeconfig(config: dict) -> None:
    """The exec stanza's own rules (client-go's kubeconfig validation), which no schema package holds."""
    for user in config["users"]:
        stanza = user["user"]["exec"]
        if not stanza.get("command") or stanza.get("apiVersion") != EXEC_API:
            raise KubeRefused(f"{FILE_NAMES['kubeconfig']}: user {user['name']}: exec needs a command and apiVersion "
                              f"{EXEC_API}")
        if stanza.get("interactiveMode") not in ("Never", "IfAvailable", "Always"):
            raise KubeRefused(f"{FILE_NAMES['kubeconfig']}: user {user['name']}: exec.interactiveMode must be Never, "
                              "IfAvailable or Always")


def check(files: KubeFiles, kubernetes_version: str = "") -> tuple[str, ...]:
    """Judge everything before it is written; the notes for the output. Raises kuberules.AuthConfigRefused
    (the API server's rules) or KubeRefused (kubernetes-validate, the kubeconfig)."""
    verdict = kuberules.refuse_unless_valid(files.authentication, FILE_NAMES["authentication"])
    done = [f"{FILE_NAMES['authentication']} passes the API server's rules (checked offline)"]
    done.append(_check_builtin(files.rbac, kubernetes_version))
    _check_kubeconfig(files.kubeconfig)
    return tuple(done) + tuple(verdict.notes) + files.notes


def dump(documents) -> str:
    """YAML of one document (a dict) or several (a tuple), keys in the order written."""
    import yaml

    class Dumper(yaml.SafeDumper):
        """No anchors and aliases (`&id001`) for lists the rules share: the file is read by people too."""

        def ignore_aliases(self, data):
            return True

    if isinstance(documents, dict):
        return yaml.dump(documents, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=120)
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=120)


def write(files: KubeFiles, directory: Path) -> dict[str, Path]:
    """Write the three files into `directory` (made if missing); what was written where. Raises KubeRefused
    when the directory cannot be written."""
    from slurm_ext.fileio import atomic_write
    header = "# written by slurm-ext oidc kubernetes; docs/operator/oidc-kubernetes.md says where each file goes\n"
    texts = {"authentication": dump(files.authentication), "rbac": dump(files.rbac),
             "kubeconfig": dump(files.kubeconfig)}
    written = {}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for what, text in texts.items():
            # the kubeconfig and the API server's file are read by their owners only; RBAC is public
            mode = 0o644 if what == "rbac" else 0o600
            written[what] = atomic_write(directory / FILE_NAMES[what], header + text, mode=mode, fsync="file")
    except OSError as err:
        raise KubeRefused(f"cannot write into {directory}: {err.strerror or err}") from None
    return written

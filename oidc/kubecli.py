"""`slurm-ext oidc kubernetes`: the API server's AuthenticationConfiguration, the RBAC for the IdP's groups and the
kubeconfig user for kubelogin, checked offline before they are written; `--check FILE` judges an
AuthenticationConfiguration someone wrote.

`add_command(actions)` adds the parser; the work (`kubernetes`, `kuberules`, PyYAML) is imported only when the
command runs, so `slurm-ext --help` loads none of it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_command"]

_PIP = "pip install 'slurm-ext[kubernetes]'"


def _yaml():
    from .kubernetes import KubeRefused
    try:
        import yaml
    except ImportError:
        raise KubeRefused(f"PyYAML is not installed, and `oidc kubernetes` reads and writes YAML: {_PIP}") from None
    return yaml


def _check_file(path: str) -> int:
    from .kubernetes import KubeRefused
    from .kuberules import refuse_unless_valid
    yaml = _yaml()
    try:
        documents = [document for document in yaml.safe_load_all(Path(path).read_text()) if document is not None]
    except OSError as err:
        raise KubeRefused(f"--check {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise KubeRefused(f"--check {path}: not YAML ({str(err).splitlines()[0]})") from None
    if len(documents) != 1:
        raise KubeRefused(f"--check {path}: expected one AuthenticationConfiguration document, found {len(documents)}")
    verdict = refuse_unless_valid(documents[0], path)
    for note in verdict.notes:
        print(f"note: {note}")
    print(f"{path}: OK: the Kubernetes API server's rules for an AuthenticationConfiguration hold (checked offline)")
    return 0


def _discover(issuer: str, ca_file: str, timeout: float) -> None:
    """The API server takes an issuer only when its discovery document names it exactly: say so now."""
    from .kubernetes import KubeRefused
    from .provider import OidcError, fetch_json
    url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
    try:
        document = fetch_json(url, "the IdP's discovery document", timeout, ca_file)
    except OidcError as err:
        raise KubeRefused(f"--discover: {err}") from None
    if document.get("issuer") != issuer:
        raise KubeRefused(f"--discover: the IdP's discovery document {url} names issuer {document.get('issuer')!r}, "
                          f"not {issuer!r}: the API server compares them character for character (a trailing slash "
                          "too); give --issuer exactly as the IdP names itself")


def _claim_value(text: str) -> tuple[str, str]:
    from .kubernetes import KubeRefused
    claim, equals, value = text.partition("=")
    if not equals or not claim.strip():
        raise KubeRefused(f"--required-claim {text!r}: expected CLAIM=VALUE (e.g. hd=example.com)")
    return claim.strip(), value


def _run(args: argparse.Namespace) -> int:
    if args.check:
        return _check_file(args.check)
    from slurm_ext import config
    from . import kubernetes
    _yaml()
    section = config.load(args.config).oidc
    issuer = args.issuer if args.issuer is not None else section.issuer
    if not issuer:
        raise kubernetes.KubeRefused("--issuer: no issuer given and [oidc] issuer is empty in the config")
    ca_file = args.ca_file if args.ca_file is not None else section.ca_file
    ca_pem = ""
    if ca_file:
        try:
            ca_pem = Path(ca_file).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise kubernetes.KubeRefused(f"the IdP's CA file {ca_file}: {getattr(err, 'strerror', None) or err}") \
                from None
    if args.discover:
        _discover(issuer, ca_file, section.timeout)
    if args.api_version:
        api_version = f"apiserver.config.k8s.io/{args.api_version}"
    else:
        api_version = kubernetes.api_version_for(args.kubernetes_version or "1.34")
    request = kubernetes.KubeRequest(
        issuer=issuer, client_ids=tuple(dict.fromkeys(args.client_id or ())), username_claim=args.username_claim,
        username_prefix=args.username_prefix, groups_claim=args.groups_claim, groups_prefix=args.groups_prefix,
        ca_pem=ca_pem, discovery_url=args.discovery_url or "", api_version=api_version,
        viewer_groups=tuple(args.viewer_group or ()), operator_groups=tuple(args.operator_group or ()),
        admin_groups=tuple(args.admin_group or ()), namespace=args.namespace,
        required_claims=tuple(_claim_value(text) for text in args.required_claim or ()),
        extra_scopes=tuple(args.extra_scope or ()), kubelogin_args=tuple(args.kubelogin_arg or ()),
        user_name=args.user_name)
    files = kubernetes.build(request)
    notes = kubernetes.check(files, args.kubernetes_version or "")
    written = kubernetes.write(files, Path(args.output))
    for path in written.values():
        print(f"wrote {path}")
    for note in notes:
        print(f"note: {note}")
    auth, rbac, kubeconfig = (written[name] for name in ("authentication", "rbac", "kubeconfig"))
    print(f"""
Next:
  1. On every API server host: copy {auth.name} (e.g. to /etc/kubernetes/{auth.name}) and start kube-apiserver with
     --authentication-config=/etc/kubernetes/{auth.name}
     and without any --oidc-* flag (the API server refuses both together). Later changes to the file are
     reloaded automatically; a file it cannot load is logged and the previous one kept.
  2. kubectl apply -f {rbac}
  3. Each person: install kubelogin (kubectl oidc-login), then merge the user into their kubeconfig:
       (umask 077; KUBECONFIG=~/.kube/config:{kubeconfig} kubectl config view --flatten > ~/.kube/config.new) && \\
         mv ~/.kube/config.new ~/.kube/config
       kubectl config set-context --current --user={request.user_name}
     (the flattened kubeconfig holds every credential of ~/.kube/config, so it is written beside it, readable by
     its owner only, never into a shared directory such as /tmp) and check who the API server takes them for:
       kubectl auth whoami""")
    return 0


def add_command(actions: argparse._SubParsersAction) -> None:
    """Add `oidc kubernetes` to the `oidc` group."""
    kube = actions.add_parser(
        "kubernetes", help="write the API server's AuthenticationConfiguration, RBAC for the IdP's groups and the "
        "kubeconfig user for kubelogin, checked offline",
        description="Writes authentication-config.yaml (the API server's --authentication-config: the IdP, its "
                    "client ids as audiences, username and groups claims with mandatory prefixes, no system: names), "
                    "rbac.yaml (Roles slurm-ext-viewer, slurm-ext-operator, slurm-ext-admin over Slinky's "
                    "resources and slurm-ext's objects in Slinky's namespace, a ClusterRole that reads nodes, and "
                    "bindings of the IdP's groups to them) and "
                    "kubeconfig-user.yaml (an exec user for kubelogin). Everything is checked before it is written: "
                    "the AuthenticationConfiguration by the API server's own rules, the RBAC objects with "
                    "kubernetes-validate where installed. Refused: exit 2 with the rule's message. Defaults for "
                    "--issuer and --ca-file come from [oidc]. docs/operator/oidc-kubernetes.md.")
    kube.add_argument("--issuer", metavar="URL", help="the IdP's issuer URL exactly as its discovery document "
                      "names it, https (default: [oidc] issuer)")
    kube.add_argument("--client-id", action="append", metavar="ID",
                      help="the OAuth client id whose ID tokens are taken (the audience); repeatable: several "
                           "audiences are matched with MatchAny, and kubelogin uses the first")
    kube.add_argument("--username-claim", default="email", metavar="CLAIM",
                      help="the claim that names the person (default: email, then only tokens whose email_verified "
                           "is true are taken; sub or preferred_username, or oid for Entra ID)")
    kube.add_argument("--username-prefix", default="oidc:", metavar="TEXT",
                      help="put before every username so no IdP user is taken for a Kubernetes one (default: oidc:; "
                           "'' for none)")
    kube.add_argument("--groups-claim", default="groups", metavar="CLAIM",
                      help="the claim with the person's groups, a list of strings (default: groups; '' for none)")
    kube.add_argument("--groups-prefix", default="oidc:", metavar="TEXT",
                      help="put before every group name, also in the bindings (default: oidc:)")
    for role in ("viewer", "operator", "admin"):
        kube.add_argument(f"--{role}-group", action="append", metavar="GROUP",
                          help=f"an IdP group (its name in the groups claim, without the prefix) bound to "
                               f"slurm-ext-{role}; repeatable")
    kube.add_argument("--required-claim", action="append", metavar="CLAIM=VALUE",
                      help="take only tokens whose string claim CLAIM is VALUE (Google Workspace: hd=example.com); "
                           "repeatable")
    kube.add_argument("--namespace", metavar="NS", default="slurm",
                      help="Slinky's namespace: the roles are Roles there, bound by RoleBindings, and hold no right "
                           "in any other namespace; only reading nodes is cluster-wide (default: slurm)")
    version = kube.add_mutually_exclusive_group()
    version.add_argument("--kubernetes-version", metavar="X.Y", help="the cluster's version: apiserver.config.k8s.io/"
                         "v1 from 1.34, v1beta1 for 1.30 to 1.33 (default: 1.34 or later)")
    version.add_argument("--api-version", choices=("v1", "v1beta1"), help="the AuthenticationConfiguration's "
                         "apiVersion, instead of --kubernetes-version")
    kube.add_argument("--ca-file", metavar="FILE", help="PEM of the CA that signed the IdP's certificate, put into "
                      "the file as certificateAuthority, where the API server's hosts do not trust it (default: "
                      "[oidc] ca_file)")
    kube.add_argument("--discovery-url", metavar="URL", help="where the API server fetches the discovery document, "
                      "when not at the issuer (an in-cluster address); https, not the issuer URL")
    kube.add_argument("--discover", action="store_true", help="first fetch the issuer's discovery document and "
                      "refuse when it names another issuer (as the API server will)")
    kube.add_argument("--extra-scope", action="append", metavar="SCOPE", help="an OAuth scope kubelogin asks for "
                      "beyond openid (email, profile, groups: docs/operator/oidc-providers.md); repeatable")
    kube.add_argument("--kubelogin-arg", action="append", metavar="ARG", help="one more kubelogin argument, e.g. "
                      "--kubelogin-arg=--oidc-client-secret=S for an IdP that wants one; repeatable")
    kube.add_argument("--user-name", default="oidc", metavar="NAME", help="the kubeconfig user's name "
                      "(default: oidc)")
    kube.add_argument("--output", default="oidc-kubernetes", metavar="DIR",
                      help="directory for the three files (default: ./oidc-kubernetes)")
    kube.add_argument("--check", metavar="FILE", help="only judge this AuthenticationConfiguration file by the API "
                      "server's rules (exit 2 with every problem); writes nothing")
    kube.set_defaults(func=_run)

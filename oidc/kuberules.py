"""The Kubernetes API server's own rules for an AuthenticationConfiguration, checked offline.

`check(document)` judges a parsed `--authentication-config` file as kube-apiserver would when it loads
it, and returns a `Verdict`: the `problems` that make the API server refuse the file (each a `Problem`
naming the field path, `jwt[0].issuer.url: URL scheme must be https`) and `notes` that are not errors
but change what the file means. `refuse_unless_valid(document)` raises `AuthConfigRefused` (exit 2) on
the first judgement with problems; `oidc kubernetes` calls it on everything it writes, and
`oidc kubernetes --check FILE` on a file an operator wrote.

Why reimplemented: a wrong file is found only when the API server restarts (or, reloading it, logs an
error and keeps the old one), and there is no API server here to ask. The rules and their wording
follow `k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go` (ValidateAuthenticationConfiguration
and what it calls), so an operator who greps the API server's log finds the same words; the field set
is the one of `apiserver.config.k8s.io/v1` and `v1beta1`, decoded strictly (an unknown field is refused,
as a typo'd key must not silently do nothing). Not checkable here: the service-account issuers the
API server forbids as `issuer.url` (its own `--service-account-issuer`) and the feature gates of a
particular cluster (said in the notes).

CEL: with `celpy` (cel-python) importable, every expression must parse; the API server's CEL
environment has more (the optional syntax `claims.?x`, the Kubernetes libraries), so an expression
with the optional syntax is left to the API server, with a note. Whether `claims.email` and
`claims.email_verified` are used is read from the expression's text with string literals removed, the
way the API server walks its syntax tree for a select of `claims`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from slurm_ext.errors import SlurmExtError

__all__ = ["API_GROUP", "API_VERSIONS", "KIND", "MAX_JWT", "Problem", "Verdict", "AuthConfigRefused", "check",
           "refuse_unless_valid"]

API_GROUP = "apiserver.config.k8s.io"
#: apiVersion -> the Kubernetes versions whose API server reads it (v1 is GA from 1.34; v1beta1 1.30-1.33,
#: still read by 1.34 and later)
API_VERSIONS = {f"{API_GROUP}/v1": "1.34 and later", f"{API_GROUP}/v1beta1": "1.30 and later"}
KIND = "AuthenticationConfiguration"
#: the most JWT authenticators one file may hold
MAX_JWT = 64
#: the audience match policy, the only value there is
MATCH_ANY = "MatchAny"
EGRESS_SELECTORS = ("controlplane", "cluster")

#: the fields of each object, as in the Go types (k8s.io/apiserver/pkg/apis/apiserver/v1/types.go)
_FIELDS = {
    "": {"apiVersion", "kind", "jwt", "anonymous"},
    "anonymous": {"enabled", "conditions"},
    "anonymous.conditions[]": {"path"},
    "jwt[]": {"issuer", "claimValidationRules", "claimMappings", "userValidationRules"},
    "issuer": {"url", "discoveryURL", "certificateAuthority", "audiences", "audienceMatchPolicy",
               "egressSelectorType"},
    "claimValidationRules[]": {"claim", "requiredValue", "expression", "message"},
    "claimMappings": {"username", "groups", "uid", "extra"},
    "prefixed": {"claim", "prefix", "expression"},
    "uid": {"claim", "expression"},
    "extra[]": {"key", "valueExpression"},
    "userValidationRules[]": {"expression", "message"},
}
#: a domain-prefixed path's domain: an RFC 1123 subdomain (k8s.io/apimachinery IsDomainPrefixedPath). Used with
#: fullmatch only: Go's `$` is the end of the text, Python's also matches before a trailing newline
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SUBDOMAIN_MAX = 253
_HTTP_PATH = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")
_STRING_LITERAL = re.compile(r"""[rR]?(\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(\\.|[^"\\])*"|'(\\.|[^'\\])*')""")


def _selects(expression: str, claim: str) -> bool:
    """Whether the CEL `expression` selects `claims.<claim>` (or `claims.?<claim>`), outside string literals."""
    code = _STRING_LITERAL.sub("''", expression)
    return re.search(rf"\bclaims\s*\.\s*\??\s*{re.escape(claim)}\b", code) is not None


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason the API server refuses the file."""

    #: where, as the API server says it: `jwt[0].claimMappings.username.prefix`
    path: str
    #: what is wrong, in the API server's words where it has some
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judgement of one AuthenticationConfiguration."""

    problems: tuple[Problem, ...] = ()
    #: what holds but changes what the file means, or what could not be checked here
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class AuthConfigRefused(SlurmExtError):
    """An AuthenticationConfiguration the API server would refuse; the message lists every problem."""

    exit_code = 2

    def __init__(self, what: str, problems: tuple[Problem, ...]):
        self.what, self.problems = what, problems
        listed = "\n".join(f"  {problem}" for problem in problems)
        super().__init__(f"{what}: the Kubernetes API server would refuse this AuthenticationConfiguration "
                         f"({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n{listed}")


@dataclass
class _Judge:
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    cel: object = None  # celpy's Environment, or False when celpy is not there
    optional_syntax: bool = False

    def refuse(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    # -- shapes ---------------------------------------------------------------------------------

    def mapping(self, value, path: str, fields: str) -> dict:
        """`value` as an object with only the fields of `fields` ({} when it is not one)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.refuse(path, f"must be an object, not {type(value).__name__}")
            return {}
        for name in value:
            if name not in _FIELDS[fields]:
                self.refuse(f"{path}.{name}" if path else str(name),
                            f"unknown field (expected one of {', '.join(sorted(_FIELDS[fields]))})")
        return value

    def items(self, value, path: str) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            self.refuse(path, f"must be a list, not {type(value).__name__}")
            return []
        return value

    def text(self, mapping: dict, name: str, path: str) -> str:
        value = mapping.get(name)
        if value is None:
            return ""
        if not isinstance(value, str):
            self.refuse(f"{path}.{name}", f"must be a string, not {type(value).__name__}")
            return ""
        return value

    def compiles(self, expression: str, path: str) -> None:
        """Refuse an expression that is not CEL, where cel-python can tell."""
        if re.search(r"\.\?|\[\?", _STRING_LITERAL.sub("''", expression)):
            self.optional_syntax = True
            return
        if self.cel is None:
            try:
                import celpy
                self.cel = celpy.Environment()
            except ImportError:
                self.cel = False
        if self.cel is False:
            return
        try:
            self.cel.compile(expression)
        except Exception as err:  # celpy raises its parse errors as several classes
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self.refuse(path, f"compilation failed: {first[:200]}")

    # -- the rules ------------------------------------------------------------------------------

    def url(self, value: str, path: str) -> None:
        try:
            parts = urllib.parse.urlsplit(value)
        except ValueError as err:
            self.refuse(path, f"{value!r}: {err}")
            return
        if parts.scheme != "https":
            self.refuse(path, "URL scheme must be https")
        if "@" in parts.netloc:
            self.refuse(path, "URL must not contain a username or password")
        if parts.query:
            self.refuse(path, "URL must not contain a query")
        if parts.fragment:
            self.refuse(path, "URL must not contain a fragment")

    def issuer(self, issuer: dict, path: str) -> None:
        url = self.text(issuer, "url", path)
        if not url:
            self.refuse(f"{path}.url", "Required value: URL is required")
        else:
            self.url(url, f"{path}.url")
        discovery = self.text(issuer, "discoveryURL", path)
        if discovery:
            if url and url.rstrip("/") == discovery.rstrip("/"):
                self.refuse(f"{path}.discoveryURL", "discoveryURL must be different from URL")
            self.url(discovery, f"{path}.discoveryURL")
        self.audiences(issuer, path)
        authority = self.text(issuer, "certificateAuthority", path)
        if authority:
            self.certificate_authority(authority, f"{path}.certificateAuthority")
        egress = self.text(issuer, "egressSelectorType", path)
        if egress:
            if egress not in EGRESS_SELECTORS:
                self.refuse(f"{path}.egressSelectorType", "egress selector must be either controlplane or cluster")
            self.notes.append(f"{path}.egressSelectorType needs Kubernetes 1.34 or later (feature gate "
                              "StructuredAuthenticationConfigurationEgressSelector, on by default there) and an "
                              "--egress-selector-config-file")

    def audiences(self, issuer: dict, path: str) -> None:
        audiences = self.items(issuer.get("audiences"), f"{path}.audiences")
        policy = self.text(issuer, "audienceMatchPolicy", path)
        if not audiences:
            self.refuse(f"{path}.audiences", f"Required value: at least one {path}.audiences is required")
            return
        seen = set()
        for index, audience in enumerate(audiences):
            where = f"{path}.audiences[{index}]"
            if not isinstance(audience, str):
                self.refuse(where, f"must be a string, not {type(audience).__name__}")
                continue
            if not audience:
                self.refuse(where, "Required value: audience can't be empty")
            if audience in seen:
                self.refuse(where, f"Duplicate value: {audience!r}")
            seen.add(audience)
        if len(audiences) > 1 and policy != MATCH_ANY:
            self.refuse(f"{path}.audienceMatchPolicy", "audienceMatchPolicy must be MatchAny for multiple audiences")
        if len(audiences) == 1 and policy and policy != MATCH_ANY:
            self.refuse(f"{path}.audienceMatchPolicy",
                        "audienceMatchPolicy must be empty or MatchAny for single audience")

    def certificate_authority(self, pem: str, path: str) -> None:
        from cryptography import x509
        try:
            found = x509.load_pem_x509_certificates(pem.encode())
        except ValueError:
            found = []
        if not found:
            self.refuse(path, "data does not contain any valid RSA or ECDSA certificates (expected PEM "
                        "certificates: the content of the CA file, not its path)")

    def claim_validation_rules(self, rules: list, path: str) -> list[str]:
        """Check the rules; their expressions (for the email_verified rule)."""
        expressions, claims = [], set()
        for index, rule in enumerate(rules):
            where = f"{path}[{index}]"
            rule = self.mapping(rule, where, "claimValidationRules[]")
            claim, expression = self.text(rule, "claim", where), self.text(rule, "expression", where)
            required, message = self.text(rule, "requiredValue", where), self.text(rule, "message", where)
            if claim and expression:
                self.refuse(where, "claim and expression can't both be set")
            elif not claim and not expression:
                self.refuse(where, "Required value: claim or expression is required")
            elif claim:
                if message:
                    self.refuse(f"{where}.message", "message can't be set when claim is set")
                if claim in claims:
                    self.refuse(f"{where}.claim", f"Duplicate value: {claim!r}")
                claims.add(claim)
            else:
                if required:
                    self.refuse(f"{where}.requiredValue", "requiredValue can't be set when expression is set")
                if expression in expressions:
                    self.refuse(f"{where}.expression", f"Duplicate value: {expression!r}")
                    continue
                expressions.append(expression)
                self.compiles(expression, f"{where}.expression")
        return expressions

    def prefixed(self, mapping: dict, path: str, required: bool) -> str:
        """Check a username or groups mapping; its expression."""
        claim, expression = self.text(mapping, "claim", path), self.text(mapping, "expression", path)
        if expression and claim:
            self.refuse(path, "claim and expression can't both be set")
        elif not expression and not claim:
            if required:
                self.refuse(path, "Required value: claim or expression is required")
        elif expression:
            # Go checks Prefix != nil: `prefix: null` decodes to nil and is taken beside an expression
            if mapping.get("prefix") is not None:
                self.refuse(f"{path}.prefix", "prefix can't be set when expression is set")
            self.compiles(expression, f"{path}.expression")
        elif mapping.get("prefix") is None:
            self.refuse(f"{path}.prefix", "Required value: prefix is required when claim is set. It can be set to "
                        "an empty string to disable prefixing")
        else:
            self.text(mapping, "prefix", path)
        return expression

    def claim_mappings(self, mappings: dict, path: str, rule_expressions: list[str]) -> None:
        username = self.mapping(mappings.get("username"), f"{path}.username", "prefixed")
        username_expression = self.prefixed(username, f"{path}.username", required=True)
        groups = self.mapping(mappings.get("groups"), f"{path}.groups", "prefixed")
        self.prefixed(groups, f"{path}.groups", required=False)
        uid = self.mapping(mappings.get("uid"), f"{path}.uid", "uid")
        uid_claim, uid_expression = self.text(uid, "claim", f"{path}.uid"), self.text(uid, "expression", f"{path}.uid")
        if uid_claim and uid_expression:
            self.refuse(f"{path}.uid", "claim and expression can't both be set")
        elif uid_expression:
            self.compiles(uid_expression, f"{path}.uid.expression")
        extra_expressions, keys = [], set()
        for index, extra in enumerate(self.items(mappings.get("extra"), f"{path}.extra")):
            where = f"{path}.extra[{index}]"
            extra = self.mapping(extra, where, "extra[]")
            key, value = self.text(extra, "key", where), self.text(extra, "valueExpression", where)
            self.extra_key(key, f"{where}.key")
            if key in keys:
                self.refuse(f"{where}.key", f"Duplicate value: {key!r}")
                continue
            keys.add(key)
            if not value:
                self.refuse(f"{where}.valueExpression", "Required value: valueExpression is required")
                continue
            extra_expressions.append(value)
            self.compiles(value, f"{where}.valueExpression")
        if username_expression and _selects(username_expression, "email") and not any(
                _selects(expression, "email_verified")
                for expression in [username_expression, *extra_expressions, *rule_expressions]):
            self.refuse(f"{path}.username.expression",
                        "claims.email_verified must be used in claimMappings.username.expression or "
                        "claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when "
                        "claims.email is used in claimMappings.username.expression")
        if self.text(username, "claim", f"{path}.username") == "email" and not any(
                _selects(expression, "email_verified") for expression in rule_expressions):
            self.notes.append(f"{path}.username.claim is email: the API server then refuses a token whose "
                              "email_verified is false, but takes one without email_verified (as "
                              "claims.?email_verified.orValue(true) == true); to require it, add the "
                              "claimValidationRules expression claims.email_verified == true")

    def extra_key(self, key: str, path: str) -> None:
        domain, slash, rest = key.partition("/")
        if not key:
            self.refuse(path, "Required value")
            return
        if not slash or not domain or not rest:
            self.refuse(path, f"Invalid value: {key!r}: must be a domain-prefixed path (such as \"acme.io/foo\")")
        else:
            # as IsDomainPrefixedPath: the domain as written (an upper-case one is not a subdomain), and the
            # domain's errors and the path's reported together
            if len(domain) > _SUBDOMAIN_MAX:
                self.refuse(path, f"Invalid value: {domain!r}: must be no more than {_SUBDOMAIN_MAX} characters")
            if not _SUBDOMAIN.fullmatch(domain):
                self.refuse(path, f"Invalid value: {domain!r}: a lowercase RFC 1123 subdomain must consist of lower "
                            "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                            "character")
            if not _HTTP_PATH.fullmatch(rest):
                self.refuse(path, f"Invalid value: {rest!r}: must be a valid HTTP path")
        if key != key.lower():
            self.refuse(path, "key must be lowercase")
        if domain in ("kubernetes.io", "k8s.io") or domain.endswith((".kubernetes.io", ".k8s.io")):
            self.refuse(path, "k8s.io, kubernetes.io and their subdomains are reserved for Kubernetes use")

    def user_validation_rules(self, rules: list, path: str) -> None:
        seen = set()
        for index, rule in enumerate(rules):
            where = f"{path}[{index}]"
            rule = self.mapping(rule, where, "userValidationRules[]")
            expression = self.text(rule, "expression", where)
            self.text(rule, "message", where)
            if not expression:
                self.refuse(f"{where}.expression", "Required value: expression is required")
                continue
            if expression in seen:
                self.refuse(f"{where}.expression", f"Duplicate value: {expression!r}")
                continue
            seen.add(expression)
            self.compiles(expression, f"{where}.expression")

    def anonymous(self, value) -> None:
        anonymous = self.mapping(value, "anonymous", "anonymous")
        enabled = anonymous.get("enabled", False)
        if not isinstance(enabled, bool):
            self.refuse("anonymous.enabled", f"must be true or false, not {enabled!r}")
        conditions = self.items(anonymous.get("conditions"), "anonymous.conditions")
        for index, condition in enumerate(conditions):
            self.mapping(condition, f"anonymous.conditions[{index}]", "anonymous.conditions[]")
        if conditions and enabled is not True:
            self.refuse("anonymous.conditions", "enabled should be set to true when conditions are defined")
        self.notes.append("anonymous needs Kubernetes 1.32 or later (feature gate AnonymousAuthConfigurableEndpoints) "
                          "and no --anonymous-auth flag")


def check(document) -> Verdict:
    """Judge one parsed AuthenticationConfiguration as the API server would load it."""
    judge = _Judge()
    if not isinstance(document, dict):
        return Verdict((Problem("", f"expected an {KIND} object, not {type(document).__name__}"),))
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if api_version not in API_VERSIONS:
        judge.refuse("apiVersion", f"{api_version!r}: expected {' or '.join(API_VERSIONS)} (v1 from Kubernetes 1.34, "
                     "v1beta1 for 1.30 to 1.33)")
    if kind != KIND:
        judge.refuse("kind", f"{kind!r}: expected {KIND}")
    judge.mapping(document, "", "")
    authenticators = judge.items(document.get("jwt"), "jwt")
    if len(authenticators) > MAX_JWT:
        judge.refuse("jwt", f"Too many: {len(authenticators)}: must have at most {MAX_JWT} items")
        return Verdict(tuple(judge.problems), tuple(judge.notes))
    issuers, discoveries = set(), set()
    for index, authenticator in enumerate(authenticators):
        path = f"jwt[{index}]"
        authenticator = judge.mapping(authenticator, path, "jwt[]")
        issuer = judge.mapping(authenticator.get("issuer"), f"{path}.issuer", "issuer")
        judge.issuer(issuer, f"{path}.issuer")
        where = f"{path}.claimValidationRules"
        rules = judge.claim_validation_rules(judge.items(authenticator.get("claimValidationRules"), where), where)
        mappings = judge.mapping(authenticator.get("claimMappings"), f"{path}.claimMappings", "claimMappings")
        judge.claim_mappings(mappings, f"{path}.claimMappings", rules)
        judge.user_validation_rules(judge.items(authenticator.get("userValidationRules"),
                                                f"{path}.userValidationRules"), f"{path}.userValidationRules")
        url, discovery = issuer.get("url"), issuer.get("discoveryURL")
        if isinstance(url, str):
            if url in issuers:
                judge.refuse(f"{path}.issuer.url", f"Duplicate value: {url!r}")
            issuers.add(url)
        if isinstance(discovery, str) and discovery:
            if discovery in discoveries:
                judge.refuse(f"{path}.issuer.discoveryURL", f"Duplicate value: {discovery!r}")
            discoveries.add(discovery)
    if "anonymous" in document:
        judge.anonymous(document["anonymous"])
    if judge.optional_syntax:
        judge.notes.append("expressions with CEL's optional syntax (claims.?name) were not compiled here (cel-python "
                           "does not parse it); the API server compiles them when it loads the file")
    elif judge.cel is False:
        judge.notes.append("the CEL expressions were not compiled here (cel-python is not installed: pip install "
                           "cel-python)")
    return Verdict(tuple(judge.problems), tuple(judge.notes))


def refuse_unless_valid(document, what: str) -> Verdict:
    """The verdict on `document` when it holds; raises AuthConfigRefused naming `what` (a file) otherwise."""
    verdict = check(document)
    if not verdict.ok:
        raise AuthConfigRefused(what, verdict.problems)
    return verdict

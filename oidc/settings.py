"""The organisation's identity provider: [oidc].

One issuer for every door (the page's sign-in, `oidc slurm`, `oidc kubernetes`'s defaults), so that the
people Kubernetes, Slurm and the page take are the same. Empty by default: nothing trusts an IdP until one
is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["OidcSection"]


@dataclass(frozen=True, slots=True)
class OidcSection:
    """The IdP that signs people in (OpenID Connect)."""

    issuer: str = setting("", "the IdP's issuer URL, exactly as its discovery document names it (https; plain http "
                          "only to 127.0.0.1 or localhost, for a test IdP); empty: no OIDC", "str",
                          pattern=r"^(https?://[^\s?#]+)?$")
    ca_file: str = setting("", "PEM file of the CA that signed the IdP's certificate, where it is not one the system "
                           "trusts; empty: the system's CAs", "path", empty_ok=True)
    clock_skew: float = setting(60.0, "how far a token's exp, iat and nbf may be off this host's clock (the IdP's "
                                "clock and ours differ a little)", "duration", minimum=0.0, maximum=600.0)
    timeout: float = setting(10.0, "longest wait for one answer of the IdP (discovery, JWKS, token endpoint)",
                             "duration", minimum=1.0, maximum=120.0)


register_section("oidc", OidcSection)

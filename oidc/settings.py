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
    slurm_jwks_file: str = setting("/etc/slurm/jwks.json", "where `oidc slurm` writes the IdP's signing keys for "
                                   "Slurm's auth/jwt (AuthAltParameters=jwks=...): SlurmUser's, mode 0400", "path")
    slurm_userclaimfield: str = setting("preferred_username", "the token claim Slurm takes as the user name "
                                        "(AuthAltParameters userclaimfield=; a `username` or `sun` claim in a token "
                                        "wins over it); lower case: Slinky lower-cases AuthAltParameters",
                                        "str", pattern=r"^[a-z0-9_.:-]+$")
    slurm_user: str = setting("", "owner of the JWKS file; empty: SlurmUser from `scontrol show config`, and "
                              "`slurm` when slurmctld does not answer", "str", pattern=r"^[A-Za-z0-9._-]*$")
    slurm_refresh: float = setting(300.0, "how often `oidc slurm --watch` reads the IdP's keys again (a rotated "
                                   "key reaches Slurm at most this late)", "duration", minimum=10.0, maximum=86400.0)


register_section("oidc", OidcSection)

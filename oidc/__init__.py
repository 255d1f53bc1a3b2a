"""One identity from the organisation's OpenID Connect provider for every door into the cluster.

`provider` reads the IdP (discovery, signing keys with their rotation, token checks) for the page's
sign-in and for `oidc slurm`; `slurm-ext oidc kubernetes` writes what the API server and RBAC need to
take the same people, and `slurm-ext oidc slurm` the JWKS and the lines Slurm's auth/jwt needs. Imported
on first use: the core CLI loads `cli` for every command.
"""

from slurm_ext.lazy import lazy_names

__all__ = ["discover", "KeySet", "verify_token", "OidcError", "TokenRefused"]

_LAZY = {"discover": "provider", "KeySet": "provider", "verify_token": "provider", "OidcError": "provider",
         "TokenRefused": "provider"}


__getattr__ = lazy_names(__name__, _LAZY)

"""`slurm-ext oidc kubernetes|slurm`: what the API server, RBAC and Slurm need to take the people the
organisation's IdP signs in. Each subcommand's parser and work live in its own module (`kubecli`,
`slurmcli`), imported here only for their parsers."""

from __future__ import annotations

import argparse

__all__ = ["add_commands"]


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `oidc` to the core CLI."""
    from . import kubecli, slurmcli
    oidc = commands.add_parser(
        "oidc", help="one identity from the organisation's OpenID Connect provider for Kubernetes RBAC and Slurm",
        description="Writes what the Kubernetes API server, RBAC and Slurm's auth/jwt need to take the people the "
                    "organisation's IdP signs in (the page's own sign-in is [web] oidc_*: docs/operator/oidc.md).")
    actions = oidc.add_subparsers(dest="verb", metavar="TARGET", required=True)
    kubecli.add_command(actions)
    slurmcli.add_command(actions)

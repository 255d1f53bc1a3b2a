"""`slurm-ext oidc slurm`: the IdP's signing keys for Slurm's auth/jwt, the lines slurm.conf and slurmdbd.conf
need, Slinky's jwksKeyRef ConfigMap, and the refresh when the IdP rotates its keys.

Only the parser is built here (the core CLI builds every parser at each command); the work (`slurmjwks`, the
IdP, Slurm's tools) is imported when the command runs.

Refresh: each run compares the IdP's keys with the file's and writes only on a change, so the command is also the
refresh; `--watch` runs it every [oidc] slurm_refresh until stopped (a systemd service or a sidecar), and a run
from a timer does the same. Slurm reads the file once when auth/jwt starts, so a rotation is followed by `scontrol
reconfigure` (slurmctld re-execs, slurmd reconfigures: both read the new file; `--no-reconfigure` leaves it to the
operator), retried by later runs until it succeeds. slurmdbd is reached by no reconfigure (`sacctmgr reconfigure`
rereads slurmdbd.conf, not the auth plug-in's keys): a rotation says it needs a restart.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_command", "WARNING"]

#: what Slurm's auth/jwt does not check, said with every run and in docs/operator/oidc-slurm.md
WARNING = """\
warning: Slurm's auth/jwt checks a token's signature and its exp, nothing else: not its issuer (iss), not its
  audience (aud). Any token the IdP signs with these keys (an ID token for the page, a token for any other
  application of the IdP) is taken by Slurm, for any user it names; a `username` or `sun` claim in it wins over
  userclaimfield. To close it: give Slurm a signing key or realm of its own at the IdP (a JWKS that signs for
  Slurm only), keep token lifetimes short (exp is all Slurm checks), and let no one mint a `username`/`sun`
  claim. use_jwt_client_ids_only (--client-ids-only) closes nothing: it widens what a token decides (its uid,
  gid and groups, with no local user database), so a key of Slurm's own matters even more with it."""


def add_command(actions: argparse._SubParsersAction) -> None:
    """Add `slurm` to `slurm-ext oidc`."""
    parser = actions.add_parser(
        "slurm", help="write the IdP's signing keys for Slurm's auth/jwt (JWKS) and the slurm.conf lines",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fetches the IdP's discovery document and JWKS and writes a JWKS Slurm can take: RSA signing "
                    "keys only, each with alg RS256 (Slurm 25.11 and 26.05.0-26.05.2 abort on an EC key and refuse "
                    "keys without alg), owned by SlurmUser, mode 0400, written atomically and never through a "
                    "symbolic link. Says which keys it left out and why; refuses to write a set with no key (the "
                    "old file stays). Writes only when the keys changed, then runs `scontrol reconfigure` (Slurm "
                    "reads the file once, at start), and a failed one again at each later run until it succeeds; "
                    "slurmdbd takes new keys only when restarted (said at each rotation). --watch runs this "
                    "every [oidc] slurm_refresh. Prints "
                    "the slurm.conf/slurmdbd.conf lines and, for Slinky, the ConfigMap for jwksKeyRef.",
        epilog=WARNING + "\n\nSee docs/operator/oidc-slurm.md.")
    parser.add_argument("--issuer", metavar="URL", help="the IdP's issuer URL (default: [oidc] issuer)")
    parser.add_argument("--ca-file", metavar="PEM", help="CA of the IdP's certificate (default: [oidc] ca_file)")
    parser.add_argument("--jwks-file", metavar="PATH", help="the JWKS file Slurm reads (default: [oidc] "
                        "slurm_jwks_file, /etc/slurm/jwks.json)")
    parser.add_argument("--userclaimfield", metavar="CLAIM", help="the claim Slurm takes as the user name "
                        "(default: [oidc] slurm_userclaimfield)")
    parser.add_argument("--slurm-user", metavar="USER", help="owner of the file (default: [oidc] slurm_user, else "
                        "SlurmUser from `scontrol show config`, else slurm)")
    parser.add_argument("--client-ids-only", action="store_true", help="add use_jwt_client_ids_only to the "
                        "lines: Slurm takes the user's uid, gid and groups from the token's claims, with no local "
                        "user database")
    parser.add_argument("--conf-out", metavar="DIR", help="write the lines to DIR/auth-jwt.conf (for an Include in "
                        "slurm.conf and slurmdbd.conf) and Slinky's ConfigMap to DIR/jwks-configmap.yaml instead of "
                        "printing them")
    parser.add_argument("--configmap", metavar="NAME", default="slurm-jwks", help="Slinky: the ConfigMap's name "
                        "(default slurm-jwks)")
    parser.add_argument("--namespace", metavar="NS", default="slurm", help="Slinky: its namespace (default slurm)")
    parser.add_argument("--no-reconfigure", action="store_true", help="after a change, leave `scontrol "
                        "reconfigure` to the operator")
    parser.add_argument("--watch", action="store_true", help="keep running: read the IdP's keys every [oidc] "
                        "slurm_refresh and rewrite the file (and reconfigure Slurm) when they change")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from . import slurmsync
    return slurmsync.main(args, sys.stdout)

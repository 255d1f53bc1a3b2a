"""The work of `slurm-ext oidc slurm`: one refresh of Slurm's JWKS file from the IdP (`refresh`), the loop of
`--watch`, and the configuration text Slurm and Slinky need (`conf_lines`, `slinky_configmap`).

A refresh writes only when the IdP's keys differ from the file's, and a rotation is followed by `scontrol
reconfigure`: Slurm's auth/jwt reads the file once, when it starts. The reconfigure a rotation owes is remembered
(a marker in [node] state_dir) from before the file is written until a reconfigure succeeds, and every refresh
that finds the marker retries it: once the file holds the IdP's keys nothing else would tell a refresh that Slurm
has not read them, whether the reconfigure failed or the run died before it (a timer's TimeoutSec, SIGKILL, OOM).
slurmdbd is not reached by any reconfigure (its `reconfig()` rereads slurmdbd.conf but never re-initialises the
auth plug-in), so a rotation says it needs a restart. Every refresh that writes, and every one that cannot (the IdP
unreachable, its answer not OpenID Connect's, no RSA key), is an event; a refused one leaves the file Slurm has
as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pwd
import signal
import stat
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import config, events
from slurm_ext.errors import SlurmError
from slurm_ext.slurm import SlurmClient

from .provider import OidcError, check_issuer_url
from .slurmjwks import SlurmJwks, change, fetch_slurm_jwks, write_jwks

__all__ = ["Options", "Refreshed", "refresh", "conf_lines", "slinky_configmap", "slurm_user", "main"]

#: the ConfigMap key Slinky projects to /etc/slurm/jwks.json (its operator's own name for it)
CONFIGMAP_KEY = "jwks.json"
#: where Slinky's operator puts the key it projects, and so the path its AuthAltParameters names
SLINKY_PATH = "/etc/slurm/jwks.json"


@dataclass(frozen=True, slots=True)
class Options:
    """What one `oidc slurm` run works with: the command line over [oidc]."""

    issuer: str
    ca_file: str
    timeout: float
    jwks_file: str
    userclaimfield: str
    #: the file's owner (a user name of this host)
    owner: str
    client_ids_only: bool
    reconfigure: bool
    refresh_every: float


@dataclass(frozen=True, slots=True)
class Refreshed:
    """What one refresh did."""

    jwks: SlurmJwks
    #: the file was written (False: it held these keys already)
    written: bool
    added: tuple[str, ...]
    removed: tuple[str, ...]
    #: `scontrol reconfigure` ran and succeeded
    reconfigured: bool
    #: why it did not reconfigure, or how it failed, or (reconfigured) the error of a marker that stays ("" when
    #: it reconfigured cleanly, or when nothing changed)
    reconfigure_note: str = ""
    #: the reconfigure ran for an earlier rotation whose reconfigure had failed (the file was already right)
    retried: bool = False
    #: what slurmdbd needs to take the new keys ("" when the keys did not change or the file is a first one)
    slurmdbd_note: str = ""


#: a rotation reaches slurmdbd only by a restart: `sacctmgr reconfigure` (and SIGHUP) run slurmdbd's reconfig(),
#: which rereads slurmdbd.conf but keeps the auth plug-in, and with it the keys it read at start
SLURMDBD_NOTE = ("slurmdbd reads the JWKS only when it starts (neither `scontrol reconfigure` nor `sacctmgr "
                 "reconfigure` makes it reread the file): restart slurmdbd, with its copy of the new file, for "
                 "accounting requests (sacct, slurmrestd's /slurmdb/) to take the new key's tokens")


def slurm_user(settings: config.Config, explicit: str | None) -> str:
    """The JWKS file's owner: `explicit`, [oidc] slurm_user, SlurmUser from `scontrol show config`, or slurm."""
    if explicit or settings.oidc.slurm_user:
        return explicit or settings.oidc.slurm_user
    try:
        found = SlurmClient(settings.slurm).show_config().get("SlurmUser", "")
    except SlurmError:
        return "slurm"
    return found.split("(")[0] or "slurm"


def _owner_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise OidcError(f"the JWKS file's owner {user!r} (SlurmUser) is not a user on this host: give --slurm-user "
                        "or [oidc] slurm_user") from None
    return entry.pw_uid, entry.pw_gid


def refresh(options: Options, settings: config.Config, emit) -> Refreshed:
    """Read the IdP's keys and, when they differ from the file's, write the file and reconfigure Slurm; when they
    do not, retry a reconfigure that failed after an earlier write (its marker says so).

    Raises:
        OidcError: the IdP or its keys cannot be used, or the file cannot be written (an event says so; the old
            file is kept).
    """
    pending = _pending_marker(settings, options.jwks_file)
    try:
        jwks = fetch_slurm_jwks(options.issuer, options.timeout, options.ca_file)
        uid, gid = _owner_ids(options.owner)
        diff = change(jwks, options.jwks_file)
        unmarked = ""
        if not diff.changed:
            _own(options.jwks_file, uid, gid)
        else:
            if options.reconfigure and not diff.first:
                # before the write: a run that dies between the write and the reconfigure leaves the marker, and
                # the next refresh (which finds the file "unchanged") reconfigures
                unmarked = _mark(pending, options.jwks_file)
            write_jwks(jwks, options.jwks_file, uid, gid)
    except OidcError as err:
        emit("oidc-slurm-jwks-refused", str(err), issuer=options.issuer, file=options.jwks_file)
        raise
    if not diff.changed:
        if options.reconfigure and pending is not None and pending.exists():
            reconfigured, note = _reconfigure(settings, emit, options.jwks_file, pending, "")
            if reconfigured:
                emit("oidc-slurm-reconfigured", f"{options.jwks_file}: `scontrol reconfigure` succeeded at a "
                     "retry: Slurm reads the keys written before", file=options.jwks_file, kids=list(jwks.kids))
            return Refreshed(jwks, False, (), (), reconfigured, note, retried=True)
        return Refreshed(jwks, False, (), (), False)
    reconfigured, note = False, ""
    if options.reconfigure and not diff.first:
        reconfigured, note = _reconfigure(settings, emit, options.jwks_file, pending, unmarked)
    elif not diff.first:
        note = "not asked (--no-reconfigure): run `scontrol reconfigure` for Slurm to read the new keys"
    else:
        note = "a first file: start (or restart) slurmctld and slurmdbd with AuthAltTypes=auth/jwt to use it"
    slurmdbd = "" if diff.first else SLURMDBD_NOTE
    dropped = [f"{d.kid or '(no kid)'}: {d.reason}" for d in jwks.dropped]
    emit("oidc-slurm-jwks-written", f"{options.jwks_file}: {len(jwks.keys)} keys from {jwks.source}"
         + (f", added {' '.join(diff.added)}" if diff.added else "")
         + (f", removed {' '.join(diff.removed)}" if diff.removed else "")
         + (f"; {slurmdbd}" if slurmdbd else ""),
         file=options.jwks_file, kids=list(jwks.kids), added=list(diff.added), removed=list(diff.removed),
         dropped=dropped, reconfigured=reconfigured, slurmdbd_restart=bool(slurmdbd))
    return Refreshed(jwks, True, diff.added, diff.removed, reconfigured, note, slurmdbd_note=slurmdbd)


def _pending_marker(settings: config.Config, path: str) -> Path | None:
    """Where a failed reconfigure for the JWKS file `path` is remembered: [node] state_dir (the journal's
    directory), one marker per file, named by a hash of its path (None: no state_dir, nothing is remembered)."""
    if not settings.node.state_dir:
        return None
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    return Path(settings.node.state_dir) / "oidc-slurm" / f"reconfigure-pending-{digest}"


def _own(path: str, uid: int, gid: int) -> None:
    """Keep an unchanged file SlurmUser's and 0400 (an operator's copy, a restore), never through a link.

    Raises:
        OidcError: `path` is a symbolic link or not a regular file, as write_jwks refuses it: "unchanged" would
            say the file is right when what Slurm reads is the link's target, which is not ours.
    """
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise OidcError(f"the JWKS file {path} is {what}: refused (put the file itself there)")
        if (info.st_uid, info.st_gid) != (uid, gid):
            os.chown(path, uid, gid, follow_symlinks=False)
        if info.st_mode & 0o777 != 0o400:
            os.chmod(path, 0o400)
    except OSError as err:
        raise OidcError(f"the JWKS file {path}: {err.strerror}") from None


def _mark(pending: Path | None, path: str) -> str:
    """Remember that Slurm owes a reconfigure for the JWKS file `path` (the marker `pending`); "" when it is
    remembered, else why not (no state_dir, or the marker cannot be written: said if the reconfigure then fails)."""
    if pending is None:
        return "no [node] state_dir to remember it in"
    try:
        pending.parent.mkdir(parents=True, exist_ok=True)
        pending.write_text(os.path.abspath(path) + "\n")
    except OSError as why:
        return f"{pending}: {why.strerror or why}"
    return ""


def _reconfigure(settings: config.Config, emit, path: str, pending: Path | None, unmarked: str) -> tuple[bool, str]:
    """`scontrol reconfigure`; the marker `pending` (written before the file, or by an earlier refresh) stays
    after a failure, for the next refresh to retry, and goes after a success. `unmarked`: why there is no marker.

    A success whose marker cannot be removed is an error, said and an event: the marker would make every later
    refresh reconfigure (slurmctld re-execs) again.
    """
    try:
        SlurmClient(settings.slurm).reconfigure()
    except SlurmError as err:
        note = (f"`scontrol reconfigure` failed ({str(err).strip()[-300:]}): Slurm keeps the old keys until it "
                "does")
        if unmarked:
            note += f"; cannot remember it for a retry ({unmarked}): run it yourself"
        else:
            note += "; retried at each refresh until it succeeds"
        emit("oidc-slurm-reconfigure-failed", note, file=path)
        return False, note
    if pending is not None:
        try:
            pending.unlink(missing_ok=True)
        except OSError as why:
            note = (f"`scontrol reconfigure` succeeded, but its marker {pending} cannot be removed "
                    f"({why.strerror or why}): every refresh will reconfigure Slurm again (slurmctld re-execs) "
                    "until it is removed: remove it")
            emit("oidc-slurm-marker-stuck", note, file=path, marker=str(pending))
            return True, note
    return True, ""


def conf_lines(jwks_file: str, userclaimfield: str, client_ids_only: bool) -> str:
    """The slurm.conf and slurmdbd.conf lines for auth/jwt with the JWKS at `jwks_file`."""
    parameters = f"jwks={jwks_file},userclaimfield={userclaimfield}"
    if client_ids_only:
        parameters += ",use_jwt_client_ids_only"
    return f"AuthAltTypes=auth/jwt\nAuthAltParameters={parameters}\n"


def slinky_configmap(jwks: SlurmJwks, name: str, namespace: str) -> str:
    """The ConfigMap that a Slinky Controller's and Accounting's `spec.jwksKeyRef` names (its key projected to
    /etc/slurm/jwks.json), as YAML, with the jwksKeyRef to put in both."""
    body = "".join(f"    {line}\n" for line in jwks.text().splitlines())
    return (f"# Slinky (1.1+): in the Controller's and the Accounting's spec:\n"
            f"#   jwksKeyRef:\n#     name: {name}\n#     key: {CONFIGMAP_KEY}\n"
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
            f"  labels:\n    app.kubernetes.io/managed-by: slurm-ext\ndata:\n  {CONFIGMAP_KEY}: |\n{body}")


def _options(args: argparse.Namespace, settings: config.Config) -> Options:
    oidc = settings.oidc
    issuer = args.issuer or oidc.issuer
    if not issuer:
        raise OidcError("no issuer: give --issuer URL or set [oidc] issuer")
    check_issuer_url(issuer)
    claim = args.userclaimfield or oidc.slurm_userclaimfield
    if not claim.replace("_", "").replace("-", "").replace(".", "").replace(":", "").isalnum() or claim != claim.lower():
        raise OidcError(f"--userclaimfield {claim!r}: expected a lower-case claim name (Slinky lower-cases "
                        "AuthAltParameters, and a comma would end it)")
    jwks_file = args.jwks_file or oidc.slurm_jwks_file
    if not os.path.isabs(jwks_file):
        raise OidcError(f"--jwks-file {jwks_file!r}: expected an absolute path (Slurm reads it from its own "
                        "working directory)")
    return Options(issuer=issuer, ca_file=args.ca_file if args.ca_file is not None else oidc.ca_file,
                   timeout=oidc.timeout, jwks_file=jwks_file, userclaimfield=claim,
                   owner=slurm_user(settings, args.slurm_user), client_ids_only=args.client_ids_only,
                   reconfigure=not args.no_reconfigure, refresh_every=oidc.slurm_refresh)


def _say(out, options: Options, done: Refreshed) -> None:
    jwks = done.jwks
    if done.written:
        changes = "".join(f"; {word} {' '.join(kids)}" for word, kids in (("added", done.added),
                                                                          ("removed", done.removed)) if kids)
        print(f"wrote {options.jwks_file} ({options.owner}, 0400): {len(jwks.keys)} keys {' '.join(jwks.kids)} "
              f"from {jwks.source}{changes}", file=out)
    else:
        print(f"unchanged: {options.jwks_file} holds the IdP's keys already ({' '.join(jwks.kids)})", file=out)
    for dropped in jwks.dropped:
        print(f"left out {dropped.kid or '(no kid)'}: {dropped.reason}", file=out)
    if done.reconfigured:
        again = " (a retry: the last one had failed)" if done.retried else ""
        print(f"reconfigured Slurm (scontrol reconfigure){again}: slurmctld and slurmd read the new keys", file=out)
        if done.reconfigure_note:
            print(f"slurm-ext: error: {done.reconfigure_note}", file=out)
    elif done.reconfigure_note:
        print(f"Slurm: {done.reconfigure_note}", file=out)
    if done.slurmdbd_note:
        print(f"slurmdbd: {done.slurmdbd_note}", file=out)


def _conf_out(args: argparse.Namespace, options: Options, jwks: SlurmJwks, out) -> None:
    lines = conf_lines(options.jwks_file, options.userclaimfield, options.client_ids_only)
    configmap = slinky_configmap(jwks, args.configmap, args.namespace)
    if args.conf_out:
        from slurm_ext.fileio import atomic_write
        directory = Path(args.conf_out)
        try:
            atomic_write(directory / "auth-jwt.conf", lines, mode=0o644)
            atomic_write(directory / "jwks-configmap.yaml", configmap, mode=0o644)
        except OSError as err:
            raise OidcError(f"--conf-out {directory}: cannot write ({err.strerror or err})") from None
        print(f"wrote {directory / 'auth-jwt.conf'} (Include it in slurm.conf and slurmdbd.conf) and "
              f"{directory / 'jwks-configmap.yaml'} (Slinky)", file=out)
        return
    print(f"\n# slurm.conf and slurmdbd.conf (both check tokens):\n{lines}", file=out)
    slinky = f"AuthAltParameters=userclaimfield={options.userclaimfield}" + (
        ",use_jwt_client_ids_only" if options.client_ids_only else "")
    print(f"# Slinky: its operator writes AuthAltTypes and jwks={SLINKY_PATH} itself; add, in the Controller's "
          f"extraConf (merged, lower-cased):\n#   {slinky}\n{configmap}", file=out)


def main(args: argparse.Namespace, out) -> int:
    """`oidc slurm` with parsed `args`: 0 when the file holds the IdP's keys, 1 when it could not."""
    settings = config.load(args.config)
    emit = events.emitter(settings.node.state_dir, "oidc")
    options = _options(args, settings)
    if not args.watch:
        done = refresh(options, settings, emit)
        _say(out, options, done)
        _conf_out(args, options, done.jwks, out)
        print(f"\n{_warning()}", file=out)
        return 0
    return _watch(args, options, settings, emit, out)


def _warning() -> str:
    from .slurmcli import WARNING
    return WARNING


def _watch(args: argparse.Namespace, options: Options, settings: config.Config, emit, out) -> int:
    """Refresh every options.refresh_every until SIGTERM or SIGINT; a refused refresh is said and retried."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"watching {options.issuer}'s keys every {options.refresh_every:g}s for {options.jwks_file}\n"
          f"{_warning()}", file=out, flush=True)
    first = True
    while not stop.is_set():
        try:
            done = refresh(options, settings, emit)
            if done.written or done.retried or first:
                _say(out, options, done)
                if first:
                    _conf_out(args, options, done.jwks, out)
                first = False
        except OidcError as err:
            print(f"slurm-ext: error: {err} (retried in {options.refresh_every:g}s)", file=out)
        except Exception as err:  # noqa: BLE001 - a bug or an unforeseen error must not end the refresh for good
            # (the file would then stay on the old keys until someone notices): said with its traceback, an
            # event, and tried again at the next turn
            trace = traceback.format_exc()
            print(f"slurm-ext: error: unexpected {type(err).__name__} in the refresh of {options.jwks_file}: {err} "
                  f"(retried in {options.refresh_every:g}s)\n{trace}", file=out)
            emit("oidc-slurm-refresh-failed", f"{options.jwks_file}: unexpected {type(err).__name__}: {err}",
                 issuer=options.issuer, file=options.jwks_file, traceback=trace)
        out.flush()
        stop.wait(options.refresh_every)
    return 0

"""The database accounts slurm-ext's parts connect as, and what each may do there: least privilege per role.

- slurmdbd (accounting.db_user): ALL on its database (accounting.database), nothing of slurm-ext's;
- the repair store (`slurm_ext_repair`): ALL on slurm-ext's own database (accounting.own_database) only;
- the page (`slurm_ext_page`): reads slurm-ext's database and writes the decisions it takes there
  (SELECT, INSERT, UPDATE: no DELETE, no schema change), nothing of slurmdbd's;
- backups (`slurm_ext_backup`): read-only on both (SELECT, LOCK TABLES, SHOW VIEW, EVENT, TRIGGER, and
  SELECT on mysql.proc for the routines' bodies).

A role has its own account where its password file is set ([accounting] repair_password_file,
page_password_file, backup_password_file: the Slinky manifests set all three), and wherever slurm-ext
runs the database (accounting.run_database): there a role without a file of its own gets an account all
the same, with slurmdbd's password (one password for a dev cluster or a small site), so that slurmdbd's
account holds nothing of slurm-ext's and `accounting restore` may run the backup's SQL as it. Only on a
server slurm-ext does not run does a role without a file connect as slurmdbd's account, which must then
hold that role's grants as well (the site made the accounts). `init_statements` is the accounts' part of
the start-up SQL, which takes back at every start what an account no longer needs; `login` is who a role
connects as.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from slurm_ext.errors import ConfigError

__all__ = ["ROLES", "OWN_USERS", "Account", "grants", "password_file_of", "has_own_account", "accounts", "init_statements", "login"]

#: the parts that connect to the database
ROLES = ("slurmdbd", "repair", "page", "backup")
#: the user of each role that may have an account of its own (slurmdbd's is accounting.db_user)
OWN_USERS = {"repair": "slurm_ext_repair", "page": "slurm_ext_page", "backup": "slurm_ext_backup"}
#: the hosts every account is made for: TCP from other pods or hosts, and the local socket
_HOSTS = ("%", "localhost")
#: MariaDB's table of stored routines, which mariadb-dump --routines reads
_PROC = "`mysql`.`proc`"


@dataclass(frozen=True, slots=True)
class Account:
    """One database user and the roles that connect as it."""

    user: str
    roles: tuple[str, ...]
    #: the file its password is read from; "": slurmdbd's password (accounting.password_file or
    #: $SLURM_EXT_DB_PASSWORD)
    password_file: str


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def grants(settings, role: str) -> tuple[str, ...]:
    """What `role` may do, as the `PRIVILEGES ON object` part of GRANT statements."""
    db, own = f"{_quoted(settings.database)}.*", f"{_quoted(settings.own_database)}.*"
    read_only = "SELECT, LOCK TABLES, SHOW VIEW, EVENT, TRIGGER"
    return {"slurmdbd": (f"ALL PRIVILEGES ON {db}",),
            "repair": (f"ALL PRIVILEGES ON {own}",),
            "page": (f"SELECT, INSERT, UPDATE ON {own}",),
            "backup": (f"{read_only} ON {db}", f"{read_only} ON {own}", f"SELECT ON {_PROC}")}[role]


def password_file_of(settings, role: str) -> str:
    """The password file of `role`'s own account ("" for slurmdbd, or where the role has none)."""
    return {"slurmdbd": "", "repair": settings.repair_password_file, "page": settings.page_password_file,
            "backup": settings.backup_password_file}[role]


def has_own_account(settings, role: str) -> bool:
    """Whether `role` connects as an account of its own: where its password file is set, or slurm-ext's start-up
    SQL makes the accounts (run_database)."""
    return role != "slurmdbd" and (settings.run_database or bool(password_file_of(settings, role)))


def accounts(settings) -> list[Account]:
    """slurmdbd's account (with the grants of every role that has none of its own), then one per role that has."""
    own = [role for role in ROLES[1:] if has_own_account(settings, role)]
    shared = Account(settings.db_user, tuple(role for role in ROLES if role not in own), "")
    return [shared] + [Account(OWN_USERS[role], (role,), password_file_of(settings, role)) for role in own]


def init_statements(settings, passwords: dict[str, str], sql_string) -> list[str]:
    """The start-up SQL's statements for every account: made, its password set to the one of now, everything it
    held taken back (a role moved to its own account leaves nothing behind in slurmdbd's), then its grants.
    Idempotent, and without a statement that can fail on a database of before (the init file stops at the first
    error): `REVOKE ALL PRIVILEGES, GRANT OPTION` takes whatever there is, nothing included.

    `passwords`: user -> password, for every account of `accounts(settings)`; `sql_string` quotes one.
    """
    statements = [f"CREATE DATABASE IF NOT EXISTS {_quoted(name)}" for name in (settings.database,
                                                                               settings.own_database)]
    for account in accounts(settings):
        secret = sql_string(passwords[account.user])
        for host in _HOSTS:
            who = f"'{account.user}'@'{host}'"
            statements += [f"CREATE USER IF NOT EXISTS {who} IDENTIFIED BY {secret}",
                           f"ALTER USER {who} IDENTIFIED BY {secret}",
                           f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM {who}"]
            statements += [f"GRANT {grant} TO {who}" for role in account.roles for grant in grants(settings, role)]
            if "slurmdbd" in account.roles:
                # `accounting restore` (as this account) must see slurmdbd's connections (PROCESS: every session
                # in PROCESSLIST) to refuse loading under a running slurmdbd
                statements.append(f"GRANT PROCESS ON *.* TO {who}")
    return statements


def login(settings, role: str, environ: dict[str, str], source: str = "<defaults>") -> tuple[str, str]:
    """(user, password) that `role` connects with: its own account where it has one (`has_own_account`), with
    its password file's password or else slurmdbd's; otherwise slurmdbd's account (accounting.db_user with
    accounting.password_file or $SLURM_EXT_DB_PASSWORD).

    Raises:
        ConfigError: the password cannot be read or used (the message names the file).
    """
    from .database import password
    own_file = password_file_of(settings, role)
    if own_file:  # read with every check slurmdbd's password gets
        return OWN_USERS[role], password(dataclasses.replace(settings, password_file=own_file), {}, source)
    if os.geteuid() != 0 and role != "slurmdbd":
        raise ConfigError(f"accounting.{role}_password_file", f"empty, and the {role} runs as uid {os.geteuid()}, "
                          "not root: it is never given slurmdbd's password (with which it could write the "
                          "accounting database, and approve repairs); give it an account of its own: a file with "
                          f"its password (root's, 0600) named by accounting.{role}_password_file, which the "
                          "start-up SQL makes the account with (restart the accounting agent)")
    user = OWN_USERS[role] if has_own_account(settings, role) else settings.db_user
    return user, password(settings, environ, source)

"""Durable accounting's config: [accounting].

Declared by the component and registered with the core
(`slurm_ext.config.register_section`), which imports this module by name
when a config needs the section.
"""

from dataclasses import dataclass

from slurm_ext.config import register_section, setting

__all__ = ["AccountingSection", "PASSWORD_ENV"]

#: the environment variable the database password may come from (a Kubernetes Secret's env)
PASSWORD_ENV = "SLURM_EXT_DB_PASSWORD"


@dataclass(frozen=True, slots=True)
class AccountingSection:
    """slurmdbd and its MariaDB: files, storage guard, queue watch, backups, reconciliation."""

    volume: str = setting("/var/lib/slurm-ext/accounting", "the database's persistent volume: MariaDB's datadir "
                          "(mysql/), tmpdir (tmp/) and logs (log/) live in it, with its identity marker", "path")
    run_database: bool = setting(False, "run MariaDB in the accounting role's agent (mariadbd first, slurmdbd once "
                                 "it answers); false: the database is elsewhere (db_host)", "bool")
    cluster: str = setting("", "the cluster the database belongs to; empty: slurm.conf's ClusterName", "str",
                           pattern=r"^[A-Za-z0-9_-]*$")
    database: str = setting("slurm_acct_db", "slurmdbd's database (StorageLoc)", "str", pattern=r"^[A-Za-z0-9_]+$")
    own_database: str = setting("slurm_ext", "slurm-ext's own database on the same server (the repair history): "
                                "created and granted to db_user beside slurmdbd's, on the same volume", "str",
                                pattern=r"^[A-Za-z0-9_]+$")
    db_user: str = setting("slurm", "slurmdbd's database user (StorageUser)", "str", pattern=r"^[A-Za-z0-9_]+$")
    db_host: str = setting("127.0.0.1", "the database's address (StorageHost)", "str", pattern=r"^[A-Za-z0-9.:_-]+$")
    db_port: int = setting(3306, "the database's TCP port (StoragePort; MariaDB's port when run_database)", "int",
                           minimum=1, maximum=65535)
    db_listen: str = setting("127.0.0.1", "MariaDB's bind-address when run_database (0.0.0.0 in a pod that other "
                             "pods reach)", "str", pattern=r"^[0-9A-Fa-f.:]+$")
    password_file: str = setting("", f"file holding the database password (a Secret's mount); empty: the "
                                 f"environment variable {PASSWORD_ENV}. Never on a command line", "path",
                                 empty_ok=True)
    repair_password_file: str = setting("", "file holding the password of the repair store's own account "
                                        "(slurm_ext_repair: ALL on own_database only); empty: slurmdbd's password, "
                                        "or with a database slurm-ext does not run (run_database off), db_user, "
                                        "which then holds own_database too", "path",
                                        empty_ok=True)
    page_password_file: str = setting("", "file holding the password of the page's own account (slurm_ext_page: "
                                      "SELECT, INSERT, UPDATE on own_database only); empty: slurmdbd's password, "
                                      "or without run_database db_user, which then holds those grants too; "
                                      "needed where the page runs as web.user, not root (never given slurmdbd's)", "path", empty_ok=True)
    backup_password_file: str = setting("", "file holding the password of backups' own account (slurm_ext_backup: "
                                        "SELECT, LOCK TABLES, SHOW VIEW, EVENT, TRIGGER on database and "
                                        "own_database); empty: slurmdbd's password, or without run_database "
                                        "db_user", "path", empty_ok=True)
    memory: int = setting(0, "MiB of memory given to MariaDB: innodb_buffer_pool_size is half of it (at least "
                          "128); 0: the container's memory limit, else a quarter of the host's memory", "int",
                          minimum=0, maximum=16777216)
    slurm_user: str = setting("", "slurmdbd's SlurmUser, owner of slurmdbd.conf; empty: slurm.conf's SlurmUser "
                              "(Slurm's default: root)", "str", pattern=r"^[a-z_][a-z0-9_-]*$|^$")
    slurmdbd_conf: str = setting("", "where `accounting config` writes slurmdbd.conf; empty: beside slurm.conf, "
                                 "where slurmdbd looks", "path", empty_ok=True)
    dbd_host: str = setting("localhost", "slurmdbd's DbdHost (the name it answers to)", "str",
                            pattern=r"^[A-Za-z0-9._-]+$")
    dbd_addr: str = setting("", "slurmdbd's DbdAddr (where it listens); empty: DbdHost's address", "str",
                            pattern=r"^[0-9A-Za-z.:_-]*$")
    dbd_port: int = setting(6819, "slurmdbd's DbdPort", "int", minimum=1, maximum=65535)
    state_save_location: str = setting("", "slurmctld's StateSaveLocation, which the controller role guards; "
                                       "empty: slurm.conf's", "path", empty_ok=True)
    allow_ephemeral: bool = setting(False, "let the storage guard accept tmpfs or a container's own layer: "
                                    "for demos only, and every line of the guard says so",
                                    "bool")
    min_free: int = setting(1024, "MiB that must be free on the volume and on StateSaveLocation at start", "int",
                            minimum=0, maximum=16777216)
    queue_interval: float = setting(10.0, "how often the controller agent reads sdiag's DBD agent queue size",
                                    "duration", minimum=0.5, maximum=3600.0)
    queue_alert_after: float = setting(60.0, "a DBD agent queue above 0 for this long is an event "
                                       "(dbd-queue-growing)", "duration", minimum=0.0, maximum=86400.0)
    stop_deadline: float = setting(300.0, "longest the controller agent lets slurmctld take to stop while accounting "
                                   "records are queued (it writes them to dbd.messages) before SIGKILL",
                                   "duration", minimum=1.0, maximum=86400.0)
    backup_dir: str = setting("/var/backups/slurm-ext/accounting", "`accounting backup`'s default --to", "path")
    backup_keep: int = setting(7, "backups `accounting backup` keeps in its directory (the oldest by their "
                               "manifests' authenticated times go)", "int", minimum=1, maximum=10000)
    backup_key: str = setting("/etc/slurm-ext/backup.key", "the key whose HMAC authenticates every backup's manifest "
                              "(verify and restore take no backup without it): root's, 0600, made by the first "
                              "backup where missing; keep it off the backup volume", "path")
    witness: str = setting("", "the job-end witness `accounting reconcile` reads: Slurm's jobcomp/filetxt log "
                           "(slurm.conf JobCompType=jobcomp/filetxt, JobCompLoc=FILE); empty: slurm.conf's "
                           "JobCompLoc", "path", empty_ok=True)


register_section("accounting", AccountingSection)

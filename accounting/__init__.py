"""slurmdbd and MariaDB on persistent storage: guarded, watched, backed up, reconciled.

Slurm loses accounting in a few known ways: a database on a volume that is
gone after a reschedule, and the records slurmctld holds in memory while
slurmdbd is away, which it writes to StateSaveLocation/dbd.messages only at a
clean stop. This component closes them:

- `write_config(config)`: slurmdbd.conf, MariaDB's option file and start-up
  SQL, the password from a file or the environment (`slurm-ext accounting config`);
- `prepare_storage(config, role)`: the durability guard and first
  initialisation (`check-storage`, a start step of the accounting and
  controller roles);
- `QueueWatch`: the controller agent's reading of sdiag's DBD agent queue
  (metric, events, and no SIGKILL of slurmctld while it holds records);
- `backup`, `restore`, `verify`: consistent dumps with a manifest authenticated by the backup key;
- `reconcile(config)`: every job end a witness saw that sacct lacks.

Its config is [accounting] (`settings`); its commands `slurm-ext accounting ...` (`cli`).
"""

from slurm_ext.lazy import lazy_names

__all__ = ["write_config", "configured", "prepare_storage", "guarded_volumes", "places_of", "QueueWatch",
           "SpaceWatch", "backup", "restore", "verify", "reconcile", "PASSWORD_ENV", "EPHEMERAL_NOTE"]

# Imported on first use: the core imports this package for its config section, and the node agent for
# its start steps; the backup and reconcile code is needed only by their commands.
_LAZY = {"write_config": "database", "configured": "database", "prepare_storage": "database",
         "guarded_volumes": "database", "places_of": "database", "QueueWatch": "queue", "SpaceWatch": "storage",
         "backup": "backups", "restore": "backups", "verify": "backups", "reconcile": "reconcile",
         "PASSWORD_ENV": "settings", "EPHEMERAL_NOTE": "storage"}


__getattr__ = lazy_names(__name__, _LAZY)

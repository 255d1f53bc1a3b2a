"""slurmdbd and MariaDB on persistent storage: guarded, backed up, reconciled.

Not built yet: this package only reserves the layout's place.
"""

__all__: list[str] = []

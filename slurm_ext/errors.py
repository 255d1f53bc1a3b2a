"""The one exception family of slurm-ext.

Every error an operator can act on is a `SlurmExtError`; the CLI prints its
message and exits without a traceback. Subclasses keep the facts (key, node,
command) as fields and build their message from them, so callers can branch
on the facts and people can read the text.
"""

from __future__ import annotations

__all__ = [
    "SlurmExtError",
    "ConfigError",
    "CommandError",
    "CommandTimeout",
    "SlurmError",
    "SlurmUnreachable",
    "NotOurDrain",
    "DevClusterError",
    "AgentError",
]


class SlurmExtError(Exception):
    """Base of every error slurm-ext raises on purpose."""

    #: exit status the CLI uses for this error
    exit_code = 1


class ConfigError(SlurmExtError):
    """The config file is unreadable, not TOML, or holds a bad key or value."""

    exit_code = 2

    def __init__(self, path, problem: str, key: str | None = None, line: int | None = None):
        self.path = path
        self.key = key
        self.problem = problem
        self.line = line
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if key:
            where += f": {key}"
        super().__init__(f"{where}: {problem}")


class CommandError(SlurmExtError):
    """An external command failed (non-zero exit, or it could not be started)."""

    def __init__(self, cmd: list[str], returncode: int | None, stderr: str = "", message: str | None = None):
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr.strip()
        if message is None:
            detail = f": {self.stderr.splitlines()[-1]}" if self.stderr else ""
            message = f"{' '.join(self.cmd)} exited with status {returncode}{detail}"
        super().__init__(message)


class CommandTimeout(CommandError):
    """An external command ran past its timeout and was killed."""

    def __init__(self, cmd: list[str], timeout: float, stderr: str = ""):
        self.timeout = timeout
        super().__init__(cmd, None, stderr, f"{' '.join(cmd)} did not finish within {timeout:g}s and was killed")


class SlurmError(SlurmExtError):
    """Slurm answered, but refused or failed the request."""

    def __init__(self, message: str, cmd: list[str] | None = None):
        self.cmd = list(cmd or [])
        super().__init__(message)


class SlurmUnreachable(SlurmError):
    """slurmctld or slurmdbd did not answer within the timeout."""


class SlurmTooOld(SlurmError):
    """The installed Slurm lacks what the configuration asks of it (a key of a later release): asking again will not
    help; the message names the key and the release that has it."""


class NotOurDrain(SlurmError):
    """A resume was refused because the node's drain was not set by slurm-ext."""

    def __init__(self, node: str, reason: str):
        self.node = node
        self.reason = reason
        super().__init__(
            f"node {node}: not resuming: its reason {reason!r} was not set by slurm-ext "
            f"(only reasons starting 'slurm-ext:' are ours; an admin must resume it)"
        )


class DevClusterError(SlurmExtError):
    """The local development cluster cannot be brought up or down."""


class AgentError(SlurmExtError):
    """The node agent cannot start (its listener's port is taken, ...)."""

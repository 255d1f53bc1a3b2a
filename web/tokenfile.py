"""The lines of the operators' token file as `slurm-ext web` lists, adds and revokes them: `token_lines`,
`without`, `new_line`.

A line is `USER sha256:HASH # added TIME`: the comment, which `auth.Tokens` ignores, says when the token was
made (lines written by hand or before it have none). A token is named to operators by its fingerprint, the first
12 hex digits of its SHA-256: enough to tell one user's tokens apart, never enough to be the token or its hash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from .auth import _HASH, _USER, HASH_PREFIX, TOKEN_ROLES, token_hash

__all__ = ["TokenLine", "token_lines", "without", "new_line", "FINGERPRINT_DIGITS"]

#: hex digits of a token's SHA-256 that name it
FINGERPRINT_DIGITS = 12
_ADDED = re.compile(r"\badded (\S+)")


@dataclass(frozen=True, slots=True)
class TokenLine:
    """One token of the file."""

    user: str
    #: the token's SHA-256, hex
    digest: str
    #: when it was made (ISO 8601 with the zone), "" where the line does not say
    added: str
    #: its line in the file, from 1
    number: int
    #: what the token may do on the page (a line without a role: operator, as before roles)
    role: str = "operator"

    @property
    def fingerprint(self) -> str:
        return self.digest[:FINGERPRINT_DIGITS]


def token_lines(text: str) -> list[TokenLine]:
    """The tokens of a token file's `text`, in its order (plain-text tokens and other lines are not tokens here:
    `auth.Tokens` does not use them either)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        content, _, comment = line.partition("#")
        words = content.split()
        if len(words) in (2, 3) and _USER.match(words[0]) and _HASH.match(words[1]) \
                and (len(words) == 2 or words[2] in TOKEN_ROLES):
            added = _ADDED.search(comment)
            found.append(TokenLine(words[0], words[1].removeprefix(HASH_PREFIX), added.group(1) if added else "",
                                   number, words[2] if len(words) == 3 else "operator"))
    return found


def without(text: str, drop: Callable[[TokenLine], bool]) -> tuple[str, list[TokenLine]]:
    """`text` without the token lines `drop` picks (every other line as it was), and those lines."""
    dropped = [line for line in token_lines(text) if drop(line)]
    gone = {line.number for line in dropped}
    kept = [line for number, line in enumerate(text.splitlines(), 1) if number not in gone]
    return "".join(f"{line}\n" for line in kept), dropped


def new_line(user: str, token: str, now: datetime, role: str = "operator") -> str:
    """The line of a new token of `user`, made at `now` (an aware time); an operator's without a role word, as
    before roles, so an older page reads it too."""
    named = "" if role == "operator" else f" {role}"
    return f"{user} {token_hash(token)}{named} # added {now.isoformat(timespec='seconds')}\n"

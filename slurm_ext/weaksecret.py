"""Whether a secret a cluster runs on is one an attacker can guess: too short, or a placeholder left in place.

Manifests and examples show where a secret goes; a deployment applied as shipped, or copied from a
tutorial, runs with a value everybody has read (Slurm's key then lets anyone forge credentials as root
on every node). `weakness` says why a secret must not be used; the callers refuse it at start, naming
the file.
"""

from __future__ import annotations

__all__ = ["PLACEHOLDERS", "weakness"]

#: words that mark a value as an example to replace, matched anywhere in the secret, case-insensitively
#: (a random value holds none of them: hex or base64 output never does, 1 KiB of random bytes about
#: once in 10^9)
PLACEHOLDERS = ("replace-me", "replace_me", "replaceme", "changeme", "change-me", "change_me", "placeholder",
                "example", "secret", "password")


def weakness(secret: bytes, minimum: int) -> str | None:
    """Why `secret` must not be used (shorter than `minimum` bytes, or holding a placeholder word); None when
    it may. Trailing newlines do not count toward the length."""
    value = secret.rstrip(b"\r\n")
    lowered = value.lower()
    for word in PLACEHOLDERS:
        if word.encode() in lowered:
            return f"holds the placeholder {word!r} (a value anyone who read the example knows)"
    if len(value) < minimum:
        return f"is {len(value)} bytes long (expected at least {minimum})"
    return None

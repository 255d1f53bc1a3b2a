"""Numbers in the sentences operators read: "1 finding", "2 findings", never "1 findings"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str = "") -> str:
    """`count` and `noun`, the noun in the plural unless the count is one (`plural` where adding "s" is wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"

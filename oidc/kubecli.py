"""Placeholder: filled by the kubecli work in progress."""

from __future__ import annotations

__all__ = ["add_command"]


def add_command(actions) -> None:
    """Not yet."""

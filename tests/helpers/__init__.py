"""Helpers the tests share, each module with one job and tests of its own (tests/test_helpers.py)."""

"""Moved to :mod:`infera_core.cli.alias`; this re-export stays for one release."""

from infera_core.cli.alias import flat_main_for, main_for

__all__ = ["flat_main_for", "main_for"]

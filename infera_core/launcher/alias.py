"""Moved to :mod:`infera_core.cli.alias`; this re-export stays for one release."""

from infera_core.cli.alias import *  # noqa: F403

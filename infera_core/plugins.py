"""Moved to :mod:`infera_core.plugin.loader`; this re-export stays for one release."""

from infera_core.plugin.loader import *  # noqa: F403

"""Moved to :mod:`infera_core.plugin.hooks`; this re-export stays for one release."""

from infera_core.plugin.hooks import *  # noqa: F403

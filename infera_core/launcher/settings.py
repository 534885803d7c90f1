"""Moved to :mod:`infera_core.engines.settings`; this re-export stays for one release."""

from infera_core.engines.settings import *  # noqa: F403

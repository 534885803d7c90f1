"""Moved to :mod:`infera_core.engines.support`; this re-export stays for one release."""

from infera_core.engines.support import *  # noqa: F403

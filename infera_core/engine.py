"""Moved to :mod:`infera_core.engines.base`; this re-export stays for one release."""

from infera_core.engines.base import *  # noqa: F403

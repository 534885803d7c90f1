"""Moved to :mod:`infera_core.engines.transfer`; this re-export stays for one release."""

from infera_core.engines.transfer import *  # noqa: F403

"""Moved to :mod:`infera_core.engines.pd`; this re-export stays for one release."""

from infera_core.engines.pd import *  # noqa: F403

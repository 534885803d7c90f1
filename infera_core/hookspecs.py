"""Moved to :mod:`infera_core.plugin.spec`; this re-export stays for one release."""

from infera_core.plugin.spec import *  # noqa: F403

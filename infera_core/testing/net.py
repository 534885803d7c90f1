"""Moved to :mod:`infera_core.util.net`; this re-export stays for one release."""

from infera_core.util.net import *  # noqa: F403

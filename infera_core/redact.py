"""Moved to :mod:`infera_core.util.redact`; this re-export stays for one release."""

from infera_core.util.redact import *  # noqa: F403

"""Moved to :mod:`infera_core.transports.http.native`; this re-export stays for one release."""

from infera_core.transports.http.native import *  # noqa: F403

"""Moved to :mod:`infera_core.transports.http.http1`; this re-export stays for one release."""

from infera_core.transports.http.http1 import *  # noqa: F403

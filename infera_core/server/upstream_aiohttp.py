"""Moved to :mod:`infera_core.transports.http.aiohttp_upstream`; this re-export stays for one release."""

from infera_core.transports.http.aiohttp_upstream import *  # noqa: F403

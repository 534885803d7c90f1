"""Moved to :mod:`infera_core.transports.http.http1`; this re-export stays for one release."""

from infera_core.transports.http.http1 import HIGH_WATER, Http1Connection, Http1Response, UpstreamClosed

__all__ = ["HIGH_WATER", "Http1Connection", "Http1Response", "UpstreamClosed"]

"""Moved to :mod:`infera_core.transports.http.native`; this re-export stays for one release."""

from infera_core.transports.http.native import KEEPALIVE_S, NativeUpstream

__all__ = ["KEEPALIVE_S", "NativeUpstream"]

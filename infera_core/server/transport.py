"""Moved to :mod:`infera_core.transports.upstreams`; this re-export stays for one release."""

from infera_core.transports.clients import Upstreams
from infera_core.transports.http import make_upstream
from infera_core.transports.upstreams import (
    READ_ERRORS,
    PoolTimeoutError,
    RequestTooLargeError,
    TransportDownError,
    TransportKind,
    Upstream,
    UpstreamError,
    UpstreamReadError,
    UpstreamResponse,
    UpstreamTarget,
    set_nodelay,
)

__all__ = [
    "READ_ERRORS",
    "PoolTimeoutError",
    "RequestTooLargeError",
    "TransportDownError",
    "TransportKind",
    "Upstream",
    "UpstreamError",
    "UpstreamReadError",
    "UpstreamResponse",
    "UpstreamTarget",
    "Upstreams",
    "make_upstream",
    "set_nodelay",
]

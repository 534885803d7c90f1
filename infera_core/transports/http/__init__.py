"""The ``http`` request transport's two clients: the native keep-alive client
(:mod:`.native`, the default) and aiohttp (:mod:`.aiohttp_upstream`, optional)."""

from __future__ import annotations

from typing import Any

from infera_core.errors import require_module
from infera_core.transports.upstreams import TransportKind, Upstream


def require_http_client(kind: str) -> None:
    """A :class:`ConfigError` (one line naming the flag and the install) when ``kind``'s
    library is not installed."""
    if kind == "aiohttp":
        require_module("aiohttp", "--http-client aiohttp", "aiohttp")


def make_upstream(
    kind: TransportKind | str,
    *,
    connect_timeout: float,
    first_byte_timeout: float,
    idle_timeout: float,
    max_connections: int,
    pool_timeout: float = 10.0,
) -> Upstream:
    cls: type[Any]
    require_http_client(kind)
    if kind == "aiohttp":
        # aiohttp is an optional dependency, imported only when asked for
        from infera_core.transports.http.aiohttp_upstream import AiohttpUpstream as cls
    else:
        from infera_core.transports.http.native import NativeUpstream as cls
    upstream: Upstream = cls(
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
        pool_timeout=pool_timeout,
    )
    return upstream

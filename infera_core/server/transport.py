"""The upstream hop: what every transport to workers provides, and which one a server uses.

Two implementations, chosen with ``--upstream-transport``:

* ``native`` (:mod:`infera_core.server.upstream_native`): asyncio protocols parsing with
  ``httptools``, a keep-alive pool per worker, each request written as one buffer;
* ``aiohttp`` (:mod:`infera_core.server.upstream_aiohttp`): one ``aiohttp.ClientSession``
  per process.

Both set TCP_NODELAY on every connection (:func:`set_nodelay` does the same for the
server's accepted sockets, see ``server.run``). :meth:`Upstream.open` sends the client's
bytes unchanged and returns once the worker's response headers arrived (the "first
byte"); everything before that is retryable (:class:`UpstreamError`), everything after is
not. Reading the body raises one of :data:`READ_ERRORS` (each transport turns its client
library's errors into :class:`UpstreamReadError`, so aiohttp loads only when selected).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

from infera_core.scheduling.types import Endpoint

TransportKind = Literal["native", "aiohttp"]


class UpstreamReadError(OSError):
    """Reading a worker's response body failed (the connection broke, the body was malformed)."""


READ_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError)
"""What reading a response body may raise when the worker fails or goes quiet."""


def set_nodelay(transport: asyncio.BaseTransport | None) -> None:
    """Disable Nagle on a TCP transport (a no-op for anything else)."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class UpstreamError(Exception):
    """The worker could not be reached or did not answer in time (retryable)."""

    def __init__(self, endpoint: Endpoint, reason: str, timeout: bool = False) -> None:
        super().__init__(f"worker {endpoint.worker_id} ({endpoint.url}): {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.timeout = timeout


class UpstreamResponse(Protocol):
    """A worker's response whose headers arrived; the body is read once, whole or in chunks."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str:
        """The Content-Type header ("" when absent)."""
        ...

    def header(self, name: str, default: str | None = None) -> str | None: ...

    async def read(self) -> bytes: ...

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked transfer decoded)."""
        ...

    def release(self) -> None:
        """Done with the response (an unfinished body closes the connection)."""

    def close(self) -> None: ...


class Upstream(Protocol):
    """The process-wide client to workers."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def open(
        self, endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """POST ``body`` to ``endpoint``; the response once its headers arrived."""
        ...


def make_upstream(
    kind: TransportKind,
    *,
    connect_timeout: float,
    first_byte_timeout: float,
    idle_timeout: float,
    max_connections: int,
) -> Upstream:
    cls: type[Any]
    if kind == "aiohttp":
        from infera_core.server.upstream_aiohttp import AiohttpUpstream as cls
    else:
        from infera_core.server.upstream_native import NativeUpstream as cls
    upstream: Upstream = cls(
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
    )
    return upstream

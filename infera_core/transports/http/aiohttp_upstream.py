"""``--http-client aiohttp``: one ``aiohttp.ClientSession`` per process.

aiohttp sets TCP_NODELAY on each client connection it makes (``BaseProtocol.connection_made``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

from infera_core.transports.upstreams import UpstreamError, UpstreamReadError, UpstreamTarget

JSON_HEADERS = {"Content-Type": "application/json"}


class AiohttpResponse:
    """An ``aiohttp.ClientResponse`` seen as an :class:`~infera_core.transports.upstreams.UpstreamResponse`."""

    __slots__ = ("_r", "content_type", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._r = resp
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "")

    def header(self, name: str, default: str | None = None) -> str | None:
        return self._r.headers.get(name, default)

    async def read(self) -> bytes:
        try:
            return await self._r.read()
        except aiohttp.ClientError as exc:
            raise UpstreamReadError(f"{type(exc).__name__}: {exc}") from exc

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._r.content.iter_any():
                yield chunk
        except aiohttp.ClientError as exc:
            raise UpstreamReadError(f"{type(exc).__name__}: {exc}") from exc

    def release(self) -> None:
        self._r.release()

    def close(self) -> None:
        self._r.close()


class AiohttpUpstream:
    """The process-wide aiohttp client session to workers."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        first_byte_timeout: float,
        idle_timeout: float,
        max_connections: int,
        pool_timeout: float = 10.0,
    ) -> None:
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        # sock_read bounds the wait for the response headers (the first byte); once they
        # arrived, open() switches the connection's read timeout to the idle timeout.
        # ``connect`` covers waiting for a free pooled connection (at the cap) and connecting.
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=connect_timeout,
            connect=connect_timeout + pool_timeout,
            sock_read=first_byte_timeout,
        )
        self._max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            limit_per_host=0,
            ttl_dns_cache=300,
            keepalive_timeout=30,
            enable_cleanup_closed=False,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def open(
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> AiohttpResponse:
        """POST ``body`` to ``endpoint``; return the response once its headers arrived."""
        session = self.session
        assert session is not None, "Upstream.start() was not called"
        key = (endpoint.record.url, path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = self._urls[key] = URL(endpoint.record.url.rstrip("/") + path)
        try:
            resp = await session.post(url, data=body, headers=headers or JSON_HEADERS)
        except TimeoutError:
            raise UpstreamError(endpoint, "no response before the first-byte timeout", timeout=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            refused = isinstance(exc, ConnectionRefusedError) or isinstance(
                getattr(exc, "os_error", None), ConnectionRefusedError
            )
            raise UpstreamError(endpoint, f"{type(exc).__name__}: {exc}", refused=refused) from None
        if self.idle_timeout != self.first_byte_timeout and resp.connection is not None:
            proto = resp.connection.protocol
            if proto is not None:
                proto.read_timeout = self.idle_timeout
                reschedule = getattr(proto, "_reschedule_timeout", None)
                if reschedule is not None:
                    reschedule()  # the gap after the headers counts as idle too
        return AiohttpResponse(resp)

"""``--http-client native``: HTTP/1.1 over asyncio protocols, a keep-alive pool per worker.

Per request the work is: take the most recently used idle connection of that worker
(or connect), write the pre-built request line + headers + body as one buffer, and let
``httptools`` parse the response (:mod:`infera_core.transports.http.http1`). A pooled connection
that turns out closed before anything came back (the worker dropped it while idle) is
replaced by a fresh one once; every other failure before the response headers is an
:class:`~infera_core.transports.upstreams.UpstreamError` (the caller retries on another worker).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import ssl
from collections import deque
from urllib.parse import unquote, urlsplit

from infera_core.transports.http.http1 import Http1Connection, Http1Response, UpstreamClosed
from infera_core.transports.upstreams import PoolTimeoutError, UpstreamError, UpstreamTarget

KEEPALIVE_S = 30.0
"""Idle connections older than this are closed instead of reused."""
_JSON_HEADERS = {"Content-Type": "application/json"}
_ONE_WRITE_MAX = 64 * 1024
"""Bodies up to this size are copied behind the header block and sent in one write."""


class _PoolFull(Exception):
    """Internal: no room under the connection cap before the pool timeout."""


class _Target:
    """Where one (worker URL, path) goes: the pool key, the address and the request head."""

    __slots__ = ("head", "host", "key", "port", "server_hostname", "tls")

    def __init__(self, url: str, path: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported worker URL {url!r} (expected http:// or https://)")
        tls = self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if tls else 80)
        self.server_hostname = self.host if tls else None
        self.key = f"{parts.scheme}://{parts.netloc}"
        netloc = parts.netloc.rpartition("@")[2]
        target = parts.path.rstrip("/") + path
        auth = ""
        if parts.username is not None:  # http://user:pass@host: basic auth, as aiohttp does
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            auth = f"Authorization: Basic {base64.b64encode(cred).decode()}\r\n"
        self.head = f"POST {target} HTTP/1.1\r\nHost: {netloc}\r\n{auth}".encode("latin-1")


def _header_block(headers: dict[str, str], length: int) -> bytes:
    lines = []
    for k, v in headers.items():
        if "\r" in v or "\n" in v:
            v = v.replace("\r", " ").replace("\n", " ")
        lines.append(f"{k}: {v}\r\n")
    lines.append(f"Content-Length: {length}\r\n\r\n")
    return "".join(lines).encode()


class NativeUpstream:
    """The process-wide pool of keep-alive connections to workers."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        first_byte_timeout: float,
        idle_timeout: float,
        max_connections: int,
        pool_timeout: float = 10.0,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self._targets: dict[tuple[str, str], _Target] = {}
        self._idle: dict[str, list[Http1Connection]] = {}
        self._conns: set[Http1Connection] = set()
        self._connecting = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ssl: ssl.SSLContext | None = None

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()
        self._idle.clear()
        for w in self._waiters:
            w.cancel()
        self._waiters.clear()

    async def open(
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> Http1Response:
        """POST ``body`` to ``endpoint``; the response once its headers arrived."""
        target = self._targets.get((endpoint.record.url, path))
        if target is None:
            target = self._target(endpoint, path)
        head = target.head + _header_block(headers or _JSON_HEADERS, len(body))
        data: bytes | tuple[bytes, bytes] = head + body if len(body) <= _ONE_WRITE_MAX else (head, body)
        conn = self._pooled(target.key)
        try:
            if conn is None:
                conn = await self._connect(target)
            try:
                return await conn.request(data, self.first_byte_timeout, self.idle_timeout)
            except UpstreamClosed as exc:
                if not exc.stale:
                    raise
            # the worker had closed this idle connection: once more on a fresh one
            conn = await self._connect(target)
            return await conn.request(data, self.first_byte_timeout, self.idle_timeout)
        except _PoolFull:
            raise PoolTimeoutError(
                endpoint,
                f"no connection to workers became free within {self.pool_timeout:g} s"
                f" (--upstream-connections {self.max_connections} in use)",
                timeout=True,
            ) from None
        except TimeoutError as exc:
            raise UpstreamError(endpoint, str(exc) or "timed out", timeout=True) from None
        except OSError as exc:
            refused = isinstance(exc, ConnectionRefusedError)
            raise UpstreamError(endpoint, f"{type(exc).__name__}: {exc}", refused=refused) from None

    def _target(self, endpoint: UpstreamTarget, path: str) -> _Target:
        try:
            target = _Target(endpoint.record.url, path)
        except ValueError as exc:
            raise UpstreamError(endpoint, str(exc)) from None
        if len(self._targets) > 4096:
            self._targets.clear()
        self._targets[(endpoint.record.url, path)] = target
        return target

    # -- the pool ------------------------------------------------------------------
    def _pooled(self, key: str) -> Http1Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        assert self._loop is not None
        now = self._loop.time()
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > KEEPALIVE_S:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, target: _Target) -> Http1Connection:
        loop = self._loop
        assert loop is not None, "Upstream.start() was not called"
        deadline = 0.0
        while len(self._conns) + self._connecting >= self.max_connections:
            if not self._evict_idle():
                deadline = deadline or loop.time() + self.pool_timeout
                await self._wait_for_room(loop, deadline)
        key = target.key
        conn = Http1Connection(
            loop, functools.partial(self._put_back, key), functools.partial(self._lost, key)
        )
        if target.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        self._connecting += 1
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(
                    lambda: conn,
                    target.host,
                    target.port,
                    ssl=self._ssl if target.tls else None,
                    server_hostname=target.server_hostname,
                )
        except TimeoutError:
            conn.abort()
            raise TimeoutError(f"could not connect within {self.connect_timeout:g} s") from None
        except BaseException:
            conn.abort()
            raise
        finally:
            self._connecting -= 1
            self._wake_one()
        if conn.closed:
            raise ConnectionResetError("the worker closed the connection at once")
        self._conns.add(conn)
        return conn

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Wait until a connection closes or goes idle; :class:`_PoolFull` at ``deadline``."""
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except BaseException as exc:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken, but leaving anyway: the room goes to the next waiter
            if isinstance(exc, TimeoutError):
                raise _PoolFull from None
            raise

    def _put_back(self, key: str, conn: Http1Connection) -> None:
        assert self._loop is not None
        conn.idle_since = self._loop.time()
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = []
        idle.append(conn)
        if self._waiters:
            self._wake_one()

    def _lost(self, key: str, conn: Http1Connection) -> None:
        self._conns.discard(conn)
        idle = self._idle.get(key)
        if idle and conn in idle:
            idle.remove(conn)
        if self._waiters:
            self._wake_one()

    def _evict_idle(self) -> bool:
        """Close the least recently used idle connection of any worker (at the connection cap)."""
        oldest: Http1Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        oldest.abort()  # connection_lost removes it from its pool
        for idle in self._idle.values():
            if idle and idle[0] is oldest:
                idle.pop(0)
        self._conns.discard(oldest)
        return True

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

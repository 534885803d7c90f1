"""The upstream hop: what every transport to workers provides, and which one a server uses.

Which *request transport* reaches a worker (``http``, ``nats``…) is in its record
(``WorkerRecord.request_transport``); :class:`Upstreams` keeps one client per transport,
made by the transport's factory (:mod:`infera_core.transports.base`), and the endpoint table
puts each worker's client on ``Endpoint.upstream``.

The ``http`` transport has two HTTP clients, chosen with ``--http-client`` (old spelling
``--upstream-transport``):

* ``native`` (:mod:`infera_core.transports.http.native`): asyncio protocols parsing with
  ``httptools``, a keep-alive pool per worker, each request written as one buffer;
* ``aiohttp`` (:mod:`infera_core.transports.http.aiohttp_upstream`): one ``aiohttp.ClientSession``
  per process; aiohttp is optional (``pip install 'infera-core[aiohttp]'``), checked by
  :func:`infera_core.transports.http.require_http_client` when the server starts.

Both set TCP_NODELAY on every connection (:func:`set_nodelay` does the same for the
server's accepted sockets, see ``server.run``). :meth:`Upstream.open` sends the client's
bytes unchanged and returns once the worker's response headers arrived (the "first
byte"); everything before that is retryable (:class:`UpstreamError`), everything after is
not. Reading the body raises one of :data:`READ_ERRORS` (each transport turns its client
library's errors into :class:`UpstreamReadError`, so aiohttp loads only when selected).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Literal, Protocol, Self

from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.server.transport")

TransportKind = Literal["native", "aiohttp"]
"""The ``http`` transport's clients (``--http-client``)."""


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


class UpstreamTarget(Protocol):
    """What a request transport reads of the worker it sends to (the scheduler's
    :class:`~infera_core.scheduling.types.Endpoint` is one)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def record(self) -> WorkerRecord: ...


class UpstreamError(Exception):
    """The worker could not be reached or did not answer in time (retryable). ``refused``: the
    connection itself was refused (nothing was sent: no listener, a worker just gone)."""

    def __init__(
        self, endpoint: UpstreamTarget, reason: str, timeout: bool = False, refused: bool = False
    ) -> None:
        super().__init__(f"worker {endpoint.worker_id} ({redact_url(endpoint.url)}): {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.timeout = timeout
        self.refused = refused


class PoolTimeoutError(UpstreamError):
    """No connection to workers became free within ``--pool-timeout`` (the router's cap, not the
    worker's fault: answered 503, never retried, never counted against the worker's breaker)."""


class TransportDownError(UpstreamError):
    """The transport itself cannot reach any worker now (e.g. its message bus is down): retried
    like any :class:`UpstreamError`, but never counted against the worker's breaker, so the
    workers are routable again as soon as the transport is back."""


class RequestTooLargeError(UpstreamError):
    """The request is larger than the transport to this worker can carry (NATS: the server's
    ``max_payload``, learnt from its INFO). The request's problem, not the worker's: answered
    413 before anything is sent, never retried, never counted against the worker's breaker."""

    def __init__(self, endpoint: UpstreamTarget, reason: str, size: int, limit: int) -> None:
        super().__init__(endpoint, reason)
        self.size = size
        self.limit = limit


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


class ChunkQueueResponse:
    """The body half every :class:`UpstreamResponse` of core and the plugins shares: chunks
    queued by a producer (a connection, a message inbox), taken by the relay.

    The producer appends to ``_chunks`` (counting ``_buffered`` bytes for its backpressure
    or slow-consumer limit), sets ``done`` at the end, calls :meth:`_wake` after new data
    and :meth:`_fail` on an error (raised to the reader once the queued chunks are taken).
    A subclass provides :meth:`_wait` (a future on its loop, resuming a paused producer
    first), and may override :meth:`_finish` (the response failed: release timers and
    registrations) and :meth:`_taken` (the reader emptied the queue: resume reading).
    """

    __slots__ = ("_buffered", "_chunks", "_exc", "_waiter", "content_type", "done", "status")

    def __init__(self) -> None:
        self.status = 0
        self.content_type = ""
        self.done = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the producer ---------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.done or self._exc is not None:
            return
        self._exc = exc
        self._finish()
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_exception(exc)

    def _finish(self) -> None:
        """The response failed (or ended): the producer's own clean-up."""

    # -- read by the relay -------------------------------------------------------------
    async def _wait(self) -> None:
        """Wait for :meth:`_wake` or :meth:`_fail`."""
        raise NotImplementedError

    def _taken(self) -> None:
        """The reader took every queued chunk."""

    async def read(self) -> bytes:
        """The whole body."""
        while not self.done:
            if self._exc is not None:
                raise self._exc
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        chunks = self._chunks
        while not chunks:
            if self.done:
                raise StopAsyncIteration
            if self._exc is not None:
                raise self._exc
            await self._wait()
            chunks = self._chunks
        self._chunks = []
        self._buffered = 0
        self._taken()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Upstream(Protocol):
    """The process-wide client to workers."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def open(
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """POST ``body`` to ``endpoint``; the response once its headers arrived."""
        ...

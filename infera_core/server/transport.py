"""The upstream hop: what every transport to workers provides, and which one a server uses.

Which *request transport* reaches a worker (``http``, ``nats``…) is in its record
(``WorkerRecord.request_transport``); :class:`Upstreams` keeps one client per transport,
made by the transport's factory (:mod:`infera_core.transports`), and the endpoint table
puts each worker's client on ``Endpoint.upstream``.

The ``http`` transport has two HTTP clients, chosen with ``--http-client`` (old spelling
``--upstream-transport``):

* ``native`` (:mod:`infera_core.server.upstream_native`): asyncio protocols parsing with
  ``httptools``, a keep-alive pool per worker, each request written as one buffer;
* ``aiohttp`` (:mod:`infera_core.server.upstream_aiohttp`): one ``aiohttp.ClientSession``
  per process; aiohttp is optional (``pip install 'infera-core[aiohttp]'``), checked by
  :func:`require_http_client` when the server starts.

Both set TCP_NODELAY on every connection (:func:`set_nodelay` does the same for the
server's accepted sockets, see ``server.run``). :meth:`Upstream.open` sends the client's
bytes unchanged and returns once the worker's response headers arrived (the "first
byte"); everything before that is retryable (:class:`UpstreamError`), everything after is
not. Reading the body raises one of :data:`READ_ERRORS` (each transport turns its client
library's errors into :class:`UpstreamReadError`, so aiohttp loads only when selected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from infera_core.errors import InferaError, UnknownNameError, require_module
from infera_core.redact import redact_url
from infera_core.scheduling.types import Endpoint

if TYPE_CHECKING:
    from infera_core.registry import RequestTransportRegistry
    from infera_core.transports import ClientContext
    from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.server.transport")

TransportKind = Literal["native", "aiohttp"]
"""The ``http`` transport's clients (``--http-client``)."""


def require_http_client(kind: str) -> None:
    """A :class:`ConfigError` (one line naming the flag and the install) when ``kind``'s
    library is not installed."""
    if kind == "aiohttp":
        require_module("aiohttp", "--http-client aiohttp", "aiohttp")


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
        super().__init__(f"worker {endpoint.worker_id} ({redact_url(endpoint.url)}): {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.timeout = timeout


class PoolTimeoutError(UpstreamError):
    """No connection to workers became free within ``--pool-timeout`` (the router's cap, not the
    worker's fault: answered 503, never retried, never counted against the worker's breaker)."""


class TransportDownError(UpstreamError):
    """The transport itself cannot reach any worker now (e.g. its message bus is down): retried
    like any :class:`UpstreamError`, but never counted against the worker's breaker, so the
    workers are routable again as soon as the transport is back."""


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
        from infera_core.server.upstream_aiohttp import AiohttpUpstream as cls
    else:
        from infera_core.server.upstream_native import NativeUpstream as cls
    upstream: Upstream = cls(
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
        pool_timeout=pool_timeout,
    )
    return upstream


class Upstreams:
    """One client per request transport, made on first use; ``for_record`` picks a worker's.

    The transports named in ``eager`` (``serve --request-transport``, plus ``http``) are
    made and started by :meth:`start`, so a misconfigured one fails at start-up; a record
    naming another installed transport makes its client on arrival (started in the
    background: a transport's ``open`` waits for its own readiness). A record naming a
    transport that is not installed gets None (logged once per transport).
    """

    def __init__(
        self, registry: RequestTransportRegistry, ctx: ClientContext, eager: Iterable[str] = ("http",)
    ) -> None:
        self.registry = registry
        self.ctx = ctx
        self.eager = list(dict.fromkeys(eager))
        self.clients: dict[str, Upstream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._unknown: set[str] = set()

    def client(self, kind: str) -> Upstream | None:
        """The client of transport ``kind`` (made now if needed), or None when not installed."""
        found = self.clients.get(kind)
        if found is not None:
            return found
        if kind not in self.registry:
            if kind not in self._unknown:
                self._unknown.add(kind)
                log.error(
                    "request transport %r is not installed here (installed: %s)",
                    kind,
                    ", ".join(self.registry.names()),
                )
            return None
        made = self.registry.get(kind).create_client(self.ctx)
        self.clients[kind] = made
        if self._started:
            task = asyncio.get_running_loop().create_task(self._start_one(kind, made))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return made

    def for_record(self, record: WorkerRecord) -> Upstream | None:
        return self.client(record.request_transport)

    async def _start_one(self, kind: str, client: Upstream) -> None:
        try:
            await client.start()
        except Exception:
            log.exception("request transport %r: client failed to start", kind)

    async def start(self) -> None:
        """Start the eager transports' clients (idempotent); a failure is one
        :class:`InferaError` line naming the transport."""
        if self._started:
            return
        for kind in self.eager:
            if self.client(kind) is None:
                raise UnknownNameError("request transport", kind, self.registry.names())
        for kind, client in list(self.clients.items()):
            try:
                await client.start()
            except InferaError:
                raise
            except Exception as exc:
                raise InferaError(
                    f"--request-transport {kind}: the client did not start: {exc or type(exc).__name__}"
                ) from None
        self._started = True

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for client in list(self.clients.values()):
            await client.close()
        self.clients.clear()
        self._started = False

    async def open(
        self, endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """Through the endpoint's own client (for callers holding the server's ``Upstreams``)."""
        upstream: Upstream = endpoint.upstream
        return await upstream.open(endpoint, path, body, headers)

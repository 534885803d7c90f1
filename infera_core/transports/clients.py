"""The router's transport clients, one per transport name, made on first use.

:class:`Clients` is the one manager of both kinds: :class:`Upstreams` holds the request
transports' clients (:class:`~infera_core.transports.upstreams.Upstream`), :class:`KvSources`
the KV-event transports' sources (:class:`~infera_core.transports.base.KvEventSource`).
A client is made the first time its transport is named (by a worker record, or eagerly at
start-up for the transports a flag names); the eager ones start in :meth:`Clients.start`,
so a misconfigured transport is one :class:`InferaError` line naming its flag. A transport
that is not installed is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from typing import ClassVar, Generic, Protocol, TypeVar

from infera_core.config.backends import BackendOptions
from infera_core.errors import InferaError, UnknownNameError
from infera_core.registry import Named, Registry
from infera_core.scheduling.types import Endpoint
from infera_core.transports.base import (
    ZMQ,
    ClientContext,
    KvEventSource,
    KvEventTransportFactory,
    KvEventTransportRegistry,
    KvSourceContext,
    RequestTransportFactory,
    RequestTransportRegistry,
)
from infera_core.transports.upstreams import Upstream, UpstreamResponse, UpstreamTarget
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.transport")


class Startable(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=Startable)
F = TypeVar("F", bound=Named)


class Clients(Generic[C, F]):
    """Transport name → its client (made from the factory registered under that name).

    :meth:`client` makes one now (started in the background once the manager has started;
    a client's own methods wait for its readiness); :meth:`get` makes one and awaits its
    start (a failed start is raised, and the next call makes a new client).
    """

    flag: ClassVar[str]
    """The flag naming the eager transports, for the start-up error line."""
    what: ClassVar[str]
    """What one client is called in that line."""

    def __init__(self, registry: Registry[F], eager: Iterable[str] = ()) -> None:
        self.registry = registry
        self.eager = list(dict.fromkeys(eager))
        self.clients: dict[str, C] = {}
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self._unknown: set[str] = set()

    def create(self, factory: F) -> C:
        """A new client from the transport's factory."""
        raise NotImplementedError

    def installed(self, kind: str) -> bool:
        return kind in self.registry

    def _made(self, kind: str) -> C | None:
        found = self.clients.get(kind)
        if found is not None:
            return found
        if kind not in self.registry:
            if kind not in self._unknown:
                self._unknown.add(kind)
                log.error(
                    "%s %r is not installed here (installed: %s)",
                    self.registry.kind,
                    kind,
                    ", ".join(self.registry.names()),
                )
            return None
        made = self.clients[kind] = self.create(self.registry.get(kind))
        return made

    def _start(self, kind: str, client: C) -> asyncio.Task[None]:
        task = self._starts.get(kind)
        if task is None:
            task = self._starts[kind] = asyncio.get_running_loop().create_task(client.start())
        return task

    def client(self, kind: str) -> C | None:
        """The client of transport ``kind`` (made now if needed), or None when not installed."""
        client = self._made(kind)
        if client is not None and self._started and kind not in self._starts:
            self._start(kind, client).add_done_callback(lambda task: self._log_failed(kind, task))
        return client

    def _log_failed(self, kind: str, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("%s %r: %s failed to start", self.registry.kind, kind, self.what, exc_info=exc)

    async def get(self, kind: str) -> C:
        """The started client of ``kind``; raises when it is not installed or did not start."""
        client = self._made(kind)
        if client is None:
            raise UnknownNameError(self.registry.kind, kind, self.registry.names())
        try:
            await asyncio.shield(self._start(kind, client))
        except Exception:
            if self.clients.get(kind) is client:  # made again on the next use
                del self.clients[kind]
                self._starts.pop(kind, None)
            raise
        return client

    async def start(self, kinds: Iterable[str] | None = None) -> None:
        """Make ``kinds`` (default: the eager transports) and start every client made so far;
        a failure is one :class:`InferaError` line naming the flag. Clients made later start
        in the background."""
        if kinds is None and self._started:
            return
        for kind in self.eager if kinds is None else kinds:
            if self._made(kind) is None:
                raise UnknownNameError(self.registry.kind, kind, self.registry.names())
        for kind in list(self.clients):
            try:
                await self.get(kind)
            except InferaError:
                raise
            except Exception as exc:
                raise InferaError(
                    f"{self.flag} {kind}: {self.what} did not start: {exc or type(exc).__name__}"
                ) from None
        self._started = True

    async def close(self) -> None:
        starts, self._starts = list(self._starts.values()), {}
        for task in starts:
            task.cancel()
        for task in starts:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        clients, self.clients = list(self.clients.values()), {}
        for client in clients:
            try:
                await client.close()
            except Exception:
                log.exception("%s: %s %r failed to close", self.registry.kind, self.what, client)
        self._started = False


class Upstreams(Clients[Upstream, RequestTransportFactory]):
    """One client per request transport; ``for_record`` picks a worker's.

    The transports named in ``eager`` (``serve --request-transport``, plus ``http``) are
    made and started by :meth:`start`, so a misconfigured one fails at start-up; a record
    naming another installed transport makes its client on arrival (started in the
    background: a transport's ``open`` waits for its own readiness). A record naming a
    transport that is not installed gets None (logged once per transport).
    """

    flag = "--request-transport"
    what = "the client"

    def __init__(
        self, registry: RequestTransportRegistry, ctx: ClientContext, eager: Iterable[str] = ("http",)
    ) -> None:
        super().__init__(registry, eager)
        self.ctx = ctx

    def create(self, factory: RequestTransportFactory) -> Upstream:
        return factory.create_client(self.ctx)

    def for_record(self, record: WorkerRecord) -> Upstream | None:
        return self.client(record.request_transport)

    async def open(
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """Through the endpoint's own client (for callers holding the server's ``Upstreams``)."""
        assert isinstance(endpoint, Endpoint), "Upstreams.open takes the scheduler's endpoints"
        upstream: Upstream = endpoint.upstream
        return await upstream.open(endpoint, path, body, headers)


class KvSources(Clients[KvEventSource, KvEventTransportFactory]):
    """One KV event source per KV-event transport (the KV hub's), made and started on first use.

    ``serve --kv-event-transport`` starts its transport's source at start-up
    (``start([kind])``); a source whose start failed is made again on the next use.
    """

    flag = "--kv-event-transport"
    what = "the KV event source"

    def __init__(self, registry: KvEventTransportRegistry, ctx: KvSourceContext | None = None) -> None:
        super().__init__(registry)
        self.ctx = ctx or KvSourceContext()

    def configure(
        self, *, options: BackendOptions | None = None, connect_timeout: float | None = None
    ) -> None:
        """The server's own settings: transport plugins' options, ``--connect-timeout``."""
        ctx = self.ctx
        self.ctx = dataclasses.replace(
            ctx,
            options=ctx.options if options is None else options,
            connect_timeout=ctx.connect_timeout if connect_timeout is None else connect_timeout,
        )

    def create(self, factory: KvEventTransportFactory) -> KvEventSource:
        source = factory.create_source(self.ctx)
        if source is None and factory.name != ZMQ:
            log.warning(
                "KV-event transport %r: create_source returned None, which is deprecated: the %s"
                " transport's source follows its workers (return a KvEventSource)",
                factory.name,
                ZMQ,
            )
            source = self.registry.get(ZMQ).create_source(self.ctx)
        if source is None:
            raise InferaError(f"KV-event transport {factory.name!r} made no KV event source")
        return source

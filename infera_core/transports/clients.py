"""The router's request-transport clients: one per transport, made on first use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from infera_core.errors import InferaError, UnknownNameError
from infera_core.scheduling.types import Endpoint
from infera_core.transports.base import ClientContext, RequestTransportRegistry
from infera_core.transports.upstreams import Upstream, UpstreamResponse, UpstreamTarget
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.transport")


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
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """Through the endpoint's own client (for callers holding the server's ``Upstreams``)."""
        assert isinstance(endpoint, Endpoint), "Upstreams.open takes the scheduler's endpoints"
        upstream: Upstream = endpoint.upstream
        return await upstream.open(endpoint, path, body, headers)

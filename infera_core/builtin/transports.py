"""Core transports, registered like any plugin's: ``http`` requests and ``zmq`` KV events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infera_core.plugin.spec import hookimpl
from infera_core.transports.base import (
    HTTP,
    ZMQ,
    ClientContext,
    KvEventSource,
    KvEventTransportRegistry,
    KvSourceContext,
    RequestTransportRegistry,
    WorkerAttachment,
    WorkerContext,
)

if TYPE_CHECKING:
    from infera_core.transports.upstreams import Upstream


class HttpRequestTransport:
    """Requests over HTTP/1.1 to the engine's own server (``WorkerRecord.url``)."""

    name = HTTP
    description = "HTTP to the engine's server; client: --http-client native|aiohttp."
    settings_model = None

    def create_client(self, ctx: ClientContext) -> Upstream:
        from infera_core.transports.http import make_upstream

        return make_upstream(
            ctx.http_client,  # type: ignore[arg-type]
            connect_timeout=ctx.connect_timeout,
            first_byte_timeout=ctx.first_byte_timeout,
            idle_timeout=ctx.idle_timeout,
            max_connections=ctx.max_connections,
            pool_timeout=ctx.pool_timeout,
        )

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return None  # routers reach the engine directly


class ZmqKvEventTransport:
    """KV events read straight from each engine's ZMQ publisher (``kv_events.endpoint``)."""

    name = ZMQ
    description = "Each router subscribes to every engine's ZMQ publisher (replay socket on gaps)."
    settings_model = None

    def create_source(self, ctx: KvSourceContext) -> KvEventSource:
        from infera_core.transports.zmq import ZmqKvEventSource  # pyzmq: only where KV events are followed

        return ZmqKvEventSource(ctx)

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        return None


@hookimpl
def infera_register_request_transports(registry: RequestTransportRegistry) -> None:
    registry.add(HttpRequestTransport())


@hookimpl
def infera_register_kv_event_transports(registry: KvEventTransportRegistry) -> None:
    registry.add(ZmqKvEventTransport())

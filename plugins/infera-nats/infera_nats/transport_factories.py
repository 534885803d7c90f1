"""The ``nats`` request transport and KV-event transport, as registered (see :mod:`infera_core.transports.base`).

* :class:`NatsRequestTransport`: routers reach workers through :class:`~infera_nats.transport.NatsUpstream`;
  the launcher starts a :class:`~infera_nats.responder.Responder` in front of the engine and
  publishes ``request_transport: nats`` with ``request_params.subject``.
* :class:`NatsKvEventTransport`: routers read KV events from the JetStream stream
  (:class:`~infera_nats.kv_source.NatsKvSource`); the launcher starts a
  :class:`~infera_nats.relay.KvRelay` and publishes ``kv_event_transport: nats`` with
  ``kv_event_params.subject`` / ``stream``.

Both read the NATS servers from the plugin's settings (``--nats-url``); ``servers=`` given
to the constructor wins (tests, embedding code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infera_core.transports.base import Attached, ClientContext, KvSourceContext, WorkerContext
from infera_nats import kv_wire
from infera_nats import transport_wire as wire
from infera_nats.auth import NatsAuth
from infera_nats.settings import NatsSettings

if TYPE_CHECKING:
    from infera_core.config.backends import BackendOptions
    from infera_core.transports.base import KvEventSource, WorkerAttachment
    from infera_core.transports.upstreams import Upstream

NATS = "nats"


def _settings(options: BackendOptions) -> NatsSettings:
    return options.get(NatsSettings)


def _servers(given: str | list[str] | None, options: BackendOptions) -> str | list[str]:
    return given if given else _settings(options).servers()


def _auth(options: BackendOptions) -> NatsAuth:
    return NatsAuth.of(_settings(options))


def _prefix(options: BackendOptions) -> str:
    return _settings(options).nats_subject_prefix


class _Running:
    """A started responder or relay and the record fields that announce it."""

    def __init__(self, part: Any, record_fields: dict[str, Any]) -> None:
        self.part = part
        self.record_fields = record_fields

    async def close(self) -> None:
        await self.part.close()


class _NatsTransport:
    """What both NATS transports share: their name, the NATS settings, and the servers
    (None: ``--nats-url`` from the settings)."""

    name = NATS
    settings_model = NatsSettings

    def __init__(self, servers: str | list[str] | None = None) -> None:
        self.servers = servers


class NatsRequestTransport(_NatsTransport):
    description = "NATS request/reply to a responder the launcher runs next to the engine (--nats-url)."

    def create_client(self, ctx: ClientContext) -> Upstream:
        from infera_nats.transport import NatsUpstream

        return NatsUpstream(
            _servers(self.servers, ctx.options),
            connect_timeout=ctx.connect_timeout,
            first_byte_timeout=ctx.first_byte_timeout,
            idle_timeout=ctx.idle_timeout,
            subject_prefix=_prefix(ctx.options),
            auth=_auth(ctx.options),
        )

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        from infera_nats.responder import Responder

        subject = wire.request_subject(_prefix(ctx.options), ctx.worker_id)
        responder = Responder(
            ctx.worker_id,
            ctx.engine_url,
            _servers(self.servers, ctx.options),
            subject=subject,
            connect_timeout=ctx.connect_timeout,
            auth=_auth(ctx.options),
        )
        await responder.start()
        return _Running(responder, {"request_transport": NATS, "request_params": {"subject": subject}})


class NatsKvEventTransport(_NatsTransport):
    description = "KV events relayed by the launcher into a JetStream stream every router replica reads."

    def create_source(self, ctx: KvSourceContext) -> KvEventSource:
        from infera_nats.kv_source import NatsKvSource

        return NatsKvSource(
            _servers(self.servers, ctx.options),
            connect_timeout=ctx.connect_timeout,
            subject_prefix=_prefix(ctx.options),
            auth=_auth(ctx.options),
        )

    async def attach_worker(self, ctx: WorkerContext) -> WorkerAttachment | None:
        if ctx.kv_events is None:
            return Attached({"kv_event_transport": NATS})  # nothing to relay
        from infera_nats.relay import KvRelay

        relay = KvRelay(
            ctx.worker_id,
            ctx.model,
            ctx.kv_events,
            _servers(self.servers, ctx.options),
            dp_size=ctx.dp_size,
            subject_prefix=_prefix(ctx.options),
            connect_timeout=ctx.connect_timeout,
            auth=_auth(ctx.options),
            purge_on_close=not _settings(ctx.options).authenticated(),
        )
        await relay.start()
        params = {"subject": relay.subject, "stream": kv_wire.STREAM}
        return _Running(relay, {"kv_event_transport": NATS, "kv_event_params": params})

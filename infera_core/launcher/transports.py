"""The worker side of a worker's request and KV-event transports."""

from __future__ import annotations

from typing import Any

from infera_core.config.backends import BackendOptions
from infera_core.engines.base import LaunchContext
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import InferaError
from infera_core.plugin.hooks import InferaHooks
from infera_core.transports.base import (
    HTTP,
    ZMQ,
    KvEventTransportFactory,
    RequestTransportFactory,
    WorkerAttachment,
    WorkerContext,
)
from infera_core.worker import WorkerRecord


class WorkerTransports:
    """The worker side of one worker's request and KV-event transports (the launcher's).

    Built before the engine starts (an unknown name fails then, listing what is
    installed); :meth:`attach` starts the transports' worker sides once and returns the
    record fields to publish (the transport names plus what the attachments add);
    :meth:`close` stops them after the worker deregistered.
    """

    def __init__(self, hooks: InferaHooks, request: str = HTTP, kv_events: str = ZMQ) -> None:
        self.request: RequestTransportFactory = hooks.require("request_transport", request)
        self.kv_events: KvEventTransportFactory = hooks.require("kv_event_transport", kv_events)
        self.attached: list[WorkerAttachment] = []
        self._fields: dict[str, Any] | None = None

    async def attach(self, ctx: WorkerContext) -> dict[str, Any]:
        if self._fields is None:
            fields: dict[str, Any] = {
                "request_transport": self.request.name,
                "kv_event_transport": self.kv_events.name,
            }
            for flag, factory in (
                ("--request-transport", self.request),
                ("--kv-event-transport", self.kv_events),
            ):
                if factory is self.kv_events and ctx.kv_events is None:
                    continue  # the engine publishes no KV events: nothing to relay
                try:
                    attachment = await factory.attach_worker(ctx)
                except InferaError:
                    raise
                except Exception as exc:
                    await self.close()
                    raise InferaError(
                        f"{flag} {factory.name}: the worker side did not start: {exc or type(exc).__name__}"
                    ) from None
                if attachment is not None:
                    self.attached.append(attachment)
                    fields.update(attachment.record_fields)
            self._fields = fields
        return dict(self._fields)

    async def close(self) -> None:
        attached, self.attached = self.attached, []
        self._fields = None
        for attachment in reversed(attached):
            await attachment.close()


def worker_context(ctx: LaunchContext, record: WorkerRecord, settings: WorkerSettings) -> WorkerContext:
    """What the transports' worker sides are started with, once the engine serves."""
    return WorkerContext(
        worker_id=ctx.worker_id,
        model=ctx.model,
        engine_url=ctx.url,
        kv_events=record.kv_events,
        dp_size=record.dp_size,
        connect_timeout=settings.discovery_timeout,
        options=BackendOptions(settings),
    )

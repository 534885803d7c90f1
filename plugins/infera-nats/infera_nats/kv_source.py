"""The router side of ``--kv-event-transport nats``: follow workers' KV events in the JetStream stream.

:class:`NatsKvSource` is a :class:`infera_core.transports.base.KvEventSource`: for each worker
(and DP rank) the KV hub follows, it reads that publisher's subject of the ``INFERA_KV``
stream through an ordered consumer (ephemeral, in order, re-created from the last stream
sequence after a gap, a missed heartbeat or a NATS restart) and hands every batch to the
hub, which sequences, decodes and indexes it exactly as ZMQ batches
(:mod:`infera_core.kv.hub`). Every ``follow`` starts at the stream's first retained
message of that publisher — the stream *is* the replay buffer, so a router that starts
late (or a second replica) rebuilds the same index; a ``follow`` started again after an
error delivers the history once more, which the hub recognises (duplicates are skipped,
or the view is rebuilt from seq 0).

``replay``: the stream has already delivered everything it holds, so the start of the
history (``start == 0``) is answered with no batches, and any other gap with None (those
events were never stored: the hub clears the view and marks it stale until it refills).
"""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from infera_core.transports.base import KvEventSink
from infera_core.worker import WorkerRecord
from infera_nats import kv_wire
from infera_nats.auth import NatsAuth
from infera_nats.transport_connect import close_quietly, connect_nats

log = logging.getLogger("infera.nats.kv")

HEARTBEAT_S = 1.0
"""Idle heartbeat of each ordered consumer: two missed ones re-create it (NATS restart)."""


class NatsKvSource:
    """See the module docstring."""

    def __init__(
        self,
        servers: str | list[str],
        *,
        connect_timeout: float = 5.0,
        subject_prefix: str = "infera",
        name: str = "infera-router-kv",
        auth: NatsAuth | None = None,
    ) -> None:
        self.auth = auth
        self.servers = servers
        self.connect_timeout = connect_timeout
        self.prefix = subject_prefix
        self.name = name
        self.nc: Client | None = None
        self.messages = 0
        self.malformed = 0

    async def start(self) -> None:
        self.nc = await connect_nats(self.servers, self.name, self.connect_timeout, auth=self.auth)
        await kv_wire.ensure_stream(self.nc, self.prefix)  # routers may start before any relay

    async def close(self) -> None:
        await close_quietly(self.nc)
        self.nc = None

    def subject(self, record: WorkerRecord, rank: int | None) -> str:
        """The worker's subject: its record's ``kv_event_params.subject`` when that names this
        worker (``<prefix>.kv.<model>.<worker>``), else the default one — a record cannot point
        a worker's view at another publisher's events."""
        given = record.kv_event_params.get("subject")
        base = kv_wire.kv_subject(self.prefix, record.model, record.worker_id)
        if isinstance(given, str) and given and given != base:
            if kv_wire.names_worker(given, self.prefix, record.worker_id):
                base = given
            else:
                log.warning(
                    "worker %s: its record's KV subject %r is not its own; reading %s",
                    record.worker_id,
                    given,
                    base,
                )
        return kv_wire.rank_subject(base, rank)

    async def follow(self, record: WorkerRecord, rank: int | None, sink: KvEventSink) -> None:
        nc = self.nc
        if nc is None:
            raise ConnectionError("the NATS KV source is not started")
        subject = self.subject(record, rank)
        sub = await nc.jetstream().subscribe(
            subject,
            stream=kv_wire.STREAM,
            ordered_consumer=True,
            idle_heartbeat=HEARTBEAT_S,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            pending_msgs_limit=-1,
            pending_bytes_limit=0,
        )
        try:
            async for msg in sub.messages:
                self.messages += 1
                if msg.subject != subject:  # not this publisher's: never applied to its view
                    self.malformed += 1
                    sink.malformed(f"{subject}: a message on {msg.subject} skipped")
                    continue
                try:
                    batches = kv_wire.unpack(msg.data)
                except ValueError as exc:
                    self.malformed += 1
                    log.warning(
                        "worker %s: malformed KV message on %s skipped: %s", record.worker_id, subject, exc
                    )
                    sink.malformed(f"{subject}: {exc}")
                    continue
                for seq, payload in batches:
                    await sink.batch(seq, payload)
        finally:
            await sub.unsubscribe()

    async def replay(
        self, record: WorkerRecord, rank: int | None, start: int, until: int
    ) -> list[tuple[int, bytes]] | None:
        return [] if start == 0 else None

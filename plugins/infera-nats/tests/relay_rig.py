"""A worker's KV relay into NATS and a router's source reading it back, for the relay tests.

An engine's ZMQ KV publisher is stood in for by a real PUB socket on a free port; the relay
(worker side) reads it and publishes into JetStream; a :class:`~infera_nats.kv_source.NatsKvSource`
(router side) follows the worker's record into a :class:`Collect` sink.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import zmq
from infera_nats.kv_source import NatsKvSource
from infera_nats.relay import KvRelay

from infera_core.util.net import free_port
from infera_core.worker import KvEventsInfo, WorkerRecord


class Collect:
    """A KV event sink that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, bytes]] = []

    async def batch(self, seq: int, payload: bytes) -> None:
        self.batches.append((seq, payload))

    def malformed(self, reason: str) -> None:
        raise AssertionError(reason)


@dataclass
class Relayed:
    pub: zmq.Socket  # type: ignore[type-arg]
    relay: KvRelay
    sink: Collect

    async def until_subscribed(self, send_first: Callable[[], None], within: float = 10.0) -> None:
        """Send ``send_first`` until the relay got one: the SUB's subscription reaches the PUB
        asynchronously, so messages sent before it are dropped."""
        async with asyncio.timeout(within):
            while not self.relay.batches:
                send_first()
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def relayed(
    nats_url: str, worker_id: str, model: str, engine: str, kv: Callable[[int], KvEventsInfo], bind: str
) -> AsyncIterator[Relayed]:
    """A PUB bound at ``bind`` (``tcp://HOST``) on a free port, ``kv(port)`` its record's KV
    events info, the relay and a source following it; all closed when the block exits."""
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"{bind}:{port}")
    info = kv(port)
    relay = KvRelay(worker_id, model, info, nats_url)
    await relay.start()
    source = NatsKvSource(nats_url)
    await source.start()
    sink = Collect()
    rec = WorkerRecord(
        worker_id=worker_id, url="http://127.0.0.1:9", model=model, engine=engine, kv_events=info
    )
    follow = asyncio.create_task(source.follow(rec, None, sink))
    try:
        yield Relayed(pub, relay, sink)
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        await source.close()
        await relay.close()
        pub.close(0)
        ctx.term()

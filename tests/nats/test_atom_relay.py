"""An ATOM worker's KV events over NATS: its publisher sends ``[topic, payload]`` with no seq frame
(``kv_events.seq_frames = False``); the worker's relay numbers the batches and publishes them all."""

from __future__ import annotations

import asyncio
import contextlib

import zmq
from infera_nats.kv_source import NatsKvSource
from infera_nats.relay import KvRelay

from infera_core.testing.nats import NatsServer
from infera_core.testing.net import free_port
from infera_core.testing.server import until
from infera_core.worker import KvEventsInfo, WorkerRecord

MODEL = "ds"


class Collect:
    def __init__(self) -> None:
        self.batches: list[tuple[int, bytes]] = []

    async def batch(self, seq: int, payload: bytes) -> None:
        self.batches.append((seq, payload))

    def malformed(self, reason: str) -> None:
        raise AssertionError(reason)


async def test_relay_numbers_an_atom_publishers_two_frame_messages(nats_server: NatsServer) -> None:
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://*:{port}")  # as ATOM binds ATOM_KV_EVENTS_ENDPOINT
    kv = KvEventsInfo(endpoint=f"tcp://127.0.0.1:{port}", format="atom", block_size=16, seq_frames=False)
    relay = KvRelay("a0", MODEL, kv, nats_server.url)
    await relay.start()
    source = NatsKvSource(nats_server.url)
    await source.start()
    sink = Collect()
    rec = WorkerRecord(worker_id="a0", url="http://127.0.0.1:9", model=MODEL, engine="atom", kv_events=kv)
    follow = asyncio.create_task(source.follow(rec, None, sink))
    try:
        async with asyncio.timeout(10):
            while not relay.batches:  # the SUB's subscription reaches the PUB asynchronously
                pub.send_multipart([b"kv-events", b"p0"])
                await asyncio.sleep(0.05)
        for payload in (b"p1", b"p2"):
            pub.send_multipart([b"kv-events", payload])
        await until(lambda: bool(sink.batches) and sink.batches[-1][1] == b"p2", within=10)
        seqs = [seq for seq, _ in sink.batches]
        assert seqs == list(range(len(seqs))), sink.batches  # 0, 1, 2…: no gap, no restart
        assert [p for _, p in sink.batches[-2:]] == [b"p1", b"p2"]
        assert relay.restarts == 0
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        await source.close()
        await relay.close()
        pub.close(0)
        ctx.term()

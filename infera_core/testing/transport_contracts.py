"""Contract suites for request transports and KV-event transports (re-exported by
:mod:`infera_core.testing.contracts`).

Subclass one, set ``factory`` (what your ``infera_register_*_transports`` hook adds) and,
when the transport needs settings (a server URL…), override ``options()``::

    class TestMyTransport(RequestTransportContract):
        factory = MyTransport()

        def options(self) -> BackendOptions:
            return BackendOptions(given=[MySettings(url=self.server_url)])

Both suites run the worker side (``attach_worker``) and the router side of the
transport against real loopback stand-ins: an HTTP engine
(:class:`~infera_core.testing.upstream.FakeUpstream`) for requests, and a ZMQ KV event
publisher with a replay socket (:class:`StandinKvPublisher`) read through the real
:class:`~infera_core.kv.hub.KvHub` for KV events. Core's ``http`` and ``zmq`` pass them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, ClassVar

import msgspec
import zmq
import zmq.asyncio
from pydantic import BaseModel

from infera_core.config.backends import BackendOptions
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import KvDecoderRegistry
from infera_core.kv.hub import KvHub
from infera_core.kv.settings import KvSettings
from infera_core.scheduling.types import Endpoint
from infera_core.testing.upstream import FakeUpstream
from infera_core.transports.base import (
    ClientContext,
    KvEventTransportFactory,
    KvEventTransportRegistry,
    RequestTransportFactory,
    WorkerAttachment,
    WorkerContext,
)
from infera_core.transports.upstreams import Upstream, UpstreamError
from infera_core.util.tasks import cancel_and_wait
from infera_core.worker import KvEventsInfo, WorkerRecord

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
BLOCK = 16
DECODER = "contract-msgpack"


def _check_identity(factory: Any, protocol: type) -> None:
    ok = isinstance(factory, protocol)
    assert ok, f"{type(factory).__name__} lacks {protocol.__name__} members"
    assert isinstance(factory.name, str) and _NAME_RE.match(factory.name), f"bad name {factory.name!r}"
    assert isinstance(factory.description, str) and factory.description.strip(), "needs a description"
    model = factory.settings_model
    assert model is None or (isinstance(model, type) and issubclass(model, BaseModel)), (
        "settings_model must be None or a pydantic model class"
    )


class RequestTransportContract:
    """A request transport carries JSON and streamed responses, errors and timeouts like HTTP."""

    factory: ClassVar[Any]

    def options(self) -> BackendOptions:
        """The transport's settings for this test (override when it needs some)."""
        return BackendOptions()

    @contextlib.asynccontextmanager
    async def worker(
        self, first_byte_timeout: float = 10.0
    ) -> AsyncIterator[tuple[FakeUpstream, Endpoint, Upstream, list[WorkerAttachment]]]:
        """A stand-in engine, its worker side attached, and a started router-side client."""
        engine = FakeUpstream("contract-worker", chunks=8)
        await engine.start()
        options = self.options()
        ctx = WorkerContext("contract-worker", "fake-model", engine.url, connect_timeout=5.0, options=options)
        attached: list[WorkerAttachment] = []
        client: Upstream | None = None
        try:
            attachment = await self.factory.attach_worker(ctx)
            if attachment is not None:
                attached.append(attachment)
            fields = attachment.record_fields if attachment is not None else {}
            record = WorkerRecord.model_validate(
                {
                    "worker_id": "contract-worker",
                    "url": engine.url,
                    "model": "fake-model",
                    "engine": "fake",
                    "request_transport": self.factory.name,
                    **fields,
                }
            )
            client = self.factory.create_client(
                ClientContext(connect_timeout=3.0, first_byte_timeout=first_byte_timeout, options=options)
            )
            await client.start()
            endpoint = Endpoint(record)
            endpoint.upstream = client
            yield engine, endpoint, client, attached
        finally:
            if client is not None:
                await client.close()
            for a in attached:
                await a.close()
            await engine.stop()

    def test_satisfies_protocol(self) -> None:
        _check_identity(self.factory, RequestTransportFactory)

    async def test_json_and_streamed_responses_arrive_whole(self) -> None:
        async with self.worker() as (engine, ep, client, _):
            resp = await client.open(ep, "/v1/chat/completions", json.dumps(CHAT).encode())
            try:
                assert resp.status == 200 and resp.content_type.startswith("application/json")
                body = json.loads(await resp.read())
                assert body["choices"][0]["message"]["content"] == "hi"
            finally:
                resp.release()
            assert engine.last_path == "/v1/chat/completions"
            stream = json.dumps({**CHAT, "stream": True}, separators=(",", ":")).encode()
            resp = await client.open(ep, "/v1/chat/completions", stream)
            try:
                assert resp.status == 200 and resp.content_type.startswith("text/event-stream")
                data = b"".join([chunk async for chunk in resp])
            finally:
                resp.release()
            events = [line for line in data.split(b"\n") if line.startswith(b"data: ")]
            assert len(events) == engine.chunks + 1 and events[-1] == b"data: [DONE]"
            assert engine.requests == 2

    async def test_worker_errors_keep_their_status_and_body(self) -> None:
        async with self.worker() as (engine, ep, client, _):
            engine.status = 503
            resp = await client.open(ep, "/v1/chat/completions", json.dumps(CHAT).encode())
            try:
                assert resp.status == 503
                assert b"fails with 503" in await resp.read()
            finally:
                resp.release()

    async def test_no_first_byte_in_time_is_a_retryable_timeout(self) -> None:
        async with self.worker(first_byte_timeout=0.5) as (engine, ep, client, _):
            engine.hang = True
            t0 = time.monotonic()
            try:
                await client.open(ep, "/v1/chat/completions", json.dumps(CHAT).encode())
            except UpstreamError as exc:
                assert exc.timeout, f"expected a timeout, got {exc.reason!r}"
            else:
                raise AssertionError("open() returned although the worker never answered")
            assert time.monotonic() - t0 < 5

    async def test_a_worker_that_is_gone_is_a_retryable_error(self) -> None:
        async with self.worker(first_byte_timeout=3.0) as (engine, ep, client, attached):
            for a in attached:
                await a.close()
            attached.clear()
            await engine.stop()
            for attempt in (1, 2):
                try:
                    await client.open(ep, "/v1/chat/completions", json.dumps(CHAT).encode())
                except UpstreamError as exc:
                    if exc.timeout and attempt == 1:
                        # a message bus may still deliver a request sent the moment the worker
                        # left (nats-server did, rarely, under load): the next one must not wait
                        continue
                    # at once (refused, no responders…), not after the first-byte timeout: the
                    # cause, not a wall-clock bound, so a loaded machine cannot make it fail
                    assert not exc.timeout, f"the worker's absence was only seen as a timeout: {exc}"
                    break
                else:
                    raise AssertionError("open() succeeded against a stopped worker")


class StandinKvPublisher:
    """A ZMQ KV event publisher like an engine's: PUB ``[topic, seq, payload]`` + replay ROUTER."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.sent: list[bytes] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def info(self) -> KvEventsInfo:
        return KvEventsInfo(
            endpoint=f"tcp://127.0.0.1:{self.port}",
            replay_endpoint=f"tcp://127.0.0.1:{self.replay_port}",
            format=DECODER,
            block_size=BLOCK,
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, block: int) -> int:
        """Publish one batch storing block number ``block``; its sequence number."""
        seq = len(self.sent)
        tokens = [block * BLOCK + i for i in range(BLOCK)]
        event: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": [1000 + block],
            "parent_block_hash": None,
        }
        event |= {"token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU"}
        payload = msgspec.msgpack.encode([time.time(), [event], None])
        self.sent.append(payload)
        await self.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve_replay(self) -> None:
        while True:
            frames = await self.router.recv_multipart()
            ident, start = frames[0], int.from_bytes(frames[-1], "big")
            for seq in range(start, len(self.sent)):
                await self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), self.sent[seq]])
            await self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


class KvEventTransportContract:
    """A KV-event transport brings a worker's batches to every router, in order, history included."""

    factory: ClassVar[Any]

    def options(self) -> BackendOptions:
        return BackendOptions()

    def catalog(self) -> Any:
        decoders = KvDecoderRegistry()
        decoders.add(MsgpackEventDecoder(DECODER))
        transports = KvEventTransportRegistry()
        transports.add(self.factory)
        return SimpleNamespace(kv_decoders=decoders, kv_event_transports=transports)

    def hub(self) -> KvHub:
        hub = KvHub(self.catalog(), None, KvSettings())
        hub.sources.configure(options=self.options())
        return hub

    @staticmethod
    def blocks(hub: KvHub, worker_id: str) -> int:
        view = hub.index.view(worker_id, None)
        return -1 if view is None else view.block_count()

    @staticmethod
    async def until(predicate: Any, within: float) -> None:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 (state without an event to wait on)
                await asyncio.sleep(0.02)

    def test_satisfies_protocol(self) -> None:
        _check_identity(self.factory, KvEventTransportFactory)

    async def test_batches_reach_every_router_in_order_history_included(self) -> None:
        publisher = StandinKvPublisher()
        publisher.start()
        ctx = WorkerContext(
            "kv-contract", "m", "http://127.0.0.1:9", kv_events=publisher.info, options=self.options()
        )
        attachment = await self.factory.attach_worker(ctx)
        fields = attachment.record_fields if attachment is not None else {}
        record = WorkerRecord.model_validate(
            {
                "worker_id": "kv-contract",
                "url": "http://127.0.0.1:9",
                "model": "m",
                "engine": "fake",
                "kv_events": publisher.info,
                "kv_event_transport": self.factory.name,
                **fields,
            }
        )
        first, late = self.hub(), self.hub()
        try:
            await first.start()
            first.worker_added(record)
            # until the first router follows (a PUB drops what it sends before subscribers join)
            block = 0
            while self.blocks(first, "kv-contract") < 1:
                await publisher.publish(block)
                block += 1
                await asyncio.sleep(0.1)
                assert block < 100, "the first router never received a batch"
            for _ in range(20):
                await publisher.publish(block)
                block += 1
            await self.until(lambda: self.blocks(first, "kv-contract") == block, 10)
            (sub,) = first.subs["kv-contract"]
            assert sub.last_seq == block - 1 and sub.undecodable == 0
            # a router that starts later loads the history (replay / stream) without new events
            await late.start()
            late.worker_added(record)
            await self.until(lambda: self.blocks(late, "kv-contract") == block, 10)
        finally:
            await first.close()
            await late.close()
            if attachment is not None:
                await attachment.close()
            await publisher.close()

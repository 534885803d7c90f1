"""KV events an engine serves by polling, published by the launcher like any engine's.

Some engines do not push KV events: TensorRT-LLM's ``trtllm-serve`` hands them out on
``POST /kv_cache_events``, and each call *takes* what it returns (the events leave the
engine's queue). Routers must not poll such an engine themselves — two router replicas
would each see part of the stream — so the launcher, the engine's one reader, polls it
(the adapter's optional :class:`~infera_core.engines.base.KvEventPoller` method) and
publishes every batch on the ZMQ endpoints of the worker record, with the sequence frame
and replay socket of the vLLM layout (``[topic, seq(8B BE), payload]``; a DEALER sends
``[b"", start]`` and reads ``[b"", topic, seq, payload]`` until seq -1). Routers then
subscribe to it as to any publisher, and a ``--kv-event-transport`` (NATS) relays it on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from infera_core.engines.base import KvEventPoller, RunningEngine
from infera_core.engines.support import bracket_host
from infera_core.util.kv_replay import serve_replay
from infera_core.worker import KvEventsInfo

log = logging.getLogger(__name__)

POLL_IDLE_S = 0.1
"""Pause after a poll that returned nothing (the engine's own call may also wait)."""
POLL_ERROR_S = 1.0
"""Pause after a failed poll (the engine restarting, a timeout): logged once per outage."""
REPLAY_BUFFER = 10_000


def endpoint_port(endpoint: str) -> int:
    """The port of a ``tcp://host:port`` endpoint (a ValueError when it has none)."""
    port = urlsplit(endpoint).port
    if port is None:
        raise ValueError(f"no port in KV event endpoint {endpoint!r}")
    return port


class PolledKvPublisher:
    """Polls one engine's KV events (``poller``) and publishes them on ``kv``'s ports."""

    def __init__(
        self,
        poller: KvEventPoller,
        engine: RunningEngine,
        kv: KvEventsInfo,
        bind_host: str,
        *,
        idle_s: float = POLL_IDLE_S,
        buffer: int = REPLAY_BUFFER,
    ) -> None:
        self.poller = poller
        self.engine = engine
        self.topic = kv.topic.encode()
        self.idle_s = idle_s
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=max(1, buffer))
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.replay: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        host = bracket_host(bind_host)
        try:
            for sock in (self.pub,):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100_000)
            self.pub.bind(f"tcp://{host}:{endpoint_port(kv.endpoint)}")
            if kv.replay_endpoint:
                self.replay = self.ctx.socket(zmq.ROUTER)
                self.replay.setsockopt(zmq.LINGER, 0)
                self.replay.bind(f"tcp://{host}:{endpoint_port(kv.replay_endpoint)}")
        except (zmq.ZMQError, ValueError):
            self._close_sockets()
            raise

    def start(self) -> None:
        """Start polling and answering replay requests (needs a running event loop)."""
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._poll(), name="kv-poll"))
        if self.replay is not None:
            self._tasks.append(asyncio.create_task(self._serve_replay(), name="kv-poll-replay"))

    async def publish(self, payload: bytes) -> int:
        """Send one batch; returns its sequence number."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _poll(self) -> None:
        failing = False
        while True:
            try:
                payloads = await self.poller.poll_kv_events(self.engine)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("worker %s: KV event poll failed: %s", self.engine.ctx.worker_id, exc)
                failing = True
                await asyncio.sleep(POLL_ERROR_S)
                continue
            failing = False
            for payload in payloads:
                await self.publish(payload)
            if not payloads:
                await asyncio.sleep(self.idle_s)

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        await serve_replay(self.replay, self.topic, lambda: list(self.buffer))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.ctx.term()


def polled_kv_events(
    adapter: object, engine: RunningEngine, kv: KvEventsInfo | None, bind_host: str
) -> PolledKvPublisher | None:
    """A started publisher for an adapter with :class:`KvEventPoller` and a ``kv_events``
    record; None for every other engine (they publish themselves)."""
    if not isinstance(adapter, KvEventPoller) or kv is None:
        return None
    publisher = PolledKvPublisher(adapter, engine, kv, bind_host)
    publisher.start()
    return publisher

"""The ``zmq`` KV-event transport's router side: each router reads every engine's ZMQ publisher.

:class:`ZmqKvEventSource` is a :class:`~infera_core.transports.base.KvEventSource` like any
other transport's: the KV hub (:mod:`infera_core.kv.hub`) does the sequencing, gap
detection, decoding and indexing; this module owns the sockets.

Wire: frames ``[topic, seq(8B BE), payload]``; replay: a DEALER sends ``[b"", start_seq]``
and reads ``[b"", (topic,) seq, payload]`` until a seq of -1 (8B signed). A publisher
without the seq frame (``kv_events.seq_frames = False``, ATOM's ``[topic, payload]``) is
numbered after the hub's last seq. DP rank ``r`` of a worker that publishes per rank
(``port_per_dp_rank``) is on the ports ``r`` above its record's endpoints.

``MAXMSGSIZE`` bounds what one publisher can make the router buffer (``--kv-max-message-bytes``):
libzmq drops a connection that sends a bigger message. It treats that as a protocol error
and, unlike a broken connection, never reconnects on its own — the subscription would be
silent for ever. :func:`redial` watches the socket's monitor and connects again whenever
the connection drops (reported to the sink as ``dropped``), so the events in between show
up as a gap (replayed, or the view marked stale) instead of a frozen view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from infera_core.kv.events import parse_seq
from infera_core.transports.base import KvEventSink, KvSourceContext
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.kv.hub")  # the hub's messages, as when the hub owned the sockets

END_SEQ = -1
"""The seq of a replay answer's last frame."""


class ZmqKvEventSource:
    """One ZMQ context per router; a SUB socket (and its monitor) per publisher followed."""

    def __init__(self, ctx: KvSourceContext) -> None:
        self.max_message = ctx.max_message_bytes
        self.reconnect_max_s = ctx.reconnect_max_s
        self.replay_timeout = ctx.replay_timeout
        self._zmq: zmq.asyncio.Context | None = None
        self._sinks: dict[tuple[str, int | None], KvEventSink] = {}
        """The sink of each publisher followed now: where a replay reports a bad seq."""

    async def start(self) -> None:
        if self._zmq is None:
            self._zmq = zmq.asyncio.Context()

    async def close(self) -> None:
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None

    async def follow(self, record: WorkerRecord, rank: int | None, sink: KvEventSink) -> None:
        kv = record.kv_events
        if kv is None:
            raise ValueError(f"worker {record.worker_id} has no KV publisher to follow")
        if self._zmq is None:
            raise ConnectionError("the ZMQ KV source is not started")
        endpoint, replay_endpoint = kv.endpoints(rank)
        sock = open_sub(self._zmq, endpoint, kv.topic.encode(), self.max_message, self.reconnect_max_s)
        mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        why = f"a message over --kv-max-message-bytes {self.max_message}, or the publisher went away"
        redialer = asyncio.create_task(redial(sock, mon, endpoint, lambda: sink.dropped(why)))
        key = (record.worker_id, rank)
        self._sinks[key] = sink
        try:
            await sink.subscribed(replay_endpoint is not None)
            numbered = kv.seq_frames
            while True:
                frames = await sock.recv_multipart()
                if len(frames) < 3:
                    if frames and not numbered:  # [topic, payload] (ATOM): numbered after the last
                        last = sink.last_seq
                        await sink.batch(0 if last is None else last + 1, frames[-1])
                    else:
                        sink.malformed(f"a message of {len(frames)} frame(s)")
                    continue
                seq = parse_seq(frames[-2])
                if seq is None:
                    sink.bad_seq(f"a {len(frames[-2])}-byte seq frame")
                    continue
                await sink.batch(seq, frames[-1])
        finally:
            if self._sinks.get(key) is sink:
                del self._sinks[key]
            redialer.cancel()
            close_monitored(sock, mon)

    async def replay(
        self, record: WorkerRecord, rank: int | None, start: int, until: int
    ) -> list[tuple[int, bytes]] | None:
        """From the publisher's replay socket; None when it has none, fails or times out."""
        kv = record.kv_events
        endpoint = kv.endpoints(rank)[1] if kv is not None else None
        if endpoint is None or self._zmq is None:
            return None
        sink = self._sinks.get((record.worker_id, rank))
        return await replay(
            self._zmq,
            endpoint,
            start,
            until,
            wait_s=self.replay_timeout,
            max_message=self.max_message,
            worker_id=record.worker_id,
            on_bad_seq=lambda: sink.bad_seq("a bad seq in a replay answer") if sink is not None else None,
        )


def open_sub(
    ctx: zmq.asyncio.Context, endpoint: str, topic: bytes, max_message: int, reconnect_max_s: float
) -> zmq.asyncio.Socket:
    """A SUB socket connected to ``endpoint`` (``max_message`` 0: no size limit)."""
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.IPV6, 1)  # tcp://[v6]:port endpoints; IPv4 ones work as before
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(reconnect_max_s * 1000))
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message or -1)
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    try:
        sock.connect(endpoint)
    except BaseException:
        sock.close(0)
        raise
    return sock


async def redial(
    sock: zmq.asyncio.Socket, mon: zmq.asyncio.Socket, endpoint: str, on_drop: Callable[[], None]
) -> None:
    """Until cancelled: whenever ``sock``'s connection drops (``mon`` is its monitor socket,
    from ``sock.get_monitor_socket()``; the caller closes both), call ``on_drop`` and connect again."""
    while True:
        event = parse_monitor_message(await mon.recv_multipart())
        if event["event"] != zmq.EVENT_DISCONNECTED:
            continue
        on_drop()
        with contextlib.suppress(zmq.ZMQError):  # already forgotten by libzmq
            sock.disconnect(endpoint)
        sock.connect(endpoint)


def close_monitored(sock: zmq.asyncio.Socket, mon: zmq.asyncio.Socket) -> None:
    """Close a socket and its monitor at once (no await: the context may be terminated next)."""
    with contextlib.suppress(zmq.ZMQError):
        sock.disable_monitor()
    mon.close(0)
    sock.close(0)


async def replay(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    start: int,
    until: int,
    *,
    wait_s: float,
    max_message: int,
    worker_id: str,
    on_bad_seq: Callable[[], None],
) -> list[tuple[int, bytes]] | None:
    """Batches ``[start, until)`` from a replay socket (DEALER ``[b"", start]`` → ``[b"",
    (topic,) seq, payload]``… until seq -1); None when it fails or times out."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message or -1)
    sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + wait_s
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await sock.poll(int(left * 1000)):
                log.warning("worker %s: KV replay from %s timed out", worker_id, endpoint)
                return None
            frames = await sock.recv_multipart()
            while frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) < 2:
                continue
            seq = parse_seq(frames[-2])
            if seq == END_SEQ:
                return out
            if seq is None or seq < 0:
                on_bad_seq()
                continue
            if start <= seq < until:
                out.append((seq, frames[-1]))
    except zmq.ZMQError as exc:
        log.warning("worker %s: KV replay failed: %s", worker_id, exc)
        return None
    finally:
        sock.close(0)

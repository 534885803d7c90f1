"""The hub's ZMQ sockets to one publisher: the SUB socket, what keeps it connected, replay.

``MAXMSGSIZE`` bounds what one publisher can make the router buffer (``--kv-max-message-bytes``):
libzmq drops a connection that sends a bigger message. It treats that as a protocol error
and, unlike a broken connection, never reconnects on its own — the subscription would be
silent for ever. :func:`redial` watches the socket's monitor and connects again whenever
the connection drops, so the events in between show up as a gap (replayed, or the view
marked stale) instead of a frozen view.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from infera_core.kv.decode import parse_seq

log = logging.getLogger("infera.kv.hub")

END_SEQ = -1
"""The seq of a replay answer's last frame."""


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

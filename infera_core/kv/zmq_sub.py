"""The hub's ZMQ SUB socket to one publisher, and what keeps it connected.

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
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("infera.kv.hub")


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

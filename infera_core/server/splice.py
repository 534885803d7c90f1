"""A streamed response's chunks written to the client from the worker connection's read callback.

The relay of an SSE stream (:mod:`infera_core.server.proxy`) otherwise wakes its task once
per chunk the worker sends: a future set, a task step, the response iterator and the ASGI
``send`` coroutine, all before the one socket write. With an engine sending one token per
chunk that is the router's per-chunk cost beyond the read and the write. A
:class:`StreamTally` given to the native transport's response (``Http1Response.sink``)
instead writes each chunk, framed for chunked transfer, to the client's transport right
where the worker's bytes are parsed, and keeps the stream's timing (first/last chunk,
``data:`` events, the last two chunks for the usage scan) as the relay would.

It declines a chunk (which then goes the ordinary way, through the task and ``send``) when
the client's transport is paused for writing (backpressure: ``send`` waits for it to drain
and the worker connection's own high-water mark pauses reading), when the client is gone,
while earlier chunks are still buffered, or while the relay task sends one itself (it
detaches the sink meanwhile): the order is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from infera_core.server.asgi import EchoHeader
from infera_core.server.coalesce import CoalescingTransport

_clock = time.perf_counter


class StreamTally:
    """The relay's per-stream state; :meth:`note` for chunks the task relays, :meth:`__call__`
    (the sink) for chunks written straight from the read callback."""

    __slots__ = ("_cycle", "_flow", "_out", "events", "first", "kept", "last", "on_first", "prev", "tail")

    def __init__(self) -> None:
        self.kept: list[bytes] | None = None
        """A migratable stream's relayed bytes (:mod:`infera_core.server.resume`): the sink
        then writes whole SSE events only and keeps them here."""
        self.first = self.last = 0.0
        self.on_first: Callable[[], None] | None = None
        """Called once, when the first chunk passed (the router saw the first token)."""
        self.events = 0
        self.prev = self.tail = b""
        self._cycle: Any = None
        self._flow: Any = None
        self._out: CoalescingTransport | None = None

    def note(self, chunk: bytes) -> None:
        """A chunk the relay task sends itself."""
        last = self.last = _clock()
        if not self.first:
            self.first = last
            if self.on_first is not None:
                self.on_first()
        self.events += chunk.count(b"data: ")
        self.prev, self.tail = self.tail, chunk

    def attach(self, send: Any) -> bool:
        """Write chunks straight to the client when ``send`` is the server's own (uvicorn's
        cycle on :class:`~infera_core.server.protocol.InferaHttpProtocol`) and the response
        it started is chunked (also behind :class:`~infera_core.server.asgi.EchoHeader`, which
        only touches the response start). False: not possible here (the relay sends every chunk)."""
        if type(send) is EchoHeader:
            send = send.inner
        cycle = getattr(send, "__self__", None)
        if type(cycle) is not RequestResponseCycle:
            return False
        out: Any = cycle.transport
        if type(out) is not CoalescingTransport or cycle.chunked_encoding is not True:
            return False
        self._cycle = cycle
        self._flow = cycle.flow
        self._out = out
        return True

    def __call__(self, chunk: bytes) -> bool:
        """Called by the worker connection per body chunk while none is buffered before it;
        True when written to the client."""
        if self._flow.write_paused or self._cycle.disconnected:
            return False
        if not chunk:  # framed, an empty chunk would be the terminating one ("0\r\n\r\n")
            return True
        kept = self.kept
        if kept is not None and not chunk.endswith(b"\n\n"):
            return False  # part of an event: the relay holds it back until it is whole
        out = self._out
        assert out is not None
        try:
            out.write_body(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        except RuntimeError:  # the transport closed under us: the client is gone
            return False
        if kept is not None:
            kept.append(chunk)
        last = self.last = _clock()
        if not self.first:
            self.first = last
            if self.on_first is not None:
                self.on_first()
        self.events += chunk.count(b"data: ")
        self.prev, self.tail = self.tail, chunk
        return True

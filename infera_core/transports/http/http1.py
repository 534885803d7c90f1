"""One HTTP/1.1 client connection to a worker (an asyncio Protocol + ``httptools``) and its response.

A connection carries one request at a time (no pipelining). :meth:`Http1Connection.request`
writes the pre-built request bytes in one ``write`` and returns an :class:`Http1Response`
once the status line and headers arrived; the body then arrives into the response
(content-length, chunked — decoded by the parser — or read until the worker closes).

Timeouts: one timer per connection, first for the response headers (``first_byte``), then,
once they arrived and the body did not come with them, for the gap between two reads
(``idle``), re-armed lazily (a read only stamps the time); it outlives the response, so
the next request on the connection usually arms none. When the response completes with keep-alive, the connection goes back
to its pool — but only when the parser stopped exactly at the end of that response: any
byte beyond it (a worker writing garbage or an unasked-for response after a complete one)
closes the connection instead, so the next request never inherits a half-parsed message.
A response released before its end closes the connection (that is how a client
disconnect reaches the worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from infera_core.transports.upstreams import ChunkQueueResponse, set_nodelay

HIGH_WATER = 256 * 1024
"""Buffered body bytes not yet taken by the relay above which reading from the worker pauses."""


class UpstreamClosed(ConnectionError):
    """The worker closed the connection (or sent something that is not HTTP/1.1) mid-request."""

    def __init__(self, message: str, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale
        """True when a reused keep-alive connection was found closed before any byte came back."""


class Http1Response(ChunkQueueResponse):
    """A worker's response: ``status``, ``content_type``, :meth:`header`, then the body by
    ``await read()`` or ``async for chunk in response``. Call :meth:`release` when done."""

    __slots__ = ("_conn", "headers", "sink")

    def __init__(self, conn: Http1Connection) -> None:
        super().__init__()
        self._conn: Http1Connection | None = conn
        self.headers: list[tuple[bytes, bytes]] = []
        self.sink: Callable[[bytes], bool] | None = None
        """Set by a relay: called with each body chunk while none is buffered before it;
        True when it took the chunk (it is then not buffered for ``async for``)."""

    def header(self, name: str, default: str | None = None) -> str | None:
        """A response header by case-insensitive name."""
        key = name.lower().encode("latin-1")
        for k, v in self.headers:
            if k.lower() == key:
                return v.decode("latin-1")
        return default

    # -- read by the relay ---------------------------------------------------------
    async def _wait(self) -> None:
        conn = self._conn
        if conn is None:
            loop = asyncio.get_running_loop()
        else:
            loop = conn.loop  # (get_running_loop() makes a getpid() system call: per read)
            if conn.paused:
                conn.resume()
        w = self._waiter = loop.create_future()
        await w

    def _taken(self) -> None:
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()

    def release(self) -> None:
        """Done with this response; a body not fully received closes the connection."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abandon()
        self._chunks = []

    close = release


class Http1Connection(asyncio.Protocol):
    """A keep-alive connection; ``on_idle(conn)`` gets it back after a complete response."""

    __slots__ = (
        "_arm_idle",
        "_deadline",
        "_desync",
        "_eof_body",
        "_feeding",
        "_got",
        "_idle_pending",
        "_last",
        "_timer",
        "_timer_at",
        "closed",
        "idle_since",
        "idle_timeout",
        "loop",
        "on_idle",
        "on_lost",
        "parser",
        "paused",
        "resp",
        "transport",
        "used",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_idle: Callable[[Http1Connection], None],
        on_lost: Callable[[Http1Connection], None],
    ) -> None:
        self.loop = loop
        self.on_idle = on_idle
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Http1Response | None = None
        self.closed = False
        self.paused = False
        self.used = 0
        """Requests this connection completed (a reused connection may turn out stale)."""
        self.idle_since = 0.0
        self.idle_timeout = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When ``_timer`` fires (it is kept across requests: see :meth:`_on_timer`)."""
        self._deadline = 0.0
        """The request's first-byte deadline."""
        self._arm_idle = False
        """Response headers arrived during this ``feed_data``: time the body once it returns."""
        self._last = 0.0
        self._got = False
        self._eof_body = False
        self._feeding = False
        self._idle_pending = False
        """A response completed during this ``feed_data``: pool the connection once it returns."""
        self._desync = False
        """The worker sent bytes beyond the response asked for: never reuse the connection."""

    # -- the request ---------------------------------------------------------------
    async def request(
        self, data: bytes | tuple[bytes, bytes], first_byte: float, idle: float
    ) -> Http1Response:
        """Send ``data``; the response once its headers arrived. Raises :class:`UpstreamClosed`,
        ``TimeoutError`` (first byte) or ``ConnectionError``; cancelling closes the connection."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            raise UpstreamClosed("the connection to the worker was closed", stale=self.used > 0)
        resp = self.resp = Http1Response(self)
        self._got = False
        self.idle_timeout = idle
        loop = self.loop
        waiter = resp._waiter = loop.create_future()
        deadline = self._deadline = loop.time() + first_byte
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)
        if isinstance(data, bytes):
            transport.write(data)
        else:
            transport.writelines(data)
        try:
            await waiter
        except BaseException:
            resp.release()
            raise
        return resp

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._on_timer)
        self._timer_at = at

    def _on_timer(self) -> None:
        """The connection's one timer: the first-byte deadline, then the gap between reads.

        It is not cancelled when a response completes: the next request on the connection
        keeps it when it fires no later than that request's deadline (the usual case, so a
        request arms no timer of its own), and a timer that finds nothing due re-arms
        itself for what is (or, the connection idle in its pool, stops)."""
        self._timer = None
        resp = self.resp
        if resp is None:
            return
        now = self.loop.time()
        if not resp.status:  # no response headers yet
            if now < self._deadline:
                self._arm(self._deadline)
                return
            resp._fail(TimeoutError("no response before the first-byte timeout"))
            self.abort()
            return
        if self.paused:  # a paused read waits on the client, not on the worker
            self._arm(now + self.idle_timeout)
            return
        deadline = self._last + self.idle_timeout
        if now < deadline:
            self._arm(deadline)
            return
        resp._fail(TimeoutError(f"no data from the worker for {self.idle_timeout:g} s"))
        self.abort()

    # -- flow control and closing --------------------------------------------------
    def resume(self) -> None:
        self.paused = False
        self._last = self.loop.time()
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abandon(self) -> None:
        """The response was released before its end: the connection cannot be reused."""
        if self.resp is not None:
            self.resp = None
            self.abort()

    def abort(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    # -- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        resp = self.resp
        self.resp = None
        if resp is not None and not resp.done:
            if self._eof_body and resp.status:
                self._complete(resp, keep=False)  # a body delimited by the end of the connection
            elif not resp.status:
                stale = self.used > 0 and not self._got
                resp._fail(UpstreamClosed("the worker closed the connection before responding", stale))
            else:
                resp._fail(UpstreamClosed("the worker closed the connection mid-response"))
        self.on_lost(self)

    def data_received(self, data: bytes) -> None:
        if self.resp is None:
            self.abort()  # bytes nobody asked for: the connection is not reusable
            return
        self._got = True
        self._last = self.loop.time()
        self._feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp = self.resp
            if resp is not None:
                resp._fail(UpstreamClosed(f"the worker sent an invalid HTTP response: {exc}"))
            self.abort()
        finally:
            self._feeding = False
        if self._arm_idle:
            self._arm_idle = False
            # the body is still arriving (a complete response needs no timer): the gap
            # between reads is timed from now on
            at = self._last + self.idle_timeout
            if self.resp is not None and not self.closed and (self._timer is None or self._timer_at > at):
                self._arm(at)
        if self._idle_pending:
            # pooled only at a message boundary: every byte of this read belonged to the response
            self._idle_pending = False
            if self._desync or self.closed:
                self.abort()
            else:
                self.on_idle(self)

    def eof_received(self) -> bool:
        return False

    # -- httptools callbacks -------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.resp is None:
            self._desync = True  # a message nobody asked for (bytes after a complete response)

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.resp
        if resp is not None:
            resp.headers.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        if resp is None:
            return
        status = self.parser.get_status_code()
        if status < 200:  # an interim response (100 Continue): wait for the real one
            resp.headers = []
            return
        resp.status = status
        length = chunked = False
        for k, v in resp.headers:
            lk = k.lower()
            if lk == b"content-type":
                resp.content_type = v.decode("latin-1")
            elif lk == b"content-length":
                length = True
            elif lk == b"transfer-encoding":
                chunked = True
        self._eof_body = not (length or chunked or status in (204, 304))
        self._arm_idle = True  # data_received times the body once the parser returns
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        if resp is None:
            return
        sink = resp.sink
        if sink is not None and not resp._chunks and sink(body):
            return
        resp._chunks.append(body)
        resp._buffered += len(body)
        if resp._waiter is not None:
            resp._wake()
        elif resp._buffered > HIGH_WATER and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        resp = self.resp
        if resp is None or not resp.status:
            return  # the end of an interim response
        self._complete(resp, self.parser.should_keep_alive() and not self._eof_body)

    def _complete(self, resp: Http1Response, keep: bool) -> None:
        self.resp = None  # the timer stays armed: the next request will likely keep it
        resp._conn = None
        resp.done = True
        resp._wake()
        self.used += 1
        if keep and not self.closed:
            if self.paused:
                self.resume()
            if self._feeding:
                self._idle_pending = True  # data_received decides once the parser returns
            else:
                self.on_idle(self)
        else:
            self.abort()

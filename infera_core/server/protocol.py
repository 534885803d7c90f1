"""The server's HTTP/1.1 protocol: uvicorn's httptools one, tuned and with connection limits.

- Nagle off, each response's header block sent with its first body bytes
  (:class:`~infera_core.server.coalesce.CoalescingTransport`), and a client disconnect
  reported to the request's ``scope[ON_DISCONNECT]`` callback (no watcher task per request).
- Limits (:class:`~infera_core.server.limits.LimitSettings`): a connection beyond
  ``max_connections``, or beyond ``max_connections_per_client`` from one client address,
  gets 503 and is closed; one idle for ``idle_timeout`` (never used,
  or between requests) is closed; a request whose headers are not complete within
  ``header_timeout`` of its first byte gets 408; a request line + headers over
  ``max_header_bytes`` gets 431; a body that stops for ``body_timeout`` between two reads,
  or averages under ``min_body_rate`` bytes/s once ``body_timeout`` passed since its
  headers, gets 408 and its request is never dispatched. Deadlines are plain timestamps checked by one timer per
  server (:class:`_Sweeper`), so a request pays for no timer of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from infera_core.server.asgi import CLIENT_CLOSING, ON_DISCONNECT
from infera_core.server.coalesce import CoalescingTransport
from infera_core.server.errors import ApiError
from infera_core.server.limits import LimitSettings
from infera_core.transports.upstreams import set_nodelay

log = logging.getLogger("infera.server")

_LINGER = 2.0
"""Seconds a rejected connection is still read (and what arrives dropped) after the last
bytes came, before it is closed."""
_LINGER_MAX = 30.0
"""Seconds a rejected connection that keeps sending is read at most (nginx's ``lingering_time``)."""
_LOG_EVERY = 10.0
"""Seconds between two log lines about one client address refused (``--max-connections-per-client``)."""
_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def _raw_error(err: ApiError) -> bytes:
    """A complete ``Connection: close`` response carrying ``err`` (written before any cycle exists)."""
    body = json.dumps(err.payload()).encode()
    extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers.items())
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (err.status, _REASONS.get(err.status, b"Error")),
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body),
            extra,
            b"\r\n",
            body,
        ]
    )


class _NoEvent:
    def set(self) -> None:
        return None


class _Closed:
    """Stands in for uvicorn's request cycle on a connection this protocol rejected."""

    response_complete = True
    disconnected = True
    message_event = _NoEvent()


_CLOSED: Any = _Closed()


class _Sweeper:
    """One timer per server: closes the connections whose deadline passed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], every: float) -> None:
        self.loop = loop
        self.connections = connections
        self.every = every
        self.armed = False

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            self.loop.call_later(self.every, self._tick)

    def _tick(self) -> None:
        self.armed = False
        if not self.connections:
            return  # re-armed by the next connection
        now = self.loop.time()
        for proto in list(self.connections):
            deadline = getattr(proto, "deadline", 0.0)
            if deadline and now >= deadline:
                proto.expire()
        self.arm()


class InferaHttpProtocol(HttpToolsProtocol):
    """See the module docstring. Built per server by :func:`protocol_class` (which sets ``limits``)."""

    limits: LimitSettings = LimitSettings()
    deadline = 0.0
    """When this connection is closed unless something happens first (0: no deadline)."""
    _awaiting_headers = False
    _awaiting_body = False
    _body_start = 0.0
    _body_bytes = 0
    _header_bytes = 0
    _read_len = 0
    """Bytes of the read being parsed."""
    _first_len = 0
    """Bytes of the read a request began in (an upper bound of its headers there)."""
    _fresh = False
    _rejected = False
    _linger_until = 0.0
    _client_addr: str | None = None
    """The client's address while this connection counts for it (``--max-connections-per-client``)."""
    _client_counts: dict[str, int]
    _is_closing: Callable[[], bool]

    def connection_made(self, transport: Any) -> None:
        set_nodelay(transport)
        coalescing = CoalescingTransport(transport, self.loop)
        coalescing.linger = self._linger
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._is_closing = self.transport.is_closing  # every request's scope[CLIENT_CLOSING]
        limits = self.limits
        state = self.server_state
        sweeper: _Sweeper | None = getattr(state, "infera_sweeper", None)
        if sweeper is None:
            shortest = min(limits.header_timeout, limits.body_timeout, limits.idle_timeout)
            every = min(1.0, max(0.05, shortest / 4))
            sweeper = _Sweeper(self.loop, self.connections, every)
            state.infera_sweeper = sweeper  # type: ignore[attr-defined]
        sweeper.arm()
        if self._over_client_cap(transport, state, limits):
            return
        if len(self.connections) - getattr(state, "infera_closing", 0) > limits.max_connections:
            log.warning("refusing a connection: %d open (--max-connections)", len(self.connections) - 1)
            err = ApiError(
                503,
                f"The server has reached its limit of {limits.max_connections} connections"
                " (--max-connections); retry later.",
                code="too_many_connections",
                headers={"retry-after": "1"},
            )
            self._reject(err)
            return
        self.deadline = self.loop.time() + limits.idle_timeout

    def _over_client_cap(self, transport: Any, state: Any, limits: LimitSettings) -> bool:
        """Count this connection for its client address; past ``--max-connections-per-client``
        answer 503 and close (one log line per address and ``_LOG_EVERY`` seconds)."""
        peer = transport.get_extra_info("peername")
        if not isinstance(peer, tuple) or not peer:
            return False  # a Unix socket: one client
        counts: dict[str, int] | None = getattr(state, "infera_per_client", None)
        if counts is None:
            counts = state.infera_per_client = {}
            state.infera_refused_at = {}
        addr = str(peer[0])
        self._client_addr = addr
        self._client_counts = counts
        n = counts[addr] = counts.get(addr, 0) + 1
        cap = limits.per_client_cap()
        if n <= cap:
            return False
        now = self.loop.time()
        logged: dict[str, float] = state.infera_refused_at
        if now - logged.get(addr, -_LOG_EVERY) >= _LOG_EVERY:
            if len(logged) > 4096:
                logged.clear()
            logged[addr] = now
            log.warning(
                "refusing connections from %s: %d open from that address (--max-connections-per-client %d)",
                addr,
                n - 1,
                cap,
            )
        self._reject(
            ApiError(
                503,
                f"Too many connections from your address: the server allows {cap} per client"
                " (--max-connections-per-client); close idle ones or retry later.",
                code="too_many_connections",
                headers={"retry-after": "1"},
            )
        )
        return True

    def _mark_rejected(self) -> None:
        """This connection is answered and closing (lingering): it no longer counts against
        ``--max-connections``, so refused clients cannot crowd out new ones."""
        if not self._rejected:
            self._rejected = True
            state = self.server_state
            state.infera_closing = getattr(state, "infera_closing", 0) + 1  # type: ignore[attr-defined]

    def _reject(self, err: ApiError) -> None:
        """Answer ``err`` without a request cycle and close. The close lingers: what the
        client still sends is read and dropped for up to ``_LINGER`` seconds, so that it
        gets the answer instead of a reset (closing with unread bytes sends an RST)."""
        self._mark_rejected()
        self._awaiting_headers = self._awaiting_body = False
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:  # a request in flight: it is over
            self._client_gone()
            cycle.disconnected = True  # its response is never written
            cycle.message_event.set()
        self.cycle = _CLOSED
        if self.transport.is_closing():
            return
        self.transport.write(_raw_error(err))
        self._half_close()

    def _half_close(self) -> None:
        """Send EOF and read (dropping) what the client still sends until it stops for
        ``_LINGER`` seconds, ``_LINGER_MAX`` at most; closing with unread bytes would send
        an RST, which can reach the client before it read the answer."""
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            self.transport.close()
            return
        now = self.loop.time()
        self._linger_until = now + _LINGER_MAX
        self.deadline = now + _LINGER

    def _linger(self) -> bool:
        """The app's response ended (and uvicorn closes the connection) while the request's
        body was still arriving, a 413 for one: close lingering, as for a rejection. False
        when there is nothing left to read (a plain close)."""
        if not self._awaiting_body or self._rejected or self.transport.is_closing():
            return False
        self._mark_rejected()
        self._awaiting_body = False
        self._half_close()
        return True

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP, OpenAI-shaped (it sends plain text)."""
        self._reject(
            ApiError(400, f"{msg.rstrip('.')}: the request is not valid HTTP/1.1.", code="invalid_http")
        )

    def expire(self) -> None:
        """The deadline passed: 408 while a request's headers are arriving, else just close."""
        self.deadline = 0.0
        if self._awaiting_headers and not self._rejected:
            limit = self.limits.header_timeout
            self._reject(
                ApiError(
                    408,
                    f"The request headers did not arrive within {limit:g} s (--header-timeout).",
                    code="header_timeout",
                )
            )
        elif self._awaiting_body and not self._rejected:
            self._body_expired()
        elif not self.transport.is_closing():
            self.transport.close()

    def _body_deadline(self, now: float) -> float:
        """When a body that receives nothing more is too slow: ``body_timeout`` after the last
        read, and no later than where its average rate falls under ``min_body_rate``."""
        limits = self.limits
        deadline = now + limits.body_timeout
        if limits.min_body_rate:
            rate_bound = self._body_start + max(limits.body_timeout, self._body_bytes / limits.min_body_rate)
            deadline = min(deadline, rate_bound)
        return deadline

    def _body_expired(self) -> None:
        now = self.loop.time()
        if self.flow.read_paused:  # the app has not taken what arrived: not the client's fault
            self._body_start = now
            self._body_bytes = 0
            self.deadline = now + self.limits.body_timeout
            return
        limits = self.limits
        if now - self._body_start <= limits.body_timeout:
            why = f"sent no body bytes for {limits.body_timeout:g} s"
        else:
            why = f"sent its body slower than {limits.min_body_rate:g} bytes/s (--min-body-rate)"
        log.info("closing a connection whose client %s", why)
        self._reject(
            ApiError(
                408,
                f"The request body did not arrive in time: the client {why} (--body-timeout"
                f" {limits.body_timeout:g} s).",
                code="body_timeout",
            )
        )

    def data_received(self, data: bytes) -> None:
        if self._rejected:  # lingering: dropped, and the close waits while the client sends
            if self._linger_until:
                self.deadline = min(self.loop.time() + _LINGER, self._linger_until)
            return
        self._read_len = n = len(data)
        if self._awaiting_body:
            self._body_bytes += n
        HttpToolsProtocol.data_received(self, data)
        if self._awaiting_body and not self._rejected:
            # this read left a body unfinished (on_message_complete clears the flag): its
            # clock starts, or restarts; an ordinary request never gets here
            now = self.loop.time()
            if not self._body_start:
                self._body_start = now
            self.deadline = self._body_deadline(now)
        if self._awaiting_headers and not self._rejected:
            # Only chunks after the one a request began in count: an under-count of at most
            # one read, so headers stay bounded; on_headers_complete checks the exact size.
            if self._fresh:
                self._fresh = False
            else:
                self._header_bytes += n
                if self._header_bytes > self.limits.max_header_bytes:
                    self._too_large_headers()

    def _too_large_headers(self) -> None:
        self._awaiting_headers = False
        limit = self.limits.max_header_bytes
        self._reject(
            ApiError(
                431,
                f"The request line and headers are larger than the server's limit of {limit} bytes"
                " (--max-header-bytes).",
                code="headers_too_large",
            )
        )

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        scope = self.scope
        scope[ON_DISCONNECT] = None  # type: ignore[literal-required]
        scope[CLIENT_CLOSING] = self._is_closing  # type: ignore[literal-required]
        self._awaiting_headers = True
        self._fresh = True
        self._first_len = self._read_len
        self._header_bytes = 0
        self.deadline = self.loop.time() + self.limits.header_timeout

    def on_headers_complete(self) -> None:
        if self._rejected:
            self.cycle = _CLOSED
            return
        self._awaiting_headers = False
        self.deadline = 0.0
        # the bytes read since the request began bound its headers: counted exactly only
        # when that bound is over the limit (never for an ordinary request)
        limit = self.limits.max_header_bytes
        bound = self._first_len + self._header_bytes + (0 if self._fresh else self._read_len)
        if bound > limit and len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers) > limit:
            self._too_large_headers()
            return
        HttpToolsProtocol.on_headers_complete(self)
        if self.cycle is not _CLOSED:  # a body may follow (on_message_complete says it ended)
            self._awaiting_body = True
            self._body_start = 0.0
            self._body_bytes = 0

    def on_message_complete(self) -> None:
        if self._awaiting_body:  # (not after a rejection: its lingering close stays due)
            self._awaiting_body = False
            self.deadline = 0.0
        HttpToolsProtocol.on_message_complete(self)
        # uvicorn leaves reading paused after a large body's last chunk: resume, so that a
        # client leaving while its request is parsed or routed is seen (EOF or reset) at once.
        # Not while a pipelined request waits: then reading stays paused until the responses
        # went out (else a client could queue requests without bound).
        if not self.pipeline and self.flow.read_paused:
            self.flow.resume_reading()

    def on_response_complete(self) -> None:
        """uvicorn's, but the keep-alive wait until the next request is this connection's
        ``deadline`` (checked by the sweeper) instead of a loop timer armed and cancelled
        per request."""
        if self._awaiting_headers or self._awaiting_body or self._rejected:
            super().on_response_complete()  # answered before its request ended: uvicorn's timer
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.deadline = self.loop.time() + self.limits.idle_timeout

    def _client_gone(self) -> None:
        """Tell the request in progress (its ``scope[ON_DISCONNECT]`` callback), once."""
        cycle = getattr(self, "cycle", None)  # uvicorn's attribute; tolerate a rename
        if cycle is not None and not cycle.response_complete:
            # uvicorn marks this only in connection_lost, a loop turn after EOF: a request
            # cancelled now would return first and be logged as an app that left its
            # response unfinished ("ASGI callable returned without completing response")
            cycle.disconnected = True
            hook: Callable[[], None] | None = cycle.scope.get(ON_DISCONNECT)
            if hook is not None:
                cycle.scope[ON_DISCONNECT] = None
                hook()

    def eof_received(self) -> None:
        # The transport closes on EOF (uvicorn keeps no half-open connections): no answer can
        # reach the client any more, so its request stops now rather than a loop turn later.
        self._client_gone()

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline = 0.0
        if self._rejected:
            self.server_state.infera_closing -= 1  # type: ignore[attr-defined]
        addr = self._client_addr
        if addr is not None:
            self._client_addr = None
            left = self._client_counts[addr] - 1
            if left:
                self._client_counts[addr] = left
            else:
                del self._client_counts[addr]
        self._client_gone()
        super().connection_lost(exc)


def protocol_class(limits: LimitSettings) -> type[InferaHttpProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to these limits."""
    fields = LimitSettings(**limits.limits_of())
    return type("InferaHttpProtocol", (InferaHttpProtocol,), {"limits": fields})

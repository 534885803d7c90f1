"""``--request-transport nats``, router side: requests to workers over NATS request/reply.

:class:`NatsUpstream` implements the router's ``Upstream`` protocol
(:mod:`infera_core.transports.upstreams`): ``open`` publishes the request to the worker's
subject with a reply subject under the process's one wildcard inbox subscription and
returns once the head message arrived (the "first byte"); the body follows as ``D``
messages and an ``E`` (framing: :mod:`infera_nats.transport_wire`). Like the HTTP hop:

* before the head everything is an :class:`UpstreamError` (retried on another worker,
  counted by the breaker): no responder for the subject (the server's "no responders"
  status), the worker's engine unreachable (``X``), the first-byte timeout (``timeout=True``);
  NATS not connected is a :class:`TransportDownError`, retried but not the worker's fault;
* after it, a broken body raises :class:`UpstreamReadError`: the connection to NATS
  dropped, a message went missing (slow consumer: the ``seq`` jumped), the worker sent
  ``X``, or nothing came for ``idle_timeout``;
* releasing a response before its end publishes a cancel message; the responder aborts
  the local HTTP request to the engine (that is how a client disconnect reaches it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from infera_core.transports.upstreams import (
    ChunkQueueResponse,
    RequestTooLargeError,
    TransportDownError,
    UpstreamError,
    UpstreamReadError,
    UpstreamTarget,
)
from infera_nats import transport_wire as wire
from infera_nats.auth import NatsAuth
from infera_nats.transport_connect import close_quietly, connect_nats

log = logging.getLogger("infera.nats.transport")

_JSON_HEADERS = {"Content-Type": "application/json"}
_WARNED: set[str] = set()
"""Workers whose record names another worker's request subject (logged once each)."""


class NatsResponse(ChunkQueueResponse):
    """A worker's response over NATS (see ``UpstreamResponse``)."""

    __slots__ = ("_last", "_raw_headers", "_seq", "_timer", "cancel_subject", "endpoint", "owner", "reply")

    def __init__(
        self, owner: NatsUpstream, endpoint: UpstreamTarget, reply: str, cancel_subject: str
    ) -> None:
        super().__init__()
        self.owner: NatsUpstream | None = owner
        self.endpoint = endpoint
        self.reply = reply
        self.cancel_subject = cancel_subject
        self._raw_headers = b""
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0

    def header(self, name: str, default: str | None = None) -> str | None:
        if name.lower() == "content-type":
            return self.content_type or default
        found = wire.find_header(self._raw_headers, name) if self._raw_headers else None
        return default if found is None else found

    # -- fed by the upstream's inbox ----------------------------------------------
    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        owner = self.owner
        if owner is not None:
            owner._pending.pop(self.reply, None)

    def _feed(self, data: bytes, now: float) -> None:
        if len(data) < 5:
            self._fail(UpstreamReadError(f"malformed message from worker {self.endpoint.worker_id}"))
            return
        kind = data[0]
        seq = int.from_bytes(data[1:5], "big")
        if seq != self._seq:
            self._gap(seq - self._seq)
            return
        self._seq = seq + 1
        self._last = now
        rest = data[5:]
        if kind == wire.DATA:
            if rest:
                self._chunks.append(rest)
                self._buffered += len(rest)
                if self.owner is not None and self._buffered > self.owner.max_buffered:
                    self._too_slow()
                    return
        elif kind == wire.END:
            if rest:
                self._chunks.append(rest)
            self.done = True
            self._finish()
        elif kind == wire.HEAD or kind == wire.FULL:
            try:
                self.status, self.content_type, self._raw_headers, body = wire.decode_head(rest)
            except ValueError as exc:
                self._fail(UpstreamReadError(f"worker {self.endpoint.worker_id}: bad response head: {exc}"))
                return
            if body:
                self._chunks.append(body)
            if kind == wire.FULL:
                self.done = True
                self._finish()
            else:
                self._arm_idle()
        elif kind == wire.FAIL:
            reason = rest.decode("utf-8", "replace")
            if self.status:
                self._fail(
                    UpstreamReadError(f"worker {self.endpoint.worker_id} failed mid-response: {reason}")
                )
            else:
                self._fail(UpstreamError(self.endpoint, reason))
            return
        else:
            self._fail(UpstreamReadError(f"worker {self.endpoint.worker_id}: unknown message kind {kind}"))
            return
        self._wake()

    def _too_slow(self) -> None:
        """The reader fell too far behind the worker: fail the response and cancel it upstream."""
        assert self.owner is not None
        self._fail(
            UpstreamReadError(
                f"slow consumer: {self._buffered} bytes of worker {self.endpoint.worker_id}'s response"
                f" unread (limit {self.owner.max_buffered})"
            )
        )
        self._chunks = []
        self._cancel()

    def _gap(self, missing: int) -> None:
        what = f"{missing} message(s) of the response were lost (slow NATS consumer?)"
        if self.status:
            self._fail(UpstreamReadError(f"worker {self.endpoint.worker_id}: {what}"))
        else:
            self._fail(UpstreamError(self.endpoint, what))

    # -- timers ----------------------------------------------------------------------
    def _first_byte_expired(self) -> None:
        self._timer = None
        if not self.status:
            self._fail(
                UpstreamError(self.endpoint, "no response before the first-byte timeout", timeout=True)
            )
            self._cancel()

    def _arm_idle(self) -> None:
        owner = self.owner
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if owner is not None and owner._loop is not None:
            self._timer = owner._loop.call_at(self._last + owner.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self._timer = None
        owner = self.owner
        if owner is None or owner._loop is None or self.done:
            return
        now = owner._loop.time()
        deadline = self._last + owner.idle_timeout
        if now < deadline:
            self._timer = owner._loop.call_at(deadline, self._idle_check)
            return
        self._fail(
            UpstreamReadError(f"no data from worker {self.endpoint.worker_id} for {owner.idle_timeout:g} s")
        )
        self._cancel()

    # -- read by the relay -------------------------------------------------------------
    async def _wait(self) -> None:
        owner = self.owner
        assert owner is not None and owner._loop is not None
        w = self._waiter = owner._loop.create_future()
        await w

    def release(self) -> None:
        """Done with this response; before its end the worker is told to cancel it."""
        if not self.done and self._exc is None:
            self._exc = UpstreamReadError("response released")
            self._finish()
            self._cancel()
        self._chunks = []
        self.owner = None

    close = release

    def _cancel(self) -> None:
        owner = self.owner
        if owner is not None:
            owner._send_cancel(self.cancel_subject, self.reply)


class NatsUpstream:
    """The process-wide NATS client to workers (see the module docstring)."""

    def __init__(
        self,
        servers: str | list[str],
        *,
        connect_timeout: float,
        first_byte_timeout: float,
        idle_timeout: float,
        subject_prefix: str = "infera",
        max_buffered: int = 64 * 1024 * 1024,
        name: str = "infera-router",
        auth: NatsAuth | None = None,
    ) -> None:
        self.servers = servers
        self.auth = auth
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.subject_prefix = subject_prefix
        self.max_buffered = max_buffered
        """Unread bytes of one streaming response above which it fails (a slow consumer)."""
        self.name = name
        self.nc: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox = ""
        self._ids = itertools.count()
        self._pending: dict[str, NatsResponse] = {}
        self._subjects: dict[str, tuple[str, str]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ready = asyncio.Event()
        self._starting: asyncio.Task[None] | None = None
        self._next_try = 0.0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._connect()
        finally:
            self._ready.set()

    async def _connect(self) -> None:
        try:
            nc = await connect_nats(
                self.servers,
                self.name,
                self.connect_timeout,
                on_disconnect=self._disconnected,
                auth=self.auth,
            )
        finally:
            self._next_try = asyncio.get_running_loop().time() + self.connect_timeout
        self._inbox = nc.new_inbox()
        await nc.subscribe(
            self._inbox + ".*",
            cb=self._on_msg,
            pending_msgs_limit=-1,  # never dropped here: a response's seq stays gapless
            pending_bytes_limit=0,
        )
        self.nc = nc

    def _reconnect_later(self) -> None:
        """The first connection failed (NATS was down when this client started): try again in
        the background, at most once per ``connect_timeout`` (the client reconnects on its own
        once it has connected)."""
        loop = self._loop
        if (
            loop is None
            or (self._starting is not None and not self._starting.done())
            or loop.time() < self._next_try
        ):
            return
        self._starting = task = loop.create_task(self._connect())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # failures: tried again later

    async def _wait_ready(self, endpoint: UpstreamTarget) -> Client:
        """The connection, waiting up to ``connect_timeout`` while :meth:`start` runs."""
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await self._ready.wait()
            except TimeoutError:
                raise UpstreamError(endpoint, "the NATS transport is not started yet", timeout=True) from None
        nc = self.nc
        if nc is None:
            self._reconnect_later()
            raise TransportDownError(endpoint, "NATS is not connected")
        if not nc.is_connected:
            raise TransportDownError(endpoint, "NATS is not connected")
        return nc

    async def close(self) -> None:
        for resp in list(self._pending.values()):
            resp._fail(UpstreamReadError("the NATS transport closed"))
        self._pending.clear()
        for t in list(self._tasks):
            t.cancel()
        await close_quietly(self.nc)
        self.nc = None

    def subjects(self, endpoint: UpstreamTarget) -> tuple[str, str]:
        """(request subject, cancel subject) of a worker: its record's ``request_params.subject``,
        else the default subject of its worker id."""
        subject = _record_subject(endpoint)
        if subject is not None:
            return subject, wire.cancel_subject(subject)
        key = endpoint.worker_id
        found = self._subjects.get(key)
        if found is None:
            subject = wire.request_subject(self.subject_prefix, key)
            if len(self._subjects) > 4096:
                self._subjects.clear()
            found = self._subjects[key] = (subject, wire.cancel_subject(subject))
        return found

    async def open(
        self, endpoint: UpstreamTarget, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> NatsResponse:
        """Publish the request to the worker's subject; the response once its head arrived."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            nc = await self._wait_ready(endpoint)
        loop = self._loop
        assert loop is not None
        subject, cancel = self.subjects(endpoint)
        reply = f"{self._inbox}.{next(self._ids)}"
        resp = NatsResponse(self, endpoint, reply, cancel)
        payload = wire.encode_request(path, headers or _JSON_HEADERS, body)
        if len(payload) > nc.max_payload:
            raise RequestTooLargeError(
                endpoint,
                f"the request is {len(payload):,} bytes as a NATS message; the NATS server's max_payload"
                f" is {nc.max_payload:,} bytes (send a smaller request, or raise max_payload in the"
                " nats-server configuration)",
                len(payload),
                nc.max_payload,
            )
        self._pending[reply] = resp
        waiter = resp._waiter = loop.create_future()
        resp._timer = loop.call_at(loop.time() + self.first_byte_timeout, resp._first_byte_expired)
        try:
            await nc.publish(subject, payload, reply=reply)
            await waiter
        except UpstreamError:
            resp._finish()
            raise
        except BaseException as exc:
            resp.release()  # cancelled while waiting (client gone): tell the worker
            if isinstance(exc, Exception):
                raise UpstreamError(endpoint, f"{type(exc).__name__}: {exc}") from None
            raise
        return resp

    # -- the inbox -----------------------------------------------------------------------
    async def _on_msg(self, msg: Msg) -> None:
        resp = self._pending.get(msg.subject)
        if resp is None:
            return  # late message of a released or failed response
        data = msg.data
        if not data and msg.headers and msg.headers.get("Status") == "503":
            resp._fail(
                UpstreamError(resp.endpoint, f"no responder on NATS subject {resp.cancel_subject[:-7]}")
            )
            return
        assert self._loop is not None
        resp._feed(data, self._loop.time())

    def _disconnected(self) -> None:
        for resp in list(self._pending.values()):
            if resp.status:
                resp._fail(UpstreamReadError("the connection to NATS was lost mid-response"))
            else:
                resp._fail(TransportDownError(resp.endpoint, "the connection to NATS was lost"))
        self._pending.clear()

    def _send_cancel(self, cancel_subject: str, reply: str) -> None:
        nc = self.nc
        if nc is None or not nc.is_connected:
            return
        task = asyncio.ensure_future(nc.publish(cancel_subject, reply.encode()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _record_subject(endpoint: UpstreamTarget) -> str | None:
    """The request subject the worker's record names (``request_params.subject``), if any and
    if it is this worker's (``….req.<worker>``): a record never sends a worker's requests to
    another worker's responders."""
    params = getattr(endpoint.record, "request_params", None)
    subject = params.get("subject") if isinstance(params, dict) else None
    if not isinstance(subject, str) or not subject:
        return None
    if not subject.endswith(".req." + wire.subject_token(endpoint.worker_id)):
        if endpoint.worker_id not in _WARNED and len(_WARNED) < 4096:
            _WARNED.add(endpoint.worker_id)
            log.warning(
                "worker %s: its record's request subject %r is not its own", endpoint.worker_id, subject
            )
        return None
    return subject

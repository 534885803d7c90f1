"""The worker side of ``--request-transport nats``: bridge NATS requests to the engine's local HTTP server.

The launcher runs one :class:`Responder` next to its engine (the engine is unchanged).
It subscribes to the worker's request subject in the queue group ``infera`` and to its
cancel subject; each request becomes one HTTP request to the engine over the project's
native keep-alive client, and the engine's response goes back to the reply subject as
messages (:mod:`infera_nats.transport_wire`): a non-streaming response in one ``F``
message when it fits, a stream as ``H``, then one ``D`` per read (whatever arrived
together goes in one message), then ``E``. A cancel message aborts the local request
(the connection to the engine closes, as when an HTTP client goes away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from infera_core.scheduling.types import Endpoint
from infera_core.transports.http.native import NativeUpstream
from infera_core.transports.upstreams import READ_ERRORS, UpstreamError
from infera_core.worker import WorkerRecord
from infera_nats import transport_wire as wire
from infera_nats.auth import NatsAuth
from infera_nats.transport_connect import close_quietly, connect_nats

log = logging.getLogger("infera.nats.responder")


class Responder:
    """See the module docstring. ``start()`` connects and subscribes; ``close()`` stops."""

    def __init__(
        self,
        worker_id: str,
        engine_url: str,
        servers: str | list[str],
        *,
        subject: str | None = None,
        subject_prefix: str = "infera",
        connect_timeout: float = 5.0,
        first_byte_timeout: float = 3600.0,
        idle_timeout: float = 3600.0,
        max_connections: int = 1024,
        auth: NatsAuth | None = None,
    ) -> None:
        self.auth = auth
        self.worker_id = worker_id
        self.engine_url = engine_url
        self.servers = servers
        self.subject = subject or wire.request_subject(subject_prefix, worker_id)
        self.connect_timeout = connect_timeout
        self.http = NativeUpstream(
            connect_timeout=connect_timeout,
            first_byte_timeout=first_byte_timeout,
            idle_timeout=idle_timeout,
            max_connections=max_connections,
        )
        self.endpoint = Endpoint(WorkerRecord(worker_id=worker_id, url=engine_url, model="-", engine="-"))
        self.nc: Client | None = None
        self.inflight: dict[str, asyncio.Task[None]] = {}
        self.requests = 0
        self.cancelled = 0
        self._subs: list[Any] = []

    async def start(self) -> None:
        await self.http.start()
        self.nc = nc = await connect_nats(
            self.servers, f"infera-responder-{self.worker_id}", self.connect_timeout, auth=self.auth
        )
        self._subs = [
            await nc.subscribe(
                self.subject, queue=wire.QUEUE_GROUP, cb=self._on_request, pending_msgs_limit=-1
            ),
            await nc.subscribe(wire.cancel_subject(self.subject), cb=self._on_cancel, pending_msgs_limit=-1),
        ]
        await nc.flush()
        log.info(
            "worker %s: answering NATS requests on %s (engine %s)",
            self.worker_id,
            self.subject,
            self.engine_url,
        )

    async def close(self, grace: float = 5.0) -> None:
        """Stop taking requests; let those in flight finish for up to ``grace`` seconds."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._subs and self.nc is not None:
            # a round trip: the server has dropped our interest when close() goes on, so a
            # request sent from now on gets "no responders" at once; without it one could still
            # be routed to this closing connection and wait out the router's first-byte timeout
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=max(1, math.ceil(self.connect_timeout)))
        self._subs = []
        tasks = list(self.inflight.values())
        if tasks:
            _, left = await asyncio.wait(tasks, timeout=grace)
            for t in left:
                t.cancel()
            if left:
                await asyncio.wait(left, timeout=1.0)
        await close_quietly(self.nc)
        self.nc = None
        await self.http.close()

    # -- messages ---------------------------------------------------------------------
    async def _on_request(self, msg: Msg) -> None:
        reply = msg.reply
        if not reply:
            log.warning(
                "worker %s: NATS request on %s without a reply subject skipped", self.worker_id, msg.subject
            )
            return
        try:
            path, headers, body = wire.decode_request(msg.data)
        except ValueError as exc:
            log.warning(
                "worker %s: malformed NATS request on %s skipped: %s", self.worker_id, msg.subject, exc
            )
            with contextlib.suppress(ConnectionError):
                await self._publish(reply, wire.frame(wire.FAIL, 0, f"malformed request: {exc}".encode()))
            return
        self.requests += 1
        task = asyncio.create_task(self._serve(reply, path, headers, body))
        self.inflight[reply] = task
        task.add_done_callback(lambda _t: self.inflight.pop(reply, None))

    async def _on_cancel(self, msg: Msg) -> None:
        task = self.inflight.get(msg.data.decode("latin-1"))
        if task is not None and not task.done():
            self.cancelled += 1
            task.cancel()

    async def _publish(self, subject: str, data: bytes) -> None:
        nc = self.nc
        if nc is None or not nc.is_connected:
            raise ConnectionError("NATS is not connected")
        await nc.publish(subject, data)

    async def _serve(self, reply: str, path: str, headers: dict[str, str], body: bytes) -> None:
        try:
            resp = await self.http.open(self.endpoint, path, body, headers)
        except UpstreamError as exc:
            with contextlib.suppress(Exception):
                await self._publish(
                    reply, wire.frame(wire.FAIL, 0, f"engine unreachable: {exc.reason}".encode())
                )
            return
        seq = 0
        try:
            head = wire.encode_head(resp.status, resp.content_type, resp.headers)
            limit = (self.nc.max_payload if self.nc is not None else 1 << 20) - 64
            if not resp.content_type.startswith("text/event-stream"):
                data = await resp.read()
                if len(head) + len(data) <= limit:
                    await self._publish(reply, wire.frame(wire.FULL, 0, head + data))
                    return
                seq = await self._send_body(reply, head, data, limit)
                return
            await self._publish(reply, wire.frame(wire.HEAD, 0, head))
            seq = 1
            async for chunk in resp:
                if resp.done:
                    seq = await self._send_body(reply, None, chunk, limit, seq)
                    return
                for i in range(0, len(chunk), limit):
                    await self._publish(reply, wire.frame(wire.DATA, seq, chunk[i : i + limit]))
                    seq += 1
            await self._publish(reply, wire.frame(wire.END, seq))
        except READ_ERRORS as exc:
            log.warning("worker %s: engine response broke: %r", self.worker_id, exc)
            with contextlib.suppress(Exception):
                await self._publish(
                    reply, wire.frame(wire.FAIL, seq, f"engine response broke: {exc!r}".encode())
                )
        finally:
            resp.release()

    async def _send_body(self, reply: str, head: bytes | None, data: bytes, limit: int, seq: int = 0) -> int:
        """``H`` (when ``head``), the body in ``D`` pieces of at most ``limit`` bytes, then ``E``."""
        if head is not None:
            await self._publish(reply, wire.frame(wire.HEAD, seq, head))
            seq += 1
        while len(data) > limit:
            await self._publish(reply, wire.frame(wire.DATA, seq, data[:limit]))
            data = data[limit:]
            seq += 1
        await self._publish(reply, wire.frame(wire.END, seq, data))
        return seq + 1

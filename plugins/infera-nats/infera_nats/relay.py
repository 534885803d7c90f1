"""The worker side of ``--kv-event-transport nats``: relay the engine's ZMQ KV events into JetStream.

The launcher runs one :class:`KvRelay` next to its engine. It subscribes to the engine's
ZMQ publisher (one SUB per DP rank when the engine publishes per rank) and publishes the
frames to the worker's subject in the ``INFERA_KV`` stream (:mod:`infera_nats.kv_wire`),
creating the stream when it is missing. When the engine has a replay socket, the relay
first publishes what the engine still buffers (batches from before the relay joined), and
fills a gap in the engine's sequence numbers from it before relaying the batch after it. Frames that arrive together (a burst) go out in
one message. Publishing is fire-and-forget (no per-message acknowledgement, which would
cap the rate at one round trip per batch); what the stream did not store shows up as a
gap in the engine's sequence numbers, which routers handle as on the ZMQ path (the view is
cleared and marked stale until it refills). On close (after the worker deregistered) the
worker's subjects are purged from the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import cast

import nats.errors
import zmq
import zmq.asyncio
from nats.aio.client import Client

from infera_core.worker import KvEventsInfo, with_port_offset
from infera_nats import kv_wire
from infera_nats.auth import NatsAuth
from infera_nats.kv_wire import ensure_stream
from infera_nats.transport_connect import close_quietly, connect_nats

log = logging.getLogger("infera.nats.relay")

MAX_BATCHES = 256
"""Frames published together at most (when that many are already queued)."""
MAX_BYTES = 512 * 1024
REPLAY_TIMEOUT_S = 2.0


async def _connect(sock: zmq.asyncio.Socket, endpoint: str, within: float) -> None:
    """Connect and wait (up to ``within`` seconds) for the handshake, so the engine's next batch is
    not lost to a subscription still on its way (ZMQ's slow joiner)."""
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint)
        async with asyncio.timeout(within):
            await monitor.recv_multipart()
    except TimeoutError:
        log.warning("KV relay: no handshake with %s within %g s; relaying once it connects", endpoint, within)
    finally:
        sock.disable_monitor()
        monitor.close(0)


class KvRelay:
    """See the module docstring. ``start()`` connects both sides; ``close()`` stops and purges."""

    def __init__(
        self,
        worker_id: str,
        model: str,
        kv_events: KvEventsInfo,
        servers: str | list[str],
        *,
        dp_size: int = 1,
        subject_prefix: str = "infera",
        connect_timeout: float = 5.0,
        max_msgs_per_subject: int = 10_000,
        auth: NatsAuth | None = None,
        purge_on_close: bool = True,
    ) -> None:
        self.auth = auth
        self.purge_on_close = purge_on_close
        """Purge this worker's subjects on close. Off on an authenticated plane: a worker may
        not purge the stream (the purge API cannot be limited to its subjects); the stream's
        retention drops the events instead."""
        self.worker_id = worker_id
        self.kv_events = kv_events
        self.servers = servers
        self.prefix = subject_prefix
        self.subject = kv_wire.kv_subject(subject_prefix, model, worker_id)
        self.connect_timeout = connect_timeout
        self.max_msgs_per_subject = max_msgs_per_subject
        per_rank = kv_events.port_per_dp_rank and dp_size > 1
        self.ranks: list[int | None] = list(range(dp_size)) if per_rank else [None]
        self.nc: Client | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.batches = 0
        self.messages = 0
        self.lost = 0
        self.restarts = 0

    @property
    def subjects(self) -> list[str]:
        return [kv_wire.rank_subject(self.subject, r) for r in self.ranks]

    async def start(self) -> None:
        self.nc = nc = await connect_nats(
            self.servers, f"infera-kv-relay-{self.worker_id}", self.connect_timeout, auth=self.auth
        )
        await ensure_stream(nc, self.prefix, max_msgs_per_subject=self.max_msgs_per_subject)
        self._ctx = zmq.asyncio.Context()
        for rank in self.ranks:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.SUBSCRIBE, self.kv_events.topic.encode())
            await _connect(sock, with_port_offset(self.kv_events.endpoint, rank or 0), self.connect_timeout)
            subject = kv_wire.rank_subject(self.subject, rank)
            replay = self.kv_events.replay_endpoint
            replay = with_port_offset(replay, rank or 0) if replay else None
            self._tasks.append(
                asyncio.create_task(self._pump(sock, subject, replay), name=f"kv-relay-{subject}")
            )
        log.info(
            "worker %s: relaying KV events from %s to %s",
            self.worker_id,
            self.kv_events.endpoint,
            self.subject,
        )

    async def close(self, purge: bool = True) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        nc = self.nc
        if purge and self.purge_on_close and nc is not None and nc.is_connected:
            js = nc.jetstream()
            for subject in self.subjects:
                with contextlib.suppress(Exception):
                    await js.purge_stream(kv_wire.STREAM, subject=subject)
        await close_quietly(self.nc)
        self.nc = None
        log.info(
            "worker %s: KV relay stopped: %d batches relayed in %d messages, %d lost, %d engine restarts",
            self.worker_id,
            self.batches,
            self.messages,
            self.lost,
            self.restarts,
        )

    async def _pump(self, sock: zmq.asyncio.Socket, subject: str, replay: str | None) -> None:
        last: int | None = None
        synced: int | None = None  # the last seq copied from the replay socket at start
        try:
            if replay is not None:  # what the engine published before we joined
                got = await self._replay(replay, 0, 1 << 62)
                for i in range(0, len(got), MAX_BATCHES):
                    await self._publish(subject, got[i : i + MAX_BATCHES])
                last = synced = got[-1][0] if got else None
            while True:
                burst = [await sock.recv_multipart()]  # and whatever is queued behind it
                size = len(burst[0][-1])
                while (
                    len(burst) < MAX_BATCHES
                    and size < MAX_BYTES
                    and cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN
                ):
                    burst.append(await sock.recv_multipart())
                    size += len(burst[-1][-1])
                batch: list[tuple[int, bytes]] = []
                for frames in burst:
                    if len(frames) < 3:
                        if not frames or self.kv_events.seq_frames:
                            continue
                        seq = 0 if last is None else last + 1  # [topic, payload] (ATOM): numbered here
                        batch.append((seq, frames[-1]))
                        last = seq
                        continue
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if synced is not None:
                        if seq <= synced:
                            continue  # already copied from the replay socket
                        synced = None
                    if last is not None and seq > last + 1 and replay is not None:
                        batch.extend(await self._replay(replay, last + 1, seq))  # fill the gap
                    elif last is not None and seq <= last:
                        self.restarts += 1  # the engine restarted: its seq began again (passed on)
                    batch.append((seq, frames[-1]))
                    last = seq
                if batch:
                    await self._publish(subject, batch)
        finally:
            sock.close(0)

    async def _replay(self, endpoint: str, start: int, until: int) -> list[tuple[int, bytes]]:
        """Batches ``start <= seq < until`` the engine still buffers (none when it does not answer)."""
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await sock.recv_multipart()
                    while frames and frames[0] == b"":
                        frames = frames[1:]
                    if len(frames) < 2:
                        continue
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if seq == -1:  # the end marker
                        return out
                    if start <= seq < until:
                        out.append((seq, frames[-1]))
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("worker %s: KV replay from %s failed: %r", self.worker_id, endpoint, exc)
            return out
        finally:
            sock.close(0)

    async def _publish(self, subject: str, batch: list[tuple[int, bytes]]) -> None:
        nc = self.nc
        assert nc is not None
        try:
            await nc.publish(subject, kv_wire.pack(batch))
        except (nats.errors.Error, OSError) as exc:
            if not self.lost:
                log.warning(
                    "worker %s: KV events not relayed (%s); routers will see a gap", self.worker_id, exc
                )
            self.lost += len(batch)
            return
        self.batches += len(batch)
        self.messages += 1

"""The KV event hub: one ZMQ SUB per worker publisher, feeding the :class:`KvIndex`.

For each worker record with ``kv_events`` it connects a SUB socket (ZMQ reconnects
on its own, with backoff up to ``reconnect_max_s``), decodes every batch with the
decoder named by ``kv_events.format`` and applies it to the view of
``(worker_id, dp_rank)``. Sequence numbers are tracked per publisher: on a gap the
missing batches are fetched from ``replay_endpoint``; when they are gone (or there is
no replay socket) the worker's view is cleared and marked stale until it has been
refilled for ``refill_s``. A publisher whose seq goes back to 0 restarted: its view
is cleared. A worker that leaves the fleet loses its view.

Frames ``[topic, seq(8B BE), payload]``; replay: DEALER sends ``[b"", start_seq]`` and
reads ``[b"", (topic,) seq, payload]`` until a seq of -1 (8B signed). A publisher without
the seq frame (``kv_events.seq_frames = False``, ATOM's ``[topic, payload]``) is numbered
here; its view is cleared (stale until refilled) whenever its connection drops.

**Off the proxying loop**: with ``thread=True`` (the server's :class:`~infera_core.kv.component.KvRouting`)
every subscription, decode and index update runs on an event loop of its own in the
``kv-ingest`` thread, so event churn in a large fleet does not queue behind (or delay)
proxied requests on the server's loop; fleet changes are handed to that loop in order.
Scorers read the index from the server's loop: each read is one dict lookup or one call
into the native store (which holds the GIL), so a read sees a batch wholly applied or
not at all. Reports (``cache_view``, metrics) iterate copies of the hub's tables.

That is the built-in ``zmq`` KV-event transport. A worker whose record names another
transport (``kv_event_transport``, e.g. ``nats``) is followed through that transport's
:class:`~infera_core.transports.base.KvEventSource` (one per transport, made on first use):
it delivers ``(seq, payload)`` batches to the same sequencing, gap and decoding logic,
and its ``replay`` fills gaps. An unknown transport is logged and not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from infera_core.errors import InferaError, UnknownNameError
from infera_core.kv.decode import MsgpackEventDecoder, parse_seq
from infera_core.kv.events import KvDecodeError, RawKvEventDecoder
from infera_core.kv.index import KvIndex, WorkerView
from infera_core.kv.metrics import KvMetrics
from infera_core.kv.settings import KvSettings
from infera_core.kv.sources import KvSources
from infera_core.kv.subscription import Subscription
from infera_core.kv.zmq_sub import close_monitored, open_sub, redial, replay
from infera_core.transports.base import ZMQ
from infera_core.worker import Status, WorkerRecord, with_port_offset

log = logging.getLogger("infera.kv.hub")

T = TypeVar("T")

SILENCE_GRACE_S = 2.0
"""A routed request gets this long (at most ``kv_silence_s``) to produce KV events."""


class KvHub:
    """See the module docstring. ``catalog`` needs ``kv_decoders``; ``registry`` is prometheus'."""

    def __init__(
        self, catalog: Any, registry: Any = None, settings: KvSettings | None = None, thread: bool = False
    ) -> None:
        self.settings = settings or KvSettings()
        self.thread = thread
        """Ingest on the ``kv-ingest`` thread's own loop (see the module docstring)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.catalog = catalog
        self.index = KvIndex(self.settings.kv_index_max_blocks)
        self.subs: dict[str, list[Subscription]] = {}
        self.records: dict[str, WorkerRecord] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._closed = False
        self._following = True
        self.sources = KvSources(catalog, self.settings.kv_replay_timeout_s)
        self.metrics = KvMetrics(self)
        if registry is not None:
            self.metrics.register(registry)

    # -- lifecycle ----------------------------------------------------------------
    def _ingest_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import uvloop

            loop = uvloop.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="kv-ingest", daemon=True)
            self._thread.start()
            self._loop = loop
        return self._loop

    async def on_ingest(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` where ingestion runs: the ``kv-ingest`` thread's loop when threaded."""
        if not self.thread:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._ingest_loop()))

    def _in_order(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn`` on the ingest loop (after what was handed to it before), or now."""
        loop = self._loop
        if loop is not None and threading.current_thread() is not self._thread:
            loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    async def start(self) -> None:
        await self.on_ingest(self._start())

    async def close(self) -> None:
        await self.on_ingest(self._close())
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 10)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    async def start_source(self, kind: str) -> None:
        """Start KV-event transport ``kind``'s source where ingestion runs (one error line if it cannot)."""
        await self.on_ingest(self.sources.start(kind))

    async def _start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._closed = False
        self._following = True
        for record in list(self.records.values()):
            self._subscribe(record)
        self._monitor = asyncio.create_task(self._watch_silence(), name="kv-silence-monitor")

    async def _close(self) -> None:
        self._closed = True
        tasks = [s.task for subs in self.subs.values() for s in subs if s.task is not None]
        if self._monitor is not None:
            tasks.append(self._monitor)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.subs.clear()
        await self.sources.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    stop = close

    async def stop_following(self) -> None:
        """Unsubscribe from every publisher and follow no new one: for an orderly stop of the
        engines behind this router (their sockets closing then is no lost publisher)."""
        await self.on_ingest(self._stop_following())

    async def _stop_following(self) -> None:
        self._following = False
        tasks = [s.task for subs in self.subs.values() for s in subs if s.task is not None]
        self.subs.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # -- fleet changes --------------------------------------------------------------
    def worker_added(self, record: WorkerRecord) -> None:
        """A new or updated record; (re)subscribes when its KV events settings changed."""
        self._in_order(self._worker_added, record)

    def worker_removed(self, worker_id: str) -> None:
        self._in_order(self._worker_removed, worker_id)

    def _worker_added(self, record: WorkerRecord) -> None:
        old = self.records.get(record.worker_id)
        self.records[record.worker_id] = record
        if old is not None and old.kv_events == record.kv_events and old.dp_size == record.dp_size:
            for sub in self.subs.get(record.worker_id, []):
                sub.record = record
            return
        self._unsubscribe(record.worker_id)
        self.index.drop_worker(record.worker_id)
        if self._ctx is not None:
            self._subscribe(record)

    def _worker_removed(self, worker_id: str) -> None:
        self.records.pop(worker_id, None)
        self.index.routed_at.pop(worker_id, None)
        self._unsubscribe(worker_id)
        self.index.drop_worker(worker_id)

    def on_worker_added(self, record: WorkerRecord) -> None:
        self.worker_added(record)

    def on_worker_removed(self, record: WorkerRecord) -> None:
        self.worker_removed(record.worker_id)

    def _subscribe(self, record: WorkerRecord) -> None:
        kv = record.kv_events
        if kv is None or not self._following:
            return
        if not self.sources.installed(record.kv_event_transport):
            log.error(
                "worker %s: KV events not followed: KV-event transport %r is not installed here",
                record.worker_id,
                record.kv_event_transport,
            )
            return
        try:
            decoder = self.catalog.kv_decoders.get(kv.format)
        except UnknownNameError as exc:
            log.error("worker %s: KV events not followed: %s", record.worker_id, exc)
            return
        decode = decoder.decode_raw if isinstance(decoder, RawKvEventDecoder) else decoder.decode
        per_rank = kv.port_per_dp_rank and record.dp_size > 1
        ranks: list[int | None] = list(range(record.dp_size)) if per_rank else [None]
        subs = []
        for r in ranks:
            off = r or 0
            replay = with_port_offset(kv.replay_endpoint, off) if kv.replay_endpoint else None
            sub = Subscription(record, r, with_port_offset(kv.endpoint, off), replay)
            sub.decode = decode
            sub.native = self.index.ingests_payloads and type(decoder) is MsgpackEventDecoder
            sub.task = asyncio.create_task(self._run(sub), name=f"kv-sub-{record.worker_id}-{r}")
            subs.append(sub)
        self.subs[record.worker_id] = subs

    def _unsubscribe(self, worker_id: str) -> None:
        for sub in self.subs.pop(worker_id, []):
            if sub.task is not None:
                sub.task.cancel()

    # -- ingestion ------------------------------------------------------------------
    async def _run(self, sub: Subscription) -> None:
        """Follow one publisher until cancelled; a broken socket is rebuilt with backoff."""
        backoff = 0.1
        while True:
            try:
                if sub.record.kv_event_transport == ZMQ:
                    await self._follow(sub)
                else:
                    sub.source = await self.sources.get(sub.record.kv_event_transport)
                    await sub.source.follow(sub.record, sub.rank, _Sink(self, sub))
            except asyncio.CancelledError:
                raise
            except (ConnectionError, InferaError) as exc:  # a transport's server is unreachable
                log.warning(
                    "worker %s: KV events via %s unavailable (%s); retrying in %.1f s",
                    sub.record.worker_id,
                    sub.record.kv_event_transport,
                    exc,
                    backoff,
                )
            except Exception:
                log.exception(
                    "worker %s: KV event subscription %s failed; retrying in %.1f s",
                    sub.record.worker_id,
                    sub.endpoint,
                    backoff,
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.kv_reconnect_max_s)

    async def _follow(self, sub: Subscription) -> None:
        assert self._ctx is not None
        kv = sub.record.kv_events
        assert kv is not None
        st = self.settings
        sock = open_sub(
            self._ctx, sub.endpoint, kv.topic.encode(), st.kv_max_message_bytes, st.kv_reconnect_max_s
        )
        mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        redialer = asyncio.create_task(redial(sock, mon, sub.endpoint, lambda: self._dropped(sub)))
        try:
            if sub.last_seq is None and sub.replay_endpoint:
                await self._initial_sync(sub)
            while True:
                frames = await sock.recv_multipart()
                if len(frames) < 3:
                    if frames and not kv.seq_frames:  # [topic, payload] (ATOM): numbered here
                        await self._on_batch(sub, 0 if sub.last_seq is None else sub.last_seq + 1, frames[-1])
                    else:
                        sub.undecodable += 1
                    continue
                seq = parse_seq(frames[-2])
                if seq is None:
                    self._bad_seq(sub, f"a {len(frames[-2])}-byte seq frame")
                    continue
                await self._on_batch(sub, seq, frames[-1])
        finally:
            redialer.cancel()
            close_monitored(sock, mon)

    def _dropped(self, sub: Subscription) -> None:
        sub.drops += 1
        if sub.record.status == Status.DRAINING:  # a worker stopping in order: its engine goes next
            log.info(
                "worker %s: KV publisher connection %s closed while the worker drains",
                sub.record.worker_id,
                sub.endpoint,
            )
        else:
            log.warning(
                "worker %s: KV publisher connection %s dropped (a message over --kv-max-message-bytes %d,"
                " or the publisher went away): reconnecting; events in between count as lost",
                sub.record.worker_id,
                sub.endpoint,
                self.settings.kv_max_message_bytes,
            )
        kv = sub.record.kv_events
        if kv is not None and not kv.seq_frames:  # no seq: what was lost cannot be told or replayed
            self._clear(sub, stale=True)

    def _bad_seq(self, sub: Subscription, what: str) -> None:
        """A frame whose seq cannot be trusted: counted and skipped (a real gap shows at the next one)."""
        sub.bad_seq += 1
        log.warning("worker %s: KV frame with %s skipped", sub.record.worker_id, what)

    async def _on_batch(self, sub: Subscription, seq: int, payload: bytes) -> None:
        if seq < 0:
            self._bad_seq(sub, f"negative seq {seq}")
            return
        try:
            await self._on_frame(sub, seq, payload)
        except Exception as exc:
            # whatever one batch does, the subscription goes on; its events are lost, so the
            # views are cleared and not credited until refilled
            sub.undecodable += 1
            log.warning(
                "worker %s: KV batch seq %d not applied (%r): view cleared, stale until refilled",
                sub.record.worker_id,
                seq,
                exc,
            )
            self._clear(sub, stale=True)

    async def _initial_sync(self, sub: Subscription) -> None:
        """Load what the publisher still buffers, so a worker that went quiet before we
        subscribed (or before a router restart) is known at once, not at its next event."""
        got = await self._replay(sub, 0, 1 << 62)
        if not got:
            return
        sub.replays += 1
        for seq, payload in got:
            self._apply(sub, seq, payload)
        sub.synced_through = sub.last_seq

    async def _on_frame(self, sub: Subscription, seq: int, payload: bytes) -> None:
        if sub.synced_through is not None:
            if seq <= sub.synced_through:
                return  # already applied by the initial sync
            sub.synced_through = None
        last = sub.last_seq
        if last is not None:
            if seq <= last:
                if seq == 0 or last - seq > self.settings.kv_restart_window:
                    log.warning(
                        "worker %s: KV publisher restarted (seq %d after %d)", sub.record.worker_id, seq, last
                    )
                    self._clear(sub, stale=False)
                    sub.last_seq = None
                    if seq > 0:  # the new stream's first batches were missed
                        await self._fill(sub, 0, seq)
                else:
                    return  # duplicate or late (already filled by replay)
            elif seq > last + 1:
                sub.gaps += 1
                await self._fill(sub, last + 1, seq)
        elif seq > 0 and (sub.replay_endpoint or sub.source is not None):
            await self._fill(sub, 0, seq, initial=True)
        self._apply(sub, seq, payload)

    def _apply(self, sub: Subscription, seq: int, payload: bytes) -> None:
        sub.last_seq = seq
        sub.batches += 1
        decode = sub.decode
        assert decode is not None
        try:
            n = self._apply_native(sub, seq, payload) if sub.native else None
            if n is None:
                batch = decode(payload)
                n = len(batch.events)
                if n:
                    self.index.apply(self._view(sub, batch.dp_rank), batch, seq)
            if not n:
                sub.empty_batches += 1
                log.warning("worker %s: KV batch seq %d decoded to no events", sub.record.worker_id, seq)
                return
        except KvDecodeError as exc:
            sub.undecodable += 1
            log.warning(
                "worker %s: undecodable KV batch seq %d: %s (view cleared, stale until refilled)",
                sub.record.worker_id,
                seq,
                exc,
            )
            self._clear(sub, stale=True)
            return
        now = time.time()
        sub.last_event_at = now
        if sub.stale_since is not None and now - sub.stale_since >= self.settings.kv_refill_s:
            sub.stale_since = None
            for v in sub.views.values():
                self.index.set_stale(v, False)

    def _apply_native(self, sub: Subscription, seq: int, payload: bytes) -> int | None:
        """Events in the batch, applied by the index's parser; None when it needs ``decode``."""
        batch_rank = None
        if sub.rank is None and sub.record.dp_size > 1:
            try:
                batch_rank = self.index.payload_dp_rank(payload)
            except ValueError:
                return None
        n = self.index.apply_payload(self._view(sub, batch_rank), payload, seq)
        if n is not None:
            sub.native_batches += 1
        return n

    def _view(self, sub: Subscription, batch_rank: int | None) -> WorkerView:
        """The view a batch applies to: its publisher's rank, else the batch's own ``dp_rank``."""
        rec = sub.record
        rank = sub.rank if sub.rank is not None else (batch_rank if rec.dp_size > 1 else rec.dp_rank)
        view = sub.views.get(rank)
        if view is None:
            kv = rec.kv_events
            assert kv is not None
            view = self.index.add_view(rec.worker_id, rank, kv.block_size)
            self.index.set_stale(view, sub.stale_since is not None)
            sub.views[rank] = view
        return view

    def _clear(self, sub: Subscription, stale: bool) -> None:
        for view in sub.views.values():
            self.index.clear_view(view)
            self.index.set_stale(view, stale)
        sub.stale_since = time.time() if stale else None

    async def _fill(self, sub: Subscription, start: int, until: int, initial: bool = False) -> None:
        """Fetch ``[start, until)`` from the replay socket; clear and mark stale if gone."""
        if sub.source is not None:
            got = await sub.source.replay(sub.record, sub.rank, start, until)
        else:
            got = await self._replay(sub, start, until) if sub.replay_endpoint else None
        complete = bool(got) and got is not None and got[0][0] == start and len(got) == until - start
        if got is not None and (complete or initial):
            sub.replays += 1
            for seq, payload in got:
                self._apply(sub, seq, payload)
            return
        sub.replays_failed += 1
        log.warning(
            "worker %s: KV events %d..%d lost and not replayable; view cleared (stale until refilled)",
            sub.record.worker_id,
            start,
            until - 1,
        )
        self._clear(sub, stale=True)
        for seq, payload in got or []:
            self._apply(sub, seq, payload)

    async def _replay(self, sub: Subscription, start: int, until: int) -> list[tuple[int, bytes]] | None:
        assert self._ctx is not None and sub.replay_endpoint is not None
        return await replay(
            self._ctx,
            sub.replay_endpoint,
            start,
            until,
            wait_s=self.settings.kv_replay_timeout_s,
            max_message=self.settings.kv_max_message_bytes,
            worker_id=sub.record.worker_id,
            on_bad_seq=lambda: self._bad_seq(sub, "a bad seq in a replay answer"),
        )

    # -- reporting --------------------------------------------------------------------
    def silent_workers(self, now: float | None = None) -> list[str]:
        """Routable workers with KV events configured, sent requests, yet no events for ``kv_silence_s``.

        An idle engine publishes nothing, so only requests routed there (recorded in
        ``index.routed_at`` by the KV scorers) more than ``SILENCE_GRACE_S`` after its
        last event make its silence suspicious.
        """
        now = time.time() if now is None else now
        limit = self.settings.kv_silence_s
        routed_at = self.index.routed_at
        out = []
        for worker_id, subs in list(self.subs.items()):
            rec = self.records.get(worker_id)
            routed = routed_at.get(worker_id)
            grace = min(SILENCE_GRACE_S, limit)
            if rec is None or not rec.routable or routed is None or now - routed < grace:
                continue
            for sub in subs:
                since = sub.last_event_at if sub.last_event_at is not None else sub.connected_at
                if now - since > limit and routed > since:
                    out.append(worker_id)
                    break
        return out

    async def _watch_silence(self) -> None:
        warned: set[str] = set()
        while True:
            await asyncio.sleep(max(1.0, self.settings.kv_silence_s / 4))
            silent = set(self.silent_workers())
            for w in sorted(silent - warned):
                log.warning(
                    "worker %s advertises KV events but none arrived for %.0f s: KV routing sees an empty cache"
                    " (check the engine's --kv-events-config and that %s is reachable)",
                    w,
                    self.settings.kv_silence_s,
                    self.subs[w][0].endpoint if self.subs.get(w) else "its endpoint",
                )
            warned = silent

    def cache_view(self, worker_id: str) -> dict[str, Any]:
        """What the router mirrors of one worker (``GET /v1/admin/cache-view/{worker_id}``)."""
        rec = self.records.get(worker_id)
        subs = list(self.subs.get(worker_id, []))
        views = [v.summary() for v in self.index.views_of(worker_id)]
        last_event = max((s.last_event_at for s in subs if s.last_event_at is not None), default=None)
        return {
            "worker_id": worker_id,
            "known": rec is not None,
            "kv_events": rec.kv_events.model_dump() if rec is not None and rec.kv_events else None,
            "blocks": sum(int(v["blocks"]) for v in views),  # type: ignore[call-overload]
            "last_event_at": last_event,
            "last_event_age_s": None if last_event is None else time.time() - last_event,
            "stale": any(s.stale_since is not None for s in subs),
            "silent": worker_id in self.silent_workers(),
            "seq": [s.last_seq for s in subs],
            "publishers": [s.summary() for s in subs],
            "views": views,
        }


class _Sink:
    """Where a transport's source delivers one publisher's batches (see ``KvEventSink``)."""

    __slots__ = ("hub", "sub")

    def __init__(self, hub: KvHub, sub: Subscription) -> None:
        self.hub = hub
        self.sub = sub

    async def batch(self, seq: int, payload: bytes) -> None:
        await self.hub._on_batch(self.sub, seq, payload)

    def malformed(self, reason: str) -> None:
        self.sub.undecodable += 1
        log.warning("worker %s: malformed KV event message skipped: %s", self.sub.record.worker_id, reason)

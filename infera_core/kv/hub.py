"""The KV event hub: follows every worker's KV-event publisher, feeding the :class:`KvIndex`.

For each worker record with ``kv_events`` it follows the publisher (or one per DP rank when
the worker publishes per rank) through the source of the record's KV-event transport
(``kv_event_transport``: ``zmq`` by default, ``nats``…; one
:class:`~infera_core.transports.base.KvEventSource` per transport, made on first use by
:class:`~infera_core.transports.clients.KvSources`). Every transport is treated alike: the
source delivers ``(seq, payload)`` batches, and :mod:`infera_core.kv.ingest` does the
sequencing, gap detection, replay (through ``source.replay``), decoding and indexing. A
broken source is followed again with backoff up to ``reconnect_max_s``; an unknown
transport or decoder is logged and not followed. A worker that leaves the fleet loses its view.

**Off the proxying loop**: with ``thread=True`` (the server's :class:`~infera_core.kv.component.KvRouting`)
every subscription, decode and index update runs on an event loop of its own in the
``kv-ingest`` thread, so event churn in a large fleet does not queue behind (or delay)
proxied requests on the server's loop; fleet changes are handed to that loop in order.
Scorers read the index from the server's loop: each read is one dict lookup or one call
into the native store (which holds the GIL), so a read sees a batch wholly applied or
not at all. Reports (``cache_view``, metrics) iterate copies of the hub's tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from prometheus_client.registry import CollectorRegistry

from infera_core.errors import InferaError, UnknownNameError
from infera_core.kv.catalog import KvCatalog
from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import RawKvEventDecoder
from infera_core.kv.index import KvIndex
from infera_core.kv.ingest import Ingest
from infera_core.kv.metrics import KvMetrics
from infera_core.kv.settings import KvSettings
from infera_core.kv.subscription import Subscription
from infera_core.transports.base import KvSourceContext
from infera_core.transports.clients import KvSources
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.kv.hub")

T = TypeVar("T")

SILENCE_GRACE_S = 2.0
"""A routed request gets this long (at most ``kv_silence_s``) to produce KV events."""


class KvHub:
    """See the module docstring. ``catalog`` needs ``kv_decoders`` and ``kv_event_transports``;
    ``registry`` is prometheus'."""

    def __init__(
        self,
        catalog: KvCatalog,
        registry: CollectorRegistry | None = None,
        settings: KvSettings | None = None,
        thread: bool = False,
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
        self._running = False
        self._monitor: asyncio.Task[None] | None = None
        self._following = True
        st = self.settings
        self.ingest = Ingest(self.index, st)
        self.sources = KvSources(
            catalog.kv_event_transports,
            KvSourceContext(
                replay_timeout=st.kv_replay_timeout_s,
                max_message_bytes=st.kv_max_message_bytes,
                reconnect_max_s=st.kv_reconnect_max_s,
            ),
        )
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
        await self.on_ingest(self.sources.start([kind]))

    async def _start(self) -> None:
        self._running = True
        self._following = True
        for record in list(self.records.values()):
            self._subscribe(record)
        self._monitor = asyncio.create_task(self._watch_silence(), name="kv-silence-monitor")

    async def _close(self) -> None:
        self._running = False
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
        if self._running:
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
            sub = Subscription(record, r, *kv.endpoints(r))
            sub.decode = decode
            sub.native = self.index.ingests_payloads and type(decoder) is MsgpackEventDecoder
            sub.task = asyncio.create_task(self._run(sub), name=f"kv-sub-{record.worker_id}-{r}")
            subs.append(sub)
        self.subs[record.worker_id] = subs

    def _unsubscribe(self, worker_id: str) -> None:
        for sub in self.subs.pop(worker_id, []):
            if sub.task is not None:
                sub.task.cancel()

    # -- following ----------------------------------------------------------------
    async def _run(self, sub: Subscription) -> None:
        """Follow one publisher until cancelled; a broken source is followed again with backoff."""
        backoff = 0.1
        sink = self.ingest.sink(sub)
        while True:
            try:
                sub.source = await self.sources.get(sub.record.kv_event_transport)
                await sub.source.follow(sub.record, sub.rank, sink)
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

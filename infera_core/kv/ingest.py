"""What the KV hub does with one publisher's batches, whatever transport brought them.

Sequence numbers are tracked per publisher (:class:`~infera_core.kv.subscription.Subscription`):
on a gap the missing batches are asked of the transport's ``replay``; when they are gone
(or cannot be replayed) the publisher's views are cleared and marked stale until they have
been refilled for ``kv_refill_s``. A publisher whose seq goes back to 0 (or far back)
restarted: its views are cleared. A router that joins late loads what the publisher still
buffers first (initial sync), so a worker that went quiet is known at once. Each batch is
decoded (or parsed natively by the index) and applied to the view of ``(worker_id,
dp_rank)``; whatever one batch does, the stream goes on.

:class:`PublisherSink` is the :class:`~infera_core.transports.base.KvEventSink` a source
delivers one publisher's batches and connection events to.
"""

from __future__ import annotations

import logging
import time

from infera_core.kv.events import KvDecodeError
from infera_core.kv.index import KvIndex, WorkerView
from infera_core.kv.settings import KvSettings
from infera_core.kv.subscription import Subscription
from infera_core.worker import Status

log = logging.getLogger("infera.kv.hub")

SYNC_ALL = 1 << 62
"""The end of "everything the publisher still buffers" in an initial sync."""


class Ingest:
    """Sequencing, gap filling, decoding and indexing of a hub's publishers."""

    def __init__(self, index: KvIndex, settings: KvSettings) -> None:
        self.index = index
        self.settings = settings

    def sink(self, sub: Subscription) -> PublisherSink:
        return PublisherSink(self, sub)

    def _lost(self, sub: Subscription, message: str, seq: int, exc: Exception) -> None:
        """A batch whose events are lost: counted as undecodable, logged (``message`` formats
        the worker id, ``seq`` and ``exc``), the worker's views cleared and stale until refilled."""
        sub.undecodable += 1
        log.warning(message, sub.record.worker_id, seq, exc)
        self.clear(sub, stale=True)

    async def on_batch(self, sub: Subscription, seq: int, payload: bytes) -> None:
        if seq < 0:
            self.bad_seq(sub, f"negative seq {seq}")
            return
        try:
            await self._on_frame(sub, seq, payload)
        except Exception as exc:
            # whatever one batch does, the subscription goes on; its events are lost, so the
            # views are cleared and not credited until refilled
            self._lost(
                sub,
                "worker %s: KV batch seq %d not applied (%r): view cleared, stale until refilled",
                seq,
                exc,
            )

    def bad_seq(self, sub: Subscription, what: str) -> None:
        """A frame whose seq cannot be trusted: counted and skipped (a real gap shows at the next one)."""
        sub.bad_seq += 1
        log.warning("worker %s: KV frame with %s skipped", sub.record.worker_id, what)

    def dropped(self, sub: Subscription, reason: str) -> None:
        sub.drops += 1
        if sub.record.status == Status.DRAINING:  # a worker stopping in order: its engine goes next
            log.info(
                "worker %s: KV publisher connection %s closed while the worker drains",
                sub.record.worker_id,
                sub.endpoint,
            )
        else:
            log.warning(
                "worker %s: KV publisher connection %s dropped (%s): reconnecting;"
                " events in between count as lost",
                sub.record.worker_id,
                sub.endpoint,
                reason,
            )
        kv = sub.record.kv_events
        if kv is not None and not kv.seq_frames:  # no seq: what was lost cannot be told or replayed
            self.clear(sub, stale=True)

    async def initial_sync(self, sub: Subscription) -> None:
        """Load what the publisher still buffers, so a worker that went quiet before we
        subscribed (or before a router restart) is known at once, not at its next event."""
        got = await self._replay(sub, 0, SYNC_ALL)
        if not got:
            return
        sub.replays += 1
        for seq, payload in got:
            self.apply(sub, seq, payload)
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
                    self.clear(sub, stale=False)
                    sub.last_seq = None
                    if seq > 0:  # the new stream's first batches were missed
                        await self._fill(sub, 0, seq)
                else:
                    return  # duplicate or late (already filled by replay)
            elif seq > last + 1:
                sub.gaps += 1
                await self._fill(sub, last + 1, seq)
        elif seq > 0 and sub.replayable:
            await self._fill(sub, 0, seq, initial=True)
        self.apply(sub, seq, payload)

    def apply(self, sub: Subscription, seq: int, payload: bytes) -> None:
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
            self._lost(
                sub,
                "worker %s: undecodable KV batch seq %d: %s (view cleared, stale until refilled)",
                seq,
                exc,
            )
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

    def clear(self, sub: Subscription, stale: bool) -> None:
        for view in sub.views.values():
            self.index.clear_view(view)
            self.index.set_stale(view, stale)
        sub.stale_since = time.time() if stale else None

    async def _fill(self, sub: Subscription, start: int, until: int, initial: bool = False) -> None:
        """Ask the source for ``[start, until)``; clear and mark stale if gone."""
        got = await self._replay(sub, start, until)
        complete = bool(got) and got is not None and got[0][0] == start and len(got) == until - start
        if got is not None and (complete or initial):
            sub.replays += 1
            for seq, payload in got:
                self.apply(sub, seq, payload)
            return
        sub.replays_failed += 1
        log.warning(
            "worker %s: KV events %d..%d lost and not replayable; view cleared (stale until refilled)",
            sub.record.worker_id,
            start,
            until - 1,
        )
        self.clear(sub, stale=True)
        for seq, payload in got or []:
            self.apply(sub, seq, payload)

    @staticmethod
    async def _replay(sub: Subscription, start: int, until: int) -> list[tuple[int, bytes]] | None:
        if sub.source is None or not sub.replayable:
            return None
        return await sub.source.replay(sub.record, sub.rank, start, until)


class PublisherSink:
    """Where a transport's source delivers one publisher's batches (a ``KvEventSink``)."""

    __slots__ = ("ingest", "sub")

    def __init__(self, ingest: Ingest, sub: Subscription) -> None:
        self.ingest = ingest
        self.sub = sub

    async def batch(self, seq: int, payload: bytes) -> None:
        await self.ingest.on_batch(self.sub, seq, payload)

    def malformed(self, reason: str) -> None:
        self.sub.undecodable += 1
        log.warning("worker %s: malformed KV event message skipped: %s", self.sub.record.worker_id, reason)

    @property
    def last_seq(self) -> int | None:
        return self.sub.last_seq

    def bad_seq(self, what: str) -> None:
        self.ingest.bad_seq(self.sub, what)

    def dropped(self, reason: str) -> None:
        self.ingest.dropped(self.sub, reason)

    async def subscribed(self, replayable: bool) -> None:
        self.sub.replayable = replayable
        if replayable and self.sub.last_seq is None:
            await self.ingest.initial_sync(self.sub)

"""Prometheus metrics of KV routing, read from the hub's state at scrape time (no hot-path cost)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from infera_core.kv.index import KvIndex
from infera_core.kv.subscription import Subscription


class HubState(Protocol):
    """What the metrics read of the KV hub (:class:`infera_core.kv.hub.KvHub`)."""

    subs: dict[str, list[Subscription]]
    index: KvIndex

    def silent_workers(self, now: float | None = None) -> list[str]: ...


class KvMetrics(Collector):
    """``infera_kv_*`` series; ``extra`` collectors (tokenization, agreement) add theirs."""

    def __init__(self, hub: HubState) -> None:
        self.hub = hub
        self.extra: list[Any] = []
        """More objects with a ``collect()`` (tokenization, agreement check)."""

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self)

    def collect(self) -> Iterable[Any]:
        hub = self.hub
        w = ["worker"]
        applied = CounterMetricFamily("infera_kv_events_applied", "KV events applied to the index", labels=w)
        batches = CounterMetricFamily("infera_kv_batches", "KV event batches received", labels=w)
        bad = CounterMetricFamily(
            "infera_kv_batches_undecodable", "KV event batches that could not be decoded", labels=w
        )
        empty = CounterMetricFamily(
            "infera_kv_batches_empty", "KV event batches with no usable event", labels=w
        )
        gaps = CounterMetricFamily("infera_kv_gaps", "Gaps in a publisher's sequence numbers", labels=w)
        replays = CounterMetricFamily(
            "infera_kv_replays", "Replay requests after a gap", labels=["worker", "result"]
        )
        parent = CounterMetricFamily(
            "infera_kv_unknown_parent", "Stored blocks skipped because their parent was unknown", labels=w
        )
        blocks = GaugeMetricFamily("infera_kv_index_blocks", "Blocks mirrored per worker", labels=w)
        age = GaugeMetricFamily(
            "infera_kv_last_event_age_seconds", "Seconds since the worker's last KV event batch", labels=w
        )
        now = time.time()
        stale = silent = 0
        silent_ids = set(hub.silent_workers(now))
        for worker_id, subs in list(hub.subs.items()):  # the ingest thread may change it
            views = hub.index.views_of(worker_id)
            applied.add_metric([worker_id], sum(v.events_applied for v in views))
            parent.add_metric([worker_id], sum(v.unknown_parent for v in views))
            blocks.add_metric([worker_id], sum(v.block_count() for v in views))
            batches.add_metric([worker_id], sum(s.batches for s in subs))
            bad.add_metric([worker_id], sum(s.undecodable for s in subs))
            empty.add_metric([worker_id], sum(s.empty_batches for s in subs))
            gaps.add_metric([worker_id], sum(s.gaps for s in subs))
            replays.add_metric([worker_id, "ok"], sum(s.replays for s in subs))
            replays.add_metric([worker_id, "failed"], sum(s.replays_failed for s in subs))
            last = max((s.last_event_at or s.connected_at for s in subs), default=now)
            age.add_metric([worker_id], now - last)
            stale += any(s.stale_since is not None for s in subs)
            silent += worker_id in silent_ids
        yield from (applied, batches, bad, empty, gaps, replays, parent, blocks, age)
        yield GaugeMetricFamily(
            "infera_kv_stale_workers", "Workers whose mirrored cache is stale", value=stale
        )
        yield GaugeMetricFamily(
            "infera_kv_silent_workers",
            "Routable workers with KV events configured but no events for --kv-silence-s",
            value=silent,
        )
        yield GaugeMetricFamily(
            "infera_kv_index_blocks_total", "Blocks in the KV index", value=hub.index.block_count()
        )
        yield GaugeMetricFamily(
            "infera_kv_index_memory_bytes",
            "Bytes held by the KV index's block tables",
            value=hub.index.blocks.memory_bytes(),
        )
        yield CounterMetricFamily(
            "infera_kv_index_evicted_for_memory",
            "Blocks dropped to stay under --kv-index-max-blocks",
            value=hub.index.total_evicted,
        )
        for c in self.extra:
            yield from c.collect()

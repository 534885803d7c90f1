"""One KV-event publisher the hub follows (a worker, or one DP rank of it) and its counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from infera_core.kv.events import IndexBatch
from infera_core.kv.index import WorkerView
from infera_core.transports.base import KvEventSource
from infera_core.worker import WorkerRecord


class Subscription:
    """One publisher (a worker, or one DP rank of it) and its ingestion state."""

    __slots__ = (
        "bad_seq",
        "batches",
        "connected_at",
        "decode",
        "drops",
        "empty_batches",
        "endpoint",
        "gaps",
        "last_event_at",
        "last_seq",
        "native",
        "native_batches",
        "rank",
        "record",
        "replay_endpoint",
        "replayable",
        "replays",
        "replays_failed",
        "source",
        "stale_since",
        "synced_through",
        "task",
        "undecodable",
        "views",
    )

    def __init__(self, record: WorkerRecord, rank: int | None, endpoint: str, replay: str | None) -> None:
        self.record = record
        self.rank = rank
        self.endpoint = endpoint
        self.replay_endpoint = replay
        self.source: KvEventSource | None = None
        """The transport's source, once made (see :class:`infera_core.transports.clients.KvSources`)."""
        self.replayable = True
        """Whether the source can replay this publisher's history (``KvEventSink.subscribed``)."""
        self.decode: Callable[[bytes], IndexBatch] | None = None
        """The decoder's ``decode_raw`` when it has one (token ids stay packed for the
        index), else its ``decode``."""
        self.native = False
        """Payloads go straight to the index's native parser (the stock msgpack decoder's
        formats, on the native store); batches it hands back go through ``decode``."""
        self.task: asyncio.Task[None] | None = None
        self.last_seq: int | None = None
        self.synced_through: int | None = None
        """Highest seq loaded by the initial replay; live frames up to it are duplicates."""
        self.batches = 0
        self.native_batches = 0
        """Batches the index's native parser applied (the rest went through ``decode``)."""
        self.undecodable = 0
        self.bad_seq = 0
        """Frames skipped because their seq was not 8 bytes or was negative."""
        self.drops = 0
        """Times the publisher's connection dropped (an oversized message, a restart)."""
        self.empty_batches = 0
        self.gaps = 0
        self.replays = 0
        self.replays_failed = 0
        self.connected_at = time.time()
        self.last_event_at: float | None = None
        self.stale_since: float | None = None
        self.views: dict[int | None, WorkerView] = {}

    def summary(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "rank": self.rank,
            "last_seq": self.last_seq,
            "batches": self.batches,
            "native_batches": self.native_batches,
            "undecodable_batches": self.undecodable,
            "bad_seq_frames": self.bad_seq,
            "connection_drops": self.drops,
            "empty_batches": self.empty_batches,
            "gaps": self.gaps,
            "replays": self.replays,
            "replays_failed": self.replays_failed,
            "last_event_at": self.last_event_at,
            "stale": self.stale_since is not None,
        }

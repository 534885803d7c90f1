"""The ``memory`` discovery backend: an in-process fleet (``infera-run up``, tests).

All :class:`MemoryDiscovery` objects sharing a :class:`MemoryStore` see the same
fleet. Without an explicit store (``DiscoverySettings.memory_store``) they share the
process-wide default store, created on first use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

from infera_core.discovery.base import ChangeKind, DiscoverySettings, FleetChange, Registration
from infera_core.discovery.records import SYNCED, check_update
from infera_core.errors import DiscoveryError
from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord


class MemoryStore:
    """Worker records plus the queues of everyone watching them (one event loop)."""

    def __init__(self) -> None:
        self.records: dict[str, WorkerRecord] = {}
        self.cards: dict[str, bytes] = {}
        """Model cards by digest (kept while a record names them)."""
        self._watchers: set[asyncio.Queue[FleetChange | None]] = set()

    def put(self, record: WorkerRecord) -> None:
        self.records[record.worker_id] = record
        self._publish(FleetChange(ChangeKind.PUT, record.worker_id, record))

    def delete(self, worker_id: str) -> None:
        record = self.records.pop(worker_id, None)
        if record is not None:
            self._publish(FleetChange(ChangeKind.DELETE, worker_id, record))

    def _publish(self, change: FleetChange) -> None:
        for queue in self._watchers:
            queue.put_nowait(change)

    def subscribe(self) -> asyncio.Queue[FleetChange | None]:
        queue: asyncio.Queue[FleetChange | None] = asyncio.Queue()
        self._watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[FleetChange | None]) -> None:
        self._watchers.discard(queue)


@functools.cache
def default_store() -> MemoryStore:
    """The process-wide store used when settings name none."""
    return MemoryStore()


class MemoryRegistration:
    def __init__(self, store: MemoryStore, record: WorkerRecord) -> None:
        self._store = store
        self._worker_id = record.worker_id
        self._record = record
        self._live = True

    async def update(self, record: WorkerRecord) -> None:
        check_update(self._live, self._record, record)
        self._record = record
        self._store.put(record)

    async def deregister(self) -> None:
        if self._live:
            self._live = False
            self._store.delete(self._worker_id)


class MemoryDiscovery:
    """In-process discovery over a :class:`MemoryStore` (model cards kept in it too)."""

    card_source = "memory"

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or default_store()
        self._queues: set[asyncio.Queue[FleetChange | None]] = set()
        self._closed = False

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        for queue in self._queues:
            queue.put_nowait(None)

    async def register(self, record: WorkerRecord) -> Registration:
        if record.worker_id in self.store.records:
            raise DiscoveryError(
                f"worker_id {record.worker_id!r} is already registered "
                f"(url {redact_url(self.store.records[record.worker_id].url)}); pick another --worker-id"
            )
        self.store.put(record)
        return MemoryRegistration(self.store, record)

    async def list_workers(self) -> list[WorkerRecord]:
        return [self.store.records[k] for k in sorted(self.store.records)]

    async def put_card(self, digest: str, data: bytes) -> None:
        self.store.cards[digest] = data

    async def get_card(self, digest: str, max_bytes: int) -> bytes | None:
        data = self.store.cards.get(digest)
        if data is not None and len(data) > max_bytes:
            raise ValueError(f"model card {digest} is {len(data)} bytes, over the limit of {max_bytes}")
        return data

    async def release_card(self, digest: str) -> None:
        if not any(r.model_card and r.model_card.digest == digest for r in self.store.records.values()):
            self.store.cards.pop(digest, None)

    async def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        queue = self.store.subscribe()
        self._queues.add(queue)
        try:
            for record in await self.list_workers():
                yield FleetChange(ChangeKind.PUT, record.worker_id, record)
            if sync_marker:
                yield SYNCED
            while not self._closed:
                change = await queue.get()
                if change is None:
                    return
                yield change
        finally:
            self._queues.discard(queue)
            self.store.unsubscribe(queue)


class MemoryDiscoveryFactory:
    name = "memory"
    description = "In-process fleet shared by everything in one process (infera-run up, tests)."

    def create(self, settings: DiscoverySettings) -> MemoryDiscovery:
        store = settings.memory_store
        if store is not None and not isinstance(store, MemoryStore):
            raise DiscoveryError("memory discovery: settings.memory_store must be a MemoryStore")
        return MemoryDiscovery(store)

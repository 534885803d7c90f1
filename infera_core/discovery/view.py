"""The server-side view of the fleet, kept current from a :class:`Discovery` watch.

Usage (server, ``infera-run up``, tests)::

    discovery = catalog.discovery.get("etcd").create(DiscoverySettings(etcd_endpoints=[...]))
    await discovery.start()
    view = FleetView(discovery, hooks=hooks)        # hooks: optional InferaHooks
    await view.start()                               # returns once the initial fleet is loaded
    view.workers                                     # {worker_id: WorkerRecord}, read-only
    view.is_routable("w1")                           # known, and status active (not draining)
    view.routable()                                  # every routable record
    unsubscribe = view.subscribe(lambda change: ...) # called synchronously for each change
    async for change in view.changes(): ...          # or an async stream (one queue per consumer)
    await view.wait_for(lambda v: "w1" in v.workers, within=5)
    await view.stop()                                # the caller still closes the discovery

Each change is a :class:`FleetChange`: ``PUT`` (new or updated record, including a
status change to ``draining``) or ``DELETE`` (``record`` is the last known one).
``SYNCED`` markers from the backend are not forwarded. When ``hooks`` is given,
``infera_worker_added`` / ``infera_worker_removed`` fire for every PUT / DELETE.
Subscriber callbacks must be quick and must not raise (errors are logged).
A PUT whose record's ``worker_id`` is not the change's is rejected with a log line (every
consumer keys by ``worker_id``; a record filed under another id would be a ghost).
If the backend's watch stream fails, it is restarted after ``retry_delay`` seconds
and the differences are applied, so the view converges to the backend's content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from infera_core.discovery.base import ChangeKind, Discovery, FleetChange
from infera_core.util.tasks import cancel_and_wait
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.discovery.view")

Callback = Callable[[FleetChange], None]


class FleetListener(Protocol):
    """Told of workers joining and leaving (:class:`infera_core.plugin.hooks.InferaHooks`
    broadcasts them to the plugins' ``infera_worker_added`` / ``infera_worker_removed``)."""

    def worker_added(self, record: WorkerRecord) -> None: ...

    def worker_removed(self, record: WorkerRecord) -> None: ...


class FleetView:
    """Current workers, a change stream, and routability, fed by ``discovery.watch()``."""

    def __init__(
        self,
        discovery: Discovery,
        *,
        hooks: FleetListener | None = None,
        retry_delay: float = 1.0,
    ) -> None:
        self.discovery = discovery
        self.hooks = hooks
        self.retry_delay = retry_delay
        self._workers: dict[str, WorkerRecord] = {}
        self._callbacks: list[Callback] = []
        self._queues: set[asyncio.Queue[FleetChange]] = set()
        self._changed = asyncio.Condition()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- reading --------------------------------------------------------------
    @property
    def workers(self) -> Mapping[str, WorkerRecord]:
        """worker_id → record, a read-only live mapping."""
        return MappingProxyType(self._workers)

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.get(worker_id)

    def is_routable(self, worker_id: str) -> bool:
        """True when the worker is known and active (not draining)."""
        record = self._workers.get(worker_id)
        return record is not None and record.routable

    def routable(self) -> list[WorkerRecord]:
        return [r for r in self._workers.values() if r.routable]

    @property
    def synced(self) -> bool:
        """True once the initial fleet has been loaded."""
        return self._synced.is_set()

    # -- subscribing ----------------------------------------------------------
    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(change)`` for every change; returns an unsubscribe function."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    async def changes(self) -> AsyncIterator[FleetChange]:
        """Every change from now on (no replay of the current fleet)."""
        queue: asyncio.Queue[FleetChange] = asyncio.Queue()
        self._queues.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.discard(queue)

    async def wait_for(self, predicate: Callable[[FleetView], bool], within: float) -> None:
        """Wait until ``predicate(view)`` holds; ``TimeoutError`` after ``within`` seconds."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    # -- lifecycle ------------------------------------------------------------
    async def start(self, wait_synced: float | None = 10.0) -> None:
        """Start following the discovery; wait (up to ``wait_synced`` s) for the initial fleet.

        ``TimeoutError`` when the fleet was not loaded in time (the view keeps trying).
        """
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-view")
        if wait_synced:
            async with asyncio.timeout(wait_synced):
                await self._synced.wait()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            seen: set[str] = set()
            resyncing = self._synced.is_set()
            try:
                async for change in self.discovery.watch(sync_marker=True):
                    if change.kind is ChangeKind.SYNCED:
                        if resyncing:  # a restarted stream: drop what it no longer reports
                            for wid in [w for w in self._workers if w not in seen]:
                                await self._apply(FleetChange(ChangeKind.DELETE, wid, self._workers[wid]))
                            resyncing = False
                        self._synced.set()
                        continue
                    seen.add(change.worker_id)
                    await self._apply(change)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fleet watch failed; retrying in %.1fs", self.retry_delay)
            await asyncio.sleep(self.retry_delay)

    async def _apply(self, change: FleetChange) -> None:
        if change.kind is ChangeKind.PUT and change.record is not None:
            if change.record.worker_id != change.worker_id:
                # one id everywhere: the table, hooks and removals all key by worker_id, so a
                # record filed under another id could never be removed (a ghost worker)
                log.warning(
                    "fleet: rejected the record of worker %r delivered as %r (ids must agree)",
                    change.record.worker_id,
                    change.worker_id,
                )
                if change.worker_id in self._workers:  # what was there under that id is gone
                    await self._apply(FleetChange(ChangeKind.DELETE, change.worker_id, None))
                return
            if self._workers.get(change.worker_id) == change.record:
                return
            self._workers[change.worker_id] = change.record
            if self.hooks is not None:
                self.hooks.worker_added(change.record)
        elif change.kind is ChangeKind.DELETE:
            old = self._workers.pop(change.worker_id, None)
            if old is None:
                return
            change = FleetChange(ChangeKind.DELETE, change.worker_id, old)
            if self.hooks is not None:
                self.hooks.worker_removed(old)
        for callback in list(self._callbacks):
            try:
                callback(change)
            except Exception:
                log.exception("fleet view subscriber failed on %s %s", change.kind, change.worker_id)
        for queue in self._queues:
            queue.put_nowait(change)
        async with self._changed:
            self._changed.notify_all()

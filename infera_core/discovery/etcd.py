"""The ``etcd`` discovery backend: leases + keepalive (launcher), supervised prefix watch (server).

* register: a transaction puts ``<prefix><worker_id>`` only if the key does not exist
  (a duplicate ``worker_id`` is a :class:`DiscoveryError`), under a fresh lease of
  ``lease_ttl`` seconds. One :class:`LeaseKeeper` per discovery refreshes every lease
  every TTL/3 over a single keepalive stream; when etcd says a lease is gone (it expired
  during a partition) it grants a new one and puts the record again.
* watch: read the prefix, emit the differences from what this watcher knew, then watch
  from the read's revision + 1. On any error (etcd restart, lost connection, revision
  compacted) start over with a full re-read, so deletions that happened meanwhile are
  emitted as DELETEs and the view converges to etcd's content.
* records that fail validation are logged with their key and skipped; so is a record
  whose ``worker_id`` differs from its key (one id everywhere: a record that claimed
  another id could never be removed by its key's deletion and would stay a ghost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import aetcd

from infera_core.discovery.base import ChangeKind, DiscoverySettings, FleetChange
from infera_core.discovery.etcd_cards import EtcdCards
from infera_core.discovery.etcd_client import ETCD_ERRORS, EtcdConnection, describe, parse_endpoints
from infera_core.discovery.etcd_lease import LeaseKeeper
from infera_core.discovery.etcd_state import EtcdState
from infera_core.discovery.records import SYNCED, check_update, diff, parse_record
from infera_core.errors import DiscoveryError
from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.discovery.etcd")

RETRY_DELAY = 0.25
MAX_RETRY_DELAY = 2.0


class EtcdRegistration:
    """One worker's key and lease; the discovery's :class:`LeaseKeeper` heartbeats it."""

    def __init__(self, discovery: EtcdDiscovery, record: WorkerRecord, lease_id: int) -> None:
        self._discovery = discovery
        self._record = record
        self.key = discovery.key(record.worker_id)
        self.lease_id = lease_id
        self.keepalives = 0
        """Successful lease refreshes (for benchmarks and tests)."""
        self.regrants = 0
        """Times the lease was found lost and re-granted."""
        self._live = True

    @property
    def record(self) -> WorkerRecord:
        return self._record

    @property
    def _client(self) -> aetcd.Client:
        return self._discovery.conn.client

    async def update(self, record: WorkerRecord) -> None:
        check_update(self._live, self._record, record)
        self._record = record
        try:
            await self._client.put(self.key.encode(), record.to_json(), lease=self.lease_id)
        except ETCD_ERRORS as exc:
            raise DiscoveryError(f"etcd: cannot update {self.key}: {exc}") from exc

    async def deregister(self, retry_for: float | None = None) -> None:
        """Delete the key and revoke the lease; retries while etcd is unreachable.

        Gives up after ``retry_for`` seconds (default: max(connect timeout, lease TTL));
        the lease then expires on its own.
        """
        if not self._live:
            return
        self._live = False
        self._discovery.keeper.remove(self)
        settings = self._discovery.settings
        budget = retry_for if retry_for is not None else max(settings.connect_timeout, settings.lease_ttl)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        delay = RETRY_DELAY
        while True:
            try:
                await self._client.delete(self.key.encode())
                with contextlib.suppress(*ETCD_ERRORS):
                    await self._client.revoke_lease(self.lease_id)
                return
            except ETCD_ERRORS as exc:
                if loop.time() + delay > deadline:
                    log.warning(
                        "etcd: could not delete %s (%s); its lease expires within %gs",
                        self.key,
                        exc,
                        settings.lease_ttl,
                    )
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)

    async def regrant(self) -> None:
        """The lease was lost (expired during a partition): new lease, record put again."""
        if not self._live:
            return
        log.warning("etcd: lease of %s was lost; granting a new one and re-putting the record", self.key)
        lease = await self._client.lease(self._discovery.ttl_seconds)
        ok = await self._discovery.put_if_absent(self.key, self._record, lease.id)
        if not ok:
            with contextlib.suppress(*ETCD_ERRORS):
                await self._client.revoke_lease(lease.id)
            log.error("etcd: %s was taken by another worker while our lease was lost", self.key)
            return
        self.lease_id = lease.id
        self.regrants += 1


class EtcdDiscovery:
    """Discovery through etcd (see the module docstring); model cards in
    :mod:`~infera_core.discovery.etcd_cards`."""

    card_source = "etcd"
    state_source = "etcd"

    def __init__(self, settings: DiscoverySettings) -> None:
        self.settings = settings
        self.prefix = settings.prefix if settings.prefix.endswith("/") else settings.prefix + "/"
        self.conn = EtcdConnection(parse_endpoints(settings.etcd_endpoints), settings.connect_timeout)
        self.keeper = LeaseKeeper(self.conn, max(settings.lease_ttl / 3, 0.1))
        self._closed = asyncio.Event()
        self.cards = EtcdCards(self.conn, self.prefix, self.list_workers)
        self.state = EtcdState(self.conn, self.prefix)

    @property
    def ttl_seconds(self) -> int:
        return max(1, math.ceil(self.settings.lease_ttl))

    def key(self, worker_id: str) -> str:
        return self.prefix + worker_id

    async def start(self) -> None:
        self._closed.clear()
        await self.conn.connect()

    async def close(self) -> None:
        self._closed.set()
        await self.keeper.close()  # heartbeats stop; leases expire unless deregistered
        await self.conn.close()

    async def put_if_absent(self, key: str, record: WorkerRecord, lease_id: int) -> bool:
        client = self.conn.client
        tx = client.transactions
        ok, _ = await client.transaction(
            compare=[tx.create(key.encode()) == 0],
            success=[tx.put(key.encode(), record.to_json(), lease=lease_id)],
            failure=[],
        )
        return bool(ok)

    async def register(self, record: WorkerRecord) -> EtcdRegistration:
        key = self.key(record.worker_id)
        client = self.conn.client
        try:
            lease = await client.lease(self.ttl_seconds)
            ok = await self.put_if_absent(key, record, lease.id)
            if not ok:
                with contextlib.suppress(*ETCD_ERRORS):
                    await client.revoke_lease(lease.id)
                existing = await client.get(key.encode())
                holder = parse_record(key, existing.value) if existing is not None else None
                where = f" by {redact_url(holder.url)}" if holder is not None else ""
                raise DiscoveryError(
                    f"worker_id {record.worker_id!r} is already registered in etcd ({key}{where}); "
                    "pick another --worker-id or stop the other worker"
                )
        except ETCD_ERRORS as exc:
            raise DiscoveryError(f"etcd ({self.conn.endpoint}): cannot register {key}: {exc}") from exc
        reg = EtcdRegistration(self, record, lease.id)
        self.keeper.add(reg)
        return reg

    async def _read(self) -> tuple[dict[str, WorkerRecord], int]:
        result = await self.conn.client.get_prefix(self.prefix.encode())
        fresh: dict[str, WorkerRecord] = {}
        for kv in result:
            key = kv.key.decode(errors="replace")
            record = self._parse(key, kv.value)
            if record is not None:
                fresh[record.worker_id] = record
        return fresh, result.header.revision

    def _parse(self, key: str, value: bytes) -> WorkerRecord | None:
        """The record at ``key``; None (logged) when malformed or when its id is not its key's."""
        record = parse_record(key, value)
        if record is None:
            return None
        worker_id = key[len(self.prefix) :]
        if record.worker_id != worker_id:
            log.warning(
                "etcd: skipping the worker record at %s: its worker_id %r is not the key's %r"
                " (a worker registers at <prefix><worker_id>)",
                key,
                record.worker_id,
                worker_id,
            )
            return None
        return record

    async def list_workers(self) -> list[WorkerRecord]:
        try:
            fresh, _ = await self._read()
        except ETCD_ERRORS as exc:
            raise DiscoveryError(
                f"etcd ({describe(self.conn.endpoints)}): cannot list workers: {exc}"
            ) from exc
        return [fresh[k] for k in sorted(fresh)]

    async def put_card(self, digest: str, data: bytes) -> None:
        await self.cards.put(digest, data)

    async def get_card(self, digest: str, max_bytes: int) -> bytes | None:
        return await self.cards.get(digest, max_bytes)

    async def state_get(self, name: str) -> tuple[bytes | None, int]:
        return await self.state.get(name)

    async def state_swap(self, name: str, value: bytes, revision: int) -> bool:
        return await self.state.swap(name, value, revision)

    async def release_card(self, digest: str) -> None:
        try:
            await self.cards.release(digest)
        except ETCD_ERRORS as exc:
            log.warning("etcd: could not release model card %s (%s); it stays in etcd", digest, exc)

    async def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        known: dict[str, WorkerRecord] = {}
        delay = RETRY_DELAY
        failures = 0
        while not self._closed.is_set():
            watch: Any = None
            try:
                fresh, revision = await self._read()
                for change in diff(known, fresh):
                    yield change
                if sync_marker:
                    yield SYNCED
                watch = await self.conn.client.watch_prefix(self.prefix.encode(), start_revision=revision + 1)
                if failures:
                    log.info("etcd: watch on %s resumed at revision %d", self.prefix, revision + 1)
                delay, failures = RETRY_DELAY, 0
                async for event in watch:
                    update = self._change(event, known)
                    if update is not None:
                        yield update
            except ETCD_ERRORS as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "etcd: watch on %s interrupted (%s); re-reading and resuming", self.prefix, exc
                    )
                if failures % 8 == 0:
                    await self.conn.failover()
            finally:
                if watch is not None:
                    with contextlib.suppress(*ETCD_ERRORS):
                        await watch.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)

    def _change(self, event: Any, known: dict[str, WorkerRecord]) -> FleetChange | None:
        key = event.kv.key.decode(errors="replace")
        worker_id = key[len(self.prefix) :]
        if event.kind == "PUT":
            record = self._parse(key, event.kv.value)
            if record is not None:
                known[worker_id] = record
                return FleetChange(ChangeKind.PUT, worker_id, record)
        old = known.pop(worker_id, None)  # a delete, or a put of a malformed record
        return FleetChange(ChangeKind.DELETE, worker_id, old) if old is not None else None


class EtcdDiscoveryFactory:
    name = "etcd"
    description = "etcd: leases with keepalive for workers, a supervised prefix watch for routers."

    def create(self, settings: DiscoverySettings) -> EtcdDiscovery:
        return EtcdDiscovery(settings)

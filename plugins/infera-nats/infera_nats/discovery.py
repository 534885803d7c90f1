"""The ``nats`` discovery backend: worker records in a JetStream key-value bucket.

* The bucket (``--nats-bucket``, default ``infera-workers``) is made on first use with
  per-key TTLs allowed and server delete markers, so a record that is not refreshed
  expires by itself and watchers see the expiry as a deletion.
* register: ``create`` (put-if-absent: a duplicate ``worker_id`` is a
  :class:`DiscoveryError`) with a TTL of ``lease_ttl`` seconds; a heartbeat re-puts the
  record every TTL/3 (expecting our own last revision). When the key is gone (it
  expired during a partition, or NATS lost its state) the record is created again;
  when someone else holds it, that is logged.
* watch: the bucket's current content, the differences from what this watcher knew,
  then live updates. After a reconnect (a NATS restart) the watch starts over with a
  full read, so deletions that happened meanwhile are emitted as DELETEs.
* keys are the worker id with every character outside ``[A-Za-z0-9_-]`` written as
  ``=XX`` (hex), so any worker id is a valid single-token key.
* records that fail validation are logged with their key and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from infera_core.discovery.base import ChangeKind, DiscoverySettings, FleetChange
from infera_core.discovery.records import SYNCED, check_update, diff, parse_record
from infera_core.errors import DiscoveryError
from infera_core.util.nats_layout import bucket_key
from infera_core.util.redact import redact_url
from infera_core.worker import WorkerRecord
from infera_nats.auth import NatsAuth
from infera_nats.cards import NatsCards
from infera_nats.settings import NatsSettings
from infera_nats.state import NatsState
from infera_nats.transport_connect import NatsUnreachableError, close_quietly, connect_nats

log = logging.getLogger("infera.discovery.nats")

NATS_ERRORS: tuple[type[Exception], ...] = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)
RELEASE_ERRORS: tuple[type[Exception], ...] = (*NATS_ERRORS, DiscoveryError)
MARKER_TTL = 300.0
"""Seconds the server keeps the delete marker of an expired key (watchers see it as DELETE)."""
RETRY_DELAY = 0.25
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream error codes of a publish whose expected last subject sequence did not match."""
MAX_RETRY_DELAY = 2.0
POLL = 0.5
"""Seconds between checks for a reconnect while a watch is idle."""


key_of = bucket_key
"""The bucket key of ``worker_id`` (reversible, always a valid key)."""


def worker_id_of(key: str) -> str:
    """The worker id a bucket key stands for (the inverse of :func:`key_of`)."""
    if "=" not in key:
        return key
    out = bytearray()
    i = 0
    while i < len(key):
        if key[i] == "=" and i + 3 <= len(key):
            try:
                out.append(int(key[i + 1 : i + 3], 16))
                i += 3
                continue
            except ValueError:
                pass
        out += key[i].encode()
        i += 1
    return out.decode(errors="replace")


def _is_tombstone(headers: dict[str, str] | None, data: bytes) -> bool:
    """A deleted key: a KV delete/purge, or a server marker left by an expired TTL."""
    if headers and (headers.get("KV-Operation") in (KV_DEL, KV_PURGE) or "Nats-Marker-Reason" in headers):
        return True
    return not data


class NatsRegistration:
    """One worker's key, refreshed by a heartbeat task until deregistered or closed."""

    def __init__(self, discovery: NatsDiscovery, record: WorkerRecord, revision: int) -> None:
        self._discovery = discovery
        self._record = record
        self.key = key_of(record.worker_id)
        self.revision = revision
        self.heartbeats = 0
        """Successful refreshes (for tests and benchmarks)."""
        self.recreated = 0
        """Times the key was found gone and created again."""
        self._live = True
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name=f"nats-lease-{self.key}")

    @property
    def record(self) -> WorkerRecord:
        return self._record

    async def update(self, record: WorkerRecord) -> None:
        check_update(self._live, self._record, record)
        self._record = record
        try:
            self.revision = await self._discovery.put(self.key, record, self.revision)
        except NATS_ERRORS as exc:
            raise DiscoveryError(f"NATS: cannot update {self.key}: {exc}") from exc

    async def _heartbeat(self) -> None:
        d = self._discovery
        interval = max(d.settings.lease_ttl / 3, 0.1)
        while self._live:
            await asyncio.sleep(interval)
            try:
                self.revision = await d.put(self.key, self._record, self.revision)
                self.heartbeats += 1
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._recreate()
            except NATS_ERRORS as exc:
                log.debug("nats: heartbeat of %s failed (%s); retrying", self.key, exc)

    async def _recreate(self) -> None:
        """Our revision is not the key's last one: gone (expired) → create again; else taken."""
        d = self._discovery
        try:
            self.revision = await d.create(self.key, self._record)
            self.recreated += 1
            log.warning("nats: record %s had expired (partition or NATS restart); registered again", self.key)
        except nats.js.errors.KeyWrongLastSequenceError:
            log.error("nats: %s is held by another worker; not overwriting it", self.key)
        except NATS_ERRORS as exc:
            log.debug("nats: re-creating %s failed (%s); retrying", self.key, exc)

    async def _stop(self) -> None:
        self._live = False
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def deregister(self, retry_for: float | None = None) -> None:
        """Delete the key; retries while NATS is unreachable for ``retry_for`` seconds
        (default: max(connect timeout, lease TTL)); the TTL then removes it anyway."""
        if not self._live:
            return
        await self._stop()
        d = self._discovery
        d.registrations.discard(self)
        budget = retry_for if retry_for is not None else max(d.settings.connect_timeout, d.settings.lease_ttl)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        delay = RETRY_DELAY
        while True:
            try:
                kv = await d.bucket()
                await kv.delete(self.key)
                return
            except NATS_ERRORS as exc:
                if loop.time() + delay > deadline:
                    log.warning(
                        "nats: could not delete %s (%s); it expires within %gs",
                        self.key,
                        exc,
                        d.settings.lease_ttl,
                    )
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)


class NatsDiscovery:
    """Discovery through a JetStream key-value bucket (see the module docstring); model
    cards in a JetStream object store (:mod:`infera_nats.cards`)."""

    card_source = "nats"
    state_source = "nats"

    def __init__(self, settings: DiscoverySettings, nats_settings: NatsSettings | None = None) -> None:
        self.settings = settings
        self.nats = nats_settings or settings.options.get(NatsSettings)
        self.servers = self.nats.servers()
        self.epoch = 0
        """Grows at every reconnect: watchers then re-read the bucket."""
        self._nc: Client | None = None
        self.registrations: set[NatsRegistration] = set()
        self._kv: KeyValue | None = None
        self._kv_epoch = -1
        self._closed = asyncio.Event()
        self.cards = NatsCards(lambda: self.nc, self.nats.nats_bucket, self.list_workers)
        self.state = NatsState(lambda: self.nc, self.nats.nats_bucket, lambda: self.epoch)

    async def state_get(self, name: str) -> tuple[bytes | None, int]:
        return await self.state.get(name)

    async def state_swap(self, name: str, value: bytes, revision: int) -> bool:
        return await self.state.swap(name, value, revision)

    async def put_card(self, digest: str, data: bytes) -> None:
        try:
            await self.cards.put(digest, data)
        except NATS_ERRORS as exc:
            raise DiscoveryError(f"{self._where()}: cannot store model card {digest}: {exc}") from exc

    async def get_card(self, digest: str, max_bytes: int) -> bytes | None:
        try:
            return await self.cards.get(digest, max_bytes)
        except NATS_ERRORS as exc:
            raise DiscoveryError(f"{self._where()}: cannot read model card {digest}: {exc}") from exc

    async def release_card(self, digest: str) -> None:
        try:
            await self.cards.release(digest)
        except RELEASE_ERRORS as exc:
            # on an authenticated plane a worker may not read the other workers' records, so it
            # cannot tell whether the card is still named: it leaves the card in the store
            log.info("%s: model card %s kept in the store (%s)", self._where(), digest, exc)

    @property
    def ttl_seconds(self) -> int:
        return max(1, math.ceil(self.settings.lease_ttl))

    def _where(self) -> str:
        shown = ", ".join(redact_url(s) for s in self.servers)
        return f"NATS ({shown}) bucket {self.nats.nats_bucket}"

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise DiscoveryError(f"{self._where()}: not connected (call start() first)")
        return self._nc

    def _reconnected(self) -> None:
        self.epoch += 1

    async def start(self) -> None:
        self._closed.clear()
        if self._nc is None:
            timeout = self.settings.connect_timeout
            try:
                self._nc = await connect_nats(
                    self.servers,
                    "infera-discovery",
                    timeout,
                    on_reconnect=self._reconnected,
                    auth=NatsAuth.of(self.nats),
                )
            except NatsUnreachableError:
                raise DiscoveryError(
                    f"{self._where()}: unreachable within {timeout:g}s; check --nats-url "
                    "(env INFERA_NATS_URL) and that nats-server runs (with JetStream: -js)"
                ) from None
        try:
            await asyncio.wait_for(self.bucket(), self.settings.connect_timeout)
        except NATS_ERRORS as exc:
            raise DiscoveryError(
                f"{self._where()}: cannot open the key-value bucket ({exc or type(exc).__name__}); "
                "is JetStream enabled (nats-server -js)?"
            ) from None

    async def close(self) -> None:
        self._closed.set()
        for reg in list(self.registrations):
            await reg._stop()  # heartbeats stop; the keys expire unless deregistered
        self.registrations.clear()
        nc, self._nc = self._nc, None
        await close_quietly(nc)
        self._kv = None

    async def bucket(self) -> KeyValue:
        """The bucket, opened (or made) once per connection epoch."""
        if self._kv is None or self._kv_epoch != self.epoch:
            js = self.nc.jetstream(timeout=max(1.0, min(self.settings.connect_timeout, 5.0)))
            name = self.nats.nats_bucket
            try:
                kv = await js.key_value(name)
            except nats.js.errors.BucketNotFoundError:
                kv = await js.create_key_value(
                    api.KeyValueConfig(
                        bucket=name,
                        description="Infera worker records",
                        history=1,
                        limit_marker_ttl=MARKER_TTL,
                    )
                )
            self._kv, self._kv_epoch = kv, self.epoch
        return self._kv

    async def create(self, key: str, record: WorkerRecord) -> int:
        """Put ``record`` if ``key`` holds none (absent, deleted or expired); raises
        ``KeyWrongLastSequenceError`` when it holds one."""
        kv = await self.bucket()
        try:
            return int(await kv.create(key, record.to_json(), msg_ttl=self.ttl_seconds))
        except nats.js.errors.KeyWrongLastSequenceError:
            js = self.nc.jetstream()
            msg = await js.get_msg(f"KV_{self.nats.nats_bucket}", subject=self._subject(key))
            if not _is_tombstone(msg.headers, msg.data or b""):
                raise
            return await self.put(key, record, msg.seq or 0)  # an expiry marker: take its place

    def _subject(self, key: str) -> str:
        return f"$KV.{self.nats.nats_bucket}.{key}"

    async def put(self, key: str, record: WorkerRecord, last: int) -> int:
        """Re-put ``record`` with a fresh TTL if ``last`` is still the key's revision."""
        await self.bucket()
        js = self.nc.jetstream()
        try:
            ack = await js.publish(
                self._subject(key),
                record.to_json(),
                headers={api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)},
                msg_ttl=self.ttl_seconds,
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code in WRONG_LAST_SEQUENCE:
                raise nats.js.errors.KeyWrongLastSequenceError(description=exc.description) from None
            raise
        return int(ack.seq)

    async def register(self, record: WorkerRecord) -> NatsRegistration:
        key = key_of(record.worker_id)
        try:
            revision = await self.create(key, record)
        except nats.js.errors.KeyWrongLastSequenceError:
            holder = None
            with contextlib.suppress(*NATS_ERRORS):
                entry = await (await self.bucket()).get(key)
                holder = parse_record(key, entry.value or b"")
                if holder == record and entry.revision:
                    # our own earlier attempt, sent when NATS came back: registering is idempotent
                    return self._registered(record, entry.revision)
            where = f" by {redact_url(holder.url)}" if holder is not None else ""
            raise DiscoveryError(
                f"worker_id {record.worker_id!r} is already registered in {self._where()} (key {key}{where}); "
                "pick another --worker-id or stop the other worker"
            ) from None
        except NATS_ERRORS as exc:
            raise DiscoveryError(f"{self._where()}: cannot register {key}: {exc}") from exc
        return self._registered(record, revision)

    def _registered(self, record: WorkerRecord, revision: int) -> NatsRegistration:
        reg = NatsRegistration(self, record, revision)
        self.registrations.add(reg)
        return reg

    async def _read(self) -> dict[str, WorkerRecord]:
        """Every record in the bucket now (keys whose last operation is a value)."""
        kv = await self.bucket()
        # the watch delivers one entry per key; nats-py may signal "no more" (None) before the
        # entries the server already sent are handled (a race a loaded machine shows), so read
        # on until as many keys as the bucket held came (or the watch is quiet that long)
        expected = (await kv.status()).values  # history 1: one message per key
        watcher: Any = await kv.watch(">")  # nats-py's KeyWatcher is untyped
        fresh: dict[str, WorkerRecord] = {}
        seen = 0
        try:
            while True:
                try:
                    entry = await watcher.updates(timeout=self.settings.connect_timeout)
                except TimeoutError:
                    if seen >= expected:
                        raise
                    return fresh  # keys that expired meanwhile
                if entry is None:
                    if seen >= expected:
                        return fresh
                    continue
                seen += 1
                self._apply(fresh, entry.key, entry.value, entry.operation)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _apply(
        self, known: dict[str, WorkerRecord], key: str, value: bytes | None, op: str | None
    ) -> FleetChange | None:
        """Apply one bucket entry to ``known`` (by worker id); the change it makes, if any."""
        worker_id = worker_id_of(key)
        record = None
        if op not in (KV_DEL, KV_PURGE):
            record = parse_record(f"{self.nats.nats_bucket}/{key}", value or b"")
            if record is not None and record.worker_id != worker_id:
                log.warning(
                    "discovery: skipping worker record at %s/%s: it names worker %r",
                    self.nats.nats_bucket,
                    key,
                    record.worker_id,
                )
                record = None
        if record is None:  # deleted, expired or malformed (logged): a previous value is forgotten
            old = known.pop(worker_id, None)
            return FleetChange(ChangeKind.DELETE, worker_id, old) if old is not None else None
        if known.get(worker_id) == record:
            return None  # a heartbeat: same record, fresh TTL
        known[worker_id] = record
        return FleetChange(ChangeKind.PUT, worker_id, record)

    async def list_workers(self) -> list[WorkerRecord]:
        try:
            fresh = await self._read()
        except NATS_ERRORS as exc:
            raise DiscoveryError(
                f"{self._where()}: cannot list workers: {exc or type(exc).__name__}"
            ) from exc
        return sorted(fresh.values(), key=lambda r: r.worker_id)

    async def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        known: dict[str, WorkerRecord] = {}  # by worker id
        delay = RETRY_DELAY
        failures = 0
        while not self._closed.is_set():
            watcher: Any = None
            try:
                epoch = self.epoch
                kv = await self.bucket()
                watcher = await kv.watch(">")
                fresh: dict[str, WorkerRecord] = {}
                while (entry := await watcher.updates(timeout=self.settings.connect_timeout)) is not None:
                    self._apply(fresh, entry.key, entry.value, entry.operation)
                for change in diff(known, fresh):
                    yield change
                if sync_marker:
                    yield SYNCED
                if failures:
                    log.info("nats: watch of bucket %s resumed", self.nats.nats_bucket)
                delay, failures = RETRY_DELAY, 0
                while not self._closed.is_set() and self.epoch == epoch:
                    try:
                        entry = await watcher.updates(timeout=POLL)
                    except TimeoutError:
                        continue
                    if entry is None:
                        continue
                    live = self._apply(known, entry.key, entry.value, entry.operation)
                    if live is not None:
                        yield live
            except NATS_ERRORS as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "nats: watch of bucket %s interrupted (%s); re-reading and resuming",
                        self.nats.nats_bucket,
                        exc or type(exc).__name__,
                    )
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            if self._closed.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)


class NatsDiscoveryFactory:
    name = "nats"
    description = (
        "NATS JetStream key-value bucket: per-key TTL + heartbeat for workers, a resyncing watch for routers."
    )
    settings_model = NatsSettings

    def create(self, settings: DiscoverySettings) -> NatsDiscovery:
        return NatsDiscovery(settings)

"""Shared records on the NATS plane (:class:`~infera_core.discovery.base.SharedState`): a
JetStream key-value bucket of their own (``<bucket>_STATE``, e.g. ``infera-workers_STATE``),
history 1, no TTL; a write names the revision it replaces (``Nats-Expected-Last-Subject-
Sequence``; 0: the key is absent), so two routers never both win."""

from __future__ import annotations

from collections.abc import Callable

import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.kv import KeyValue


class NatsState:
    """Get and compare-and-swap records in the ``<bucket>_STATE`` key-value bucket."""

    def __init__(self, nc: Callable[[], Client], bucket: str, epoch: Callable[[], int]) -> None:
        self._nc = nc
        self._epoch = epoch
        self.bucket = f"{bucket}_STATE"
        self._kv: KeyValue | None = None
        self._kv_epoch = -1

    async def _open(self) -> KeyValue:
        if self._kv is None or self._kv_epoch != self._epoch():
            js = self._nc().jetstream(timeout=2.0)
            try:
                kv = await js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                kv = await js.create_key_value(
                    api.KeyValueConfig(bucket=self.bucket, description="Infera shared state", history=1)
                )
            self._kv, self._kv_epoch = kv, self._epoch()
        return self._kv

    async def get(self, name: str) -> tuple[bytes | None, int]:
        kv = await self._open()
        try:
            entry = await kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        return entry.value, int(entry.revision or 0)

    async def swap(self, name: str, value: bytes, revision: int) -> bool:
        kv = await self._open()
        try:
            await kv.update(name, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

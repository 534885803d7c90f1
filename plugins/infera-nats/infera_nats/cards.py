"""Model cards on the NATS plane: a JetStream object store (``<bucket>_CARDS``, e.g.
``INFERA_CARDS``), one object per digest (named by its hex sha256).

Objects are chunked by JetStream itself and kept while a worker record names them: a
launcher stores its card after it registered, and after it deregistered deletes it when no
record names the digest; it then looks again and stores it back when a worker registered
meanwhile (it holds the same bytes), so a live worker's card is never lost. A worker that
dies without deregistering leaves its card until the next worker of that digest leaves
(``nats object rm INFERA_CARDS <hex>`` removes it by hand).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.object_store import ObjectStore

from infera_core.worker import WorkerRecord


def _name(digest: str) -> str:
    return digest.split(":", 1)[-1]


class NatsCards:
    """Put, get and release model cards in a JetStream object store."""

    def __init__(
        self, nc: Callable[[], Client], bucket: str, list_records: Callable[[], Awaitable[list[WorkerRecord]]]
    ) -> None:
        self._nc = nc
        self.bucket = f"{bucket}_CARDS"
        self._list = list_records
        self._held: dict[str, bytes] = {}

    async def store(self) -> ObjectStore:
        js = self._nc().jetstream()
        try:
            return await js.object_store(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            return await js.create_object_store(
                self.bucket, config=api.ObjectStoreConfig(description="Infera model cards")
            )

    async def put(self, digest: str, data: bytes) -> None:
        self._held[digest] = data
        await (await self.store()).put(_name(digest), data)

    async def get(self, digest: str, max_bytes: int) -> bytes | None:
        obs = await self.store()
        try:
            info = await obs.get_info(_name(digest))
        except nats.js.errors.ObjectNotFoundError:
            return None
        if (info.size or 0) > max_bytes:
            raise ValueError(f"model card {digest} is {info.size} bytes, over the limit of {max_bytes}")
        try:
            result = await obs.get(_name(digest))
        except nats.js.errors.ObjectNotFoundError:
            return None
        return result.data

    async def _named(self, digest: str) -> bool:
        return any(r.model_card is not None and r.model_card.digest == digest for r in await self._list())

    async def release(self, digest: str) -> None:
        data = self._held.pop(digest, None)
        if await self._named(digest):
            return
        obs = await self.store()
        try:
            await obs.delete(_name(digest))
        except nats.js.errors.ObjectNotFoundError:
            return
        if data is not None and await self._named(digest):
            await obs.put(_name(digest), data)  # a worker registered while we deleted
